#ifndef WSYNC_TESTS_UNIT_QUANT_LOOPBACK_RUN_H_
#define WSYNC_TESTS_UNIT_QUANT_LOOPBACK_RUN_H_

// What the executor tests of quantized syncs share (quant_executor_test.cc,
// quant_device_executor_test.cc): every process of a job as a thread over a fresh loopback fabric,
// and the check of a NaN's refusal.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/execute.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/job.h"
#include "transport/loopback/loopback.h"

namespace wsync::test {

using ProcessRun = std::function<absl::StatusOr<TransferStats>(int32_t, Transport&, Group&)>;

// run(p, transport, group) for every process p of `job`, each on its own thread; the results by
// process (a process whose transport or group failed to connect has that error).
inline std::vector<absl::StatusOr<TransferStats>> RunOnLoopback(const Job& job,
                                                                const ProcessRun& run) {
  LoopbackFabric fabric(job.num_processes());
  std::vector<absl::StatusOr<TransferStats>> results(job.num_processes(),
                                                     absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int32_t p = 0; p < job.num_processes(); ++p) {
    threads.emplace_back([&, p] {
      absl::StatusOr<std::unique_ptr<Transport>> transport = fabric.Connect(p);
      absl::StatusOr<std::unique_ptr<Group>> group = fabric.MakeGroup(p);
      if (!transport.ok() || !group.ok()) {
        results[p] = transport.ok() ? group.status() : transport.status();
        return;
      }
      results[p] = run(p, **transport, **group);
    });
  }
  for (std::thread& thread : threads) thread.join();
  return results;
}

// Each process of `quantizers` failed with InvalidArgument naming parameter "w", a NaN and
// `element` ("(e, r, c)" in the quantized region).
inline void ExpectNaNRefused(const std::vector<absl::StatusOr<TransferStats>>& results,
                             const std::vector<int32_t>& quantizers, const std::string& element) {
  for (int32_t p : quantizers) {
    ASSERT_FALSE(results[p].ok()) << p;
    EXPECT_EQ(results[p].status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(results[p].status().message()), ::testing::HasSubstr("parameter w"));
    EXPECT_THAT(std::string(results[p].status().message()),
                ::testing::HasSubstr("cannot quantize NaN at element " + element));
  }
}

}  // namespace wsync::test

#endif  // WSYNC_TESTS_UNIT_QUANT_LOOPBACK_RUN_H_
