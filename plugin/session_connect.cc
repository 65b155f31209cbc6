// Session's connect (session.h): the hosted coordinator, the control connection, the join and
// the roster checks, planning, transports and the schedule. Split from session.cc by phase; the
// class comment in session.h states the contracts.

#include <algorithm>
#include <utility>

#include "common/status.h"
#include "executor/memory_kinds.h"
#include "executor/schedule.h"
#include "planner/layout_parts.h"
#include "planner/manifest_codec.h"
#include "planner/policy.h"
#include "plugin/coordinator_figures.h"
#include "plugin/roster_check.h"
#include "plugin/session.h"
#include "plugin/transport_setup.h"
#include "transport/control/auth.h"
#include "transport/control/client.h"
#include "transport/control/coordinator.h"
#include "transport/selector/selector.h"

namespace wsync {

absl::Status Session::PlanJob(const std::vector<Layout>& trainer_parts,
                              const std::vector<Layout>& rollout_parts) {
  WSYNC_ASSIGN_OR_RETURN(Layout trainers, MergeLayoutParts(trainer_parts));
  WSYNC_ASSIGN_OR_RETURN(Layout rollouts, MergeLayoutParts(rollout_parts));
  WSYNC_ASSIGN_OR_RETURN(Job job, Job::Create(std::move(trainers), std::move(rollouts)));
  job_ = std::make_unique<Job>(std::move(job));
  const LinkFits* fits = calibration_.fits ? &*calibration_.fits : nullptr;
  WSYNC_ASSIGN_OR_RETURN(auto policy, MakeSessionPolicy(config_.replica_policy, fits));
  PlanOptions plan_options;
  plan_options.process = process_;
  plan_options.relay.arena_bytes = RelayArenaLimit(StagingBudget{config_.staging_budget_bytes});
  // With a calibration the cost model decides what to relay (planner/relay.h), else the bytes rule.
  if (fits != nullptr) plan_options.relay.fits = std::make_shared<const LinkFits>(*fits);
  WSYNC_ASSIGN_OR_RETURN(plan_, MakePlan(*job_, *policy, plan_options));
  prediction_.reset();
  if (fits != nullptr) {
    absl::StatusOr<Prediction> prediction = PredictSync(
        *job_, *policy, *fits, StagingBudget{config_.staging_budget_bytes}, plan_options.relay);
    if (prediction.ok()) prediction_ = *prediction;
  }
  return absl::OkStatus();
}

absl::Status Session::Connect() {
  WSYNC_RETURN_IF_ERROR(RequireState(SessionState::kRegistered, "connect"));
  absl::Status status = ConnectOnce();
  metrics_->RecordError(status);
  // The secret is needed until a connect succeeded (a failed one may be retried): then it is
  // wiped. Whatever needs it later keeps its own copy and wipes it itself: a hosted coordinator
  // (every Hello, a replacement's too; wiped when it stops). Keys derived from it for the data
  // path are derived in ConnectOnce, before this point.
  if (status.ok()) WipeSecret(secret_);
  if (!status.ok()) {
    // Back to a clean REGISTERED session, so that a retry starts from scratch.
    DropConnection();
    job_.reset();
    plan_ = Plan{};
    endpoints_ = Endpoints{};
    buffers_.clear();
    cuda_deferred_.reset();
  }
  return status;
}

void Session::DropConnection() {
  std::unique_ptr<RoutedTransport> transport;
  std::unique_ptr<ControlClient> client;
  std::unique_ptr<Coordinator> coordinator;
  metrics_->SetCoordinatorSource(nullptr);
  {
    absl::MutexLock lock(&handles_mu_);
    transport = std::move(transport_);
    client = std::move(client_);
    coordinator = std::move(coordinator_);
  }
  transport.reset();
  client.reset();
  if (coordinator != nullptr) coordinator->Stop();
}

absl::Status Session::ConnectOnce() {
  const absl::Time deadline = absl::Now() + config_.deadline;
  if (config_.verify == VerifyMode::kKeyed) {
    WSYNC_ASSIGN_OR_RETURN(data_key_, DeriveDataKey(secret_, config_.job_id));
  }
  if (config_.host_coordinator) WSYNC_RETURN_IF_ERROR(StartHostedCoordinator());

  ControlClientOptions control;
  control.coordinator_host = config_.coordinator_host;
  control.coordinator_port =
      config_.host_coordinator ? coordinator_port() : config_.coordinator_port;
  control.job_id = config_.job_id;
  control.role = config_.role == Role::kTrainer ? ControlRole::kTrainer : ControlRole::kRollout;
  control.rank = config_.rank;
  control.node_id = config_.node_id;
  control.secret = secret_;
  control.connect_timeout = config_.deadline;
  control.progress = &progress_;
  WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<ControlClient> client,
                         ControlClient::Connect(std::move(control)));
  process_ = client->process();
  {
    absl::MutexLock lock(&handles_mu_);
    client_ = std::move(client);
  }
  // Keys derived from the job secret for this connection belong here: `secret_` is still held
  // (Connect wipes it once this function succeeded).

  // One UCX worker per distinct transport choice; peers are routed by path class below.
  WSYNC_ASSIGN_OR_RETURN(PathTransports paths, ParsePathTransports(config_.path_transports));
  WSYNC_ASSIGN_OR_RETURN(PathTransportSetup setup,
                         PathTransportSetup::Create(process_, std::move(paths)));

  JoinRequest join;
  join.manifest = SerializeLayout(part_);
  join.address = setup.address_bundle();
  absl::Status calibration_read;
  join.metadata = CalibrationMetadata(process_, config_.calibration_file, &calibration_read);
  WSYNC_ASSIGN_OR_RETURN(Roster roster, client_->Join(join, deadline));
  WSYNC_RETURN_IF_ERROR(calibration_read);
  // Nothing from the wire is trusted for memory safety: this process's entry is what it sent.
  WSYNC_RETURN_IF_ERROR(CheckOwnRosterEntry(
      roster, process_,
      config_.role == Role::kTrainer ? ControlRole::kTrainer : ControlRole::kRollout, config_.rank,
      join.manifest));

  std::vector<Layout> trainer_parts, rollout_parts;
  std::vector<std::string> bundles(roster.size());
  for (int32_t p = 0; p < roster.size(); ++p) {
    WSYNC_ASSIGN_OR_RETURN(Layout layout, ParseLayout(roster.manifest(p)));
    (layout.role == Role::kTrainer ? trainer_parts : rollout_parts).push_back(std::move(layout));
    bundles[p] = roster.processes[p].address;
  }
  WSYNC_ASSIGN_OR_RETURN(calibration_, CalibrationFromRoster(roster));
  if (calibration_.fits) metrics_->SetCalibrationTime(calibration_.measured);
  // A layout that cannot be planned fails every process the same way: all see the same parts.
  WSYNC_RETURN_IF_ERROR(WithErrorKind(PlanJob(trainer_parts, rollout_parts), kErrorLayoutRefused));
  // Everything this process will touch lies in what it registered, with the registered sizes.
  WSYNC_RETURN_IF_ERROR(CheckOwnMemory(*job_, plan_.segments, process_, part_.buffers));

  WSYNC_RETURN_IF_ERROR(ConnectTransports(roster, std::move(setup), bundles, deadline));
  for (int32_t p = 0; p < roster.size(); ++p) endpoints_.processes.push_back(p);
  // The schedule is built now so that a budget or geometry problem shows at connect, not at the
  // first sync; every process agrees on it before the first byte moves.
  absl::StatusOr<ProcessSchedule> schedule = ScheduleTransfers(
      *job_, plan_.segments, endpoints_, StagingBudget{config_.staging_budget_bytes}, process_);
  WSYNC_RETURN_IF_ERROR(WithErrorKind(schedule.status(), kErrorLayoutRefused));
  BindMetrics(*schedule);
  SetState(SessionState::kIdle);
  if (trainer_triggered_) background_ = std::thread([this] { BackgroundLoop(); });
  return absl::OkStatus();
}

absl::Status Session::StartHostedCoordinator() {
  CoordinatorOptions options;
  options.job_id = config_.job_id;
  options.secret = secret_;
  options.num_trainers = config_.num_trainers;
  options.num_rollouts = config_.num_rollouts;
  options.address = config_.coordinator_host;
  options.port = config_.coordinator_port;
  options.rendezvous_timeout = config_.deadline;
  options.heartbeat_interval = config_.heartbeat_interval;
  options.silence_limit = config_.silence_limit;
  WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<Coordinator> coordinator,
                         Coordinator::Start(std::move(options)));
  coordinator_port_.store(coordinator->port(), std::memory_order_release);
  // Read at each exposition; DropConnection removes it before the coordinator goes.
  const Coordinator* hosted = coordinator.get();
  const int32_t world = config_.num_trainers + config_.num_rollouts;
  metrics_->SetCoordinatorSource([hosted, world] { return FiguresOf(hosted->counters(), world); });
  absl::MutexLock lock(&handles_mu_);
  coordinator_ = std::move(coordinator);
  return absl::OkStatus();
}

absl::Status Session::ConnectTransports(const Roster& roster, PathTransportSetup setup,
                                        const std::vector<std::string>& bundles,
                                        absl::Time deadline) {
  // Each peer's transport by (path class, memory kind); with CUDA buffers in the job, one more
  // collective spreads any refusal and forms the NCCL communicator (plugin/cuda_setup.h).
  absl::StatusOr<std::vector<TransportChoice>> routes =
      setup.ChooseRoutes(*job_, plan_.segments, NcclBuilt());
  cuda_job_ = JobMemoryKinds(*job_).any_cuda();
  nccl_pairs_ = setup.NcclPairs(*job_, NcclBuilt());
  CudaConnection cuda;
  // A roster of a later epoch answers the Join of a replacement (the job's first roster has epoch
  // 0): it defers the CUDA collective to its first sync (NcclBackendFormedAtFirstSync), and keeps
  // a refusal of its routes as its verdict there, so that the sync fails everywhere with it.
  if (roster.epoch > 0 && cuda_job_) {
    cuda_deferred_ = routes.status();
    const bool member = std::any_of(nccl_pairs_.begin(), nccl_pairs_.end(), [this](NcclPair pair) {
      return pair.first == process_ || pair.second == process_;
    });
    if (routes.ok() && member) cuda.nccl = NcclBackendFormedAtFirstSync(process_);
  } else {
    WSYNC_ASSIGN_OR_RETURN(
        cuda, ConnectCuda(*job_, nccl_pairs_, process_, cuda_device_, routes.status(), *client_,
                          deadline, config_.nccl_api));
    WSYNC_RETURN_IF_ERROR(routes.status());
  }
  cuda_collective_pending_ = cuda_deferred_.has_value();
  if (routes.ok()) {  // Otherwise a refused replacement: its first sync fails with its routes.
    const PathTransportSetup::CudaIpcFactory make_cuda_ipc =
        [this](std::unique_ptr<Transport> messenger) {
          return MakeCudaIpc(process_, cuda_device_, std::move(messenger), config_.nccl_api);
        };
    WSYNC_ASSIGN_OR_RETURN(
        std::unique_ptr<RoutedTransport> transport,
        std::move(setup).Connect(*job_, bundles, *routes, std::move(cuda.nccl), make_cuda_ipc));
    absl::MutexLock lock(&handles_mu_);
    transport_ = std::move(transport);
  }
  if (cuda.device != nullptr) {
    arenas_ = std::make_unique<ArenaCache>();  // Arenas of an earlier device go first.
    device_ = std::move(cuda.device);
  }
  for (size_t b = 0; b < part_.buffers.size(); ++b) {
    buffers_[part_.buffers[b].id] = buffer_addresses_[b];
    if (transport_ == nullptr) continue;
    absl::Status registered =
        transport_
            ->RegisterMemory(buffer_addresses_[b], part_.buffers[b].bytes, part_.buffers[b].kind)
            .status();
    // Registration is optional for CUDA memory (NCCL registers where it helps); none of this
    // process's transports may carry it when all its peers are host processes.
    if (part_.buffers[b].kind == MemoryKind::kCuda && absl::IsUnimplemented(registered)) continue;
    WSYNC_RETURN_IF_ERROR(registered);
  }
  return absl::OkStatus();
}

}  // namespace wsync
