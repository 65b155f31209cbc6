#ifndef WSYNC_TESTS_UNIT_QUANT_LOOPBACK_RUN_H_
#define WSYNC_TESTS_UNIT_QUANT_LOOPBACK_RUN_H_

// What the executor tests of quantized syncs share (quant_executor_test.cc,
// quant_device_executor_test.cc): every process of a job as a thread over a fresh loopback fabric,
// and the check of a NaN's refusal.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/execute.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/job.h"
#include "tests/testing/loopback_threads.h"
#include "transport/loopback/loopback.h"

namespace wsync::test {

using ProcessRun = std::function<absl::StatusOr<TransferStats>(int32_t, Transport&, Group&)>;

// run(p, transport, group) for every process p of `job`, each on its own thread
// (RunOnLoopbackThreads); the results by process (a process whose transport or group failed to
// connect has that error).
inline std::vector<absl::StatusOr<TransferStats>> RunOnLoopback(const Job& job,
                                                                const ProcessRun& run) {
  return RunOnLoopbackThreads<absl::StatusOr<TransferStats>>(
      job.num_processes(),
      [&](int32_t p, std::unique_ptr<Transport> transport, Group& group) {
        return run(p, *transport, group);
      });
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
