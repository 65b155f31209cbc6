#ifndef WSYNC_CONTROL_COORDINATOR_CORE_H_
#define WSYNC_CONTROL_COORDINATOR_CORE_H_

// The coordinator's protocol without I/O (coordinator.h describes the protocol): every decision of
// the coordinator — who is admitted or refused, when the rendezvous completes or fails, when a
// collective round completes or fails, who is lost and why (a closed connection, silence), what
// rendezvous progress and `wsync status` say — and nothing else. No sockets, no threads, no clock
// reads: the driver (Coordinator's poll loop in coordinator.cc, or a test) reports events with the
// time they happened, and takes the actions they caused, in order, with TakeActions.
//
// The driver owns, per connection, the socket, a FrameReader and a FrameWriter (framing.h); it
// decodes frames and hands them over (Received), and applies each action to the connection it
// names. The core builds and MACs the handshake's frames (auth.h) from the nonce the driver drew
// for the connection; sealing the channel after the Welcome (kSeal) is the driver's, with the
// secret of options().
//
// Thread safety: one thread at a time calls everything, except counters() and
// rendezvous_status(), which any thread may call at any time.

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "control/control.pb.h"
#include "control/coordinator.h"
#include "control/framing.h"
#include "control/protocol.h"

namespace wsync {

namespace coordinator_internal {

inline constexpr size_t kMaxListed = 32;             // Processes named in one error message.
inline constexpr size_t kMaxRememberedRefusals = 8;  // The latest refusals of identified peers.
// RendezvousProgress frames go out at most this often (and only when something changed).
inline constexpr absl::Duration kProgressInterval = absl::Milliseconds(200);

// "a, b and 3 more" (at most kMaxListed items named).
inline std::string ListOf(const std::vector<std::string>& items) {
  if (items.size() <= kMaxListed) return absl::StrJoin(items, ", ");
  std::vector<std::string> head(items.begin(), items.begin() + kMaxListed);
  return absl::StrCat(absl::StrJoin(head, ", "), " and ", items.size() - kMaxListed, " more");
}

}  // namespace coordinator_internal

// Chosen by the driver, unique for the core's lifetime; later connections get larger ids (the
// core treats a smaller id as the older connection). 0 is never a connection.
using ConnectionId = uint64_t;

struct CoordinatorAction {
  enum class Kind {
    // Queue `frame` on the connection, after everything queued before.
    kSend,
    // Queue `frame` (a Heartbeat) unless frames are still queued to the connection: anything
    // queued tells the peer as much.
    kHeartbeat,
    // The Welcome was queued: seal every frame queued from now on and open every frame read from
    // now on (channel_keys.h SealChannel with options().secret, `nonce`, `client_nonce`,
    // `process`, `peer`), and read frames of up to options().max_frame_bytes. When sealing fails,
    // report Closed(connection, its message).
    kSeal,
    // Read nothing more; close the connection once what is queued was written, or at `deadline`.
    kClose,
    // Close the connection at once; nothing more is written to it.
    kDrop,
  };
  Kind kind = Kind::kSend;
  ConnectionId connection = 0;
  std::shared_ptr<const OutgoingFrame> frame;    // kSend, kHeartbeat.
  std::string nonce, client_nonce, peer;         // kSeal.
  int32_t process = -1;                          // kSeal.
  absl::Time deadline = absl::InfiniteFuture();  // kClose.
  // kClose, kDrop: why; `refusal` when the connection was refused (and counted as such).
  std::optional<RefusalReason> refusal;
  std::string why;
};

class CoordinatorCore {
 public:
  // `options` as Coordinator::Start validated them; the rendezvous deadline counts from `start`.
  CoordinatorCore(CoordinatorOptions options, absl::Time start);
  ~CoordinatorCore();  // Wipes the secret.
  CoordinatorCore(const CoordinatorCore&) = delete;
  CoordinatorCore& operator=(const CoordinatorCore&) = delete;

  // Events. An event naming a connection the core closed or never saw is ignored.
  //
  // A connection `id` from `peer` ("10.0.0.1:4242") was accepted; `nonce` is kNonceBytes of fresh
  // randomness for its Challenge (an error refuses the connection). The core sends the Challenge,
  // or refuses the connection (rendezvous failed, too many pending: see CoordinatorOptions).
  void Opened(absl::Time now, ConnectionId id, absl::string_view peer,
              absl::StatusOr<std::string> nonce);
  // Bytes (or the end of the stream) arrived on the connection: its peer is not silent.
  void Heard(absl::Time now, ConnectionId id);
  // Part of a frame arrived: a welcomed peer must finish it within frame_timeout.
  void PartialFrame(absl::Time now, ConnectionId id);
  // A whole frame arrived: decoded, or the reader's error (Unauthenticated: its tag failed;
  // otherwise malformed).
  void Received(absl::Time now, ConnectionId id, absl::StatusOr<control::Frame> frame);
  // The reader failed (FrameReader::ReadSome's errors): ResourceExhausted (oversized) and DataLoss
  // (truncated) refuse the connection, anything else ends it ("disconnected" for Unavailable).
  void ReadFailed(absl::Time now, ConnectionId id, const absl::Status& error);
  // The driver ended the connection (a write failed, sealing failed): like a disconnection.
  void Closed(ConnectionId id, absl::string_view why);
  // Time passed: handshake, frame and silence limits, heartbeats, the rendezvous deadline,
  // rendezvous progress and contributors' deadlines due at `now`.
  void Tick(absl::Time now);
  // The driver woke `late` after NextDeadline (its thread or host stalled): silence counts only
  // time the core was there to hear, so every heartbeating connection's silence shrinks by it. A
  // check that was itself due still fails at the next Tick.
  void Stalled(absl::Duration late);
  // The coordinator stops: every open connection gets Reject(Unavailable) and is forgotten.
  void Shutdown();

  // The earliest time Tick has something to do; InfiniteFuture when nothing is due.
  absl::Time NextDeadline() const;
  // The actions caused since the last call, in order.
  std::vector<CoordinatorAction> TakeActions();

  const CoordinatorOptions& options() const { return options_; }
  CoordinatorCounters counters() const;
  // Unavailable while pending, OK once the roster was sent, else the failure every process got.
  absl::Status rendezvous_status() const;

 private:
  enum class Phase { kHandshake, kWelcomed, kJoined };

  struct Connection {
    ConnectionId id = 0;
    std::string peer;
    std::string source;  // The peer's address without its port: per-source limits count by it.
    Phase phase = Phase::kHandshake;
    std::string nonce;
    absl::Time accepted_at = absl::InfinitePast();
    absl::Time handshake_deadline = absl::InfiniteFuture();
    absl::Time frame_deadline = absl::InfiniteFuture();  // Set while a frame is incomplete.
    int32_t process = -1;                                // Bound once welcomed, until detached.
    bool open = true;      // False once closed or dropped; forgotten at the end of the event.
    bool pending = false;  // Counted in pending_ (accepted, not welcomed, open).
    // Heartbeats agreed in the handshake; then the last time anything arrived from the peer, and
    // when the next heartbeat to it is due.
    bool heartbeats = false;
    absl::Time last_heard = absl::InfiniteFuture();
    absl::Time next_heartbeat = absl::InfiniteFuture();
    // Who the Hello said it is ("rollout rank 1", before the MAC was checked; empty before a
    // Hello with a valid role), and whether it accepts RendezvousProgress frames.
    std::string claim;
    bool rendezvous_progress = false;
  };

  // A refusal of a peer that said who it is (a Hello arrived), for the waiting processes.
  struct RefusalRecord {
    absl::Time when;
    std::string text;  // "rollout rank 1 claimed by a connection from ...: was refused: ...".
  };

  struct Process {
    ControlRole role = ControlRole::kTrainer;
    int32_t rank = 0;
    std::string node_id;
    Connection* connection = nullptr;
    bool joined = false;
    bool left = false;  // Joined, then its connection ended before the roster.
    std::string manifest, address, metadata;
    bool lost = false;  // Its connection ended after the roster: it never contributes again.
    std::string lost_reason;
    uint64_t next_number = 0;
    // What its latest heartbeat reported (control.proto: Heartbeat), kept after it was lost.
    std::optional<control::SyncProgress> progress;
  };

  struct Round {
    int kind = control::COLLECTIVE_UNSPECIFIED;
    int32_t root = -1;
    int32_t first = -1;  // The first contributor, named when kinds disagree.
    int32_t count = 0;
    std::vector<uint8_t> contributed, answered;
    std::vector<absl::Time> expiry;
    std::vector<std::string> payloads;
    absl::Status failure;  // Not OK once the round failed for good.
  };

  std::string Describe(int32_t id) const {
    const Process& p = processes_[id];
    return DescribeProcess(id, p.role, p.rank, p.node_id);
  }
  void Count(RefusalReason reason) {
    absl::MutexLock lock(&mu_);
    ++counters_.refused[static_cast<int>(reason)];
  }
  Connection* Find(ConnectionId id);
  // Forgets the connections closed during an event.
  void Reap();

  // Connections.
  void OnFrame(Connection& c, control::Frame& frame, absl::Time now);
  void Send(Connection& c, const control::Frame& frame);
  void Enqueue(const Connection& c, std::shared_ptr<const OutgoingFrame> frame);
  void SendReject(Connection& c, const absl::Status& status);
  void Refuse(Connection& c, RefusalReason reason, const absl::Status& status, absl::Time now);
  // Reject is queued before; the connection closes once it was written or at close_timeout.
  void CloseAfterWrites(Connection& c, absl::Time now, std::optional<RefusalReason> refusal,
                        absl::string_view why);
  void Drop(Connection& c, absl::string_view why);
  // Both: `action` (kClose or kDrop) goes out for `c`, which is then forgotten (at the end of the
  // event) and detached from its process. Nothing when `c` already ended.
  void End(Connection& c, CoordinatorAction action, absl::string_view why);
  void Unpend(Connection& c);
  void Detach(Connection& c, absl::string_view why);
  // Closes the oldest pending connection of `source` (of any source when empty) pending for at
  // least pending_grace. False when there is none.
  bool Displace(const std::string& source, absl::Time now);
  // At the total limit, for a new connection from a source with `same_source` pending ones: when
  // another source holds more, closes the oldest pending connection of a source holding the most,
  // whatever its age. False when no source holds more.
  bool DisplaceLargestShare(int32_t same_source);
  // Tells every other joined process, unasked, that process `id` was lost (control.proto: Lost).
  void NoticeLoss(int32_t id);
  // Heartbeats due now, and the closing of connections silent for the limit.
  void KeepAlive(Connection& c, absl::Time now);

  // Handshake and rendezvous.
  void HandleHello(Connection& c, const control::Hello& hello, absl::Time now);
  // Binds `c` to its process and sends the Welcome (then kSeal).
  void Welcome(Connection& c, const control::Hello& hello, int32_t id, absl::Time now);
  void HandleJoin(Connection& c, control::Join& join, absl::Time now);
  void CompleteRendezvous(absl::Time now);
  // A replacement for lost process `c.process` joined: checks its layout against the one it
  // replaces, starts it at the job's next collective, and sends the updated roster to everyone.
  void AdmitReplacement(Connection& c, control::Join& join, absl::Time now);
  void FailRendezvous(const absl::Status& status, absl::Time now);

  // Rendezvous progress (coordinator_progress.cc). NoteRefusal remembers the refusal of `c` (when
  // its Hello said who it is) before it is detached; ReportProgress sends RendezvousProgress to
  // the joined processes that asked for it when something changed and kProgressInterval passed;
  // MissingProcesses and RefusalsText describe the same for the rendezvous' own failure.
  void NoteRefusal(const Connection& c, const absl::Status& status, absl::Time now);
  void ReportProgress(absl::Time now);
  absl::Time NextProgress() const;
  std::vector<std::string> MissingProcesses() const;
  std::string RefusalsText(absl::Time now) const;  // "; refused: ..." or empty.

  // `wsync status` (coordinator_status.cc): checks the request's MAC and job, answers with the
  // StatusBody and closes the connection.
  void HandleStatusRequest(Connection& c, const control::StatusRequest& request, absl::Time now);
  control::JobStatusBody StatusBody(absl::Time now) const;
  // Keeps the progress a heartbeat of `c`'s process carries (when it is bound to one).
  void NoteProgress(const Connection& c, control::Heartbeat& heartbeat);
  // "; it last reported: transferring version 5: round 3 of 10, ..." for process `id`, or empty.
  std::string LastProgressNote(int32_t id) const;

  // Collectives (coordinator_rounds.cc).
  void HandleContribute(Connection& c, control::Contribute& contribute, absl::Time now);
  // The contribution's bounds; false when `c` was refused.
  bool AdmitContribution(Connection& c, const control::Contribute& contribute, absl::Time now);
  void Answer(int32_t id, uint64_t number, std::shared_ptr<const OutgoingFrame> encoded);
  void AnswerStatus(int32_t id, uint64_t number, const absl::Status& status);
  void CompleteRound(uint64_t number);
  void FailRound(uint64_t number, const absl::Status& status);
  void ExpireContributor(uint64_t number, int32_t id);
  void OnProcessLost(int32_t id);
  void EnforceRoundLimit();

  CoordinatorOptions options_;
  const int32_t world_;
  const absl::Time rendezvous_deadline_;
  std::vector<CoordinatorAction> actions_;

  std::map<ConnectionId, Connection> connections_;  // Oldest first; node addresses are stable.
  std::set<ConnectionId> pending_;                  // Accepted, not welcomed, open; oldest first.
  absl::flat_hash_map<std::string, int32_t> pending_per_source_;
  bool reap_ = false;  // Some connection was closed during this event.
  std::vector<Process> processes_;
  int32_t joined_count_ = 0;
  bool rendezvous_done_ = false;
  bool rendezvous_failed_ = false;
  std::deque<RefusalRecord> refusals_;  // Oldest first, at most kMaxRememberedRefusals.
  bool progress_changed_ = false;       // Since the last RendezvousProgress.
  absl::Time next_progress_ = absl::InfinitePast();

  std::map<uint64_t, Round> rounds_;
  std::set<std::tuple<absl::Time, uint64_t, int32_t>> expiries_;  // (when, round, process).
  uint64_t forgotten_below_ = 0;  // Rounds below this number were failed and dropped.
  control::Roster roster_;        // As sent at the rendezvous, with every replacement since.

  mutable absl::Mutex mu_;
  CoordinatorCounters counters_ ABSL_GUARDED_BY(mu_);
  absl::Status rendezvous_status_ ABSL_GUARDED_BY(mu_) =
      absl::UnavailableError("control: the rendezvous is pending");
};

}  // namespace wsync

#endif  // WSYNC_CONTROL_COORDINATOR_CORE_H_
