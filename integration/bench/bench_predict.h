#ifndef WSYNC_INTEGRATION_BENCH_BENCH_PREDICT_H_
#define WSYNC_INTEGRATION_BENCH_BENCH_PREDICT_H_

// `wsync-bench predict`: is the cost model right? For each scenario (layouts, process counts,
// shared memory, TCP, two "nodes" on one machine, two network namespaces joined by a tc-shaped
// veth link) it calibrates the scenario's processes (calibrate_job.h), predicts the sync with the
// link model (plugin/prediction.h), runs the sync as real processes (wsync_host over UCX),
// and prints predicted against measured seconds with the relative error, their median and
// maximum, and the first_holder / cost_aware ratios (measured alternating) on the replicated
// scenarios (shared memory; DP replica 0 across the shaped link from replica 1 and the rollouts).

#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "integration/bench/bench_jobs.h"

namespace wsync::bench {

// Everything `wsync-bench predict` runs with (flags.cc fills it; these are the flags' defaults).
struct PredictBenchOptions {
  std::string model = "qwen2.5-0.5b";
  // Scenario names, comma-separated, or "all"; empty: the six of the default run.
  std::string scenarios;
  int32_t rounds = 2;          // Each calibrates and measures every scenario once.
  int32_t syncs = 5;           // Timed syncs per measured job.
  int32_t warmup = 2;          // Untimed syncs before them.
  std::string rate = "2gbit";  // tc tbf rate of the veth between the two namespaces.
  std::string probe_sizes = "256K,1M,4M,16M,64M";  // Calibration message sizes.
  int32_t probe_repeats = 5;                       // Calibration repeats.
  double timeout_s = 300;                          // Limit of each child job.
  JobOptions job;  // The binaries and the staging budget (the policies are the scenario's).
};

// Text describing `wsync-bench predict`'s flags, for `wsync-bench help`.
std::string PredictBenchUsage();

// Runs the benchmark and prints progress and the table to `out`. Fails when a calibration or a
// job fails or a binary is missing; a scenario that needs network namespaces is skipped (and
// said so) where they cannot be made.
absl::Status RunPredictBench(const PredictBenchOptions& options, std::FILE* out);

}  // namespace wsync::bench

#endif  // WSYNC_INTEGRATION_BENCH_BENCH_PREDICT_H_
