// ConnectedJob's sync step (runtime.h): the trigger, the roster update and CUDA collective, the
// agreement and transfer, the caller's check and the commit vote.

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "control/loss_watch.h"
#include "executor/agreement.h"
#include "executor/delta_run.h"
#include "plugin/runtime.h"
#include "plugin/runtime_log.h"

namespace wsync {

absl::StatusOr<int64_t> ConnectedJob::Trigger(std::optional<int64_t> own_version,
                                              absl::Time deadline) {
  const std::string mine = own_version ? absl::StrCat(*own_version) : "";
  WSYNC_ASSIGN_OR_RETURN(std::string trigger, client_->Broadcast(0, mine, deadline));
  int64_t version = 0;
  if (!absl::SimpleAtoi(trigger, &version)) {
    return absl::DataLossError("trainer rank 0 sent an unreadable version");
  }
  return version;
}

absl::Status ConnectedJob::PrepareStep(bool* cuda_collective_failed) {
  absl::Status outcome;
  // A replacement process took a lost one's rank. Without CUDA buffers every process moves to
  // fresh UCX workers: the lost process may have died inside a send into a survivor's
  // shared-memory receive FIFO, which then never delivers again (transport/ucx/README.md). With
  // them, each process reaches the replacement at its new addresses and meets its first CUDA
  // collective.
  bool cuda_collective = cuda_collective_pending_;
  bool renew_workers = workers_renewal_pending_;
  if (std::optional<Roster> update = client_->TakeRosterUpdate()) {
    if (cuda_job_) {
      std::vector<std::string> bundles;
      for (const RosterEntry& entry : update->processes) bundles.push_back(entry.address);
      if (transport_ != nullptr) outcome = PathTransportSetup::Reconnect(*transport_, bundles);
      cuda_collective = true;
    } else {
      renew_workers = true;
    }
  }
  if (renew_workers) outcome = RenewWorkers(absl::Now() + config_.deadline);
  // Every process runs it here or none does (see cuda_collective_pending_); a failure fails this
  // step (after the collective, so that the numbering stays the same everywhere).
  if (cuda_collective) {
    absl::Status formed = RunCudaCollective(absl::Now() + config_.deadline);
    *cuda_collective_failed = !formed.ok();
    if (outcome.ok()) outcome = formed;
  }
  return outcome;
}

StepResult ConnectedJob::RunStep(const StepOptions& step) {
  StepResult result;
  SyncProgress* const progress = config_.progress;
  if (progress != nullptr) progress->Begin(step.version);
  LogStepStart(who_, step.version);
  bool cuda_collective_failed = false;
  result.outcome = PrepareStep(&cuda_collective_failed);
  if (result.outcome.ok()) result.outcome = step.rejection;
  if (step.on_phase) step.on_phase(StepPhase::kTransfer);
  // The transfer, after agreeing on digest and budget. It and the decision share one deadline
  // (plus kDecisionGrace for the decision), so a failed step ends within D + 1 s of its start.
  const absl::Time sync_deadline = absl::Now() + config_.deadline;
  SyncRequest sync;
  sync.sync_id = static_cast<uint64_t>(step.version);
  sync.plan_digest = plan_.digest;
  sync.deadline = sync_deadline;
  sync.verify = config_.verify;
  sync.rejected_messages = &result.rejected_messages;
  // delta=auto: on where the calibration says it pays (every process derives the same rule from
  // the same calibration; the agreement compares it), decided per lane at the agreed changed
  // fraction (executor/delta_run.h).
  const bool automatic = config_.delta == DeltaMode::kAuto;
  sync.delta.on = config_.delta == DeltaMode::kOn || (automatic && !delta_pays_below_.empty());
  sync.delta.automatic = automatic;
  if (automatic) sync.delta.pays_below = delta_pays_below_;
  sync.delta.observed = delta_observed_;
  if (sync.delta.on && delta_bases_ == nullptr) {
    delta_bases_ = std::make_unique<DeltaBaseStore>(config_.delta_budget_bytes);
  }
  sync.delta.bases = delta_bases_.get();
  sync.delta.held_version = delta_held_;
  // A local failure votes no before the peers are told (execute.h), so that the decision names
  // this process's reason.
  std::optional<absl::Status> early_decision;
  sync.before_notices = [&](const absl::Status& failure) {
    if (progress != nullptr) progress->SetPhase(SyncPhase::kVoting);
    early_decision = client_->Decide(false, failure.message(), sync_deadline + kDecisionGrace);
  };
  sync.after_wave = step.after_wave;
  sync.transport = step.transport;  // A test's or benchmark's, for this step only.
  if (result.outcome.ok() && executor_ == nullptr) {
    result.outcome = absl::FailedPreconditionError("this process has no transport");
  }
  if (result.outcome.ok()) {
    // A process lost meanwhile (the coordinator's notice, within a round trip of its connection
    // ending) fails this process's requests with it at once (NCCL: the communicator is aborted
    // and re-formed by the next step), so the step fails now naming it, not at the deadline.
    LossWatch watch(*client_, [this](int32_t process, const absl::Status& reason) {
      absl::MutexLock lock(&transport_mu_);
      if (transport_ != nullptr) transport_->PeerLost(process, reason);
    });
    // FP8 targets, host or device (executor/quant_work.h), in wave 0; the waves in order.
    result.stats = executor_->Run(sync);
    result.outcome = result.stats.status();
  } else {
    // Take part in the agreement with the rejection, so that the other processes fail at once
    // naming it instead of waiting for this one's transfers until their deadline.
    AgreeOnBatch(*client_, result.outcome, plan_.digest, config_.staging_budget_bytes,
                 static_cast<int32_t>(sync.verify), sync.deadline,
                 executor_internal::DeltaClaimOf(sync.delta))
        .IgnoreError();
  }
  if (step.on_phase) step.on_phase(StepPhase::kTransferred);
  if (result.outcome.ok() && step.check) result.outcome = step.check();
  if (progress != nullptr) progress->SetPhase(SyncPhase::kVoting);
  if (step.on_phase) step.on_phase(StepPhase::kDecide);
  if (step.pause_before_decide > absl::ZeroDuration()) absl::SleepFor(step.pause_before_decide);
  if (step.on_phase) step.on_phase(StepPhase::kVote);
  // The commit decision: every process votes; a failure anywhere fails everyone.
  const absl::Time decide_deadline = sync_deadline + kDecisionGrace + step.check_time;
  result.decision = early_decision ? *early_decision
                                   : client_->Decide(result.outcome.ok(), result.outcome.message(),
                                                     decide_deadline);
  // What this step sent becomes the bases of its version only when every process committed it.
  const bool committed = result.status().ok();
  if (delta_bases_ != nullptr && committed) delta_bases_->Commit(sync.sync_id);
  if (committed && result.stats.ok()) {
    const TransferStats& s = *result.stats;
    if (s.delta_compared_elements > 0) {
      delta_observed_ = DeltaObservation{s.delta_changed_elements, s.delta_compared_elements};
    }
    if (s.delta_announced_sent_bytes > 0 && s.delta_changed_elements > 0) {
      const double wire = static_cast<double>(s.delta_announced_wire_bytes) /
                          static_cast<double>(s.delta_announced_sent_bytes);
      delta_encoded_per_changed_ = wire * static_cast<double>(s.delta_compared_elements) /
                                   static_cast<double>(s.delta_changed_elements);
    }
    delta_changed_fraction_ = result.stats->delta_changed_fraction;
  }
  if (delta_bases_ != nullptr && !committed) delta_bases_->Abort();
  delta_held_.reset();
  if (committed && sync.delta.on && !job_->IsSource(process_)) delta_held_ = sync.sync_id;
  if (progress != nullptr) progress->End(result.status().ok());
  LogStepEnd(who_, step.version, result);
  cuda_collective_pending_ =
      cuda_deferred_.has_value() ||
      (!result.status().ok() && (!nccl_pairs_.empty() || cuda_collective_failed));
  return result;
}

absl::Status ConnectedJob::RunCudaCollective(absl::Time deadline) {
  if (cuda_deferred_) {
    WSYNC_ASSIGN_OR_RETURN(CudaConnection cuda,
                           ConnectCuda(*job_, nccl_pairs_, process_, config_.cuda_device,
                                       *cuda_deferred_, *client_, deadline, config_.nccl_api));
    cuda_deferred_.reset();
    if (cuda.device != nullptr) {
      executor_.reset();  // Its arenas of an earlier device go first.
      device_ = std::move(cuda.device);
      BuildExecutor();
    }
    return cuda.nccl == nullptr ? absl::OkStatus() : ReplaceNcclBackend(std::move(cuda.nccl));
  }
  WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<Transport> nccl,
                         ReformNccl(*job_, nccl_pairs_, process_, config_.cuda_device, *client_,
                                    deadline, config_.nccl_api));
  if (nccl == nullptr) return absl::OkStatus();  // Not a member.
  return ReplaceNcclBackend(std::move(nccl));
}

absl::Status ConnectedJob::ReplaceNcclBackend(std::unique_ptr<Transport> nccl) {
  absl::MutexLock lock(&transport_mu_);  // Abort must not run while the backend is swapped.
  for (int32_t b = 0; transport_ != nullptr && transport_->backend(b) != nullptr; ++b) {
    if (transport_->backend(b)->name() != "nccl") continue;
    transport_->backend(b)->Abort(absl::AbortedError("the NCCL communicator was re-formed"));
    return transport_->ReplaceBackend(b, std::move(nccl));
  }
  return absl::InternalError("this process has no NCCL backend to re-form");
}

absl::Status ConnectedJob::RenewWorkers(absl::Time deadline) {
  absl::StatusOr<PathTransportSetup> setup =
      PathTransportSetup::Create(process_, config_.path_transports);
  // Every process contributes, an empty bundle when its workers did not start, so that the
  // collective numbering stays in step; every process then sees the same gathered bundles.
  absl::StatusOr<std::vector<std::string>> bundles =
      client_->AllGather(setup.ok() ? setup->address_bundle() : std::string(), deadline);
  workers_renewal_pending_ = !bundles.ok();
  WSYNC_RETURN_IF_ERROR(bundles.status());
  for (int32_t p = 0; p < static_cast<int32_t>(bundles->size()); ++p) {
    if (!(*bundles)[p].empty()) continue;
    workers_renewal_pending_ = true;  // Everyone tries again at the next step.
    if (p == process_) return setup.status();
    return absl::UnavailableError(absl::StrCat("process ", p, " could not start new UCX workers"));
  }
  if (transport_ == nullptr) return absl::FailedPreconditionError("no transport to renew");
  WSYNC_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Transport>> fresh,
                         std::move(*setup).ConnectFreshWorkers(*transport_, *bundles));
  // The old workers go after the lock is released (their teardown drains for a while).
  std::vector<std::unique_ptr<Transport>> old;
  absl::MutexLock lock(&transport_mu_);  // Abort and PeerLost must not meet a swap.
  for (int32_t b = 0; b < static_cast<int32_t>(fresh.size()); ++b) {
    WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<Transport> replaced,
                           transport_->SwapBackend(b, std::move(fresh[b])));
    old.push_back(std::move(replaced));
  }
  if (aborted_) transport_->Abort(*aborted_);
  LogWorkersRenewed(who_, static_cast<int32_t>(fresh.size()));
  return absl::OkStatus();
}

void ConnectedJob::Abort(const absl::Status& reason) {
  absl::MutexLock lock(&transport_mu_);
  if (!aborted_) aborted_ = reason;
  if (client_ != nullptr) client_->Abort(reason);
  if (transport_ != nullptr) transport_->Abort(reason);
}

std::pair<absl::Duration, absl::Duration> ConnectedJob::Heartbeats() const {
  return {client_->heartbeat_interval(), client_->silence_limit()};
}

}  // namespace wsync
