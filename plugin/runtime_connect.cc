// ConnectedJob::Connect (runtime.h): the hosted coordinator, the control connection, the join and
// the roster checks, planning, the CUDA connection, the transports and the schedule.

#include <algorithm>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "common/status.h"
#include "executor/memory_kinds.h"
#include "executor/waves.h"
#include "planner/layout_parts.h"
#include "planner/manifest_codec.h"
#include "planner/policy.h"
#include "plugin/roster_check.h"
#include "plugin/runtime.h"
#include "plugin/runtime_log.h"

namespace wsync {
namespace {

// Registration is optional for CUDA memory (NCCL registers where it helps): no transport of this
// process may carry it when all its peers are host processes.
bool OptionalRegistrationDeclined(MemoryKind kind, const absl::Status& registered) {
  return kind == MemoryKind::kCuda && absl::IsUnimplemented(registered);
}

ControlRole ControlRoleOf(Role role) {
  return role == Role::kTrainer ? ControlRole::kTrainer : ControlRole::kRollout;
}

absl::StatusOr<std::unique_ptr<Coordinator>> StartHostedCoordinator(const RuntimeConfig& config,
                                                                    absl::string_view secret) {
  CoordinatorOptions options;
  options.job_id = config.job_id;
  options.secret = std::string(secret);
  options.num_trainers = config.num_trainers;
  options.num_rollouts = config.num_rollouts;
  options.address = config.coordinator_host;
  options.port = config.coordinator_port;
  options.rendezvous_timeout = config.deadline;
  if (config.heartbeat_interval > absl::ZeroDuration()) {
    options.heartbeat_interval = config.heartbeat_interval;
  }
  if (config.silence_limit > absl::ZeroDuration()) options.silence_limit = config.silence_limit;
  return Coordinator::Start(std::move(options));
}

// The control client of `config`, to `hosted` when this process hosts the coordinator.
absl::StatusOr<std::unique_ptr<ControlClient>> ConnectControlClient(const RuntimeConfig& config,
                                                                    const Coordinator* hosted,
                                                                    absl::string_view secret) {
  ControlClientOptions control;
  control.coordinator_host = config.coordinator_host;
  control.coordinator_port = hosted != nullptr ? hosted->port() : config.coordinator_port;
  control.job_id = config.job_id;
  control.role = ControlRoleOf(config.role);
  control.rank = config.rank;
  control.node_id = config.node_id;
  control.secret = std::string(secret);
  control.connect_timeout = config.control_connect_timeout.value_or(config.deadline);
  control.progress = config.progress;
  return ControlClient::Connect(std::move(control));
}

}  // namespace

void ConnectAbort::Abort(const absl::Status& reason) {
  absl::MutexLock lock(&mu_);
  if (!aborted_) aborted_ = reason;
  if (client_ != nullptr) client_->Abort(reason);
}

std::optional<absl::Status> ConnectAbort::aborted() const {
  absl::MutexLock lock(&mu_);
  return aborted_;
}

void ConnectAbort::Attach(ControlClient* client) {
  absl::MutexLock lock(&mu_);
  client_ = client;
  if (client_ != nullptr && aborted_) client_->Abort(*aborted_);
}

void ConnectAbort::Reset() {
  absl::MutexLock lock(&mu_);
  aborted_.reset();
}

absl::StatusOr<std::unique_ptr<ConnectedJob>> ConnectedJob::Connect(RuntimeConfig config,
                                                                    absl::string_view secret,
                                                                    const ConnectHooks& hooks) {
  if (config.buffer_addresses.size() != config.part.buffers.size()) {
    return absl::InvalidArgumentError("one address per buffer of the part is needed");
  }
  const absl::Time deadline = absl::Now() + config.deadline;
  auto connected = std::unique_ptr<ConnectedJob>(new ConnectedJob(std::move(config)));
  // Runs before `connected` is destroyed: nobody may abort a client that is gone.
  absl::Cleanup detach = [&hooks] {
    if (hooks.abort != nullptr) hooks.abort->Attach(nullptr);
  };
  ConnectedJob& job = *connected;
  if (job.config_.verify == VerifyMode::kKeyed) {
    WSYNC_ASSIGN_OR_RETURN(job.data_key_, DeriveDataKey(secret, job.config_.job_id));
  }
  if (job.config_.host_coordinator) WSYNC_RETURN_IF_ERROR(job.StartCoordinator(secret, hooks));
  WSYNC_RETURN_IF_ERROR(job.ConnectControl(secret, hooks));
  // One UCX worker per distinct transport choice; peers are routed by path class once planned.
  WSYNC_ASSIGN_OR_RETURN(PathTransportSetup setup,
                         PathTransportSetup::Create(job.process_, job.config_.path_transports));
  std::vector<std::string> bundles;
  if (hooks.before_join) hooks.before_join();
  WSYNC_RETURN_IF_ERROR(job.JoinAndPlan(setup, deadline, &bundles));
  WSYNC_RETURN_IF_ERROR(job.ConnectTransports(std::move(setup), bundles, deadline));
  WSYNC_RETURN_IF_ERROR(job.RegisterBuffers());
  for (int32_t p = 0; p < static_cast<int32_t>(bundles.size()); ++p) {
    job.endpoints_.processes.push_back(p);
  }
  // The schedule is built now so that a budget or geometry problem shows at connect, not at the
  // first step; every process agrees on it before the first byte moves.
  job.waves_ = SplitIntoWaves(*job.job_, job.plan_.segments);
  absl::StatusOr<ProcessSchedule> schedule =
      ScheduleWaves(*job.job_, job.waves_, job.plan_.quant, job.endpoints_,
                    StagingBudget{job.config_.staging_budget_bytes}, job.process_);
  WSYNC_RETURN_IF_ERROR(WithErrorKind(schedule.status(), kErrorLayoutRefused));
  job.schedule_ = *std::move(schedule);
  job.BuildExecutor();
  LogPlan(job.who_, job.plan_, job.schedule_, static_cast<int64_t>(job.waves_.size()));
  return connected;
}

ConnectedJob::~ConnectedJob() {
  executor_.reset();  // It refers to the transport, the client and the device.
  std::unique_ptr<RoutedTransport> transport;
  {
    absl::MutexLock lock(&transport_mu_);
    transport = std::move(transport_);
  }
  transport.reset();
  client_.reset();
  if (coordinator_ != nullptr) coordinator_->Stop();
}

absl::Status ConnectedJob::StartCoordinator(absl::string_view secret, const ConnectHooks& hooks) {
  WSYNC_ASSIGN_OR_RETURN(coordinator_, StartHostedCoordinator(config_, secret));
  if (hooks.coordinator_started) hooks.coordinator_started(coordinator_->port());
  return absl::OkStatus();
}

absl::Status ConnectedJob::ConnectControl(absl::string_view secret, const ConnectHooks& hooks) {
  WSYNC_ASSIGN_OR_RETURN(client_, ConnectControlClient(config_, coordinator_.get(), secret));
  process_ = client_->process();
  who_ = RuntimeWho(config_.role, config_.rank, process_);
  if (hooks.abort != nullptr) hooks.abort->Attach(client_.get());
  return absl::OkStatus();
}

absl::StatusOr<ConnectedMesh> ConnectMesh(
    const RuntimeConfig& config, absl::string_view secret,
    const std::function<std::string(int32_t, int32_t)>& path_class) {
  const absl::Time deadline = absl::Now() + config.deadline;
  ConnectedMesh mesh;
  if (config.host_coordinator) {
    WSYNC_ASSIGN_OR_RETURN(mesh.coordinator, StartHostedCoordinator(config, secret));
  }
  WSYNC_ASSIGN_OR_RETURN(mesh.client, ConnectControlClient(config, mesh.coordinator.get(), secret));
  WSYNC_ASSIGN_OR_RETURN(
      PathTransportSetup setup,
      PathTransportSetup::Create(mesh.client->process(), config.path_transports));
  JoinRequest join;
  join.address = setup.address_bundle();
  WSYNC_ASSIGN_OR_RETURN(Roster roster, mesh.client->Join(join, deadline));
  std::vector<std::string> bundles;
  for (const RosterEntry& entry : roster.processes) bundles.push_back(entry.address);
  WSYNC_ASSIGN_OR_RETURN(mesh.transport, std::move(setup).Connect(path_class, bundles));
  return mesh;
}

absl::Status ConnectedJob::JoinAndPlan(const PathTransportSetup& setup, absl::Time deadline,
                                       std::vector<std::string>* bundles) {
  JoinRequest join;
  join.manifest = SerializeLayout(config_.part);
  join.address = setup.address_bundle();
  absl::Status calibration_read;
  join.metadata = CalibrationMetadata(process_, config_.calibration_file, &calibration_read);
  WSYNC_ASSIGN_OR_RETURN(Roster roster, client_->Join(join, deadline));
  WSYNC_RETURN_IF_ERROR(calibration_read);
  // Nothing from the wire is trusted for memory safety: this process's entry is what it sent.
  WSYNC_RETURN_IF_ERROR(CheckOwnRosterEntry(roster, process_, ControlRoleOf(config_.role),
                                            config_.rank, join.manifest));
  roster_epoch_ = static_cast<int64_t>(roster.epoch);
  LogJoined(who_, config_.job_id, roster);
  std::vector<Layout> trainer_parts, rollout_parts;
  bundles->assign(roster.size(), std::string());
  for (int32_t p = 0; p < roster.size(); ++p) {
    WSYNC_ASSIGN_OR_RETURN(Layout layout, ParseLayout(roster.manifest(p)));
    (layout.role == Role::kTrainer ? trainer_parts : rollout_parts).push_back(std::move(layout));
    (*bundles)[p] = roster.processes[p].address;
  }
  WSYNC_ASSIGN_OR_RETURN(calibration_, CalibrationFromRoster(roster));
  // A layout that cannot be planned fails every process the same way: all see the same parts.
  WSYNC_RETURN_IF_ERROR(WithErrorKind(PlanJob(trainer_parts, rollout_parts), kErrorLayoutRefused));
  // Everything this process will touch lies in what it registered, with the registered sizes.
  return CheckOwnMemory(*job_, plan_.segments, process_, config_.part.buffers);
}

absl::Status ConnectedJob::PlanJob(const std::vector<Layout>& trainer_parts,
                                   const std::vector<Layout>& rollout_parts) {
  WSYNC_ASSIGN_OR_RETURN(Layout trainers, MergeLayoutParts(trainer_parts));
  WSYNC_ASSIGN_OR_RETURN(Layout rollouts, MergeLayoutParts(rollout_parts));
  WSYNC_ASSIGN_OR_RETURN(Job job, Job::Create(std::move(trainers), std::move(rollouts)));
  job_ = std::make_unique<Job>(std::move(job));
  const LinkFits* fits = calibration_.fits ? &*calibration_.fits : nullptr;
  WSYNC_ASSIGN_OR_RETURN(auto policy, MakeSessionPolicy(config_.replica_policy, fits));
  const StagingBudget budget{config_.staging_budget_bytes};
  PlanOptions plan_options;
  plan_options.process = process_;
  plan_options.relay.mode = config_.relay_mode;
  plan_options.relay.arena_bytes = RelayArenaLimit(budget);
  // With a calibration the cost model decides what to relay (planner/relay.h), else the bytes
  // rule, unless the configuration states the links.
  if (config_.relay_fits.has_value()) {
    plan_options.relay.fits = *config_.relay_fits;
  } else if (fits != nullptr) {
    plan_options.relay.fits = std::make_shared<const LinkFits>(*fits);
  }
  WSYNC_ASSIGN_OR_RETURN(plan_, MakePlan(*job_, *policy, plan_options));
  if (fits != nullptr) delta_pays_below_ = DeltaPaysBelow(*fits);
  if (fits != nullptr) {
    absl::StatusOr<Prediction> prediction =
        PredictSync(*job_, *policy, *fits, budget, plan_options.relay);
    if (prediction.ok()) prediction_ = *std::move(prediction);
  }
  return absl::OkStatus();
}

absl::Status ConnectedJob::ConnectTransports(PathTransportSetup setup,
                                             const std::vector<std::string>& bundles,
                                             absl::Time deadline) {
  // Each peer's transport by (path class, memory kind); with CUDA buffers in the job, one more
  // collective spreads any refusal and forms the NCCL communicator (plugin/cuda_setup.h).
  absl::StatusOr<std::vector<TransportChoice>> routes =
      setup.ChooseRoutes(*job_, plan_.segments, NcclBuilt());
  if (routes.ok()) LogRoutes(who_, *job_, process_, *routes);
  cuda_job_ = JobMemoryKinds(*job_).any_cuda();
  nccl_pairs_ = setup.NcclPairs(*job_, NcclBuilt());
  CudaConnection cuda;
  // A roster of a later epoch answers the Join of a replacement (the job's first roster has epoch
  // 0): it defers the CUDA collective to its first step (NcclBackendFormedAtFirstSync), and keeps
  // a refusal of its routes as its verdict there, so that the step fails everywhere with it.
  if (roster_epoch_ > 0 && cuda_job_) {
    cuda_deferred_ = routes.status();
    const bool member = std::any_of(nccl_pairs_.begin(), nccl_pairs_.end(), [this](NcclPair pair) {
      return pair.first == process_ || pair.second == process_;
    });
    if (routes.ok() && member) cuda.nccl = NcclBackendFormedAtFirstSync(process_);
  } else {
    WSYNC_ASSIGN_OR_RETURN(
        cuda, ConnectCuda(*job_, nccl_pairs_, process_, config_.cuda_device, routes.status(),
                          *client_, deadline, config_.nccl_api));
    WSYNC_RETURN_IF_ERROR(routes.status());
  }
  cuda_collective_pending_ = cuda_deferred_.has_value();
  // A replacement renews its workers at its first step with the survivors, who take its roster
  // there (PrepareStep).
  workers_renewal_pending_ = roster_epoch_ > 0 && !cuda_job_;
  if (routes.ok()) {  // Otherwise a refused replacement: its first step fails with its routes.
    const PathTransportSetup::CudaIpcFactory make_cuda_ipc =
        [this](std::unique_ptr<Transport> messenger) {
          return MakeCudaIpc(process_, config_.cuda_device, std::move(messenger), config_.nccl_api);
        };
    WSYNC_ASSIGN_OR_RETURN(
        std::unique_ptr<RoutedTransport> transport,
        std::move(setup).Connect(*job_, bundles, *routes, std::move(cuda.nccl), make_cuda_ipc));
    absl::MutexLock lock(&transport_mu_);
    transport_ = std::move(transport);
  }
  if (cuda.device != nullptr) {
    executor_.reset();  // Its arenas of an earlier device go first.
    device_ = std::move(cuda.device);
  }
  return absl::OkStatus();
}

void ConnectedJob::BuildExecutor() {
  executor_.reset();  // Its arenas first: they may be memory of an earlier device.
  if (transport_ == nullptr) return;
  executor_ = std::make_unique<Executor>(
      *job_, waves_, &plan_.quant, endpoints_, StagingBudget{config_.staging_budget_bytes},
      process_, buffers_, *transport_, *client_,
      ExecutorDeps{.device = device_.get(), .data_key = &data_key_, .progress = config_.progress});
}

absl::Status ConnectedJob::RegisterBuffers() {
  const std::vector<BufferInfo>& infos = config_.part.buffers;
  for (size_t b = 0; b < infos.size(); ++b) {
    buffers_[infos[b].id] = config_.buffer_addresses[b];
    if (transport_ == nullptr) continue;
    absl::StatusOr<RegistrationId> registered =
        transport_->RegisterMemory(config_.buffer_addresses[b], infos[b].bytes, infos[b].kind);
    if (OptionalRegistrationDeclined(infos[b].kind, registered.status())) continue;
    WSYNC_RETURN_IF_ERROR(registered.status());
    registrations_[infos[b].id] = *registered;
  }
  return absl::OkStatus();
}

absl::Status ConnectedJob::RebindBuffer(uint64_t id, void* address) {
  const std::vector<BufferInfo>& infos = config_.part.buffers;
  const auto info = std::find_if(infos.begin(), infos.end(),
                                 [id](const BufferInfo& buffer) { return buffer.id == id; });
  if (info == infos.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rebind_buffer: this process registered no buffer ", id));
  }
  if (address == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("rebind_buffer: buffer ", id, " at NULL"));
  }
  delta_held_.reset();  // Its senders send it dense until a step commits again.
  if (buffers_[id] == address) return absl::OkStatus();
  absl::MutexLock lock(&transport_mu_);  // Abort, from any thread, must not meet a registration.
  if (transport_ != nullptr) {
    // The new registration first: a refusal leaves the old one (and the binding) in place.
    absl::StatusOr<RegistrationId> registered =
        transport_->RegisterMemory(address, info->bytes, info->kind);
    if (!OptionalRegistrationDeclined(info->kind, registered.status())) {
      WSYNC_RETURN_IF_ERROR(registered.status());
    }
    if (auto old = registrations_.find(id); old != registrations_.end()) {
      if (absl::Status released = transport_->DeregisterMemory(old->second); !released.ok()) {
        if (registered.ok()) transport_->DeregisterMemory(*registered).IgnoreError();
        return released;
      }
      registrations_.erase(old);
    }
    if (registered.ok()) registrations_[id] = *registered;
  }
  buffers_[id] = address;
  return absl::OkStatus();
}

}  // namespace wsync
