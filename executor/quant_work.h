#ifndef WSYNC_EXECUTOR_QUANT_WORK_H_
#define WSYNC_EXECUTOR_QUANT_WORK_H_

// Private to the executor: what one process runs of a plan's quantization steps (issue 22;
// planner/quant_plan.h), on host memory, as segments the rounds move plus quantize steps before,
// during (quant_run.h) and after them.
//
// - Sender side (QuantSide::kSender): the sender quantizes the step's whole blocks from its
//   source piece into its quantization staging (buffer kQuantStagingBuffer) and two segments carry
//   them like any other: the e4m3 elements of `box` (the target parameter, 1 byte each) from the
//   staging to `to`, and the scales of `scale_box` (the scale parameter, 4 bytes each) to
//   `scale_to`. The segments address a virtual staging (per step the e4m3 bytes row-major over
//   `blocks`, then the fp32 scales row-major over `scale_box`, each region 64-byte aligned, steps
//   in plan order) that every process computes alike; only the sender reads it, through
//   QuantStagingLayout, which places it in far less memory (below).
// - Receiver side (kReceiver): the plan's gathers are segments into the receiver's quantization
//   arena (kQuantArenaBuffer, elements of the source dtype, regions as planned); after its rounds
//   (and the chunk verification) the receiver quantizes each step's blocks there and writes the
//   e4m3 elements of `box` and the scales: straight into the target when `box` is the whole
//   `blocks`, else through a scratch buffer of the blocks.
// The schedule and the run both use QuantWork::segments, so the schedule counts the quantized
// bytes on the wire; the staging and the arena are reported apart (ProcessSchedule) and in
// arena_bytes, outside the per-peer staging budget (the planner sizes the arena).
//
// The sender's staging (QuantStagingLayout, LayOutQuantStaging) holds at once:
// - the scales of every step it quantizes (resident for the run: 4 bytes per block);
// - per send lane, a ring of the e4m3 blocks of the steps that lane sends: a step is quantized
//   when the lane prepares the first message carrying its e4m3 bytes, and its region is reused
//   once the message after its last one is prepared (a lane's messages before the one it prepares
//   minus one have completed, with either lane driver, so nothing reads the region any more). A
//   lane's steps live in lane order (their e4m3 bytes are contiguous in it), so the ring of
//   capacity live + largest never overlaps a live step, where live is the most e4m3 blocks of the
//   steps alive at once: those whose e4m3 bytes travel in the message being prepared or the one
//   before it. A ring takes min(that capacity, all of its steps) bytes;
// - a transient region (the largest step that needs it; none in the named layouts, whose scale
//   parameters are named after their weights: parameters are ordered by name): steps the sender
//   also receives (copied before the rounds, one at a time) and steps whose scales may go out
//   before their e4m3 bytes (scales first in the lane or on another lane), whose scales are
//   computed when first sent, the e4m3 output dropped, with a scratch for the second computation.
// Bound: staging <= scales + transient + scratch + sum over send lanes of
// min(all its steps, 3 x its largest step + W x (e4m3 bytes of two consecutive messages)), where
// W is the most a step's blocks exceed its box (1 for block-aligned pieces) and a message carries
// at most budget/2 bytes (or one row of a piece, when larger). A single step is never split: a
// step larger than the budget is held whole while its bytes are sent.
// On a CUDA process the staging and the arena are device memory and the steps run on the device
// (quant_device.h); every step a CUDA process quantizes must then read and write CUDA buffers only
// (CheckQuantRun).
// A simulated run (ExecuteOptions::simulated_quantize) quantizes nothing: its step takes the
// time the simulation gives it for the step's input bytes.
// Not thread-safe; pure but for the memory QuantizeSends / QuantizeReceived write.

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "executor/execute.h"
#include "executor/work.h"
#include "planner/job.h"
#include "planner/plan.h"

namespace wsync::executor_internal {

// A sender-side step this process quantizes, with where its output lies in the virtual staging
// (what its segments address) and which of QuantWork::segments carry it.
struct StagedQuantStep {
  QuantTransform step;
  int64_t fp8_offset = 0;    // Bytes into the virtual staging: e4m3 row-major over step.blocks.
  int64_t scale_offset = 0;  // Bytes into the virtual staging: fp32 row-major over scale_box.
  int32_t fp8_segment = -1;  // Indices into QuantWork::segments.
  int32_t scale_segment = -1;
};

// Where the sender's staging really lies and when each step is quantized (LayOutQuantStaging).
struct QuantStagingLayout {
  struct Placement {     // Of QuantWork::sends[i].
    int32_t lane = -1;   // The send lane carrying its e4m3 bytes; -1: copied locally.
    int32_t birth = 0;   // The message of `lane` at whose preparation it is quantized.
    int64_t fp8 = 0;     // Bytes into the staging: its e4m3 blocks (the transient if local).
    int64_t scales = 0;  // Bytes into the staging: its scales.
  };
  std::vector<Placement> steps;  // Parallel to QuantWork::sends.
  // Per (lane, message index): the sends quantized when it is prepared, and those whose scales it
  // carries while their e4m3 blocks may not be quantized yet.
  absl::flat_hash_map<std::pair<int32_t, int32_t>, std::vector<int32_t>> births;
  absl::flat_hash_map<std::pair<int32_t, int32_t>, std::vector<int32_t>> scale_needs;
  int64_t transient = 0;      // Bytes into the staging: e4m3 output copied locally or dropped.
  int64_t scale_scratch = 0;  // Bytes into the staging: scales computed a second time.
  int64_t bytes = 0;          // Of the staging: what the run allocates.
  // Virtual staging ranges of this process's sends, ascending: [begin, end) bytes.
  struct Range {
    int64_t begin = 0;
    int64_t end = 0;
    int64_t physical = 0;  // Where `begin` lies in the staging.
  };
  std::vector<Range> ranges;
  // Bytes into the staging of virtual staging byte `offset` (inside one of `ranges`).
  int64_t Physical(int64_t offset) const;
};

struct QuantWork {
  // The plan's segments followed by the quantization segments of this process (sender-side e4m3
  // and scale segments it sends or receives, gathers it sends or receives), or empty for a job
  // without quantized parameters (then the plan's segments are used as given).
  std::vector<Segment> segments;
  std::vector<StagedQuantStep> sends;    // Sender-side steps this process quantizes.
  std::vector<QuantTransform> receives;  // Receiver-side steps this process quantizes.
  int64_t staging_bytes = 0;             // Of the virtual staging: every send at once.
  QuantStagingLayout layout;             // Set by BuildWorkWithQuant.
  int64_t arena_bytes = 0;               // Of kQuantArenaBuffer on this process.
  int64_t quantized_elements = 0;        // Volume of the blocks of sends and receives.
};

// The element size of segment `s`'s elements on the wire: the source dtype's for a gather into a
// quantization arena, else the target parameter's.
int64_t SegmentElementSize(const Job& job, const Segment& s);

// Whether a run of `job` can quantize on `process`: Ok without quantized parameters;
// FailedPrecondition when the job has some and `quant` is null (the caller must pass Plan::quant:
// the segments alone would leave the FP8 weights unwritten); Unimplemented when a step of `quant`
// is quantized by a CUDA process (memory_kinds.h) from or into a host buffer of it (the device
// kernels read and write device memory only), or when `process` quantizes on its device and
// `device` is null or has no FP8 kernel; Ok for those when `simulated` (the run's
// ExecuteOptions::simulated_quantize is set). Every process of the job computes the same verdict on
// the steps it knows, so the agreement refuses the batch everywhere.
absl::Status CheckQuantRun(const Job& job, const QuantPlan* quant, int32_t process,
                           const DeviceMemory* device, bool simulated);

// Bytes of source-dtype input quantizing `step` reads: its blocks at the source parameter's
// element size.
int64_t QuantizeInputBytes(const Job& job, const QuantTransform& step);

// The QuantWork of `process` for `segments` and `quant` (a plan's, whole or the process's own:
// staging offsets are computed over the steps `quant` lists, so a receiver's view of a sender's
// staging offsets may differ from the sender's; only the sender reads them). InvalidArgument for
// a step that is not host-runnable (a parameter of rank other than 2 or 3).
absl::StatusOr<QuantWork> BuildQuantWork(const Job& job, absl::Span<const Segment> segments,
                                         const QuantPlan& quant, int32_t process);

// BuildWork over quant.segments (or `segments` when it is empty), then quant.layout
// (LayOutQuantStaging), with the staging's and the arena's sizes in the work.
absl::StatusOr<Work> BuildWorkWithQuant(const Job& job, absl::Span<const Segment> segments,
                                        QuantWork& quant, const Endpoints& endpoints,
                                        const StagingBudget& budget, int32_t process);

// The staging layout of quant.sends over `work`'s send lanes (the header states it). Internal if a
// ring would overlap a live step (a broken invariant).
absl::StatusOr<QuantStagingLayout> LayOutQuantStaging(const Work& work, const QuantWork& quant);

// One sender-side quantization: `step`'s whole blocks from the process's source piece into `fp8`
// (row-major over step->blocks) and `scales` (row-major over step->scale_box).
struct SendQuantCall {
  const QuantTransform* step = nullptr;
  char* fp8 = nullptr;
  char* scales = nullptr;
};

// About how many bytes of input QuantizeSends quantizes between two calls of its `between_bands`.
inline constexpr int64_t kQuantizeBandInputBytes = int64_t{1} << 20;

// Runs `calls` on host memory in order. Each step is quantized in bands along its first axis
// (whole experts of a rank-3 step, whole block rows of a rank-2 one; a step whose one block spans
// every row is one band) of at most band_input_bytes of input (or one expert or block row), calling
// `between_bands` (when set) between two bands and between two steps: each block is computed alone,
// so the bytes equal those of one call over the whole step. InvalidArgument naming the parameter
// for a NaN or infinity (the bands before it are written).
absl::Status QuantizeSends(const Job& job, absl::Span<const SendQuantCall> calls,
                           const LocalBuffers& buffers,
                           const std::function<void()>& between_bands = nullptr,
                           int64_t band_input_bytes = kQuantizeBandInputBytes);

// Quantizes every step of quant.receives from `arena` (quant.arena_bytes, every gather landed)
// into this process's target buffers. InvalidArgument naming the parameter for a NaN or
// infinity.
absl::Status QuantizeReceived(const Job& job, const QuantWork& quant, const char* arena,
                              const LocalBuffers& buffers);

}  // namespace wsync::executor_internal

#endif  // WSYNC_EXECUTOR_QUANT_WORK_H_
