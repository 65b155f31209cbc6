#ifndef WSYNC_TESTS_UNIT_UCX_TEST_FIXTURE_H_
#define WSYNC_TESTS_UNIT_UCX_TEST_FIXTURE_H_

// The fixture of the UCX transport tests (ucx_test.cc, ucx_checks_test.cc): a job of connected
// UcxTransports over one transport list, and helpers to drive them.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/ucx/ucx_transport.h"

namespace wsync::test {

// One UCX transport list under test.
struct Fabric {
  std::string name;
  std::string transports;
  std::string devices;
};

inline std::string FabricName(const ::testing::TestParamInfo<Fabric>& info) {
  return info.param.name;
}

inline absl::Time In(absl::Duration d) { return absl::Now() + d; }

inline std::vector<uint8_t> Pattern(int64_t bytes, uint32_t seed) {
  std::vector<uint8_t> v(static_cast<size_t>(bytes));
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

// Runs each function in its own thread and joins them all.
inline void RunConcurrently(const std::vector<std::function<void()>>& fns) {
  std::vector<std::thread> threads;
  threads.reserve(fns.size());
  for (const auto& fn : fns) threads.emplace_back(fn);
  for (auto& t : threads) t.join();
}

// Drives `t`'s progress for `d` (a WaitAll on a receive nobody sends), so that messages already
// sent to it reach its unexpected queue and a receive posted next completes inside the post.
inline void Drain(Transport& t, int32_t peer, absl::Duration d) {
  uint8_t byte = 0;
  auto id = t.PostReceive(peer, MakeTag(0xfffff, 0xfffff, peer), &byte, 1);
  ASSERT_TRUE(id.ok()) << id.status();
  // Unavailable when the transport learns meanwhile that `peer` failed.
  EXPECT_THAT(t.WaitAll({*id}, In(d)).code(), ::testing::AnyOf(absl::StatusCode::kDeadlineExceeded,
                                                               absl::StatusCode::kUnavailable));
}

class UcxTest : public ::testing::TestWithParam<Fabric> {
 protected:
  UcxOptions Options(int32_t process) const {
    UcxOptions o;
    o.process = process;
    o.transports = GetParam().transports;
    o.net_devices = GetParam().devices;
    o.drain_timeout = absl::Seconds(1);
    return o;
  }

  // `n` connected transports, processes 0..n-1.
  std::vector<std::unique_ptr<UcxTransport>> MakeJob(int32_t n) {
    std::vector<std::unique_ptr<UcxTransport>> job;
    std::vector<std::string> addresses;
    for (int32_t p = 0; p < n; ++p) {
      absl::StatusOr<std::unique_ptr<UcxTransport>> t = UcxTransport::Create(Options(p));
      EXPECT_TRUE(t.ok()) << t.status();
      if (!t.ok()) return {};
      addresses.push_back((*t)->WorkerAddress());
      job.push_back(std::move(*t));
    }
    for (auto& t : job) {
      absl::Status s = t->ConnectPeers(addresses);
      EXPECT_TRUE(s.ok()) << s;
    }
    return job;
  }
};

}  // namespace wsync::test

#endif  // WSYNC_TESTS_UNIT_UCX_TEST_FIXTURE_H_
