#ifndef WSYNC_TESTS_UNIT_LOOPBACK_TESTING_H_
#define WSYNC_TESTS_UNIT_LOOPBACK_TESTING_H_

// Helpers of the loopback fabric's tests (loopback_test.cc, loopback_group_test.cc): a transport
// or group of one process that must connect (a failure is reported to gtest, then nullptr).

#include <cstdint>
#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "transport/loopback/loopback.h"

namespace wsync::test {

inline absl::Time In(absl::Duration d) { return absl::Now() + d; }

inline std::unique_ptr<Transport> MustConnect(LoopbackFabric& fabric, int32_t p) {
  absl::StatusOr<std::unique_ptr<Transport>> t = fabric.Connect(p);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

inline std::unique_ptr<Group> MustGroup(LoopbackFabric& fabric, int32_t p) {
  absl::StatusOr<std::unique_ptr<Group>> g = fabric.MakeGroup(p);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? std::move(*g) : nullptr;
}

}  // namespace wsync::test

#endif  // WSYNC_TESTS_UNIT_LOOPBACK_TESTING_H_
