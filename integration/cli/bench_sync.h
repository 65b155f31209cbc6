#ifndef WSYNC_INTEGRATION_CLI_BENCH_SYNC_H_
#define WSYNC_INTEGRATION_CLI_BENCH_SYNC_H_

// `wsync bench sync`: real multi-process syncs (a coordinator, trainer and rollout processes of
// wsync_test_worker, moving weights over UCX) over shared memory and over TCP, timed per sync and
// compared with `ucx_perftest` tag_bw between two processes at the largest message the schedule
// sends, the contestants alternating so that noise hits all of them.

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "planner/models.h"

namespace wsync::cli {

// What the schedule sends to the rollout processes (every process on one node, as the benchmark
// jobs run them), with the replica policy of --policy.
struct ScheduleFacts {
  int32_t trainers = 0;
  int32_t rollouts = 0;
  int64_t bytes_per_rollout = 0;  // The busiest rollout process's received bytes.
  int64_t bytes_total = 0;        // All rollout processes.
  int64_t largest_message = 0;
  bool largest_direct = false;
  int64_t messages = 0;  // Received by the busiest rollout process.
  int64_t direct_messages = 0;
  int32_t rounds = 0;          // The most rounds of any rollout process.
  int64_t median_message = 0;  // Bytes-weighted median message size of that process.
  // Bytes per sync of every sender -> receiver pair that carries any, largest first.
  std::vector<int64_t> pair_bytes;
  // Pairs carrying at least a quarter of the busiest pair's bytes: the sender/receiver pairs
  // that stream at the same time, as many as concurrent ucx_perftest pairs are fair to compare.
  int32_t busy_pairs = 0;
};

// Plans `model` from `from` to `to` and schedules it with a staging budget of `budget` bytes per
// peer direction. Fails when a layout, the plan or the schedule fails, or nothing is sent.
absl::StatusOr<ScheduleFacts> ScheduleFactsFor(const ModelSpec& model, const std::string& from,
                                               const std::string& to, double budget);

// ucx_perftest messages of `message_bytes` that carry two syncs' bytes to the busiest rollout
// process, at least 10.
int32_t PerftestIterations(const ScheduleFacts& facts, int64_t message_bytes);

// The UCX transports of a wsync job.
struct Transports {
  std::string name;     // "shm" or "tcp".
  std::string tls;      // UCX_TLS.
  std::string devices;  // UCX_NET_DEVICES; empty: UCX's default.
};

// One timed sync: the slowest process's figures.
struct SyncSample {
  double seconds = 0;  // Transfer (agreement excluded), slowest process.
  // Outside the transfer, per process (the largest of any process): building the work and the
  // agreement inside ExecuteTransfers, which includes waiting for the last process to arrive.
  double agree_seconds = 0;
  // The commit decision of the process that finished the transfer last: the collective's round
  // trip through the coordinator (the others also wait there for it).
  double decide_seconds = 0;
  double step_seconds = 0;    // ExecuteTransfers plus the decision, slowest process.
  int64_t rollout_bytes = 0;  // Received by the busiest rollout process.
  int64_t total_bytes = 0;    // Received by all rollout processes.
  // CPU time (user and system, every thread) of all processes during ExecuteTransfers: the
  // work the sync costs, which other load on the cores inflates far less than seconds.
  double cpu_seconds = 0;
  double cpu_user_seconds = 0;  // The user-space part of cpu_seconds (the rest is the kernel's).
};

// Runs one wsync job (coordinator, trainers and rollouts of `worker`, coordinator from `cli`)
// of warmup + syncs versions over `t`, with every rollout byte checked when `verify` and the
// executor's end-to-end chunk hashes (ExecuteOptions::verify) when `hashes`. Returns the
// timed syncs; fails when a process fails (a wrong byte included), or the received bytes or
// rounds differ from `facts`. Sets *peak_rss_bytes (when not null) to every process's peak
// resident set, by global process id. Every process and every step of the workers is bounded by
// `limit`. Uses --budget and --policy.
absl::StatusOr<std::vector<SyncSample>> RunWsync(const ScheduleFacts& facts,
                                                 const std::string& model, const std::string& from,
                                                 const std::string& to, const Transports& t,
                                                 int32_t warmup, int32_t syncs, bool verify,
                                                 bool hashes, const std::string& worker,
                                                 const std::string& cli, absl::Duration limit,
                                                 std::vector<int64_t>* peak_rss_bytes = nullptr);

// This program's path (/proc/self/exe); wsync_test_worker next to it or in its build tree (or
// --sync_worker), for the benchmarks that launch jobs; `name` looked up in PATH (or taken as is
// when it holds a '/').
absl::StatusOr<std::string> SelfPath();
absl::StatusOr<std::string> FindWorker(const std::string& self);
absl::StatusOr<std::string> FindInPath(const std::string& name);

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
