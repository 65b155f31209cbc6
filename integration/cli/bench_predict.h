#ifndef WSYNC_INTEGRATION_CLI_BENCH_PREDICT_H_
#define WSYNC_INTEGRATION_CLI_BENCH_PREDICT_H_

// `wsync bench predict`: is the cost model right? For each scenario (layouts, process counts,
// shared memory, TCP, two "nodes" on one machine, two network namespaces joined by a tc-shaped
// veth link) it calibrates the scenario's processes (calibrate_job.h), predicts the sync with the
// link model (plugin/prediction.h), runs the sync as real processes (wsync_test_worker over UCX),
// and prints predicted against measured seconds with the relative error, their median and
// maximum, and the first_holder / cost_aware ratios (measured alternating) on the replicated
// scenarios (shared memory; DP replica 0 across the shaped link from replica 1 and the rollouts).

#include <cstdio>
#include <string>

#include "absl/status/status.h"

namespace wsync::cli {

std::string PredictBenchUsage();

// Runs the benchmark (flags already parsed) and prints progress and the table to `out`. Fails when
// a calibration or a job fails or a binary is missing; a scenario that needs network namespaces
// is skipped (and said so) where they cannot be made.
absl::Status RunPredictBench(std::FILE* out);

}  // namespace wsync::cli

#endif  // WSYNC_INTEGRATION_CLI_BENCH_PREDICT_H_
