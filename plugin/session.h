#ifndef WSYNC_PLUGIN_SESSION_H_
#define WSYNC_PLUGIN_SESSION_H_

// The session of one process of a job: the state machine behind the C ABI (include/wsync/wsync.h
// states the states and what each call may do), over the per-process runtime (plugin/runtime.h):
// it keeps the layout until Connect, the connected job after it, the metrics, and, in the
// trainer-triggered mode, the background thread.
//
// One sync, on every process: (1) trainer rank 0 broadcasts the version (the trigger), every
// process checks it against its own when it called Sync itself; (2) ExecuteTransfers, which first
// agrees on the plan digest and budget; (3) every process votes in the commit decision. A rollout
// becomes consistent at the version only when every process voted ok; otherwise it is dirty.
//
// Errors: wrong-state calls are FailedPrecondition with the error kind kErrorWrongState; layouts
// that cannot be merged, validated, planned or scheduled at Connect carry kErrorLayoutRefused;
// processes that disagree (plan digest, budget, version, a rejection) carry kErrorRanksDisagree
// (see WithErrorKind in common/status.h). Other errors keep their codes: DeadlineExceeded,
// Unavailable (a peer or the coordinator lost), Aborted, Unauthenticated, Unimplemented.
//
// Thread safety: calls are serialized by the caller, except Abort, LastError, State, Stats,
// Progress and the metrics (MetricsText, metrics_port, metrics_url), which any thread may call.
//
// Metrics (metrics/metrics.h): every sync records its result, duration, rounds, bytes by path
// class and transport (bound once at connect from this process's schedule), direct, staged and
// local-copy bytes and arena bytes; every state change publishes the version and state; failed
// connects and syncs count by error kind. With metrics_address set, Create starts the exporter and
// Finalize stops it.

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/data_key.h"
#include "common/sync_progress.h"
#include "control/auth.h"
#include "control/coordinator.h"
#include "executor/delta_base.h"
#include "executor/execute.h"
#include "metrics/metrics.h"
#include "planner/layout.h"
#include "planner/plan.h"
#include "plugin/cuda_setup.h"
#include "plugin/local_layout.h"
#include "plugin/prediction.h"
#include "plugin/runtime.h"
#include "plugin/settings.h"
#include "plugin/transport_setup.h"

namespace wsync {

struct SessionConfig {
  Role role = Role::kTrainer;
  int32_t rank = 0;
  int32_t num_trainers = 0;
  int32_t num_rollouts = 0;
  std::string job_id;
  std::string coordinator_host = std::string(kDefaultCoordinatorHost);
  int32_t coordinator_port = 0;
  bool host_coordinator = false;  // Trainer rank 0 runs the coordinator in-process.
  SecretSource secret = SecretSource::Environment(std::string(kDefaultSecretEnv));
  std::string node_id;  // Empty: the host name.
  // This process's GPU on its node (ProcessInfo::device); kUnknownDevice: unknown.
  int32_t device = kUnknownDevice;
  double staging_budget_bytes = static_cast<double>(kDefaultStagingBudgetBytes);
  absl::Duration deadline = absl::Seconds(kDefaultDeadlineSeconds);
  std::string replica_policy = std::string(kDefaultReplicaPolicy);
  std::string path_transports;  // ParsePathTransports syntax; empty: UCX defaults.
  // Where the Prometheus exporter listens (ParseMetricsAddress: "HOST:PORT", port 0 picks one);
  // empty: no exporter (the metrics text is still kept).
  std::string metrics_address;
  // Whether metrics_address may be a wildcard (every interface, MetricsAddress).
  bool metrics_allow_any_address = false;
  // A calibration (wsync calibrate --out), read by global process 0 only and shared with every
  // process at connect (plugin/prediction.h); empty: none. Needed by replica_policy "cost_aware";
  // gives the schedule report and the predicted-seconds metric their prediction.
  std::string calibration_file;
  // End-to-end integrity of every sync (ExecuteOptions::verify, executor/verify.h); kKeyed
  // uses the data key derived from the secret at connect.
  VerifyMode verify = VerifyMode::kOff;
  // Delta sync (executor/delta_run.h; RuntimeConfig::delta): kOn moves only the elements changed
  // since the version a rollout holds; kAuto where the calibration's cost model says it pays
  // (plugin/prediction.h DeltaPaysBelow; dense without a calibration measuring its rates).
  DeltaMode delta = DeltaMode::kOff;
  // With delta: the byte budget of a sender's bases (RuntimeConfig::delta_budget_bytes).
  int64_t delta_budget_bytes = kDefaultDeltaBudgetBytes;
  // The hosted coordinator's heartbeats (host_coordinator only; docs/control_plane.md):
  // zero takes its default (kDefaultHeartbeatInterval, kDefaultSilenceLimit); the interval is at
  // least 1 ms and the silence limit at least twice the interval (Create refuses others with
  // InvalidArgument).
  absl::Duration heartbeat_interval = absl::ZeroDuration();
  absl::Duration silence_limit = absl::ZeroDuration();
  // The CUDA runtime and NCCL calls of a job with CUDA buffers (plugin/cuda_setup.h); empty: the
  // real libraries. Tests pass a fake.
  NcclApiFactory nccl_api;
};

enum class SessionState : int { kRegistered = 1, kConnected, kIdle, kSyncing, kDirty, kFinalized };
absl::string_view SessionStateName(SessionState state);

class Session {
 public:
  // Validates the configuration and loads the secret. Starts nothing.
  static absl::StatusOr<std::unique_ptr<Session>> Create(SessionConfig config);
  // Finalize()s.
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Layout of this process; REGISTERED only (else FailedPrecondition with kErrorWrongState), then
  // forwarded to the session's LocalLayoutBuilder: local_layout.h states what each call declares,
  // how SetManifest and SetNamedLayout place the process, and each refusal.
  absl::Status RegisterBuffer(uint64_t id, void* address, int64_t bytes, MemoryKind kind,
                              int32_t device);
  absl::Status DeclareParameter(const std::string& name, DType dtype, const Dims& shape);
  absl::Status DeclarePiece(const std::string& parameter, uint64_t buffer, const Box& box,
                            int64_t offset, const Dims& strides);
  absl::Status DeclareFp8Parameter(const std::string& name, const ParamQuant& quant,
                                   DType scale_dtype, const Dims& scale_shape);
  absl::Status SetManifest(absl::string_view bytes);
  absl::Status SetNamedLayout(const std::string& model, const std::string& layout);
  using BeforeUpdate = std::function<void(int64_t version)>;
  using AfterUpdate = std::function<void(int64_t version, const absl::Status& status)>;
  absl::Status SetUpdateCallbacks(BeforeUpdate before, AfterUpdate after);
  // Streamed syncs (wsync.h, set_parameter_wave): REGISTERED only, then forwarded to
  // LocalLayoutBuilder::SetParameterWave.
  absl::Status SetParameterWave(const std::string& name, int32_t wave);
  // Called on the sync's thread after each wave this process finished (executor/waves.h); its
  // error fails the sync (this process votes no). REGISTERED only; empty: none.
  using AfterWave = std::function<absl::Status(int64_t version, int32_t wave)>;
  absl::Status SetWaveCallback(AfterWave after_wave);
  // Buffer `id` moved to `address` (same size, kind and device; ConnectedJob::RebindBuffer):
  // IDLE or DIRTY, host-driven sessions only (a trainer-triggered one may start a sync at any
  // moment), else FailedPrecondition with kErrorWrongState.
  absl::Status RebindBuffer(uint64_t id, void* address);

  // The layout part declared so far (after SetNamedLayout: that layout's part of this rank).
  const Layout& part() const { return layout_.part(); }
  // Host coordinator only: the port it listens on, once Connect started it (0 before, and
  // without host_coordinator). Any thread, also while Connect waits for the job.
  int32_t coordinator_port() const { return coordinator_port_.load(std::memory_order_acquire); }
  // The heartbeat interval and silence limit the job's coordinator announced to this process
  // (zero: none; both zero before Connect). Any thread.
  std::pair<absl::Duration, absl::Duration> CoordinatorHeartbeats() const;
  // The metrics exporter's port (Create starts it when metrics_address is set; 0: none) and URL.
  int32_t metrics_port() const { return metrics_->exporter_port(); }
  std::string metrics_url() const { return metrics_->exporter_url(); }
  // The Prometheus text exposition of this session's metrics (metrics/metrics.h lists them).
  std::string MetricsText() const { return metrics_->Text(); }

  absl::Status Connect();
  absl::StatusOr<std::string> ScheduleReport() const;

  absl::Status Sync(int64_t version);
  absl::Status SyncBegin(int64_t version);
  // nullopt while the sync started by SyncBegin runs; then its outcome (once).
  std::optional<absl::Status> SyncTest();

  void Abort(const absl::Status& reason);
  std::pair<int64_t, SessionState> State() const;
  // What the last successful transfer of this process did, and its version (-1 before any).
  struct SyncStats {
    int64_t version = -1;
    TransferStats stats;
  };
  SyncStats LastStats() const;
  // Where this process stands in its current sync (or its last one: idle). Any thread; relaxed
  // reads, no lock (common/sync_progress.h). Also sent to the coordinator with every heartbeat.
  SyncProgressSnapshot Progress() const { return progress_.Read(); }
  std::string LastError() const;
  // Records the message of `status` as the session's last error when it is not OK; returns it.
  absl::Status Remember(absl::Status status) const;

  // Ends the session: stops the background thread, closes the control client and the transport,
  // releases registrations and arenas. Idempotent.
  void Finalize();

 private:
  explicit Session(SessionConfig config, std::string secret);
  absl::Status RequireState(SessionState wanted, absl::string_view call) const;
  absl::Status ConnectOnce();
  // The runtime's configuration of this session (plugin/runtime.h).
  absl::StatusOr<RuntimeConfig> MakeRuntimeConfig() const;
  // Stops and releases the connected job (its transports, control client and coordinator).
  void DropConnection();
  absl::Status RunStep(std::optional<int64_t> own_version);  // One sync; see the class comment.
  void BackgroundLoop();
  // BackgroundLoop after a sync failed with Unavailable: true to go on with the next sync (a
  // replacement for every process lost so far joined, or none was lost), false to end (the
  // session finalizes, or the control connection is gone). While a lost process is not replaced,
  // this rollout takes part in no collective, so that its numbering does not run ahead of the
  // trainers' (it catches up through the rounds they failed meanwhile, which fail at once).
  bool AwaitReplacement();
  // The exception firewall of the session's threads and of the host's sync, called inside their
  // catch blocks: the
  // exception as a status (bad_alloc: ResourceExhausted, else Internal, naming `thread`), the
  // session aborted with it (peers fail at once; later syncs fail with it), the state DIRTY
  // (rollouts) or IDLE (trainers), the error remembered. Returns the status.
  absl::Status ThreadFailed(absl::string_view thread);
  void SetState(SessionState state, std::optional<int64_t> version = std::nullopt);
  // Metrics: binds the byte counters of this process's schedule (at connect); records one sync
  // (after its decision); publishes the version and state.
  void BindMetrics();
  void RecordSyncMetrics(const absl::StatusOr<TransferStats>& stats, const absl::Status& outcome,
                         double seconds);
  void PublishState();

  SessionConfig config_;
  // The job secret, from `config.secret` at Create; wiped (WipeSecret) once Connect succeeded and
  // at destruction. A hosted coordinator and the control client keep copies of their own.
  std::string secret_;
  // The layout until Connect (and the buffers' addresses as rebind_buffer moves them): the
  // layout calls check the state and forward to it. Caller's thread only.
  LocalLayoutBuilder layout_;

  // Set by Connect and released by DropConnection, both under handles_mu_ on the caller's thread
  // (or in Finalize once the sync threads ended); Abort reads it under handles_mu_ from any
  // thread. The sync path uses it without the lock: only those two functions change it.
  mutable absl::Mutex handles_mu_;
  // Written by the sync path (and the executor), read by the control client's I/O thread (for
  // heartbeats) and by Progress; declared before connected_, whose control client reads it until
  // destroyed.
  SyncProgress progress_;
  std::unique_ptr<ConnectedJob> connected_;
  // Aborts a Connect in progress (Abort from another thread while it waits on the job).
  ConnectAbort connect_abort_;
  std::atomic<int32_t> coordinator_port_{0};
  BeforeUpdate before_update_;
  AfterUpdate after_update_;
  AfterWave after_wave_;  // Set in REGISTERED, read by the sync path.
  // The version whose before_update was called and whose after_update is still owed (background
  // thread only): a step ended by an exception still tells the engine its outcome.
  std::optional<int64_t> after_update_owed_;
  size_t losses_replaced_ = 0;      // Loss notices answered by a replacement (background thread).
  bool trainer_triggered_ = false;  // set_update_callbacks was called: the background thread runs.
  std::thread background_;
  std::thread sync_thread_;
  std::optional<absl::Status> sync_outcome_;  // Set by the SyncBegin thread when it ends.
  std::atomic<bool> sync_done_{false};
  std::atomic<bool> finalizing_{false};
  std::unique_ptr<SessionMetrics> metrics_;  // Set by the constructor; never null.
  // What one sync sends and receives in place and through arenas, by direction (send, receive):
  // from the schedule at connect. Written by Connect, read by the sync path.
  int64_t direct_bytes_[2] = {0, 0};
  int64_t staged_bytes_[2] = {0, 0};
  // The path byte series of each path class's host traffic (PathClassIndex), for [send, receive]
  // (nullopt: no such traffic): where a delta sync's savings come off the planned bytes. Written
  // by Connect, read by the sync path.
  std::optional<SessionMetrics::PathBytes> class_paths_[kPathClassCount][2];
  int64_t arena_peak_bytes_ = 0;  // The largest peak_arena_bytes of any sync; sync path only.

  mutable absl::Mutex mu_;
  SessionState state_ ABSL_GUARDED_BY(mu_) = SessionState::kRegistered;
  int64_t version_ ABSL_GUARDED_BY(mu_) = -1;
  TransferStats last_stats_ ABSL_GUARDED_BY(mu_);
  int64_t last_stats_version_ ABSL_GUARDED_BY(mu_) = -1;
  mutable std::string last_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace wsync

#endif  // WSYNC_PLUGIN_SESSION_H_
