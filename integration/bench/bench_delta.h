#ifndef WSYNC_INTEGRATION_BENCH_BENCH_DELTA_H_
#define WSYNC_INTEGRATION_BENCH_BENCH_DELTA_H_

// `wsync-bench delta` (issue 44's benchmark scenario): the sync of a realistic update with the
// library's delta setting off (dense), on and auto. Trainers of wsync_host (libwsync.so through
// its C ABI) hold fp32 masters initialised as the Qwen2 family initialises them and take one AdamW
// step per version on random gradients (wsync_host --update adamw, integration/host/
// adamw_update.h), writing the bf16 casts into their buffers; each job runs S consecutive
// versions, the first dense for every mode (it primes the senders' bases), the others timed.
// Rows per learning rate (1e-6): dense and on over UCX TCP on loopback, dense, on and auto over UCX
// shared memory, and (root) dense and on across a veth between two network namespaces shaped by
// tc, trainers in one and rollouts in the other; every round runs each row's job once, in turn.
// Before the rounds, one job per verification learning rate (1e-6 and 1e-5) with delta=on and the
// library's verify=hash (every chunk's xxh3 compared between sender and receiver after the
// receiver patched it), which also gives the bytes each version sent at that rate.

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "integration/bench/bench_jobs.h"

namespace wsync::bench {

// Everything `wsync-bench delta` runs with (flags.cc fills it from the flags; the defaults here
// are the flags' defaults).
struct DeltaBenchOptions {
  std::string model = "qwen2.5-0.5b";
  std::string from = "megatron(tp=2)";
  std::string to = "vllm(tp=2)";
  int32_t steps = 4;   // Versions per job: the first primes the bases (dense), the rest timed.
  int32_t rounds = 1;  // Jobs per row, the rows alternating.
  std::string lrs = "1e-6";    // AdamW learning rates of the timed rows, comma-separated.
  double weight_decay = 0.01;  // AdamW's decoupled weight decay (wsync_host --weight_decay).
  std::string links = "tcp,shm,netns";  // Which links' rows run (netns needs root).
  int32_t rate_mbit = 1000;             // The netns veth's rate (tc tbf).
  // Learning rates of the verified delta=on jobs before the rounds (their bytes sent per version
  // are printed too); empty: none.
  std::string verify_lrs = "1e-6,1e-5";
  bool verify_timed = false;  // verify=hash in the timed jobs too (checked; costs time).
  std::string shm_tls = "sm,cma,self";
  std::string tcp_tls = "tcp";
  std::string tcp_devices = "lo";
  JobOptions job;
};

// Text describing `wsync-bench delta`'s flags, for `wsync-bench help`.
std::string DeltaBenchUsage();

// Runs the benchmark and prints its progress, table and goals to `out`. Fails when a job fails
// (a chunk digest that differs after patching included), a verified job checked fewer chunks than
// the schedule sends, a dense sync received other bytes than the schedule's, or a binary is
// missing. The netns rows are skipped, with the reason, where namespaces cannot be made.
absl::Status RunDeltaBench(const DeltaBenchOptions& options, std::FILE* out);

}  // namespace wsync::bench

#endif  // WSYNC_INTEGRATION_BENCH_BENCH_DELTA_H_
