#ifndef WSYNC_CONTROL_CLIENT_H_
#define WSYNC_CONTROL_CLIENT_H_

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
// other process at once, unasked (control.proto: Lost). The I/O thread records them as they arrive;
// WatchLosses waits for them (loss_watch.h runs it on a thread of its own while a sync moves data).
//
// One owner of the socket: after Connect (whose handshake runs on the caller), one I/O thread of
// the client's own, from Connect to destruction, is the only thread that touches the connection.
// Calls queue their frame and wait, each until its own deadline, for their completion: the I/O
// thread writes the queued frames in the order they were queued (so the sealed channel's sequence
// numbers need no lock), reads every frame the coordinator sends, routes each Result to the call
// of its number (a late answer of a call that gave up is dropped), the roster to Join, and records
// loss notices, replacements' rosters and rendezvous progress. When the connection ends (closed,
// reset, a frame that fails authentication, a protocol error, a Reject) it fails every waiting
// call with the error naming the coordinator ("Barrier #3: lost the coordinator: connection closed
// by peer"; the first such error is kept and every later call fails with it at once), and closes.
//
// Heartbeats (coordinator.h): when the coordinator asks for them in its Welcome, the I/O thread
// sends a Heartbeat every interval while nothing else is queued (also while calls block or the
// owner moves data: a process is silent only when it is frozen or cut off), with a snapshot of
// options.progress, and when nothing at all arrived from the coordinator for the silence limit it
// closes the connection: every waiting and later call fails with Unavailable ("lost the
// coordinator: nothing arrived from it for 3.0 s"), and so does WatchLosses (LossWatch then fails
// the transfers with every peer). A stall of that thread itself (it woke later than it asked to)
// does not count as the coordinator's silence. Without heartbeats the thread still owns the
// connection and notices its end at once.
//
// Thread safety: thread-safe. Any thread may call anything at any time, also concurrently:
// collectives of concurrent calls are numbered in the order they were queued (round k is the k-th
// queued collective of every process). Abort, loss_count, LossesSince, TakeRosterUpdate and
// HasRosterUpdate never wait for the connection. Destruction fails every call still waiting (with
// Cancelled) and returns once they have returned.

#include <cstdint>
#include <deque>
#include <map>
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
#include "control/framing.h"
#include "control/protocol.h"
#include "control/socket.h"
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
  // lock) by the I/O thread and sent with every heartbeat (control.proto: Heartbeat), so that
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

  // Fails every waiting call (Cancelled), stops and joins the I/O thread (which closes the
  // connection), and returns once every waiting call returned.
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

  // The roster the coordinator sent unasked since the last take, when a replacement joined for a
  // lost process (its new transport address; Roster::epoch counts replacements); nullopt when
  // none came. The I/O thread receives it; this only hands it over.
  std::optional<Roster> TakeRosterUpdate();
  // Whether such a roster is waiting to be taken.
  bool HasRosterUpdate();

  // Fails every waiting and later call with Aborted(reason) and closes the connection, so the
  // other processes' collectives fail at once naming this process. Idempotent.
  void Abort(const absl::Status& reason);

  // Loss notices received so far (recorded by the I/O thread as they arrive), and those from
  // index `first` on, in the order they came.
  size_t loss_count() const;
  std::vector<LossNotice> LossesSince(size_t first) const;

  // Waits until `until`, until `wake_fd` (optional, -1: none) is readable, or until the I/O thread
  // recorded a loss notice or a replacement's roster or the connection became unusable, whichever
  // comes first; reads nothing itself. Errors: the connection is unusable (lost coordinator,
  // closed or silent; protocol error; Aborted after Abort), as every later call then fails.
  // Several threads may wait at once.
  absl::Status WatchLosses(absl::Time until, int wake_fd);

 private:
  // A call waiting for its reply (Join or a collective). Lives on the caller's stack; the I/O
  // thread touches it only under mu_ and only while it is registered (join_call_, calls_).
  struct Call {
    std::string name;  // Names this call in the errors of a lost connection (ends with a space).
    bool done = false;
    absl::Status status;           // With done: the call's error, or OK with its reply below.
    control::Result result;        // A collective's reply.
    std::optional<Roster> roster;  // Join's reply.
  };
  // How the connection ended before a call named it: a call named `name` fails with
  // Status(code, name + text).
  struct Ending {
    absl::StatusCode code = absl::StatusCode::kUnavailable;
    std::string text;
    absl::Status Named(absl::string_view name) const;
  };
  // Counts a public call that may wait (Join, collectives, WatchLosses) for its whole run, so that
  // destruction waits for it to return. Takes mu_.
  class Waiter;
  // The I/O thread's clock: when the coordinator was last heard and when the next beat is due.
  struct Beat {
    absl::Time heard_at;
    absl::Time next_beat;
  };

  ControlClient() = default;

  // Reads the challenge, sends the hello, checks the welcome (on the caller, before the I/O thread
  // starts). `*retry` says whether a new connection may succeed (the coordinator was busy).
  absl::Status Handshake(absl::Time deadline, bool* retry);
  // Starts the I/O thread (and its wake-up eventfd).
  absl::Status StartIo();
  // Checks a roster from the coordinator and converts it (moving its strings out of `wire`).
  // Internal (a protocol error) when it is inconsistent.
  absl::StatusOr<Roster> ReadRoster(control::Roster& wire) const;
  // Queues one numbered collective and waits for its Result (OK code) or its error.
  absl::StatusOr<control::Result> Collective(control::Contribute contribute, absl::Time deadline);
  // The error of a call named `name` once the connection is unusable, OK while it is usable:
  // Close's reason, else the first named error (which the first caller to meet an Ending names).
  absl::Status UnusableLocked(absl::string_view name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes `cause` the client's error (unless it has one) and has the I/O thread close the
  // connection. Returns the client's error.
  absl::Status BreakLocked(const absl::Status& cause) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Break(const absl::Status& cause) ABSL_LOCKS_EXCLUDED(mu_);
  // Fails every waiting and later call with `reason` (verbatim) and has the I/O thread close the
  // connection (Abort, a silent coordinator, an exception, destruction). The first reason stays.
  void Close(const absl::Status& reason) ABSL_LOCKS_EXCLUDED(mu_);
  // Wakes the I/O thread (a frame was queued, or the connection is to close).
  void WakeIo();

  // The I/O thread (client_io.cc).
  void IoLoop();
  // One turn: writes what is queued, waits for the socket, reads and routes frames, checks the
  // coordinator's silence and sends a heartbeat when due. An Ending when the connection failed.
  std::optional<Ending> IoTurn(Beat& beat);
  // Moves the queued frames to the writer (sealing them in order) and writes what the socket takes.
  std::optional<Ending> Send() ABSL_LOCKS_EXCLUDED(mu_);
  // Reads every whole frame the socket has and routes them.
  std::optional<Ending> Receive() ABSL_LOCKS_EXCLUDED(mu_);
  std::optional<Ending> RouteLocked(control::Frame& frame) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<Ending> RouteBeforeRosterLocked(control::Frame& frame)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<Ending> RecordLossLocked(const control::Lost& lost)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void QueueHeartbeat();
  // Fails every registered call (with `ending` when it is the first thing that ended the
  // connection) and wakes WatchLosses.
  void EndLocked(const std::optional<Ending>& ending) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A loss notice, a roster update or the end happened: wakes WatchLosses.
  void NotifyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string Prefix() const;

  // Immutable once Connect returns.
  ControlClientOptions options_;
  int32_t process_ = -1;
  int32_t num_trainers_ = 0;
  int32_t num_rollouts_ = 0;
  int64_t coordinator_max_frame_bytes_ = kDefaultMaxFrameBytes;
  // Agreed in the Welcome; zero: no heartbeats.
  absl::Duration heartbeat_interval_ = absl::ZeroDuration();
  absl::Duration silence_limit_ = absl::ZeroDuration();

  // The connection: Connect's until the I/O thread starts, the I/O thread's alone from then on.
  UniqueFd fd_;
  FrameReader reader_{kDefaultMaxFrameBytes};
  FrameWriter writer_;
  UniqueFd wake_fd_;  // eventfd: WakeIo.
  std::thread io_;

  mutable absl::Mutex mu_;
  // Frames queued by the calls, written by the I/O thread in this order.
  std::deque<control::Frame> outbox_ ABSL_GUARDED_BY(mu_);
  Call* join_call_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::map<uint64_t, Call*> calls_ ABSL_GUARDED_BY(mu_);  // Collectives waiting, by number.
  bool join_attempted_ ABSL_GUARDED_BY(mu_) = false;
  bool joined_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_number_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<Roster> roster_update_ ABSL_GUARDED_BY(mu_);
  // Join: the coordinator's latest RendezvousProgress and when it arrived.
  std::optional<control::RendezvousProgress> rendezvous_progress_ ABSL_GUARDED_BY(mu_);
  absl::Time rendezvous_progress_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::vector<LossNotice> losses_ ABSL_GUARDED_BY(mu_);
  uint64_t events_ ABSL_GUARDED_BY(mu_) = 0;        // Counts NotifyLocked.
  std::vector<int> watchers_ ABSL_GUARDED_BY(mu_);  // eventfds of WatchLosses calls with a wake_fd.
  absl::Status close_reason_ ABSL_GUARDED_BY(mu_);  // Close's.
  absl::Status broken_ ABSL_GUARDED_BY(mu_);        // The first named error.
  std::optional<Ending> ending_ ABSL_GUARDED_BY(mu_);
  bool finish_ ABSL_GUARDED_BY(mu_) = false;   // The I/O thread is to close the connection.
  bool stop_ ABSL_GUARDED_BY(mu_) = false;     // The destructor stops the I/O thread.
  bool io_done_ ABSL_GUARDED_BY(mu_) = false;  // The I/O thread closed the connection and left.
  int waiters_ ABSL_GUARDED_BY(mu_) = 0;       // Waiter.
};

}  // namespace wsync

#endif  // WSYNC_CONTROL_CLIENT_H_
