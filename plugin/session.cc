#include "plugin/session.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/failpoint.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/status.h"
#include "control/auth.h"
#include "control/client.h"
#include "control/coordinator.h"
#include "executor/schedule.h"
#include "planner/policy.h"
#include "plugin/runtime.h"
#include "transport/selector/selector.h"

namespace wsync {
namespace {

// Trainer-triggered mode waits this long for the next trigger; every other wait uses the
// configured deadline.
constexpr absl::Duration kIdleTriggerWait = absl::Hours(24);

std::string HostName() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

}  // namespace

absl::string_view SessionStateName(SessionState state) {
  switch (state) {
    case SessionState::kRegistered:
      return "registered";
    case SessionState::kConnected:
      return "connected";
    case SessionState::kIdle:
      return "idle";
    case SessionState::kSyncing:
      return "syncing";
    case SessionState::kDirty:
      return "dirty";
    case SessionState::kFinalized:
      return "finalized";
  }
  return "invalid";
}

namespace {

// config, info: what a session starts with (never the secret).
void LogSessionConfig(const SessionConfig& c) {
  if (!log::Enabled(log::Category::kConfig, log::Level::kInfo)) return;
  const std::string coordinator =
      c.host_coordinator ? absl::StrCat("hosted on port ", c.coordinator_port)
                         : absl::StrCat("at ", c.coordinator_host, ":", c.coordinator_port);
  WSYNC_LOG(kConfig, kInfo, RoleName(c.role), " ", c.rank, ": job ", c.job_id, " of ",
            log::Count(c.num_trainers, "trainer"), " and ", log::Count(c.num_rollouts, "rollout"),
            ", coordinator ", coordinator, ", staging budget ",
            log::Bytes(static_cast<int64_t>(c.staging_budget_bytes)), ", deadline ",
            absl::FormatDuration(c.deadline), ", policy ", c.replica_policy, ", path transports ",
            c.path_transports.empty() ? "(default)" : c.path_transports, ", verify ",
            static_cast<int>(c.verify), ", delta ", static_cast<int>(c.delta));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Session>> Session::Create(SessionConfig config) {
  // A secret given by value is wiped whatever the outcome; the session keeps one copy (wiped
  // once connected).
  absl::Cleanup wipe = [&config] { WipeSecret(config.secret.value); };
  if (config.role != Role::kTrainer && config.role != Role::kRollout) {
    return absl::InvalidArgumentError("role must be trainer or rollout");
  }
  if (config.num_trainers < 1 || config.num_rollouts < 0) {
    return absl::InvalidArgumentError(absl::StrCat("a job needs at least one trainer, got ",
                                                   config.num_trainers, " trainers and ",
                                                   config.num_rollouts, " rollouts"));
  }
  const int32_t of_role = config.role == Role::kTrainer ? config.num_trainers : config.num_rollouts;
  if (config.rank < 0 || config.rank >= of_role) {
    return absl::InvalidArgumentError(absl::StrCat(RoleName(config.role), " rank ", config.rank,
                                                   " is outside [0, ", of_role, ")"));
  }
  if (config.job_id.empty()) return absl::InvalidArgumentError("job id is required");
  if (config.host_coordinator && !(config.role == Role::kTrainer && config.rank == 0)) {
    return absl::InvalidArgumentError("only trainer rank 0 may host the coordinator");
  }
  if (config.coordinator_port <= 0 && !config.host_coordinator) {
    return absl::InvalidArgumentError("coordinator port is required");
  }
  if (config.deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the deadline must be positive");
  }
  if (config.heartbeat_interval == absl::ZeroDuration()) {
    config.heartbeat_interval = kDefaultHeartbeatInterval;
  }
  if (config.silence_limit == absl::ZeroDuration()) config.silence_limit = kDefaultSilenceLimit;
  if (config.heartbeat_interval < absl::Milliseconds(1) ||
      config.silence_limit < 2 * config.heartbeat_interval) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the heartbeat interval must be at least 1 ms and the silence limit at least twice it, "
        "got ",
        absl::FormatDuration(config.heartbeat_interval), " and ",
        absl::FormatDuration(config.silence_limit)));
  }
  WSYNC_RETURN_IF_ERROR(CheckSessionPolicyName(config.replica_policy));
  WSYNC_RETURN_IF_ERROR(ParsePathTransports(config.path_transports).status());
  if (config.node_id.empty()) config.node_id = HostName();
  if (config.device < kUnknownDevice || config.device > kMaxDevice) {
    return absl::InvalidArgumentError(
        absl::StrCat("device must be in 0..", kMaxDevice, " (or unknown), got ", config.device));
  }
  std::optional<MetricsAddress> metrics_address;
  if (!config.metrics_address.empty()) {
    WSYNC_ASSIGN_OR_RETURN(metrics_address, ParseMetricsAddress(config.metrics_address));
    metrics_address->allow_any_address = config.metrics_allow_any_address;
  }
  absl::StatusOr<std::string> secret = LoadSecret(config.secret);
  WipeSecret(config.secret.value);
  if (!secret.ok()) return WithErrorKind(secret.status(), kErrorAuthentication);
  auto session = std::unique_ptr<Session>(new Session(std::move(config), std::move(*secret)));
  if (metrics_address) {
    WSYNC_RETURN_IF_ERROR(session->metrics_->StartExporter(*metrics_address));
  }
  return session;
}

Session::Session(SessionConfig config, std::string secret)
    : config_(std::move(config)),
      secret_(std::move(secret)),
      layout_(config_.role, config_.rank, config_.node_id, config_.device),
      metrics_(std::make_unique<SessionMetrics>(RoleName(config_.role))) {
  LogSessionConfig(config_);
}

Session::~Session() {
  Finalize();
  WipeSecret(secret_);
}

absl::Status Session::RequireState(SessionState wanted, absl::string_view call) const {
  absl::MutexLock lock(&mu_);
  if (state_ == wanted) return absl::OkStatus();
  return WithErrorKind(absl::FailedPreconditionError(
                           absl::StrCat(call, " is not allowed in state ", SessionStateName(state_),
                                        " (needs ", SessionStateName(wanted), ")")),
                       kErrorWrongState);
}

void Session::SetState(SessionState state, std::optional<int64_t> version) {
  {
    absl::MutexLock lock(&mu_);
    state_ = state;
    if (version) version_ = *version;
  }
  PublishState();
}

void Session::PublishState() {
  int64_t version;
  SessionState state;
  {
    absl::MutexLock lock(&mu_);
    version = version_;
    state = state_;
  }
  VersionState shown = VersionState::kNone;
  if (state == SessionState::kSyncing) {
    shown = VersionState::kUpdating;
  } else if (state == SessionState::kDirty) {
    shown = VersionState::kDirty;
  } else if (state == SessionState::kIdle && version >= 0) {
    shown = VersionState::kConsistent;
  }
  metrics_->SetVersion(version, shown);
}

void Session::BindMetrics() {
  const ConnectedJob& connected = *connected_;
  const PathTransports& paths = connected.config().path_transports;
  const RoutedTransport* transport = connected.transport();
  std::vector<SessionMetrics::PathBytes> bytes;
  for (int d = 0; d < 2; ++d) direct_bytes_[d] = staged_bytes_[d] = 0;
  for (auto& by_direction : class_paths_) by_direction[0] = by_direction[1] = std::nullopt;
  for (const PeerSchedule& peer : connected.schedule().peers) {
    SessionMetrics::PathBytes path;
    path.path_class = std::string(connected.job().PathClass(connected.process(), peer.peer));
    const Transport* backend = transport != nullptr ? transport->BackendFor(peer.peer) : nullptr;
    if (backend != nullptr && (backend->name() == "nccl" || backend->name() == "cuda_ipc")) {
      // CUDA pairs (executor/memory_kinds.h), whatever the class maps to.
      path.transport = backend->name();
    } else {
      const TransportChoice* chosen = &paths.For(path.path_class);
      // Host pairs of a class mapped to a CUDA-only backend use the fallback (selector.h).
      if (chosen->backend == "nccl" || chosen->backend == "cuda_ipc") chosen = &paths.fallback;
      const TransportChoice& choice = *chosen;
      path.transport = choice.transports.empty()
                           ? choice.backend
                           : absl::StrCat(choice.backend, ":", choice.transports);
    }
    path.direction =
        peer.direction == Direction::kSend ? MetricDirection::kSend : MetricDirection::kReceive;
    const int d = peer.direction == Direction::kSend ? 0 : 1;
    for (const ScheduledRound& round : peer.rounds) {
      path.bytes += round.bytes;
      (round.direct ? direct_bytes_ : staged_bytes_)[d] += round.bytes;
    }
    const int path_class = PathClassIndex(path.path_class);
    const bool device_pair = path.transport == "nccl" || path.transport == "cuda_ipc";
    if (path_class >= 0 && !device_pair) class_paths_[path_class][d] = path;
    bytes.push_back(std::move(path));
  }
  metrics_->BindPaths(bytes);
  const Plan& plan = connected.plan();
  metrics_->SetPlanDigest(DigestHex(plan.digest));
  metrics_->SetPlanInterNodeBytes(plan.inter_node_bytes, plan.inter_node_bytes_without_relay);
  std::optional<int64_t> unpriced;
  if (connected.prediction().has_value()) {
    unpriced = 0;
    for (const auto& [path, bytes] : connected.prediction()->unpriced_bytes) *unpriced += bytes;
  }
  metrics_->SetUnpricedBytes(unpriced);
}

void Session::RecordSyncMetrics(const absl::StatusOr<TransferStats>& stats,
                                const absl::Status& outcome, double seconds) {
  const std::optional<Prediction>& prediction = connected_->prediction();
  metrics_->RecordSync(outcome.ok() ? SyncResult::kOk : SyncResult::kFailed, seconds,
                       prediction ? std::optional<double>(prediction->seconds) : std::nullopt);
  // Bytes count once this process's transfer ran to the end, whatever the decision.
  if (stats.ok()) {
    metrics_->RecordRounds(stats->rounds);
    std::vector<SessionMetrics::PathBytes> saved;  // Of delta syncs: off the planned bytes.
    for (int c = 0; c < kPathClassCount; ++c) {
      for (int d = 0; d < 2; ++d) {
        if (stats->delta_saved_by_path[c][d] == 0 || !class_paths_[c][d]) continue;
        saved.push_back(*class_paths_[c][d]);
        saved.back().bytes = stats->delta_saved_by_path[c][d];
      }
    }
    metrics_->RecordPathBytes(saved);
    metrics_->RecordDirectStaged(MetricDirection::kSend, direct_bytes_[0], staged_bytes_[0]);
    metrics_->RecordDirectStaged(MetricDirection::kReceive, direct_bytes_[1], staged_bytes_[1]);
    metrics_->RecordLocalCopy(stats->local_copy_bytes);
    metrics_->RecordDelta({stats->delta_compared_elements, stats->delta_changed_elements,
                           stats->delta_saved_bytes, stats->delta_encode_cpu_seconds,
                           stats->delta_apply_cpu_seconds});
    arena_peak_bytes_ = std::max(arena_peak_bytes_, stats->peak_arena_bytes);
  }
  metrics_->SetArenaBytes(connected_->arena_held_bytes(), arena_peak_bytes_);
  metrics_->RecordError(outcome);
  PublishState();
}

absl::Status Session::Remember(absl::Status status) const {
  if (!status.ok()) {
    absl::MutexLock lock(&mu_);
    last_error_ = std::string(status.message());
  }
  return status;
}

std::string Session::LastError() const {
  absl::MutexLock lock(&mu_);
  return last_error_;
}

absl::StatusOr<std::string> Session::ScheduleReport() const {
  {
    absl::MutexLock lock(&mu_);
    if (state_ == SessionState::kRegistered || state_ == SessionState::kFinalized) {
      return WithErrorKind(
          absl::FailedPreconditionError(
              absl::StrCat("schedule_report is not allowed in state ", SessionStateName(state_))),
          kErrorWrongState);
    }
  }
  const ConnectedJob& connected = *connected_;
  const ProcessSchedule& s = connected.schedule();
  const int32_t process = connected.process();
  std::string report = absl::StrFormat(
      "process %d (%s rank %d): %d segments, %d chunks, %d rounds; sends %d B, receives %d B, "
      "copies %d B locally; direct %d B, staged %d B; arenas %d B (host %d B, cuda %d B)\n",
      process, RoleName(config_.role), config_.rank, s.segments, s.chunks, s.rounds, s.sent_bytes,
      s.received_bytes, s.local_copy_bytes, s.direct_bytes, s.staged_bytes, s.arena_bytes,
      s.arena_bytes - s.cuda_arena_bytes, s.cuda_arena_bytes);
  for (const PeerSchedule& peer : s.peers) {
    int64_t bytes = 0;
    for (const ScheduledRound& round : peer.rounds) bytes += round.bytes;
    absl::StrAppendFormat(&report,
                          "  %s process %d (%s): %d rounds, %d B, arena %d B (%s memory)\n",
                          peer.direction == Direction::kSend ? "to" : "from", peer.peer,
                          connected.job().PathClass(process, peer.peer), peer.rounds.size(), bytes,
                          peer.arena_bytes(), MemoryKindName(peer.arena_kind));
  }
  absl::StrAppend(&report, "plan digest ", DigestHex(connected.plan().digest), "; ",
                  PredictionLine(connected.prediction(), connected.calibration()), "\n");
  // Delta sync: the prediction at the changed fraction the last committed sync saw (none yet:
  // issue 44's 4 % of a bf16 step at lr 1e-6, said so).
  if (config_.delta != DeltaMode::kOff && connected.prediction().has_value() &&
      connected.calibration().fits.has_value()) {
    // The fraction the next sync will agree on is summed from what the senders saw in this one:
    // this process's own when it is a sender (the agreed one of this sync is one sync older).
    std::optional<double> seen = connected.delta_observed_fraction();
    if (!seen.has_value()) seen = connected.delta_changed_fraction();
    const std::optional<double> encoded = connected.delta_encoded_per_changed();
    absl::StrAppend(
        &report,
        DeltaPredictionLine(
            PredictDeltaSync(
                connected.job(), connected.plan(), *connected.prediction(),
                *connected.calibration().fits, seen.value_or(kAssumedDeltaFraction),
                encoded.value_or(kDeltaEncodedPerChanged),
                config_.delta == DeltaMode::kAuto ? &connected.delta_pays_below() : nullptr),
            !seen.has_value()     ? "assumed, none seen yet"
            : encoded.has_value() ? "the last sync's"
                                  : "the last sync's; the encoding's cost assumed"),
        "\n");
  }
  return report;
}

absl::Status Session::RunStep(std::optional<int64_t> own_version) {
  ConnectedJob& connected = *connected_;
  const absl::Duration wait = own_version ? config_.deadline : kIdleTriggerWait;
  // (1) The trigger: trainer rank 0's version.
  WSYNC_ASSIGN_OR_RETURN(const int64_t version, connected.Trigger(own_version, absl::Now() + wait));
  StepOptions step;
  step.version = version;
  if (own_version && *own_version != version) {
    step.rejection = WithErrorKind(absl::FailedPreconditionError(absl::StrCat(
                                       "ranks disagree on the version: this process syncs ",
                                       *own_version, ", trainer rank 0 syncs ", version)),
                                   kErrorRanksDisagree);
  }
  absl::Time started = absl::Now();
  step.on_phase = [&](StepPhase phase) {
    if (phase != StepPhase::kTransfer) return;
    started = absl::Now();
    if (!own_version && before_update_) {
      after_update_owed_ = version;
      before_update_(version);
    }
    SetState(SessionState::kSyncing);
    failpoint::Evaluate("sync_step");
  };
  // (2) The transfer, after agreeing on digest and budget, and (3) the commit decision: every
  // process votes; a failure anywhere fails everyone (plugin/runtime.h).
  if (after_wave_) {
    step.after_wave = [this, version](int32_t wave) { return after_wave_(version, wave); };
  }
  const StepResult result = connected.RunStep(step);
  const absl::Status outcome = result.status();
  {
    absl::MutexLock lock(&mu_);
    if (result.stats.ok()) {
      last_stats_ = *result.stats;
      last_stats_version_ = version;
    }
    if (outcome.ok()) {
      state_ = SessionState::kIdle;
      version_ = version;
    } else {
      state_ = config_.role == Role::kRollout ? SessionState::kDirty : SessionState::kIdle;
    }
  }
  metrics_->RecordRejected("stale_sync", result.rejected_messages);
  RecordSyncMetrics(result.stats, outcome, absl::ToDoubleSeconds(absl::Now() - started));
  if (!own_version && after_update_) {
    after_update_owed_.reset();
    after_update_(version, outcome);
  }
  return outcome;
}

absl::Status Session::Sync(int64_t version) {
  {
    absl::MutexLock lock(&mu_);
    if (state_ != SessionState::kIdle && state_ != SessionState::kDirty) {
      return WithErrorKind(absl::FailedPreconditionError(absl::StrCat(
                               "sync is not allowed in state ", SessionStateName(state_))),
                           kErrorWrongState);
    }
    if (trainer_triggered_) {
      return WithErrorKind(absl::FailedPreconditionError("sync is not allowed in the "
                                                         "trainer-triggered mode: the background "
                                                         "thread joins syncs"),
                           kErrorWrongState);
    }
  }
  try {  // The exception firewall of the host's sync: the session never stays SYNCING.
    return RunStep(version);
  } catch (...) {
    return ThreadFailed("sync");
  }
}

absl::Status Session::SyncBegin(int64_t version) {
  {
    absl::MutexLock lock(&mu_);
    if (state_ != SessionState::kIdle && state_ != SessionState::kDirty) {
      return WithErrorKind(absl::FailedPreconditionError(absl::StrCat(
                               "sync_begin is not allowed in state ", SessionStateName(state_))),
                           kErrorWrongState);
    }
  }
  if (sync_thread_.joinable()) sync_thread_.join();
  sync_done_ = false;
  sync_outcome_.reset();
  SetState(SessionState::kSyncing);
  sync_thread_ = std::thread([this, version] {
    absl::Status status;
    try {  // The exception firewall of the sync_begin thread.
      failpoint::Evaluate("sync_thread");
      status = RunStep(version);
    } catch (...) {
      status = ThreadFailed("sync_begin thread");
    }
    sync_outcome_ = std::move(status);
    sync_done_ = true;
  });
  return absl::OkStatus();
}

std::optional<absl::Status> Session::SyncTest() {
  if (!sync_thread_.joinable()) {
    return WithErrorKind(absl::FailedPreconditionError("sync_test without a sync_begin"),
                         kErrorWrongState);
  }
  if (!sync_done_) return std::nullopt;
  sync_thread_.join();
  return *sync_outcome_;
}

void Session::BackgroundLoop() {
  // A failed sync leaves this rollout dirty and the loop waits for the next trigger (after a lost
  // process, once it was replaced); it ends when the session is finalized or the job's control
  // connection is gone, or at an exception (the firewall: it becomes the session's error).
  try {
    while (!finalizing_) {
      failpoint::Evaluate("background_thread");
      absl::Status status = Remember(RunStep(std::nullopt));
      if (finalizing_ || (absl::IsUnavailable(status) && !AwaitReplacement())) return;
    }
  } catch (...) {
    // Nobody waits on this thread: the session remembers the error for the next call. An engine
    // that paused serving in before_update hears the error (it must not resume serving).
    const absl::Status status = ThreadFailed("trainer-triggered thread");
    if (after_update_owed_ && after_update_) {
      const int64_t version = *std::exchange(after_update_owed_, std::nullopt);
      try {
        after_update_(version, status);
      } catch (...) {  // The host's callback threw in its turn: the session already failed.
      }
    }
  }
}

absl::Status Session::ThreadFailed(absl::string_view thread) {
  absl::Status status = StatusOfCurrentException(absl::StrCat("wsync ", thread));
  WSYNC_LOG(kFault, kError, RoleName(config_.role), " ", config_.rank, ": ", status.ToString());
  try {
    // The step was cut short: its peers learn at once (nothing of it may complete later), and the
    // session keeps the error; every later sync fails with it (finalize and start anew).
    Abort(status);
    {
      absl::MutexLock lock(&mu_);
      state_ = config_.role == Role::kRollout ? SessionState::kDirty : SessionState::kIdle;
    }
    metrics_->RecordError(status);
    return Remember(status);
  } catch (...) {
    return status;
  }
}

bool Session::AwaitReplacement() {
  while (!finalizing_) {
    // An unusable connection (the coordinator lost, closed or silent; Abort) ends the loop.
    ControlClient& client = connected_->client();
    if (!client.WatchLosses(absl::Now(), -1).ok()) return false;
    if (client.loss_count() <= losses_replaced_ || client.HasRosterUpdate()) {
      losses_replaced_ = client.loss_count();
      return true;
    }
    if (!client.WatchLosses(absl::Now() + absl::Milliseconds(100), -1).ok()) return false;
  }
  return false;
}

void Session::Abort(const absl::Status& reason) {
  WSYNC_LOG(kFault, kWarn, RoleName(config_.role), " ", config_.rank,
            ": abort: ", reason.ToString());
  absl::MutexLock lock(&handles_mu_);
  if (connected_ != nullptr) {
    connected_->Abort(reason);
  } else {
    connect_abort_.Abort(reason);  // A connect in progress, if any.
  }
}

std::pair<absl::Duration, absl::Duration> Session::CoordinatorHeartbeats() const {
  absl::MutexLock lock(&handles_mu_);
  if (connected_ == nullptr) return {absl::ZeroDuration(), absl::ZeroDuration()};
  return connected_->Heartbeats();
}

std::pair<int64_t, SessionState> Session::State() const {
  absl::MutexLock lock(&mu_);
  return {version_, state_};
}

Session::SyncStats Session::LastStats() const {
  absl::MutexLock lock(&mu_);
  return SyncStats{last_stats_version_, last_stats_};
}

void Session::Finalize() {
  if (finalizing_.exchange(true)) return;
  const absl::Status reason = absl::AbortedError("the session was finalized");
  if (background_.joinable() || sync_thread_.joinable()) Abort(reason);
  if (background_.joinable()) background_.join();
  if (sync_thread_.joinable()) sync_thread_.join();
  DropConnection();
  metrics_->StopExporter();
  SetState(SessionState::kFinalized);
}

}  // namespace wsync
