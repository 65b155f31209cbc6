#ifndef WSYNC_INTEGRATION_SIMULATION_SIMULATE_SYNC_H_
#define WSYNC_INTEGRATION_SIMULATION_SIMULATE_SYNC_H_

// One sync of a whole job simulated on SimGrid: every process runs the product's executor
// (ExecuteTransfers: agreement, rounds, lanes, arenas, relays) as a SimGrid actor over the
// integration/simulation/simgrid backend, on a platform built in code; the sync time is the
// simulated time at which the last process finished. No weight byte exists: every buffer must be
// device memory (the executor then copies through VirtualDeviceMemory only), so a model of any size
// runs in the memory of its plan and schedule.
//
// Each simulation runs in a child process (SimGrid allows one engine per process lifetime; a
// crash of the simulation cannot take the caller with it). Call from a single-threaded program.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "executor/execute.h"
#include "executor/schedule.h"
#include "integration/simulation/simgrid/platform.h"
#include "integration/simulation/simgrid/simgrid_transport.h"
#include "planner/job.h"
#include "planner/plan.h"
#include "transport/transport.h"

namespace wsync::simulation {

struct SimulationOptions {
  const simgrid_backend::Platform* platform = nullptr;  // Required; caller-owned.
  // Device copies (packs, unpacks, local copies): bytes per simulated second, one copy stream
  // per process.
  double copy_bytes_per_second = 1.5e12;
  // Transport::NeedsRoundOrder of every process: true runs lockstep rounds, as over NCCL.
  bool needs_round_order = true;
  StagingBudget budget;
  // The plan's quantization steps (Plan::quant), caller-owned; required when the job has
  // quantized parameters. Each process's quantize step then occupies its device stream for its
  // input bytes / quantize_bytes_per_second (ExecutorHooks::simulated_quantize): nothing is
  // quantized, the FP8 bytes and scales travel as scheduled.
  const QuantPlan* quant = nullptr;
  double quantize_bytes_per_second = 0;  // Required (> 0) with `quant`.
  uint64_t plan_digest = 0;
  // Simulated time each process's run may take (ExecuteOptions::deadline); infinite by default,
  // SimGrid then ends a run that waits for a message nobody sends (a deadlock) with an error.
  absl::Duration deadline = absl::InfiniteDuration();
  // Keep every delivered message (SimulationResult::messages), for tests.
  bool record_messages = false;
  // SimGrid settings on top of the model's (CM02 without TCP factors, window or cross traffic),
  // each "key:value" as SimGrid's --cfg takes it, e.g. "network/optim:Full"; applied after the
  // model's, so a setting here overrides them. A bad one fails the simulation.
  std::vector<std::string> simgrid_config;
  // Tests: process p's transport is wrap_transport(p, the SimGrid transport) when set.
  std::function<std::unique_ptr<Transport>(int32_t process, Transport& inner)> wrap_transport;
};

struct ProcessOutcome {
  absl::Status status;        // Of ExecuteTransfers.
  double finish_seconds = 0;  // Simulated time at which it returned.
  TransferStats stats;        // When status is OK.
  int64_t device_copy_bytes = 0;
};

struct SimulationResult {
  double sync_seconds = 0;                                  // The latest finish over all processes.
  std::vector<ProcessOutcome> processes;                    // By global process id.
  std::vector<simgrid_backend::DeliveredMessage> messages;  // With record_messages.
  std::vector<int64_t> sent_bytes;                          // Delivered, by sender.
  std::vector<int64_t> received_bytes;                      // Delivered, by receiver.
  int64_t message_count = 0;
  double wall_seconds = 0;     // Of the simulation, start of the child to its end.
  int64_t peak_rss_bytes = 0;  // Of the child (its ru_maxrss).

  // The first failed process's error, naming it; OK when every process succeeded.
  absl::Status FirstFailure() const;
};

// Runs one sync of `segments` (a plan's segments) for every process of `job`. Errors: a job with
// a host-memory buffer (InvalidArgument, naming it), a platform that cannot be built, or a
// simulation that died (Internal, with its signal or exit code). A process that failed, or that
// never finished because SimGrid found the simulation deadlocked, has its error in `processes`.
absl::StatusOr<SimulationResult> SimulateSync(const Job& job, absl::Span<const Segment> segments,
                                              const SimulationOptions& options);

// `layout` with every buffer in device memory (kCuda), as GPU processes hold their weights.
Layout InDeviceMemory(Layout layout);

}  // namespace wsync::simulation

#endif  // WSYNC_INTEGRATION_SIMULATION_SIMULATE_SYNC_H_
