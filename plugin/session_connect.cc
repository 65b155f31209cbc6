// Session's connect (session.h): the session's configuration handed to the runtime
// (plugin/runtime.h), which connects; the session binds its metrics to the connected job and starts
// the trainer-triggered thread. The class comment in session.h states the contracts.

#include <utility>

#include "common/log.h"
#include "common/status.h"
#include "plugin/coordinator_figures.h"
#include "plugin/runtime.h"
#include "plugin/session.h"

namespace wsync {

absl::Status Session::Connect() {
  WSYNC_RETURN_IF_ERROR(RequireState(SessionState::kRegistered, "connect"));
  absl::Status status = ConnectOnce();
  metrics_->RecordError(status);
  if (!status.ok()) {
    WSYNC_LOG(kFault, kError, RoleName(config_.role), " ", config_.rank,
              ": connect failed: ", status.ToString());
  }
  // The secret is needed until a connect succeeded (a failed one may be retried): then it is
  // wiped. Whatever needs it later keeps its own copy and wipes it itself: a hosted coordinator
  // (every Hello, a replacement's too; wiped when it stops). Keys derived from it for the data
  // path are derived by the runtime's connect, before this point.
  if (status.ok()) WipeSecret(secret_);
  // A failed connect leaves nothing behind (the runtime's contract): a retry starts from scratch.
  return status;
}

absl::StatusOr<RuntimeConfig> Session::MakeRuntimeConfig() const {
  RuntimeConfig runtime;
  runtime.role = config_.role;
  runtime.rank = config_.rank;
  runtime.num_trainers = config_.num_trainers;
  runtime.num_rollouts = config_.num_rollouts;
  runtime.job_id = config_.job_id;
  runtime.coordinator_host = config_.coordinator_host;
  runtime.coordinator_port = config_.coordinator_port;
  runtime.host_coordinator = config_.host_coordinator;
  runtime.heartbeat_interval = config_.heartbeat_interval;
  runtime.silence_limit = config_.silence_limit;
  runtime.node_id = layout_.node_id();
  runtime.part = layout_.part();
  runtime.buffer_addresses = layout_.buffer_addresses();
  runtime.cuda_device = layout_.cuda_device();
  runtime.staging_budget_bytes = config_.staging_budget_bytes;
  runtime.deadline = config_.deadline;
  runtime.replica_policy = config_.replica_policy;
  WSYNC_ASSIGN_OR_RETURN(runtime.path_transports, ParsePathTransports(config_.path_transports));
  runtime.calibration_file = config_.calibration_file;
  runtime.verify = config_.verify;
  runtime.delta = config_.delta;
  runtime.delta_budget_bytes = config_.delta_budget_bytes;
  runtime.nccl_api = config_.nccl_api;
  return runtime;
}

absl::Status Session::ConnectOnce() {
  WSYNC_ASSIGN_OR_RETURN(RuntimeConfig runtime, MakeRuntimeConfig());
  runtime.progress = &progress_;  // Declared before connected_ (session.h): outlives it.
  ConnectHooks hooks;
  hooks.coordinator_started = [this](int32_t port) {
    coordinator_port_.store(port, std::memory_order_release);
  };
  connect_abort_.Reset();  // An Abort before this connect aborted nothing.
  hooks.abort = &connect_abort_;
  absl::StatusOr<std::unique_ptr<ConnectedJob>> connected =
      ConnectedJob::Connect(std::move(runtime), secret_, hooks);
  if (!connected.ok()) {
    coordinator_port_.store(0, std::memory_order_release);  // The runtime stopped the coordinator.
    return connected.status();
  }
  {
    absl::MutexLock lock(&handles_mu_);
    connected_ = *std::move(connected);
    // An Abort between the runtime's return and this point reached no client: apply it now.
    if (std::optional<absl::Status> aborted = connect_abort_.aborted()) connected_->Abort(*aborted);
  }
  if (connected_->calibration().fits) {
    metrics_->SetCalibrationTime(connected_->calibration().measured);
  }
  if (const Coordinator* hosted = connected_->coordinator(); hosted != nullptr) {
    // Read at each exposition; DropConnection removes it before the coordinator goes.
    const int32_t world = config_.num_trainers + config_.num_rollouts;
    metrics_->SetCoordinatorSource(
        [hosted, world] { return FiguresOf(hosted->counters(), world); });
  }
  BindMetrics();
  SetState(SessionState::kIdle);
  if (trainer_triggered_) background_ = std::thread([this] { BackgroundLoop(); });
  return absl::OkStatus();
}

void Session::DropConnection() {
  metrics_->SetCoordinatorSource(nullptr);
  coordinator_port_.store(0, std::memory_order_release);
  std::unique_ptr<ConnectedJob> connected;
  {
    absl::MutexLock lock(&handles_mu_);
    connected = std::move(connected_);
  }
  connected.reset();
}

}  // namespace wsync
