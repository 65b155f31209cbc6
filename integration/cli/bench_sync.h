#ifndef WSYNC_INTEGRATION_CLI_BENCH_SYNC_H_
#define WSYNC_INTEGRATION_CLI_BENCH_SYNC_H_

// `wsync bench sync`: real multi-process syncs (a coordinator, trainer and rollout processes of
// wsync_test_worker, moving weights over UCX) over shared memory and over TCP, timed per sync and
// compared with `ucx_perftest` tag_bw between two processes at the largest message the schedule
// sends, the contestants alternating so that noise hits all of them.

#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "integration/cli/bench_jobs.h"

namespace wsync::cli {

// Text describing `wsync bench sync`'s flags, for `wsync help`.
std::string SyncBenchUsage();

// Runs the benchmark (flags already parsed) and prints its progress and table to `out`; writes
// the table as JSON to --sync_json when set. Fails when a job or ucx_perftest fails, a verified
// byte differs, or a binary is missing. With --memory cuda runs RunCudaSyncBench instead.
absl::Status RunSyncBench(std::FILE* out);

// `wsync bench sync --memory cuda` (bench_sync_cuda.cc): FailedPrecondition "no CUDA device" at
// once on a machine without a GPU, Unimplemented in a build without NCCL.
absl::Status RunCudaSyncBench(std::FILE* out);
std::string CudaSyncBenchUsage();

}  // namespace wsync::cli

#endif  // WSYNC_INTEGRATION_CLI_BENCH_SYNC_H_
