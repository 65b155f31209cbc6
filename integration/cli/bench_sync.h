#ifndef WSYNC_INTEGRATION_CLI_BENCH_SYNC_H_
#define WSYNC_INTEGRATION_CLI_BENCH_SYNC_H_

// `wsync bench sync`: real multi-process syncs (a coordinator, trainer and rollout processes of
// wsync_test_worker, moving weights over UCX) over shared memory and over TCP, timed per sync and
// compared with `ucx_perftest` tag_bw between two processes at the largest message the schedule
// sends, the contestants alternating so that noise hits all of them.

#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace wsync::cli {

// Text describing `wsync bench sync`'s flags, for `wsync help`.
std::string SyncBenchUsage();

// The running binary (/proc/self/exe), and wsync_test_worker next to it or in the build tree
// (or --sync_worker): for benchmarks that launch jobs.
absl::StatusOr<std::string> SelfPath();
absl::StatusOr<std::string> FindWorker(const std::string& self);

// Runs the benchmark (flags already parsed) and prints its progress and table to `out`; writes
// the table as JSON to --sync_json when set. Fails when a job or ucx_perftest fails, a verified
// byte differs, or a binary is missing.
absl::Status RunSyncBench(std::FILE* out);

// This binary's path, and the wsync_test_worker binary (--sync_worker, else next to this binary
// or in its build tree); shared with `wsync bench predict`.
absl::StatusOr<std::string> BenchSelfPath();
absl::StatusOr<std::string> BenchWorkerPath(const std::string& self);

}  // namespace wsync::cli

#endif  // WSYNC_INTEGRATION_CLI_BENCH_SYNC_H_
