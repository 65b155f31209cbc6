#ifndef WSYNC_EXECUTOR_QUANT_RUN_H_
#define WSYNC_EXECUTOR_QUANT_RUN_H_

// Private to the executor: when a run (run.h) quantizes (quant_work.h). A sender quantizes each
// step it copies locally before the rounds (into the transient, copied at once), each step it
// sends when its lane prepares the step's first message (into the step's place in its lane's
// ring: QuantStagingLayout; in bands, moving the messages posted before between two bands), and
// the scales of a step that go out before its e4m3 blocks when they first go out; a receiver
// quantizes after the rounds. On the host by quant/fp8.h, on a CUDA
// process by its device (quant_device.h), in a simulated run by ExecuteOptions::simulated_quantize
// (the time of the input bytes only). Not thread-safe: the run's thread.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "executor/execute.h"
#include "executor/lane_state.h"
#include "executor/quant_work.h"
#include "planner/job.h"

namespace wsync::executor_internal {

class QuantSteps {
 public:
  // All references must outlive this. `device_pending` is set before every device launch (the
  // run's failure path waits for the device then). Quantizing adds to stats.quantized_elements
  // (each step's blocks once) and stats.quantize_cpu_seconds. `between_bands` (may be null) runs
  // between the bands of the host's quantize steps during the rounds (QuantizeSends): the run
  // moves the messages it posted there (Transport::ProgressInFlight), so that quantizing the next
  // message overlaps sending the one before.
  QuantSteps(const Job& job, const QuantWork& quant, const LocalBuffers& buffers,
             const ExecuteOptions& options, bool on_device, bool& device_pending,
             TransferStats& stats, std::function<void()> between_bands);

  // The staging (layout.bytes) and the arena (quant.arena_bytes), of the process's memory kind,
  // and, on a device, where the report words live (`arenas`, slot `report_slot`).
  void SetMemory(char* staging, char* arena, ArenaCache* arenas, size_t report_slot);

  // Before the rounds: quantizes each send copied locally into the transient and calls
  // copy(segment) for its e4m3 and scale segments before the next one.
  absl::Status BeforeRounds(const std::function<absl::Status(int32_t segment)>& copy);

  // Before the next message of each of `lanes` (index states[lane].posted) is packed or posted:
  // quantizes the sends born there and the scales those messages need. InvalidArgument naming the
  // parameter for a NaN or infinity.
  absl::Status BeforeMessages(absl::Span<const int32_t> lanes, absl::Span<const LaneState> states);

  // After the rounds: quantizes quant.receives from the arena into the targets.
  absl::Status AfterRounds();

  // Delta sync (delta_run.h) on a host process: quantizes every send at once into `whole`,
  // resized to the virtual staging (quant.staging_bytes; each step at its fp8_offset and
  // scale_offset), before the rounds, so that the sender compares what each chunk carries with its
  // base before it announces. The steps are quantized again, as the layout places them, when their
  // messages are due (the sends and `verify` read them there): the same bytes, the kernels being
  // deterministic. Adds to stats.quantize_cpu_seconds only. A simulated run fills `whole` with
  // zeros (it moves no real bytes); on a CUDA process, or without sends, `whole` is left empty
  // (device staging is not encoded: delta_run.h). InvalidArgument naming the parameter for a NaN or
  // infinity.
  absl::Status QuantizeWhole(std::vector<char>& whole);

  // The staging address of virtual staging byte `offset` (what a segment from kQuantStagingBuffer
  // addresses).
  char* StagingAddress(int64_t offset) const { return staging_ + quant_.layout.Physical(offset); }

 private:
  // Runs `calls` where this process quantizes; `counted` adds their blocks to the stats.
  absl::Status Run(absl::Span<const SendQuantCall> calls, bool counted);

  const Job& job_;
  const QuantWork& quant_;
  const LocalBuffers& buffers_;
  const ExecuteOptions& options_;
  const bool on_device_;
  bool& device_pending_;
  TransferStats& stats_;
  char* staging_ = nullptr;
  char* arena_ = nullptr;
  ArenaCache* arenas_ = nullptr;
  size_t report_slot_ = 0;
  std::vector<bool> scaled_;  // Per send: its scales are in their place.
  const std::function<void()> between_bands_;
};

}  // namespace wsync::executor_internal

#endif  // WSYNC_EXECUTOR_QUANT_RUN_H_
