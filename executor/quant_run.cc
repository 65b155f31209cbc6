#include "executor/quant_run.h"

#include <algorithm>
#include <utility>

#include "common/cpu_time.h"
#include "common/status.h"
#include "executor/quant_device.h"

namespace wsync::executor_internal {

QuantSteps::QuantSteps(const Job& job, const QuantWork& quant, const LocalBuffers& buffers,
                       const ExecuteOptions& options, bool on_device, bool& device_pending,
                       TransferStats& stats, std::function<void()> between_bands)
    : job_(job),
      quant_(quant),
      buffers_(buffers),
      options_(options),
      on_device_(on_device),
      device_pending_(device_pending),
      stats_(stats),
      scaled_(quant.sends.size(), false),
      between_bands_(std::move(between_bands)) {}

void QuantSteps::SetMemory(char* staging, char* arena, ArenaCache* arenas, size_t report_slot) {
  staging_ = staging;
  arena_ = arena;
  arenas_ = arenas;
  report_slot_ = report_slot;
}

absl::Status QuantSteps::Run(absl::Span<const SendQuantCall> calls, bool counted) {
  if (calls.empty()) return absl::OkStatus();
  for (const SendQuantCall& call : calls) {  // What the staging must hold.
    const int64_t fp8_end = call.fp8 - staging_ + Volume(call.step->blocks);
    const int64_t scale_end =
        call.scales - staging_ + Volume(call.step->scale_box) * static_cast<int64_t>(sizeof(float));
    stats_.quant_staging_written_bytes =
        std::max({stats_.quant_staging_written_bytes, fp8_end, scale_end});
  }
  const double start = ThreadCpuSeconds();
  absl::Status status;
  if (options_.simulated_quantize) {  // A simulated process: the quantize step's time only.
    int64_t input_bytes = 0;
    for (const SendQuantCall& call : calls) input_bytes += QuantizeInputBytes(job_, *call.step);
    status = options_.simulated_quantize(input_bytes);
  } else if (on_device_) {   // The device's FP8 kernels.
    device_pending_ = true;  // A failed wait leaves them to the failure path's.
    status = QuantizeSendsOnDevice(job_, calls, buffers_, *options_.device, *arenas_, report_slot_,
                                   options_.deadline);
  } else {
    status = QuantizeSends(job_, calls, buffers_, between_bands_);
  }
  stats_.quantize_cpu_seconds += ThreadCpuSeconds() - start;
  if (!status.ok() || !counted) return status;
  for (const SendQuantCall& call : calls) stats_.quantized_elements += Volume(call.step->blocks);
  return absl::OkStatus();
}

absl::Status QuantSteps::BeforeRounds(const std::function<absl::Status(int32_t segment)>& copy) {
  const QuantStagingLayout& layout = quant_.layout;
  for (size_t i = 0; i < quant_.sends.size(); ++i) {
    if (layout.steps[i].lane >= 0) continue;
    const StagedQuantStep& staged = quant_.sends[i];
    const SendQuantCall call{&staged.step, staging_ + layout.transient,
                             staging_ + layout.steps[i].scales};
    WSYNC_RETURN_IF_ERROR(Run({&call, 1}, /*counted=*/true));
    scaled_[i] = true;
    WSYNC_RETURN_IF_ERROR(copy(staged.fp8_segment));
    WSYNC_RETURN_IF_ERROR(copy(staged.scale_segment));
  }
  return absl::OkStatus();
}

absl::Status QuantSteps::BeforeMessages(absl::Span<const int32_t> lanes,
                                        absl::Span<const LaneState> states) {
  const QuantStagingLayout& layout = quant_.layout;
  if (layout.births.empty() && layout.scale_needs.empty()) return absl::OkStatus();
  std::vector<SendQuantCall> born, scales_only;
  for (int32_t lane : lanes) {
    const auto at = std::make_pair(lane, states[lane].posted);
    if (auto it = layout.births.find(at); it != layout.births.end()) {
      for (int32_t i : it->second) {  // Scales computed before go to the scratch.
        const int64_t scales = scaled_[i] ? layout.scale_scratch : layout.steps[i].scales;
        born.push_back({&quant_.sends[i].step, staging_ + layout.steps[i].fp8, staging_ + scales});
        scaled_[i] = true;
      }
    }
  }
  for (int32_t lane : lanes) {
    const auto at = std::make_pair(lane, states[lane].posted);
    if (auto it = layout.scale_needs.find(at); it != layout.scale_needs.end()) {
      for (int32_t i : it->second) {  // The e4m3 output is dropped.
        if (scaled_[i]) continue;
        scales_only.push_back({&quant_.sends[i].step, staging_ + layout.transient,
                               staging_ + layout.steps[i].scales});
        scaled_[i] = true;
      }
    }
  }
  WSYNC_RETURN_IF_ERROR(Run(born, /*counted=*/true));
  return Run(scales_only, /*counted=*/false);
}

absl::Status QuantSteps::QuantizeWhole(std::vector<char>& whole) {
  whole.clear();
  if (quant_.sends.empty() || on_device_) return absl::OkStatus();
  whole.assign(static_cast<size_t>(quant_.staging_bytes), 0);
  if (options_.simulated_quantize) return absl::OkStatus();
  std::vector<SendQuantCall> calls;
  for (const StagedQuantStep& staged : quant_.sends) {
    calls.push_back(
        {&staged.step, whole.data() + staged.fp8_offset, whole.data() + staged.scale_offset});
  }
  const double start = ThreadCpuSeconds();
  const absl::Status status = QuantizeSends(job_, calls, buffers_, between_bands_);
  stats_.quantize_cpu_seconds += ThreadCpuSeconds() - start;
  return status;
}

absl::Status QuantSteps::AfterRounds() {
  if (quant_.receives.empty()) return absl::OkStatus();
  const double start = ThreadCpuSeconds();
  absl::Status status;
  if (options_.simulated_quantize) {
    int64_t input_bytes = 0;
    for (const QuantTransform& step : quant_.receives)
      input_bytes += QuantizeInputBytes(job_, step);
    status = options_.simulated_quantize(input_bytes);
  } else if (on_device_) {
    device_pending_ = true;
    status = QuantizeReceivedOnDevice(job_, quant_, buffers_, arena_, *options_.device, *arenas_,
                                      report_slot_, options_.deadline);
  } else {
    status = QuantizeReceived(job_, quant_, arena_, buffers_);
  }
  stats_.quantize_cpu_seconds += ThreadCpuSeconds() - start;
  if (!status.ok()) return status;
  for (const QuantTransform& step : quant_.receives)
    stats_.quantized_elements += Volume(step.blocks);
  return absl::OkStatus();
}

}  // namespace wsync::executor_internal
