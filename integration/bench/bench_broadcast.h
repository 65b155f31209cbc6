#ifndef WSYNC_INTEGRATION_BENCH_BENCH_BROADCAST_H_
#define WSYNC_INTEGRATION_BENCH_BENCH_BROADCAST_H_

// The broadcast contestants of `wsync-bench compare`: the layout spec that
// integration/bench/broadcast_sync.py reads, and one run of its processes (one per trainer and
// rollout rank, torch.distributed over gloo on loopback).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "planner/layout.h"

namespace wsync::bench {

// "trainer P" for P < trainers, else "rollout P - trainers".
std::string ProcessName(int32_t process, int32_t trainers);

// The spec broadcast_sync.py reads, as JSON: the parameters in the trainer layout's order, and
// per process its buffers and pieces (parameter index, box, buffer offset and strides in
// elements). Unimplemented when the parameters have more than one element size, InvalidArgument
// when a rollout parameter has no trainer parameter of its name and shape.
absl::StatusOr<std::string> LayoutSpecJson(const std::string& model_name, const Layout& trainers,
                                           const Layout& rollouts);

struct BroadcastRun {
  std::vector<double> seconds;  // Per timed sync: the slowest process.
  std::vector<int64_t> peak_rss_bytes;
  std::string buckets_line;  // Rank 0's "BUCKETS count=N largest_bytes=B".
};

// How to run broadcast_sync.py.
struct BroadcastOptions {
  std::string python;   // A Python with torch.
  std::string scripts;  // The folder of broadcast_sync.py.
  std::string mode;     // "param" or "bucket".
  int64_t bucket_bytes = 0;
  absl::Duration timeout;  // Of the whole run (and each process's own --timeout_s).
};

// Runs warmup + syncs broadcasts of the layouts in the spec file `spec_path` with one process
// per rank. Fails when a process fails or is killed, a rollout did not verify every version, or
// not every timed sync reported its seconds.
absl::StatusOr<BroadcastRun> RunBroadcast(const BroadcastOptions& options,
                                          const std::string& spec_path, int32_t trainers,
                                          int32_t rollouts, int32_t warmup, int32_t syncs);

}  // namespace wsync::bench

#endif  // WSYNC_INTEGRATION_BENCH_BENCH_BROADCAST_H_
