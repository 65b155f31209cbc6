#ifndef WSYNC_INTEGRATION_BENCH_BENCH_RELAY_H_
#define WSYNC_INTEGRATION_BENCH_BENCH_RELAY_H_

// `wsync-bench relay`: trainers in one network namespace, rollouts (several DP replicas) in
// another, joined by a veth that tc shapes well below shared memory. Runs the same job with relay
// `never` and `auto` (alternating, real processes over UCX: TCP across the veth,
// shared memory inside the rollouts' namespace, every byte verified) and prints, per mode, the
// inter-node bytes the transports carried, the measured seconds per sync and the cost model's
// prediction, and the ratio of the two modes. Needs root (ip netns, tc). Refused for now
// (RunRelayBench returns Unimplemented at once): the jobs' processes are hosts of the C ABI, which
// has no relay setting, so the `never` side cannot run.

#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "integration/bench/bench_jobs.h"

namespace wsync::bench {

// Everything `wsync-bench relay` runs with (flags.cc fills it; these are the flags' defaults).
struct RelayBenchOptions {
  std::string model = "qwen2.5-tiny";
  std::string from = "megatron(tp=2)";  // The trainers' layout (namespace of node-a).
  std::string to = "vllm(tp=2,dp=2)";   // The rollouts' layout (namespace of node-b).
  int32_t rate_mbit = 100;              // tc's rate of the veth between the namespaces.
  // The shared-memory link the cost model assumes (SyntheticCalibration syntax).
  std::string intra_link = "intra_node=20us,2GB/s";
  int32_t syncs = 5;       // Timed syncs per job (after one warm-up sync).
  int32_t rounds = 2;      // Jobs per mode, the modes alternating.
  double timeout_s = 120;  // Limit of each job.
  JobOptions job;          // The binaries and the staging budget.
};

// Text describing `wsync-bench relay`'s flags, for `wsync-bench help`.
std::string RelayBenchUsage();

// Runs the benchmark, printing to `out`. Fails when namespaces or tc are unavailable, a job fails
// or a byte differs.
absl::Status RunRelayBench(const RelayBenchOptions& options, std::FILE* out);

}  // namespace wsync::bench

#endif  // WSYNC_INTEGRATION_BENCH_BENCH_RELAY_H_
