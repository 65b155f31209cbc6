#include "executor/waves.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "executor/agreement.h"

namespace wsync {
namespace {

// `failure` of the host's callback after `wave`, named as such; Aborted and DeadlineExceeded keep
// their codes (an abort or the deadline reached during the callback), anything else becomes
// InvalidArgument (the host refused the wave).
absl::Status CallbackFailure(int32_t wave, const absl::Status& failure) {
  const std::string message =
      absl::StrCat("the host's callback after wave ", wave, " failed: ", failure.message());
  if (absl::IsAborted(failure)) return absl::AbortedError(message);
  if (absl::IsDeadlineExceeded(failure)) return absl::DeadlineExceededError(message);
  return absl::InvalidArgumentError(message);
}

void AddStats(TransferStats& total, const TransferStats& wave) {
  total.segments += wave.segments;
  total.chunks += wave.chunks;
  total.rounds += wave.rounds;
  total.sent_bytes += wave.sent_bytes;
  total.received_bytes += wave.received_bytes;
  total.local_copy_bytes += wave.local_copy_bytes;
  total.direct_bytes += wave.direct_bytes;
  total.staged_bytes += wave.staged_bytes;
  total.forwarded_bytes += wave.forwarded_bytes;
  total.peak_arena_bytes = std::max(total.peak_arena_bytes, wave.peak_arena_bytes);
  total.seconds += wave.seconds;
  total.pack_cpu_seconds += wave.pack_cpu_seconds;
  total.unpack_cpu_seconds += wave.unpack_cpu_seconds;
  total.packed_ahead_messages += wave.packed_ahead_messages;
  total.verified_chunks += wave.verified_chunks;
  total.rejected_messages += wave.rejected_messages;
  total.quantized_elements += wave.quantized_elements;
  total.quantize_cpu_seconds += wave.quantize_cpu_seconds;
  total.quant_staging_bytes = std::max(total.quant_staging_bytes, wave.quant_staging_bytes);
  total.quant_staging_written_bytes =
      std::max(total.quant_staging_written_bytes, wave.quant_staging_written_bytes);
  total.delta_messages += wave.delta_messages;
  total.delta_saved_bytes += wave.delta_saved_bytes;
  for (int c = 0; c < kPathClassCount; ++c) {
    for (int d = 0; d < 2; ++d) total.delta_saved_by_path[c][d] += wave.delta_saved_by_path[c][d];
  }
  total.delta_compared_elements += wave.delta_compared_elements;
  total.delta_changed_elements += wave.delta_changed_elements;
  total.delta_announced_sent_bytes += wave.delta_announced_sent_bytes;
  total.delta_announced_wire_bytes += wave.delta_announced_wire_bytes;
  total.delta_encode_cpu_seconds += wave.delta_encode_cpu_seconds;
  total.delta_apply_cpu_seconds += wave.delta_apply_cpu_seconds;
  total.delta_changed_fraction = wave.delta_changed_fraction;
}

void AddSchedule(ProcessSchedule& total, ProcessSchedule wave, int64_t segment_offset) {
  for (PeerSchedule& peer : wave.peers) {
    for (ScheduledRound& round : peer.rounds) round.round += total.rounds;
    total.peers.push_back(std::move(peer));
  }
  for (LocalCopy& copy : wave.local_copies) {
    copy.segment += static_cast<int32_t>(segment_offset);
    total.local_copies.push_back(copy);
  }
  total.rounds += wave.rounds;
  total.segments += wave.segments;
  total.chunks += wave.chunks;
  total.sent_bytes += wave.sent_bytes;
  total.received_bytes += wave.received_bytes;
  total.local_copy_bytes += wave.local_copy_bytes;
  total.direct_bytes += wave.direct_bytes;
  total.staged_bytes += wave.staged_bytes;
  total.arena_bytes = std::max(total.arena_bytes, wave.arena_bytes);
  total.cuda_arena_bytes = std::max(total.cuda_arena_bytes, wave.cuda_arena_bytes);
  total.relay_stage1_bytes += wave.relay_stage1_bytes;
  total.forwarded_bytes += wave.forwarded_bytes;
  total.forwarded_received_bytes += wave.forwarded_received_bytes;
  total.relay_arena_bytes = std::max(total.relay_arena_bytes, wave.relay_arena_bytes);
  total.inter_node_bytes_saved += wave.inter_node_bytes_saved;
  total.quant_staging_bytes = std::max(total.quant_staging_bytes, wave.quant_staging_bytes);
  total.quant_staging_whole_bytes =
      std::max(total.quant_staging_whole_bytes, wave.quant_staging_whole_bytes);
  total.quant_arena_bytes = std::max(total.quant_arena_bytes, wave.quant_arena_bytes);
  total.quantized_elements += wave.quantized_elements;
}

}  // namespace

absl::StatusOr<TransferStats> ExecuteWaves(const Job& job, absl::Span<const Wave> waves,
                                           const QuantPlan& quant, const Endpoints& endpoints,
                                           const StagingBudget& budget, int32_t process,
                                           const LocalBuffers& buffers, Transport& transport,
                                           Group& group, const ExecuteOptions& options,
                                           const std::function<absl::Status(int32_t)>& after_wave) {
  static const QuantPlan kNoQuantization;
  TransferStats total;
  for (size_t w = 0; w < waves.size(); ++w) {
    const bool last = w + 1 == waves.size();
    ExecuteOptions wave_options = options;
    wave_options.wave = waves[w].wave;
    wave_options.quant = waves[w].wave == 0 ? &quant : &kNoQuantization;
    if (!last) wave_options.before_notices = nullptr;
    bool agreed = false;
    wave_options.agreed = &agreed;
    absl::StatusOr<TransferStats> stats =
        ExecuteTransfers(job, waves[w].segments, endpoints, budget, process, buffers, transport,
                         group, wave_options);
    if (agreed && options.agreed != nullptr) *options.agreed = true;
    absl::Status failure = stats.status();
    if (stats.ok()) {
      AddStats(total, *stats);
      if (after_wave) {
        absl::Status called = after_wave(waves[w].wave);
        if (!called.ok()) failure = CallbackFailure(waves[w].wave, called);
      }
    } else if (waves.size() > 1) {
      failure = absl::Status(failure.code(),
                             absl::StrCat("wave ", waves[w].wave, ": ", failure.message()));
    }
    if (failure.ok()) continue;
    // Every process failed in a failed agreement; after it, the next wave's agreement tells them.
    if (agreed && !last) {
      AgreeOnBatch(group, failure, options.plan_digest, budget.bytes,
                   static_cast<int32_t>(options.verify), options.deadline)
          .IgnoreError();
    }
    return failure;
  }
  return total;
}

absl::StatusOr<ProcessSchedule> ScheduleWaves(const Job& job, absl::Span<const Wave> waves,
                                              const QuantPlan& quant, const Endpoints& endpoints,
                                              const StagingBudget& budget, int32_t process) {
  static const QuantPlan kNoQuantization;
  ProcessSchedule total;
  total.process = process;
  int64_t segment_offset = 0;
  for (const Wave& wave : waves) {
    WSYNC_ASSIGN_OR_RETURN(
        ProcessSchedule schedule,
        ScheduleTransfers(job, wave.segments, wave.wave == 0 ? quant : kNoQuantization, endpoints,
                          budget, process));
    AddSchedule(total, std::move(schedule), segment_offset);
    segment_offset += static_cast<int64_t>(wave.segments.size());
  }
  return total;
}

}  // namespace wsync
