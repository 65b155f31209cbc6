#include "executor/quant_device.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "quant/fp8_device_host.h"

namespace wsync::executor_internal {
namespace {

using quant::Fp8DeviceQuant;

// Axes of a step's region as the request's three (a 2-D step has one expert).
void SetAxes(const Dims& values, int64_t missing, int64_t (&out)[3]) {
  const size_t first = 3 - values.size();
  for (size_t axis = 0; axis < 3; ++axis) out[axis] = axis < first ? missing : values[axis - first];
}

// The request of `step` reading its blocks at (input, input_strides), without its outputs.
absl::StatusOr<Fp8DeviceQuant> StepRequest(const Job& job, const QuantTransform& step,
                                           const char* input, const Dims& input_strides) {
  const ParamInfo& source = job.source().params[job.SourceParamOf(step.param)];
  const ParamQuant& blocking = job.target().params[step.param].quant;
  Fp8DeviceQuant q;
  if (source.dtype == DType::kBFloat16) {
    q.input_type = quant::kFp8InputBf16;
  } else if (source.dtype == DType::kFloat32) {
    q.input_type = quant::kFp8InputFp32;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter ", job.target().params[step.param].name,
                     ": FP8 quantization takes bf16 or fp32 input, not ", DTypeName(source.dtype)));
  }
  q.input = input;
  int64_t extent[3];
  SetAxes(step.blocks.extent, 1, extent);
  q.experts = extent[0];
  q.rows = extent[1];
  q.cols = extent[2];
  SetAxes(input_strides, 0, q.input_strides);
  q.block_rows = blocking.block_rows;
  q.block_cols = blocking.block_cols;
  return q;
}

// The e4m3 output of the window `box` of `blocks` at (fp8, strides).
void SetOutput(const QuantTransform& step, const Box& box, char* fp8, const Dims& strides,
               Fp8DeviceQuant& q) {
  Dims origin(box.origin.size());
  for (size_t axis = 0; axis < origin.size(); ++axis) {
    origin[axis] = box.origin[axis] - step.blocks.origin[axis];
  }
  q.fp8 = reinterpret_cast<uint8_t*>(fp8);
  SetAxes(strides, 0, q.fp8_strides);
  SetAxes(origin, 0, q.window_origin);
  SetAxes(box.extent, 1, q.window_extent);
}

char* At(const LocalBuffers& buffers, const Endpoint& end, int64_t element_size) {
  return static_cast<char*>(buffers.at(end.buffer)) + end.offset * element_size;
}

}  // namespace

namespace {

// Launches `requests` (each of steps[i], without its report word) on `device`, waits for them and
// turns their report words into a status.
absl::Status LaunchAndReport(const Job& job, absl::Span<const QuantTransform* const> steps,
                             std::vector<Fp8DeviceQuant>& requests, DeviceMemory& device,
                             ArenaCache& arenas, size_t report_slot, absl::Time deadline) {
  if (requests.empty()) return absl::OkStatus();
  using Word = unsigned long long;  // NOLINT(runtime/int): the report word's type.
  const int64_t count = static_cast<int64_t>(requests.size());
  const int64_t report_bytes = count * static_cast<int64_t>(sizeof(Word));
  WSYNC_ASSIGN_OR_RETURN(char* device_words, arenas.GetDevice(device, report_slot, report_bytes));
  Word* reports = reinterpret_cast<Word*>(device_words);
  Word* host_reports = reinterpret_cast<Word*>(arenas.Get(report_slot, report_bytes));
  for (int64_t i = 0; i < count; ++i) {
    requests[i].report = reports + i;
    WSYNC_RETURN_IF_ERROR(
        device.QuantizeFp8Async(requests[i], job.target().params[steps[i]->param].name));
  }
  WSYNC_RETURN_IF_ERROR(
      device.CopyStridedAsync(host_reports, {1}, reports, {1}, {count}, sizeof(Word)));
  WSYNC_RETURN_IF_ERROR(device.Synchronize(deadline));
  for (int64_t i = 0; i < count; ++i) {
    WSYNC_RETURN_IF_ERROR(quant::Fp8ReportStatus(host_reports[i], requests[i],
                                                 job.target().params[steps[i]->param].name));
  }
  return absl::OkStatus();
}

int64_t SourceSize(const Job& job, const QuantTransform& step) {
  return DTypeSize(job.source().params[job.SourceParamOf(step.param)].dtype);
}

}  // namespace

absl::Status QuantizeSendsOnDevice(const Job& job, absl::Span<const SendQuantCall> calls,
                                   const LocalBuffers& buffers, DeviceMemory& device,
                                   ArenaCache& arenas, size_t report_slot, absl::Time deadline) {
  std::vector<const QuantTransform*> steps;
  std::vector<Fp8DeviceQuant> requests;
  for (const SendQuantCall& call : calls) {
    const QuantTransform& step = *call.step;
    WSYNC_ASSIGN_OR_RETURN(
        Fp8DeviceQuant q,
        StepRequest(job, step, At(buffers, step.from, SourceSize(job, step)), step.from.strides));
    SetOutput(step, step.blocks, call.fp8, RowMajorStrides(step.blocks.extent), q);
    q.scales = reinterpret_cast<float*>(call.scales);
    SetAxes(RowMajorStrides(step.scale_box.extent), 0, q.scale_strides);
    steps.push_back(&step);
    requests.push_back(q);
  }
  return LaunchAndReport(job, steps, requests, device, arenas, report_slot, deadline);
}

absl::Status QuantizeReceivedOnDevice(const Job& job, const QuantWork& quant,
                                      const LocalBuffers& buffers, const char* arena,
                                      DeviceMemory& device, ArenaCache& arenas, size_t report_slot,
                                      absl::Time deadline) {
  std::vector<const QuantTransform*> steps;
  std::vector<Fp8DeviceQuant> requests;
  for (const QuantTransform& step : quant.receives) {
    WSYNC_ASSIGN_OR_RETURN(Fp8DeviceQuant q,
                           StepRequest(job, step, arena + step.from.offset * SourceSize(job, step),
                                       step.from.strides));
    SetOutput(step, step.box, At(buffers, step.to, 1), step.to.strides, q);
    q.scales = reinterpret_cast<float*>(At(buffers, step.scale_to, sizeof(float)));
    SetAxes(step.scale_to.strides, 0, q.scale_strides);
    steps.push_back(&step);
    requests.push_back(q);
  }
  return LaunchAndReport(job, steps, requests, device, arenas, report_slot, deadline);
}

}  // namespace wsync::executor_internal
