#ifndef WSYNC_PLUGIN_RUNTIME_H_
#define WSYNC_PLUGIN_RUNTIME_H_

// The per-process runtime: the one implementation of connect and of a sync step that the session
// (libwsync.so), the multi-process test worker and the link calibration job run.
//
// ConnectedJob::Connect returns a connected job: the hosted coordinator (when asked), the control
// client, the roster, the merged job, this process's plan and schedule, the routed transports with
// this process's buffers registered, the CUDA connection and the shared calibration with its
// prediction. What it was connected with (roster, job, plan, schedule, endpoints, calibration)
// never changes afterwards. RunStep runs one sync on it: a roster update (a replacement joined:
// fresh UCX workers on every process, or, with CUDA buffers, the replacement's addresses) and the
// CUDA collective when due, the agreement, the transfer (with verification when configured), the
// caller's check and the commit vote. The routed transport object stays the same across a
// renewal (its UCX backends are swapped), so a reference to it stays valid. Test and benchmark
// hooks are options of RunStep.
//
// Ownership: the connected job owns the coordinator, the client, the transports, the device memory
// and the executor (executor/executor.h, built once at connect, with the staging arenas); it
// destroys the executor first, then the transports, then the client, and stops the coordinator
// last. Buffers stay the caller's: they must outlive the connected job.
//
// Thread safety: RunStep and the accessors are called from one thread at a time (the sync path);
// Abort and Heartbeats may be called from any thread, also while RunStep runs.

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/data_key.h"
#include "common/sync_progress.h"
#include "control/client.h"
#include "control/coordinator.h"
#include "executor/execute.h"
#include "executor/executor.h"
#include "executor/schedule.h"
#include "planner/layout.h"
#include "planner/plan.h"
#include "planner/relay.h"
#include "planner/waves.h"
#include "plugin/cuda_setup.h"
#include "plugin/prediction.h"
#include "plugin/settings.h"
#include "plugin/transport_setup.h"
#include "transport/selector/selector.h"

namespace wsync {

// What a process connects with. The secret is passed to Connect on its own (never stored here).
struct RuntimeConfig {
  Role role = Role::kTrainer;
  int32_t rank = 0;
  int32_t num_trainers = 0;  // Read with host_coordinator only.
  int32_t num_rollouts = 0;  // Read with host_coordinator only.
  std::string job_id;
  std::string coordinator_host = std::string(kDefaultCoordinatorHost);
  int32_t coordinator_port = 0;   // With host_coordinator: the port to listen on (0: any).
  bool host_coordinator = false;  // This process runs the job's coordinator.
  absl::Duration heartbeat_interval = absl::ZeroDuration();  // host_coordinator; 0: default.
  absl::Duration silence_limit = absl::ZeroDuration();       // host_coordinator; 0: default.
  std::string node_id;  // Empty: the host name (ControlClientOptions).
  // This process's part of its side's layout, and the address of each of its buffers (parallel to
  // part.buffers). The caller keeps the memory alive and registered with nothing else.
  Layout part;
  std::vector<void*> buffer_addresses;
  int32_t cuda_device = -1;  // The device of this process's CUDA buffers; -1: none.
  double staging_budget_bytes = static_cast<double>(kDefaultStagingBudgetBytes);
  absl::Duration deadline =
      absl::Seconds(kDefaultDeadlineSeconds);  // Of connect, and of each step's transfer.
  // The control client's connect and handshake; nullopt: `deadline`.
  std::optional<absl::Duration> control_connect_timeout;
  std::string replica_policy = std::string(kDefaultReplicaPolicy);
  PathTransports path_transports;  // UCX defaults when default-constructed.
  // Read by global process 0 only and shared through the roster (plugin/prediction.h).
  std::string calibration_file;
  RelayMode relay_mode = RelayMode::kAuto;
  // The relay decision's links: nullopt takes the calibration's fits (the bytes rule without
  // one); a value (null: the bytes rule) overrides them.
  std::optional<std::shared_ptr<const LinkFits>> relay_fits;
  VerifyMode verify = VerifyMode::kOff;
  // Delta sync (ExecuteOptions::delta): kOn on every step; kAuto per path class where the cost
  // model says it pays (plugin/prediction.h DeltaPaysBelow, from the shared calibration: without
  // one, or without its delta rates, auto stays dense); a sender's bases in host memory within
  // delta_budget_bytes (DeltaBaseStore).
  DeltaMode delta = DeltaMode::kOff;
  int64_t delta_budget_bytes = kDefaultDeltaBudgetBytes;
  NcclApiFactory nccl_api;  // Empty: the real CUDA module.
  // Where this process stands in its steps (common/sync_progress.h): RunStep and the executor
  // write it, the control client sends it with every heartbeat (`wsync status`). Owned by the
  // caller and must outlive the connected job; null: none kept, none sent.
  SyncProgress* progress = nullptr;
};

// Lets another thread abort a connect while it waits on the job: Connect attaches its control
// client while it exists and detaches it before returning. An Abort is latched: `aborted()` tells
// the caller to abort the connected job it then receives. Thread-safe.
class ConnectAbort {
 public:
  void Abort(const absl::Status& reason);
  std::optional<absl::Status> aborted() const;
  void Attach(ControlClient* client);  // nullptr detaches.
  void Reset();                        // Forgets an Abort (before a new connect).

 private:
  mutable absl::Mutex mu_;
  ControlClient* client_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::optional<absl::Status> aborted_ ABSL_GUARDED_BY(mu_);
};

struct ConnectHooks {
  // Called with the hosted coordinator's port as soon as it listens (host_coordinator only).
  std::function<void(int32_t port)> coordinator_started;
  // Called once the control client is connected and the transports started, right before the
  // join waits for the roster.
  std::function<void()> before_join;
  ConnectAbort* abort = nullptr;  // Optional.
};

// Points of a step at which RunStep calls StepOptions::on_phase.
enum class StepPhase {
  kTransfer,     // Right before the transfer's deadline is set and the transfer starts.
  kTransferred,  // Right after the transfer returned (ok or not), before the check.
  kDecide,       // After the check, before pause_before_decide.
  kVote,         // After pause_before_decide, right before the commit vote.
};

struct StepOptions {
  // The version trainer rank 0 gave (Trigger); the sync id of every message of the step.
  int64_t version = 0;
  // Not OK: this process rejects the step (no transfer; it joins the agreement with the
  // rejection, so that every process fails at once naming it, and votes no).
  absl::Status rejection;
  // Test and benchmark hooks (none in the session):
  // The transfer posts through this transport when set (it must forward to transport()): the
  // executor's per-run override (SyncRequest::transport), this step only.
  Transport* transport = nullptr;
  // After a successful transfer: its error becomes this process's vote. `check_time` is added to
  // the decision's deadline (a check outside wsync's protocol takes time of its own).
  std::function<absl::Status()> check;
  absl::Duration check_time = absl::ZeroDuration();
  absl::Duration pause_before_decide = absl::ZeroDuration();
  std::function<void(StepPhase)> on_phase;
  // A streamed sync's callback (executor/executor.h SyncRequest::after_wave): called on the
  // step's thread after each wave this process finished; its error fails the step (this process
  // votes no).
  std::function<absl::Status(int32_t wave)> after_wave;
};

struct StepResult {
  // The transfer's own result (Aborted "not run" when the step was rejected before it).
  absl::StatusOr<TransferStats> stats = absl::AbortedError("not run");
  absl::Status outcome;           // This process's result before the vote (transfer, then check).
  absl::Status decision;          // The commit decision of every process's votes.
  int64_t rejected_messages = 0;  // Stale messages the transfer dropped.
  // The step's status: the local outcome when it failed, else the decision.
  absl::Status status() const { return outcome.ok() ? decision : outcome; }
};

class ConnectedJob {
 public:
  // Connects this process: hosts the coordinator (config.host_coordinator), connects the control
  // client, starts the path transports, joins (with the calibration on global process 0), checks
  // its own roster entry, plans (kErrorLayoutRefused when the parts cannot be merged, planned or
  // scheduled), connects the CUDA buffers and the transports and registers the buffers. Every
  // blocking wait ends by config.deadline. On failure nothing is left running.
  static absl::StatusOr<std::unique_ptr<ConnectedJob>> Connect(RuntimeConfig config,
                                                               absl::string_view secret,
                                                               const ConnectHooks& hooks = {});
  ~ConnectedJob();
  ConnectedJob(const ConnectedJob&) = delete;
  ConnectedJob& operator=(const ConnectedJob&) = delete;

  // The trigger of a trainer-triggered or host-driven step: trainer rank 0's version, broadcast
  // by it (`own_version` is what this process syncs; nullopt: it only follows). DataLoss for an
  // unreadable version.
  absl::StatusOr<int64_t> Trigger(std::optional<int64_t> own_version, absl::Time deadline);
  // One sync step (see the file comment). Every process of the job calls it with the same version
  // at the same point. A failed step that aborted the NCCL communicator leaves the next step to
  // re-form it first, on every process.
  StepResult RunStep(const StepOptions& options);

  // Points buffer `id` of the part at `address` for the steps that follow: memory of the same
  // size, kind and device, holding what the old address held (an engine that released and
  // reallocated its weights, as vLLM's sleep and wake_up do). The transports' registration moves
  // with it; the plan, the schedule and the digest stay, and no other process is told: a peer
  // addresses this process's memory only through the messages and descriptors of each step.
  // InvalidArgument for a null address or an id not in the part; on any failure the binding is
  // unchanged. Sync path only, between steps.
  absl::Status RebindBuffer(uint64_t id, void* address);

  // Fails this process's waits and transfers at once with `reason`; later steps fail. Any thread.
  void Abort(const absl::Status& reason);
  // The heartbeat interval and silence limit the coordinator announced. Any thread.
  std::pair<absl::Duration, absl::Duration> Heartbeats() const;

  const RuntimeConfig& config() const { return config_; }
  int32_t process() const { return process_; }
  const Job& job() const { return *job_; }
  const Plan& plan() const { return plan_; }
  // The plan's segments by wave (planner/waves.h): one wave 0 in a job without waves.
  const std::vector<Wave>& waves() const { return waves_; }
  const ProcessSchedule& schedule() const { return schedule_; }
  const Endpoints& endpoints() const { return endpoints_; }
  const SharedCalibration& calibration() const { return calibration_; }
  const std::optional<Prediction>& prediction() const { return prediction_; }
  // delta=auto's rule from the calibration (empty: dense everywhere), and the changed fraction
  // the last committed step's senders agreed on (nullopt: none seen yet).
  const std::map<std::string, double>& delta_pays_below() const { return delta_pays_below_; }
  std::optional<double> delta_changed_fraction() const { return delta_changed_fraction_; }
  // What an encoding cost this process's sends in that step: wire bytes per dense byte per
  // changed fraction (TransferStats::delta_announced_sent_bytes; nullopt: none seen yet).
  std::optional<double> delta_encoded_per_changed() const { return delta_encoded_per_changed_; }
  // The changed fraction this process's sends saw in that step (what the next step's agreement
  // sums with the other senders'; nullopt: it compared nothing).
  std::optional<double> delta_observed_fraction() const {
    if (delta_observed_.compared_elements <= 0) return std::nullopt;
    return static_cast<double>(delta_observed_.changed_elements) /
           static_cast<double>(delta_observed_.compared_elements);
  }
  ControlClient& client() const { return *client_; }
  // Null for a replacement whose routes were refused (its first step fails with that reason).
  RoutedTransport* transport() const { return transport_.get(); }
  Coordinator* coordinator() const { return coordinator_.get(); }  // Hosted only.
  // The bytes of the staging arenas the executor keeps across steps (0 without a transport).
  int64_t arena_held_bytes() const {
    return executor_ != nullptr ? executor_->arenas().held_bytes() : 0;
  }

 private:
  explicit ConnectedJob(RuntimeConfig config) : config_(std::move(config)) {}
  absl::Status StartCoordinator(absl::string_view secret, const ConnectHooks& hooks);
  absl::Status ConnectControl(absl::string_view secret, const ConnectHooks& hooks);
  // Joins with the part and the transport addresses; plans the job from the roster. `bundles`:
  // every process's published addresses.
  absl::Status JoinAndPlan(const PathTransportSetup& setup, absl::Time deadline,
                           std::vector<std::string>* bundles);
  absl::Status PlanJob(const std::vector<Layout>& trainer_parts,
                       const std::vector<Layout>& rollout_parts);
  // Routes each peer (path class, memory kind), forms the CUDA connection when the job has CUDA
  // buffers and connects the transports.
  absl::Status ConnectTransports(PathTransportSetup setup, const std::vector<std::string>& bundles,
                                 absl::Time deadline);
  absl::Status RegisterBuffers();
  // (Re)builds executor_ over the job, its waves, the buffers, the transport and the device: at
  // connect and when a replacement's first step brings its device. None without a transport (a
  // replacement whose routes were refused: its steps fail before the transfer).
  void BuildExecutor();
  // The roster update (a replacement's addresses) and the CUDA collective, when due.
  absl::Status PrepareStep(bool* cuda_collective_failed);
  // Replaces this process's UCX workers by fresh ones (new receive FIFOs) connected to every
  // process's fresh workers, whose address bundles one AllGather exchanges; the buffers'
  // registrations move with them. Every process runs it at the same step (see
  // workers_renewal_pending_). A job without CUDA buffers only.
  absl::Status RenewWorkers(absl::Time deadline);
  absl::Status RunCudaCollective(absl::Time deadline);
  absl::Status ReplaceNcclBackend(std::unique_ptr<Transport> nccl);

  const RuntimeConfig config_;
  DataKey data_key_;  // Keyed verification's key; wiped with the job.
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<ControlClient> client_;
  std::unique_ptr<RoutedTransport> transport_;
  // Guards the transport against Abort and PeerLost while RunStep swaps its NCCL backend or its
  // UCX workers or RebindBuffer moves a registration.
  mutable absl::Mutex transport_mu_;
  // The first Abort's reason: a backend swapped in later is aborted with it too.
  std::optional<absl::Status> aborted_ ABSL_GUARDED_BY(transport_mu_);
  int32_t process_ = -1;
  std::string who_;  // "trainer 0 (process 0)": log lines (runtime_log.h).
  int64_t roster_epoch_ = 0;
  std::unique_ptr<Job> job_;
  Plan plan_;
  std::vector<Wave> waves_;
  ProcessSchedule schedule_;
  Endpoints endpoints_;
  LocalBuffers buffers_;
  // The transports' registration of each buffer (absent: the optional CUDA registration that no
  // transport of this process takes).
  std::map<uint64_t, RegistrationId> registrations_;
  SharedCalibration calibration_;
  std::optional<Prediction> prediction_;
  bool cuda_job_ = false;
  std::vector<NcclPair> nccl_pairs_;
  // The next step starts with the CUDA collective (plugin/cuda_setup.h) on every process: after
  // a failed step in a job with a communicator, after a failed collective, and at a replacement's
  // first step. Sync path only.
  bool cuda_collective_pending_ = false;
  // The next step starts with RenewWorkers on every process (a job without CUDA buffers): at the
  // step that takes a roster update on the survivors, which is a replacement's first step (it got
  // its roster at Join), and again after a renewal whose AllGather failed or in which a process
  // could not start its workers (every process sees the same gathered result). Sync path only.
  bool workers_renewal_pending_ = false;
  // A replacement's route verdict for the ConnectCuda of its first step; cleared once it ran.
  std::optional<absl::Status> cuda_deferred_;
  // Declared before executor_, whose arenas may hold device memory it allocated.
  std::unique_ptr<DeviceMemory> device_;
  // Runs each step's transfer (executor/executor.h): built once at connect (BuildExecutor), over
  // buffers_ (RebindBuffer's addresses are read by the next step), the transport and the client;
  // it owns the staging arenas every step reuses. Null without a transport. Sync path only.
  std::unique_ptr<Executor> executor_;
  // Delta sync: this process's bases as a sender (committed or aborted with each step's
  // decision), and as a rollout the version it committed last and holds unchanged: none when
  // new, after a failed step and after RebindBuffer, so that its senders send it dense. Sync path
  // only.
  std::unique_ptr<DeltaBaseStore> delta_bases_;
  std::optional<uint64_t> delta_held_;
  std::map<std::string, double> delta_pays_below_;
  // What this process's sends saw in the last committed step that compared anything, and the
  // changed fraction that step agreed on.
  DeltaObservation delta_observed_;
  std::optional<double> delta_changed_fraction_;
  std::optional<double> delta_encoded_per_changed_;
};

// Processes connected without a job, for the link calibration (calibration/): the hosted
// coordinator (when config.host_coordinator), the control client and host-memory transports routed
// by `path_class(this process, peer)`. Destroys the transport, then the client, then the
// coordinator. Not thread-safe.
struct ConnectedMesh {
  std::unique_ptr<Coordinator> coordinator;
  std::unique_ptr<ControlClient> client;
  std::unique_ptr<RoutedTransport> transport;
};

// Connects as ConnectedJob::Connect does up to the roster (its join carries no layout), with the
// same coordinator, control and path-transport settings of `config` (part, buffers, planning and
// verification are not read). Fails like it; on failure nothing is left running.
absl::StatusOr<ConnectedMesh> ConnectMesh(
    const RuntimeConfig& config, absl::string_view secret,
    const std::function<std::string(int32_t, int32_t)>& path_class);

}  // namespace wsync

#endif  // WSYNC_PLUGIN_RUNTIME_H_
