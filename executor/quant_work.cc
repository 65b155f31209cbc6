#include "executor/quant_work.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "executor/copy.h"
#include "executor/memory_kinds.h"
#include "quant/fp8.h"

namespace wsync::executor_internal {
namespace {

int64_t AlignUp(int64_t bytes) {
  return (bytes + kQuantArenaAlignment - 1) / kQuantArenaAlignment * kQuantArenaAlignment;
}

int64_t SourceElementSize(const Job& job, int32_t target_param) {
  return DTypeSize(job.source().params[job.SourceParamOf(target_param)].dtype);
}

// The two segments that carry a sender-side step's output from the staging; their indices into
// `out` go to `staged`.
void AppendSentSegments(StagedQuantStep& staged, std::vector<Segment>& out) {
  const QuantTransform& step = staged.step;
  const Dims fp8_strides = RowMajorStrides(step.blocks.extent);
  Segment fp8;
  fp8.param = step.param;
  fp8.box = step.box;
  fp8.from =
      Endpoint{step.from.process, kQuantStagingBuffer,
               SubRegionOffset(step.blocks, staged.fp8_offset, fp8_strides, step.box), fp8_strides};
  fp8.to = step.to;
  staged.fp8_segment = static_cast<int32_t>(out.size());
  out.push_back(std::move(fp8));
  Segment scales;
  scales.param = step.scale_param;
  scales.box = step.scale_box;
  scales.from = Endpoint{step.from.process, kQuantStagingBuffer,
                         staged.scale_offset / static_cast<int64_t>(sizeof(float)),
                         RowMajorStrides(step.scale_box.extent)};
  scales.to = step.scale_to;
  staged.scale_segment = static_cast<int32_t>(out.size());
  out.push_back(std::move(scales));
}

const char* Address(const LocalBuffers& buffers, const Endpoint& end, int64_t element_size) {
  return static_cast<const char*>(buffers.at(end.buffer)) + end.offset * element_size;
}

quant::Fp8Blocking BlockingOf(const Job& job, int32_t param) {
  const ParamQuant& q = job.target().params[param].quant;
  return quant::Fp8Blocking{q.block_rows, q.block_cols};
}

// Quantizes the whole blocks of target parameter `param` of extent `blocks` read at (input,
// input_strides) into `fp8` (strides fp8_strides) and their scales, of extent `scale_box`, into
// `scales` (strides scale_strides).
absl::Status QuantizeRegion(const Job& job, int32_t param, const void* input,
                            const Dims& input_strides, const Dims& blocks, void* fp8,
                            const Dims& fp8_strides, void* scales, const Dims& scale_strides,
                            const Dims& scale_box) {
  quant::ConstRegion in;
  quant::MutableRegion out, scale_out;
  WSYNC_RETURN_IF_ERROR(quant::MakeRegion(input, input_strides, blocks, in));
  WSYNC_RETURN_IF_ERROR(quant::MakeRegion(fp8, fp8_strides, blocks, out));
  WSYNC_RETURN_IF_ERROR(quant::MakeRegion(scales, scale_strides, scale_box, scale_out));
  const int32_t source_param = job.SourceParamOf(param);
  return quant::QuantizeFp8(BlockingOf(job, param), job.source().params[source_param].dtype, in,
                            out, scale_out, job.target().params[param].name);
}

// Quantizes `step`'s blocks read at (input, input_strides) into `fp8` (strides fp8_strides) and
// its scales into `scales` (strides scale_strides).
absl::Status QuantizeStep(const Job& job, const QuantTransform& step, const void* input,
                          const Dims& input_strides, void* fp8, const Dims& fp8_strides,
                          void* scales, const Dims& scale_strides) {
  return QuantizeRegion(job, step.param, input, input_strides, step.blocks.extent, fp8, fp8_strides,
                        scales, scale_strides, step.scale_box.extent);
}

// How QuantizeSends cuts a step along its first axis: `rows` (a multiple of rows_per_scale_row
// but for the last band) per band, and the first-axis elements one row of its scales covers.
struct QuantBands {
  int64_t rows = 1;
  int64_t rows_per_scale_row = 1;
};

QuantBands BandsOf(const Job& job, const QuantTransform& step, int64_t element_size,
                   int64_t band_input_bytes) {
  const Dims& extent = step.blocks.extent;
  int64_t unit = 1;  // First-axis elements quantized alone: an expert, or a block row.
  if (extent.size() == 2) {
    const int64_t block_rows = BlockingOf(job, step.param).rows;
    unit = block_rows >= extent[0] ? extent[0] : block_rows;
  }
  const int64_t unit_bytes =
      Volume(step.blocks) / std::max<int64_t>(extent[0], 1) * unit * element_size;
  const int64_t all_units = (std::max<int64_t>(extent[0], 1) + unit - 1) / unit;
  const int64_t units =
      std::clamp<int64_t>(band_input_bytes / std::max<int64_t>(unit_bytes, 1), 1, all_units);
  return QuantBands{units * unit, unit};
}

}  // namespace

int64_t SegmentElementSize(const Job& job, const Segment& s) {
  if (s.to.buffer == kQuantArenaBuffer) return SourceElementSize(job, s.param);
  return job.ElementSize(s.param);
}

absl::Status CheckQuantRun(const Job& job, const QuantPlan* quant, int32_t process,
                           const DeviceMemory* device, bool simulated) {
  if (!job.HasQuantizedParams()) return absl::OkStatus();
  if (quant == nullptr) {
    return absl::FailedPreconditionError(
        "the rollout layout has quantized (FP8) parameters but the run was given no quantization "
        "steps (ExecuteOptions::quant = &Plan::quant)");
  }
  if (simulated) return absl::OkStatus();  // Quantizes nothing: only the step's time.
  const JobMemoryKinds kinds(job);
  if (!kinds.any_cuda()) return absl::OkStatus();
  for (const QuantTransform& step : quant->transforms) {
    const bool sender = step.side == QuantSide::kSender;
    const int32_t quantizer = sender ? step.from.process : step.to.process;
    if (kinds.Process(quantizer) != MemoryKind::kCuda) continue;
    const absl::string_view name = job.target().params[step.param].name;
    const bool host_input =
        sender && kinds.Buffer(quantizer, step.from.buffer) == MemoryKind::kHost;
    const bool host_output =
        !sender && (kinds.Buffer(quantizer, step.to.buffer) == MemoryKind::kHost ||
                    kinds.Buffer(quantizer, step.scale_to.buffer) == MemoryKind::kHost);
    if (host_input || host_output) {
      return absl::UnimplementedError(absl::StrCat(
          "quantized parameter '", name, "': process ", quantizer,
          " holds CUDA buffers and would quantize ", host_input ? "from" : "into",
          " host memory; its FP8 steps run on the device, which reads and writes CUDA buffers "
          "only"));
    }
    if (quantizer == process && (device == nullptr || !device->HasFp8Kernel())) {
      return absl::UnimplementedError(absl::StrCat(
          "quantized parameter '", name, "': process ", process, " quantizes CUDA memory but ",
          device == nullptr ? "was given no device memory"
                            : "its device memory has no FP8 kernel (a build without nvcc)"));
    }
  }
  return absl::OkStatus();
}

int64_t QuantizeInputBytes(const Job& job, const QuantTransform& step) {
  return Volume(step.blocks) * SourceElementSize(job, step.param);
}

absl::StatusOr<QuantWork> BuildQuantWork(const Job& job, absl::Span<const Segment> segments,
                                         const QuantPlan& quant, int32_t process) {
  QuantWork work;
  if (!job.HasQuantizedParams()) return work;
  work.segments.assign(segments.begin(), segments.end());
  absl::flat_hash_map<int32_t, int64_t> staging;  // Bytes used per sender.
  for (const QuantTransform& step : quant.transforms) {
    if (step.blocks.rank() != 2 && step.blocks.rank() != 3) {
      return absl::InvalidArgumentError(
          absl::StrCat("quantized parameter '", job.target().params[step.param].name, "' has rank ",
                       step.blocks.rank(), "; FP8 steps take 2 or 3 axes"));
    }
    if (step.side == QuantSide::kReceiver) {
      if (step.to.process != process) continue;
      work.receives.push_back(step);
      work.arena_bytes = std::max(work.arena_bytes, (step.from.offset + Volume(step.blocks)) *
                                                        SourceElementSize(job, step.param));
      work.quantized_elements += Volume(step.blocks);
      continue;
    }
    int64_t& used = staging[step.from.process];
    StagedQuantStep staged{step, AlignUp(used), 0};
    staged.scale_offset = AlignUp(staged.fp8_offset + Volume(step.blocks));
    used = staged.scale_offset + Volume(step.scale_box) * static_cast<int64_t>(sizeof(float));
    if (step.from.process != process && step.to.process != process) continue;
    AppendSentSegments(staged, work.segments);
    if (step.from.process != process) continue;
    work.quantized_elements += Volume(step.blocks);
    work.sends.push_back(std::move(staged));
  }
  work.staging_bytes = staging.contains(process) ? staging[process] : 0;
  for (const Segment& gather : quant.gathers) {
    if (gather.from.process == process || gather.to.process == process) {
      work.segments.push_back(gather);
    }
  }
  return work;
}

absl::StatusOr<Work> BuildWorkWithQuant(const Job& job, absl::Span<const Segment> segments,
                                        QuantWork& quant, const Endpoints& endpoints,
                                        const StagingBudget& budget, int32_t process) {
  const bool quantized = job.HasQuantizedParams();
  WSYNC_ASSIGN_OR_RETURN(
      Work work, BuildWork(job, quantized ? absl::Span<const Segment>(quant.segments) : segments,
                           endpoints, budget, process));
  WSYNC_ASSIGN_OR_RETURN(quant.layout, LayOutQuantStaging(work, quant));
  work.quant_staging_bytes = quant.layout.bytes;
  work.quant_staging_whole_bytes = quant.staging_bytes;
  work.quant_arena_bytes = quant.arena_bytes;
  work.quantized_elements = quant.quantized_elements;
  return work;
}

absl::Status QuantizeSends(const Job& job, absl::Span<const SendQuantCall> calls,
                           const LocalBuffers& buffers, const std::function<void()>& between_bands,
                           int64_t band_input_bytes) {
  bool first = true;
  for (const SendQuantCall& call : calls) {
    const QuantTransform& step = *call.step;
    const int64_t element_size = SourceElementSize(job, step.param);
    const char* input = Address(buffers, step.from, element_size);
    const Dims fp8_strides = RowMajorStrides(step.blocks.extent);
    const Dims scale_strides = RowMajorStrides(step.scale_box.extent);
    const QuantBands bands = BandsOf(job, step, element_size, band_input_bytes);
    for (int64_t begin = 0; begin < step.blocks.extent[0]; begin += bands.rows) {
      if (!first && between_bands) between_bands();
      first = false;
      const int64_t rows = std::min(bands.rows, step.blocks.extent[0] - begin);
      const int64_t scale_begin = begin / bands.rows_per_scale_row;
      Dims blocks = step.blocks.extent;
      Dims scale_box = step.scale_box.extent;
      blocks[0] = rows;
      scale_box[0] = (rows + bands.rows_per_scale_row - 1) / bands.rows_per_scale_row;
      WSYNC_RETURN_IF_ERROR(QuantizeRegion(
          job, step.param, input + begin * step.from.strides[0] * element_size, step.from.strides,
          blocks, call.fp8 + begin * fp8_strides[0], fp8_strides,
          call.scales + scale_begin * scale_strides[0] * static_cast<int64_t>(sizeof(float)),
          scale_strides, scale_box));
    }
  }
  return absl::OkStatus();
}

absl::Status QuantizeReceived(const Job& job, const QuantWork& quant, const char* arena,
                              const LocalBuffers& buffers) {
  std::unique_ptr<uint8_t[]> scratch;
  int64_t scratch_bytes = 0;
  for (const QuantTransform& step : quant.receives) {
    const int64_t element_size = SourceElementSize(job, step.param);
    const char* input = arena + step.from.offset * element_size;
    void* scales = const_cast<char*>(Address(buffers, step.scale_to, sizeof(float)));
    void* target = const_cast<char*>(Address(buffers, step.to, 1));
    if (step.box == step.blocks) {  // Every quantized element is the piece's: write in place.
      WSYNC_RETURN_IF_ERROR(QuantizeStep(job, step, input, step.from.strides, target,
                                         step.to.strides, scales, step.scale_to.strides));
      continue;
    }
    const int64_t blocks_bytes = Volume(step.blocks);
    if (blocks_bytes > scratch_bytes) {
      scratch = std::make_unique_for_overwrite<uint8_t[]>(blocks_bytes);
      scratch_bytes = blocks_bytes;
    }
    const Dims packed = RowMajorStrides(step.blocks.extent);
    WSYNC_RETURN_IF_ERROR(QuantizeStep(job, step, input, step.from.strides, scratch.get(), packed,
                                       scales, step.scale_to.strides));
    CopyStrided(target, step.to.strides,
                scratch.get() + SubRegionOffset(step.blocks, 0, packed, step.box), packed,
                step.box.extent, 1);
  }
  return absl::OkStatus();
}

}  // namespace wsync::executor_internal
