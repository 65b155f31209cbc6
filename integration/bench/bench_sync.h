#ifndef WSYNC_INTEGRATION_BENCH_BENCH_SYNC_H_
#define WSYNC_INTEGRATION_BENCH_BENCH_SYNC_H_

// `wsync-bench sync`: real multi-process syncs (a coordinator, trainer and rollout processes of
// wsync_host, libwsync.so through its C ABI, over UCX) over shared memory and over TCP, timed per
// sync and compared with `ucx_perftest` tag_bw between two processes at the largest message the
// schedule sends, the contestants alternating so that noise hits all of them; and the same sync
// into FP8 rollouts (quantized during the sync) against the sync into bf16, bytes on the wire and
// seconds.

#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "integration/bench/bench_jobs.h"

namespace wsync::bench {

// `wsync-bench sync --memory cuda`'s own settings (the model and the timed syncs are the sync
// benchmark's).
struct CudaSyncOptions {
  std::string from = "megatron(tp=1)";
  std::string to = "vllm(tp=1)";
  std::string path_transports;  // Empty: CUDA IPC within the node; "intra_node=nccl": NCCL.
  bool forked = false;          // Each process of the job a forked OS process, not a thread.
};

// Everything `wsync-bench sync` runs with (flags.cc fills it from the flags; the defaults here are
// the flags' defaults).
struct SyncBenchOptions {
  std::string model = "qwen2.5-0.5b";
  std::string from = "megatron(tp=2)";
  std::string to = "vllm(tp=2)";
  std::string memory = "host";  // "host" (UCX contestants) or "cuda" (RunCudaSyncBench).
  int32_t syncs = 5;            // Timed syncs per wsync job.
  int32_t warmup = 1;           // Untimed syncs before them.
  int32_t rounds = 4;           // Turns of every contestant.
  bool verify_first = true;     // One verification job per scenario and transport first.
  bool verify = false;          // Also wsync+verify and wsync+keyed contestants.
  std::string shm_tls = "sm,cma,self";
  std::string tcp_tls = "tcp";
  std::string tcp_devices = "lo";
  std::string perftest = "ucx_perftest";       // Searched in PATH unless it holds a '/'.
  int32_t perftest_iters = 0;                  // 0: two syncs' bytes to one rollout.
  int64_t perftest_size = 0;                   // 0: the schedule's largest message.
  bool perftest_concurrent = true;             // Also the concurrent pairs.
  int32_t perftest_pairs = 0;                  // 0: the schedule's busy pairs.
  std::string single_from = "megatron(tp=1)";  // The 1->1 contestant; empty: none.
  std::string single_to = "vllm(tp=1)";
  bool perftest_wsync_settings = true;  // ucx_perftest with wsync's UCX settings.
  // The FP8 scenario (issue 22): `quant_from` -> `quant_to` with quant=Q (QuantizedSpec) over
  // TCP, verified against the reference quantizer, then timed in the same rounds as the sync of the
  // same layouts into bf16 (the main scenario's row when its layouts are these, else a
  // "wsync bf16" contestant); prints both syncs' bytes on the wire and their ratios. Empty quant:
  // none. The default rollout is one vLLM rank: vllm(tp=2, quant=fp8_block) of qwen2.5-0.5b is
  // no layout vLLM serves (planner/named_quant.h), and megatron(tp=2) still cuts q/k/v/o blocks.
  std::string quant = "fp8_block";
  std::string quant_from = "megatron(tp=2)";
  std::string quant_to = "vllm(tp=1)";
  std::string json;  // Also write the table as JSON here; empty: no.
  JobOptions job;
  CudaSyncOptions cuda;
};

// Text describing `wsync-bench sync`'s flags, for `wsync-bench help`.
std::string SyncBenchUsage();

// Runs the benchmark and prints its progress and table to `out`; writes the table as JSON to
// options.json when set. Fails when a job or ucx_perftest fails, a verified byte differs, or a
// binary is missing. With memory "cuda" runs RunCudaSyncBench instead.
absl::Status RunSyncBench(const SyncBenchOptions& options, std::FILE* out);

// `wsync-bench sync --memory cuda` (bench_sync_cuda.cc): FailedPrecondition "no CUDA device" at
// once on a machine without a GPU, Unimplemented in a build without NCCL.
absl::Status RunCudaSyncBench(const SyncBenchOptions& options, std::FILE* out);
std::string CudaSyncBenchUsage();

}  // namespace wsync::bench

#endif  // WSYNC_INTEGRATION_BENCH_BENCH_SYNC_H_
