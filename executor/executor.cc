#include "executor/executor.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "executor/agreement.h"
#include "executor/quant_work.h"
#include "executor/run.h"
#include "executor/work.h"
#include "planner/relay.h"

namespace wsync {
namespace {

using executor_internal::Work;

// Checks that every buffer the work touches on this process was handed over, and that a process
// holding CUDA memory was given a DeviceMemory.
absl::Status CheckBuffers(const Work& work, absl::Span<const Segment> segments,
                          const LocalBuffers& buffers, const ExecuteOptions& options) {
  if (work.relay_arena_kind == MemoryKind::kCuda && options.device == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        "process ", work.process,
        " holds CUDA buffers but was given no device memory (CUDA buffers need a build with NCCL "
        "and a CUDA device)"));
  }
  auto check = [&](const Endpoint& end) -> absl::Status {
    if (end.process != work.process || end.buffer == kRelayArenaBuffer ||
        end.buffer == kQuantArenaBuffer || end.buffer == kQuantStagingBuffer) {
      return absl::OkStatus();
    }
    if (!buffers.contains(end.buffer)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "process ", work.process, " was given no address for its buffer ", end.buffer));
    }
    return absl::OkStatus();
  };
  for (const Segment& s : segments) {
    if (s.from.process != work.process && s.to.process != work.process) continue;
    WSYNC_RETURN_IF_ERROR(check(s.from));
    WSYNC_RETURN_IF_ERROR(check(s.to));
  }
  return absl::OkStatus();
}

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

}  // namespace

Executor::Executor(const Job& job, absl::Span<const Wave> waves, const QuantPlan* quant,
                   const Endpoints& endpoints, const StagingBudget& budget, int32_t process,
                   const LocalBuffers& buffers, Transport& transport, Group& group,
                   const ExecutorDeps& deps, ExecutorHooks hooks)
    : job_(job),
      endpoints_(endpoints),
      budget_(budget),
      process_(process),
      buffers_(buffers),
      transport_(transport),
      group_(group),
      deps_(deps),
      hooks_(std::move(hooks)),
      arenas_(hooks_.arenas != nullptr ? hooks_.arenas : &own_arenas_) {
  static const QuantPlan kNoQuantization;
  waves_.reserve(waves.size());
  for (const Wave& wave : waves) {
    waves_.push_back(
        WaveSegments{wave.wave, wave.segments, wave.wave == 0 ? quant : &kNoQuantization});
  }
}

Executor::Executor(const Job& job, absl::Span<const Segment> segments, const QuantPlan* quant,
                   const Endpoints& endpoints, const StagingBudget& budget, int32_t process,
                   const LocalBuffers& buffers, Transport& transport, Group& group,
                   const ExecutorDeps& deps, ExecutorHooks hooks, int32_t wave)
    : Executor(job, absl::Span<const Wave>(), nullptr, endpoints, budget, process, buffers,
               transport, group, deps, std::move(hooks)) {
  waves_.push_back(WaveSegments{wave, segments, quant});
}

absl::StatusOr<TransferStats> Executor::Run(const SyncRequest& sync) {
  ExecuteOptions options;
  options.sync_id = sync.sync_id;
  options.plan_digest = sync.plan_digest;
  options.deadline = sync.deadline;
  options.arenas = arenas_;
  options.verify = sync.verify;
  options.data_key = deps_.data_key;
  options.rejected_messages = sync.rejected_messages;
  options.device = deps_.device;
  options.now = hooks_.now;
  options.progress = deps_.progress;
  options.simulated_quantize = hooks_.simulated_quantize;
  options.delta = sync.delta;
  Transport& transport = sync.transport != nullptr ? *sync.transport : transport_;
  TransferStats total;
  for (size_t w = 0; w < waves_.size(); ++w) {
    const WaveSegments& wave = waves_[w];
    const bool last = w + 1 == waves_.size();
    options.wave = wave.wave;
    options.quant = wave.quant;
    options.before_notices = last ? sync.before_notices : nullptr;
    bool agreed = false;
    options.agreed = &agreed;
    absl::StatusOr<TransferStats> stats = RunWave(wave.segments, transport, options);
    if (agreed && sync.agreed != nullptr) *sync.agreed = true;
    absl::Status failure = stats.status();
    if (stats.ok()) {
      AddStats(total, *stats);
      if (sync.after_wave) {
        absl::Status called = sync.after_wave(wave.wave);
        if (!called.ok()) failure = CallbackFailure(wave.wave, called);
      }
    } else if (waves_.size() > 1) {
      failure =
          absl::Status(failure.code(), absl::StrCat("wave ", wave.wave, ": ", failure.message()));
    }
    if (failure.ok()) continue;
    // Every process failed in a failed agreement; after it, the next wave's agreement tells them.
    if (agreed && !last) {
      AgreeOnBatch(group_, failure, sync.plan_digest, budget_.bytes,
                   static_cast<int32_t>(sync.verify), sync.deadline)
          .IgnoreError();
    }
    return failure;
  }
  return total;
}

absl::StatusOr<TransferStats> Executor::RunWave(absl::Span<const Segment> segments,
                                                Transport& transport,
                                                const ExecuteOptions& options) {
  absl::Status local = executor_internal::CheckQuantRun(
      job_, options.quant, process_, options.device, options.simulated_quantize != nullptr);
  absl::StatusOr<executor_internal::QuantWork> quant = executor_internal::QuantWork{};
  if (local.ok() && options.quant != nullptr) {
    quant = executor_internal::BuildQuantWork(job_, segments, *options.quant, process_);
    local = quant.status();
  }
  // The segments that run: the plan's, plus the quantization steps' (quant_work.h).
  const absl::Span<const Segment> all = quant.ok() && job_.HasQuantizedParams()
                                            ? absl::Span<const Segment>(quant->segments)
                                            : segments;
  absl::StatusOr<Work> work = absl::FailedPreconditionError("not built");
  if (local.ok()) {
    work = executor_internal::BuildWorkWithQuant(job_, segments, *quant, endpoints_, budget_,
                                                 process_);
    local = work.status();
  }
  if (local.ok()) local = CheckBuffers(*work, all, buffers_, options);
  if (local.ok() && options.verify == VerifyMode::kKeyed && options.data_key == nullptr) {
    local = absl::FailedPreconditionError("verify: keyed verification without a data key");
  }
  executor_internal::DeltaAgreed agreed;
  WSYNC_RETURN_IF_ERROR(AgreeOnBatch(group_, local, options.plan_digest, budget_.bytes,
                                     static_cast<int32_t>(options.verify), options.deadline,
                                     executor_internal::DeltaClaimOf(options.delta),
                                     &agreed.held_versions, &agreed.changed_fraction));
  if (options.agreed != nullptr) *options.agreed = true;
  WSYNC_ASSIGN_OR_RETURN(TransferStats stats,
                         executor_internal::RunWork(job_, all, *work, *quant, buffers_, transport,
                                                    options, std::move(agreed)));
  stats.segments = work->segments;
  return stats;
}

namespace executor_internal {

ExecutorDeps DepsOf(const ExecuteOptions& options) {
  return ExecutorDeps{options.device, options.data_key, options.progress};
}

ExecutorHooks HooksOf(const ExecuteOptions& options) {
  return ExecutorHooks{options.now, options.simulated_quantize, options.arenas};
}

SyncRequest SyncRequestOf(const ExecuteOptions& options) {
  SyncRequest sync;
  sync.sync_id = options.sync_id;
  sync.plan_digest = options.plan_digest;
  sync.deadline = options.deadline;
  sync.verify = options.verify;
  sync.delta = options.delta;
  sync.before_notices = options.before_notices;
  sync.rejected_messages = options.rejected_messages;
  sync.agreed = options.agreed;
  return sync;
}

}  // namespace executor_internal
}  // namespace wsync
