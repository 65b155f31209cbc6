#include "executor/waves.h"

#include <algorithm>
#include <utility>

#include "common/status.h"
#include "executor/executor.h"

namespace wsync {
namespace {

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
  Executor executor(job, waves, &quant, endpoints, budget, process, buffers, transport, group,
                    executor_internal::DepsOf(options), executor_internal::HooksOf(options));
  SyncRequest sync = executor_internal::SyncRequestOf(options);
  sync.after_wave = after_wave;
  return executor.Run(sync);
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
