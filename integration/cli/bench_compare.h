#ifndef WSYNC_INTEGRATION_CLI_BENCH_COMPARE_H_
#define WSYNC_INTEGRATION_CLI_BENCH_COMPARE_H_

// `wsync bench compare`: wsync against the weight-sync patterns in use today, side by side in one
// run on this machine. Per scenario (model, trainer layout, rollout layout; host memory), the
// contestants run in turn, several times:
//   wsync-shm, wsync-tcp  real wsync jobs (wsync_test_worker) over UCX shared memory and UCX TCP;
//   per-param             trainer rank 0 gathers each full parameter and broadcasts it to every
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
// llama-3.2-1b, each to vllm(tp=2) and vllm(tp=1,dp=2)). Prints a table per scenario and writes compare.json and
// compare.png (python3-matplotlib) to --out (default bench-results/compare).

#include <cstdio>
#include <string>

#include "absl/status/status.h"

namespace wsync::cli {

// Text describing `wsync bench compare`'s flags, for `wsync help`.
std::string CompareBenchUsage();

// Runs the benchmark (flags already parsed); `command` is the command line, recorded in the JSON.
// Fails when a contestant fails or moves a wrong byte, a binary or script is missing, or the
// results cannot be written.
absl::Status RunCompareBench(std::FILE* out, const std::string& command);

// `wsync bench memcpy` (the benchmark's own child): copies --compare_memcpy_bytes between two
// buffers touched beforehand, checks the copy, prints "MEMCPY seconds=S bytes=N".
absl::Status RunMemcpyProbe(std::FILE* out);

}  // namespace wsync::cli

#endif  // WSYNC_INTEGRATION_CLI_BENCH_COMPARE_H_
