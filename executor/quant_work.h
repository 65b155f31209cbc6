#ifndef WSYNC_EXECUTOR_QUANT_WORK_H_
#define WSYNC_EXECUTOR_QUANT_WORK_H_

// Private to the executor: what one process runs of a plan's quantization steps (issue 22;
// planner/quant_plan.h), on host memory, as segments the rounds move plus a quantize step before
// and after them.
//
// - Sender side (QuantSide::kSender): before its rounds, the sender quantizes the step's whole
//   blocks from its source piece into its quantization staging (buffer kQuantStagingBuffer:
//   per step the e4m3 bytes row-major over `blocks`, then the fp32 scales row-major over
//   `scale_box`, each region 64-byte aligned, steps in plan order). Two segments carry them like
//   any other: the e4m3 elements of `box` (the target parameter, 1 byte each) from the staging
//   to `to`, and the scales of `scale_box` (the scale parameter, 4 bytes each) to `scale_to`.
//   Steps of the same blocks read from the same source region (one per rollout replica of the
//   target piece) are quantized and staged once; each still gets its two segments, all reading
//   that one staged output.
// - Receiver side (kReceiver): the plan's gathers are segments into the receiver's quantization
//   arena (kQuantArenaBuffer, elements of the source dtype, regions as planned); after its rounds
//   (and the chunk verification) the receiver quantizes each step's blocks there and writes the
//   e4m3 elements of `box` and the scales: straight into the target when `box` is the whole
//   `blocks`, else through a scratch buffer of the blocks.
// The schedule and the run both use QuantWork::segments, so the schedule counts the quantized
// bytes on the wire; the staging and the arena are reported apart (ProcessSchedule) and in
// arena_bytes, outside the per-peer staging budget (the planner sizes the arena).
// On a CUDA process the staging and the arena are device memory and the steps run on the device
// (quant_device.h); every step a CUDA process quantizes must then read and write CUDA buffers only
// (CheckQuantRun).
// A simulated run (ExecuteOptions::simulated_quantize) quantizes nothing: its step takes the
// time the simulation gives it for the step's input bytes.
// Not thread-safe; pure but for the memory QuantizeForSending / QuantizeReceived write.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "executor/execute.h"
#include "executor/work.h"
#include "planner/job.h"
#include "planner/plan.h"

namespace wsync::executor_internal {

// A sender-side step this process quantizes, with where its output lies in the staging.
struct StagedQuantStep {
  QuantTransform step;
  int64_t fp8_offset = 0;    // Bytes into the staging: e4m3 row-major over step.blocks.
  int64_t scale_offset = 0;  // Bytes into the staging: fp32 row-major over step.scale_box.
};

struct QuantWork {
  // The plan's segments followed by the quantization segments of this process (sender-side e4m3
  // and scale segments it sends or receives, gathers it sends or receives), or empty for a job
  // without quantized parameters (then the plan's segments are used as given).
  std::vector<Segment> segments;
  std::vector<StagedQuantStep> sends;    // Sender-side steps this process quantizes, once each.
  std::vector<QuantTransform> receives;  // Receiver-side steps this process quantizes.
  int64_t staging_bytes = 0;             // Of kQuantStagingBuffer on this process.
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

// Bytes of source-dtype input the quantize step reads: quant.sends' blocks (sending) or
// quant.receives' blocks, at the source parameter's element size.
int64_t QuantizeInputBytes(const Job& job, const QuantWork& quant, bool sending);

// The QuantWork of `process` for `segments` and `quant` (a plan's, whole or the process's own:
// staging offsets are computed over the steps `quant` lists, so a receiver's view of a sender's
// staging offsets may differ from the sender's; only the sender reads them). InvalidArgument for
// a step that is not host-runnable (a parameter of rank other than 2 or 3).
absl::StatusOr<QuantWork> BuildQuantWork(const Job& job, absl::Span<const Segment> segments,
                                         const QuantPlan& quant, int32_t process);

// BuildWork over quant.segments (or `segments` when it is empty), with the quantization staging
// and arena sizes of `quant`.
absl::StatusOr<Work> BuildWorkWithQuant(const Job& job, absl::Span<const Segment> segments,
                                        const QuantWork& quant, const Endpoints& endpoints,
                                        const StagingBudget& budget, int32_t process);

// Quantizes every step of quant.sends from this process's source buffers into `staging`
// (quant.staging_bytes). InvalidArgument naming the parameter for a NaN or infinity.
absl::Status QuantizeForSending(const Job& job, const QuantWork& quant, const LocalBuffers& buffers,
                                char* staging);

// Quantizes every step of quant.receives from `arena` (quant.arena_bytes, every gather landed)
// into this process's target buffers. InvalidArgument naming the parameter for a NaN or
// infinity.
absl::Status QuantizeReceived(const Job& job, const QuantWork& quant, const char* arena,
                              const LocalBuffers& buffers);

}  // namespace wsync::executor_internal

#endif  // WSYNC_EXECUTOR_QUANT_WORK_H_
