#ifndef WSYNC_TRANSPORT_CONTROL_CLIENT_H_
#define WSYNC_TRANSPORT_CONTROL_CLIENT_H_

// One process's connection to the job's coordinator (coordinator.h): the authenticated handshake,
// the rendezvous (Join -> Roster), and small collectives relayed by the coordinator. Implements
// wsync::Group.
//
// Collectives (AllGather, Broadcast, Barrier, Decide) share one numbering: the k-th call of every
// process forms round k, and a call that fails still uses its number. Every call waits at most
// until its deadline. Errors:
//   DeadlineExceeded  the round did not complete in time; names the processes that had not
//                     contributed (or says that the coordinator did not answer at all)
//   Unavailable       a process left the job (named), or the coordinator connection ended
//   InvalidArgument   processes called different collectives (or roots) in the same round
//   Aborted           Decide: a process said not ok (the first one, named with its reason, decides
//                     for everyone at once); or Abort
//   ResourceExhausted a payload or a gathered result above the frame cap
// A call that finds the connection broken (closed, refused, protocol error) fails at once with
// that error; the client is then finished. A frame from the coordinator that fails authentication
// (forged, replayed, reordered: auth.h) is Unauthenticated naming the coordinator, and the client
// closes the connection at once. Error messages never contain the secret.
//
// Loss notices: once a process's connection ends after the rendezvous, the coordinator tells every
// other process at once, unasked (control.proto: Lost). Calls record the notices they read on the
// way; between calls WatchLosses reads them (loss_watch.h runs it on a thread of its own while a
// sync moves data).
//
// Heartbeats (coordinator.h): when the coordinator asks for them in its Welcome, the client runs a
// thread of its own from Connect to destruction. It sends a Heartbeat every interval (also while a
// call blocks or the owner moves data: a process is silent only when it is frozen or cut off),
// reads what the coordinator sends unasked while no call holds the connection (loss notices are
// recorded at once), and when nothing at all arrived from the coordinator for the silence limit it
// closes the connection: the call in progress and every later one fail with Unavailable ("lost the
// coordinator: nothing arrived from it for 3.0 s"), and so does WatchLosses (LossWatch then fails
// the transfers with every peer). A stall of that thread itself (it woke later than it asked to)
// does not count as the coordinator's silence.
//
// Thread safety: one call at a time (thread-compatible), except Abort, which any thread may call
// at any time, loss_count and LossesSince (any thread), and WatchLosses, which one other thread
// may run while a call is in progress (it then leaves the connection to the call). The client owns
// its socket; the heartbeat thread writes to it only between the calls' frames and reads only
// while no call holds the connection.

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/sync_progress.h"
#include "transport/control/framing.h"
#include "transport/control/protocol.h"
#include "transport/control/socket.h"
#include "transport/transport.h"

namespace wsync {

// How long after a sync's deadline its commit decision (Decide) may still complete: a process
// whose transfer failed at the deadline still votes and learns the outcome, and the whole failed
// sync ends within D + kDecisionGrace of its start (the promise is D + 2 s).
inline constexpr absl::Duration kDecisionGrace = absl::Seconds(1);

struct ControlClientOptions {
  std::string coordinator_host = "127.0.0.1";  // A literal address or a host name.
  int coordinator_port = 0;
  std::string job_id;
  ControlRole role = ControlRole::kTrainer;
  int32_t rank = 0;
  std::string node_id;  // Empty: this machine's host name.
  std::string secret;   // See LoadSecret. The client keeps a copy, wiped on destruction.
  // Connecting (refused connections are retried: the coordinator may start later) plus the
  // handshake.
  absl::Duration connect_timeout = absl::Seconds(60);
  int64_t max_frame_bytes = kDefaultMaxFrameBytes;  // Cap on frames this client reads.
  // Offer heartbeats in the Hello (see the class comment). False: behave as a client from before
  // heartbeats (none sent, none expected, never timed out by the coordinator).
  bool heartbeats = true;
  // Ask for RendezvousProgress frames in the Hello (control.proto), so that Join's timeout names
  // who joined, who is missing and who was refused. False: behave as a client from before them.
  bool rendezvous_progress = true;
  // Optional, caller-owned, outlives the client: this process's sync progress, read (relaxed, no
  // lock) by the heartbeat thread and sent with every heartbeat (control.proto: Heartbeat), so that
  // `wsync status` shows it. Null: heartbeats carry none.
  const SyncProgress* progress = nullptr;
};

struct JoinRequest {
  std::string manifest;  // Serialized wsync.proto.Manifest of this process (opaque here).
  std::string address;   // Transport address of this process (opaque here).
  std::string metadata;  // Plan or layout metadata (opaque here).
};

struct RosterEntry {
  int32_t process = 0;
  ControlRole role = ControlRole::kTrainer;
  int32_t rank = 0;
  std::string node_id;
  int32_t manifest_blob = 0;  // Index into Roster::blobs.
  int32_t metadata_blob = 0;  // Index into Roster::blobs.
  std::string address;
};

// Every process's join data, indexed by global process id. Equal manifests (and metadata) of
// several processes are stored once in `blobs`.
struct Roster {
  int32_t num_trainers = 0;
  int32_t num_rollouts = 0;
  std::vector<RosterEntry> processes;
  std::vector<std::string> blobs;
  uint64_t epoch = 0;  // Replacements admitted before this roster was sent.

  int32_t size() const { return static_cast<int32_t>(processes.size()); }
  const std::string& manifest(int32_t process) const {
    return blobs[processes[process].manifest_blob];
  }
  const std::string& metadata(int32_t process) const {
    return blobs[processes[process].metadata_blob];
  }
};

// A process the coordinator reported lost: its global id and the coordinator's text ("process 3
// (rollout rank 1, node n) was lost: disconnected").
struct LossNotice {
  int32_t process = 0;
  std::string reason;
};

class ControlClient : public Group {
 public:
  // Connects and authenticates. InvalidArgument for bad options; Unauthenticated when the
  // coordinator refuses the secret or cannot prove it holds it; the coordinator's reason for any
  // other refusal (unknown job, rank out of range, duplicate rank...); DeadlineExceeded when no
  // handshake completed within connect_timeout.
  static absl::StatusOr<std::unique_ptr<ControlClient>> Connect(ControlClientOptions options);

  // Stops and joins the heartbeat thread, then closes the connection.
  ~ControlClient() override;
  ControlClient(const ControlClient&) = delete;
  ControlClient& operator=(const ControlClient&) = delete;

  // Valid from Connect on.
  int32_t process() const override { return process_; }
  int32_t size() const override { return num_trainers_ + num_rollouts_; }
  int32_t num_trainers() const { return num_trainers_; }
  int32_t num_rollouts() const { return num_rollouts_; }
  // The coordinator's heartbeat interval and silence limit from its Welcome (zero: no heartbeats).
  absl::Duration heartbeat_interval() const { return heartbeat_interval_; }
  absl::Duration silence_limit() const { return silence_limit_; }

  // Sends this process's join data and waits for everyone's. Once per client (FailedPrecondition
  // otherwise). DeadlineExceeded listing the missing (role, rank)s and the refused connections
  // when the coordinator's rendezvous deadline passed first; when `deadline` did, DeadlineExceeded
  // with the coordinator's latest RendezvousProgress (who joined, who is missing, who was refused
  // and how long ago; rendezvous_progress.h), or saying that none came.
  absl::StatusOr<Roster> Join(const JoinRequest& request, absl::Time deadline);

  // Group: all payloads indexed by process.
  absl::StatusOr<std::vector<std::string>> AllGather(absl::string_view payload,
                                                     absl::Time deadline) override;
  // The root's payload on every process; `payload` is ignored on the others.
  absl::StatusOr<std::string> Broadcast(int32_t root, absl::string_view payload,
                                        absl::Time deadline);
  absl::Status Barrier(absl::Time deadline);
  // The per-step commit decision: OK only when every process said ok; otherwise Aborted naming the
  // first process that did not, with its reason (every process gets the same answer, at once).
  // `reason` (used when !ok) is cut to kMaxReasonBytes.
  absl::Status Decide(bool ok, absl::string_view reason, absl::Time deadline);

  // The roster the coordinator sent unasked since the last call, when a replacement joined for a
  // lost process (its new transport address; Roster::epoch counts replacements); nullopt when
  // none came. Collectives receive it; this only hands it over.
  std::optional<Roster> TakeRosterUpdate();
  // Whether such a roster is waiting to be taken. Any thread.
  bool HasRosterUpdate();

  // Fails the current and every later call with Aborted(reason) and closes the connection, so the
  // other processes' collectives fail at once naming this process. Idempotent; any thread.
  void Abort(const absl::Status& reason);

  // Loss notices received so far (by calls, WatchLosses or the heartbeat thread), and those from
  // index `first` on, in the order they came. Any thread.
  size_t loss_count() const;
  std::vector<LossNotice> LossesSince(size_t first) const;

  // Waits until `until`, until `wake_fd` (optional, -1: none) is readable, until the coordinator
  // sent something, or until the heartbeat thread recorded a loss notice, and reads what the
  // coordinator sent unasked: loss notices (recorded), rosters of replacements (TakeRosterUpdate),
  // late answers of earlier calls (dropped), heartbeats. When a call is in progress it reads
  // nothing (the call records the notices). Errors: the connection is unusable (lost coordinator,
  // closed or silent; protocol error; Aborted after Abort); later calls then fail the same way.
  // Reads nothing before Join succeeded. May run on another thread than the calls (see the class
  // comment).
  absl::Status WatchLosses(absl::Time until, int wake_fd);

 private:
  ControlClient() = default;

  // Reads the challenge, sends the hello, checks the welcome. `*retry` says whether a new
  // connection may succeed (the coordinator was busy).
  absl::Status Handshake(absl::Time deadline, bool* retry);
  // Checks a roster from the coordinator and converts it (moving its strings out of `wire`).
  absl::StatusOr<Roster> ReadRoster(control::Roster& wire);
  // Runs one numbered collective and returns its Result (OK code) or its error.
  absl::StatusOr<control::Result> Collective(control::Contribute contribute, absl::Time deadline);
  // The error to return once the connection is unusable: Abort's reason if aborted, else `cause`
  // (remembered for later calls).
  absl::Status Broken(const absl::Status& cause);
  // Reads every whole frame the socket has now (io_mu_ held, no call in progress): see WatchLosses.
  absl::Status ReadUnasked();
  // Records a Lost frame; a protocol error (Broken) for a process out of range or an oversized
  // reason.
  absl::Status RecordLoss(const control::Lost& lost);
  // Fails the current and every later call with `reason` and shuts the socket down (Abort, and a
  // silent coordinator). The first reason stays.
  void Close(const absl::Status& reason);
  // The heartbeat thread (see the class comment) and its sending step.
  void KeepAlive();
  void SendHeartbeat();
  std::string Prefix() const;

  ControlClientOptions options_;
  UniqueFd fd_;
  FrameReader reader_{kDefaultMaxFrameBytes};
  FrameWriter writer_;
  int32_t process_ = -1;
  int32_t num_trainers_ = 0;
  int32_t num_rollouts_ = 0;
  int64_t coordinator_max_frame_bytes_ = kDefaultMaxFrameBytes;
  bool joined_ = false;
  bool join_attempted_ = false;
  uint64_t next_number_ = 0;
  std::optional<Roster> roster_update_;
  // Join: the coordinator's latest RendezvousProgress and when it arrived.
  std::optional<control::RendezvousProgress> rendezvous_progress_;
  absl::Time rendezvous_progress_at_ = absl::InfinitePast();
  absl::Status broken_;
  // Agreed in the Welcome; zero: no heartbeats.
  absl::Duration heartbeat_interval_ = absl::ZeroDuration();
  absl::Duration silence_limit_ = absl::ZeroDuration();

  // Held by every call for its whole run, and by WatchLosses and the heartbeat thread while they
  // read (so the connection's reader and the fields above have one user at a time).
  absl::Mutex io_mu_;
  // Held while writing writer_ to the socket: by a call (inside io_mu_) for each frame it sends,
  // and by the heartbeat thread (TryLock only) for a heartbeat, so frames never interleave. Frames
  // are sealed (given their sequence numbers) as they are queued, under this lock, so the numbers
  // follow the order on the wire.
  absl::Mutex write_mu_;

  // Bytes received from the coordinator (reader_'s progress counter), sampled by the heartbeat
  // thread to see that the coordinator is alive.
  std::atomic<int64_t> bytes_heard_{0};
  UniqueFd stop_fd_;    // eventfd: the destructor stops the heartbeat thread.
  UniqueFd notice_fd_;  // eventfd: the heartbeat thread recorded a loss notice (wakes WatchLosses).
  std::thread keepalive_;

  mutable absl::Mutex loss_mu_;
  std::vector<LossNotice> losses_ ABSL_GUARDED_BY(loss_mu_);

  std::atomic<bool> closed_{false};  // By Close: Abort or a silent coordinator.
  mutable absl::Mutex close_mu_;
  absl::Status close_reason_ ABSL_GUARDED_BY(close_mu_);
};

}  // namespace wsync

#endif  // WSYNC_TRANSPORT_CONTROL_CLIENT_H_
