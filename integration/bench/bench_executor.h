#ifndef WSYNC_INTEGRATION_BENCH_BENCH_EXECUTOR_H_
#define WSYNC_INTEGRATION_BENCH_BENCH_EXECUTOR_H_

// `wsync-bench executor`: runs a model's resharding on the in-process loopback transport (threads
// stand in for processes, host memory) and measures the executor's pack and unpack throughput
// against memcpy of the same bytes, side by side in one run; then the FP8 quantization of the
// model's weights (bench_quant.h) against memcpy.

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "executor/schedule.h"
#include "plugin/settings.h"

namespace wsync::bench {

// Everything `wsync-bench executor` runs with (flags.cc fills it; these are the flags' defaults).
struct ExecutorBenchOptions {
  std::string model = "llama-3-8b";
  int32_t layers = 2;  // Keep only the first N transformer layers.
  // One scenario from `from` to `to` when either is set (the other then megatron(tp=2) or
  // vllm(tp=2)); both empty: tp=2 -> tp=2, 4 -> 2 and 2 -> 4.
  std::string from;
  std::string to;
  std::string policy = std::string(kDefaultReplicaPolicy);
  double budget = static_cast<double>(kDefaultStagingBudgetBytes);  // Per peer direction.
  int32_t repeats = 5;                                              // Syncs per scenario.
  bool one_core = true;  // Pin every thread to the core the benchmark starts on.
};

// Text describing `wsync-bench executor`'s flags, for `wsync-bench help`.
std::string ExecutorBenchUsage();

// Runs the benchmark, printing to `out`. Fails when a layout, plan or sync fails.
absl::Status RunExecutorBench(const ExecutorBenchOptions& options, std::FILE* out);

}  // namespace wsync::bench

#endif  // WSYNC_INTEGRATION_BENCH_BENCH_EXECUTOR_H_
