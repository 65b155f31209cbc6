#ifndef WSYNC_INTEGRATION_BENCH_BENCH_COMPARE_H_
#define WSYNC_INTEGRATION_BENCH_BENCH_COMPARE_H_

// `wsync-bench compare`: wsync against the weight-sync patterns in use today, side by side in one
// run on this machine. Per scenario (model, trainer layout, rollout layout; host memory), the
// contestants run in turn, several times:
//   wsync-shm, wsync-tcp  real wsync jobs (wsync_host: libwsync.so) over UCX shared memory and UCX
//   TCP; per-param             trainer rank 0 gathers each full parameter and broadcasts it to
//   every
//                         rollout process (torch.distributed, gloo over loopback TCP), each rollout
//                         keeps its slices (integration/bench/broadcast_sync.py --mode param);
//   bucketed              the same with whole parameters packed into buckets (--mode bucket);
// and the link limits: ucx_perftest tag_bw over shared memory and TCP at the schedule's message
// size, and memcpy of the bytes one rollout process must receive. The broadcast rollouts check
// every element they hold after every sync; wsync runs one verification job per transport first
// (bench_jobs.h: every chunk's hash, or with --verify_elements every element) and its timed jobs
// check the bytes and rounds each rollout received. A wrong byte fails the run.
//
// Default: qwen2.5-0.5b, megatron(tp=2) -> vllm(tp=2), 2 rounds (--compare_long: qwen2.5-0.5b and
// llama-3.2-1b, each to vllm(tp=2) and vllm(tp=1,dp=2)). Prints a table per scenario and writes
// compare.json and compare.png (python3-matplotlib) to --out (default bench-results/compare).

#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "integration/bench/bench_jobs.h"

#ifndef WSYNC_BENCH_SCRIPT_DIR
#define WSYNC_BENCH_SCRIPT_DIR "integration/bench"
#endif

namespace wsync::bench {

// Everything `wsync-bench compare` runs with (flags.cc fills it; these are the flags' defaults).
struct CompareBenchOptions {
  std::string models = "qwen2.5-0.5b";   // ','-separated.
  std::string froms = "megatron(tp=2)";  // ';'-separated.
  std::string tos = "vllm(tp=2)";        // ';'-separated.
  int32_t repeats = 2;                   // Rounds of every contestant.
  int32_t syncs = 3;                     // Timed syncs per contestant run.
  int32_t warmup = 1;                    // Untimed syncs before them.
  int64_t bucket_bytes = int64_t{1} << 30;
  std::string python = "/usr/bin/python3";  // With torch; searched in PATH unless it holds '/'.
  std::string scripts = WSYNC_BENCH_SCRIPT_DIR;  // Folder of broadcast_sync.py, plot_compare.py.
  double timeout_s = 600;                        // Each broadcast, ucx_perftest and memcpy run.
  bool plot = true;                              // Also compare.png.
  std::string out_dir = "bench-results/compare";
  std::string shm_tls = "sm,cma,self";
  std::string tcp_tls = "tcp";
  std::string tcp_devices = "lo";
  std::string perftest = "ucx_perftest";
  std::string command;  // The command line, recorded in the JSON.
  JobOptions job;
};

// Text describing `wsync-bench compare`'s flags, for `wsync-bench help`.
std::string CompareBenchUsage();

// Runs the benchmark. Fails when a contestant fails or moves a wrong byte, a binary or script is
// missing, or the results cannot be written.
absl::Status RunCompareBench(const CompareBenchOptions& options, std::FILE* out);

// `wsync-bench memcpy` (the benchmark's own child): copies `bytes` between two buffers touched
// beforehand, the source filled with `pattern`, checks the copy, prints "MEMCPY seconds=S
// bytes=N". InvalidArgument unless bytes > 0.
absl::Status RunMemcpyProbe(int64_t bytes, int32_t pattern, std::FILE* out);

}  // namespace wsync::bench

#endif  // WSYNC_INTEGRATION_BENCH_BENCH_COMPARE_H_
