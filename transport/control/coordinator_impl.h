#ifndef WSYNC_TRANSPORT_CONTROL_COORDINATOR_IMPL_H_
#define WSYNC_TRANSPORT_CONTROL_COORDINATOR_IMPL_H_

// Private to coordinator.cc (connections, handshake, rendezvous, the serving loop) and
// coordinator_rounds.cc (collective rounds). Not part of the control library's interface.

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transport/control/auth.h"
#include "transport/control/control.pb.h"
#include "transport/control/coordinator.h"
#include "transport/control/framing.h"
#include "transport/control/protocol.h"
#include "transport/control/socket.h"

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

// Everything below runs on the serving thread, except RequestStop, counters and
// rendezvous_status (any thread, under mu_).
class Coordinator::Impl {
 public:
  Impl(CoordinatorOptions options, UniqueFd listen_fd, UniqueFd wake_fd)
      : options_(std::move(options)),
        listen_fd_(std::move(listen_fd)),
        wake_fd_(std::move(wake_fd)),
        world_(options_.num_trainers + options_.num_rollouts),
        rendezvous_deadline_(absl::Now() + options_.rendezvous_timeout) {
    processes_.resize(world_);
    for (int32_t id = 0; id < world_; ++id) {
      const bool trainer = id < options_.num_trainers;
      processes_[id].role = trainer ? ControlRole::kTrainer : ControlRole::kRollout;
      processes_[id].rank = trainer ? id : id - options_.num_trainers;
    }
  }
  ~Impl() { WipeSecret(options_.secret); }

  void Run();
  // Closes every connection (best-effort Reject). Also the serving thread's exception firewall.
  void Shutdown();
  void RequestStop() {
    stop_.store(true);
    const uint64_t one = 1;
    (void)!write(wake_fd_.get(), &one, sizeof(one));
  }
  CoordinatorCounters counters() const {
    absl::MutexLock lock(&mu_);
    return counters_;
  }
  absl::Status rendezvous_status() const {
    absl::MutexLock lock(&mu_);
    return rendezvous_status_;
  }

 private:
  enum class Phase { kHandshake, kWelcomed, kJoined };

  struct Connection {
    explicit Connection(UniqueFd socket, int64_t cap) : fd(std::move(socket)), reader(cap) {}
    UniqueFd fd;
    std::string peer;
    std::string source;  // The peer's address without its port: per-source limits count by it.
    Phase phase = Phase::kHandshake;
    std::string nonce;
    absl::Time accepted_at = absl::InfinitePast();
    absl::Time handshake_deadline = absl::InfiniteFuture();
    absl::Time frame_deadline = absl::InfiniteFuture();  // Set while a frame is incomplete.
    FrameReader reader;
    FrameWriter writer;
    int32_t process = -1;  // Bound once welcomed, until detached.
    bool closing = false;  // Reads stop; closed once the writer drains or at close_deadline.
    absl::Time close_deadline = absl::InfiniteFuture();
    bool gone = false;  // Closed at the end of this turn.
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

  // Connections.
  void AcceptAll(absl::Time now);
  void ReadFrom(Connection& c, absl::Time now);
  void OnFrame(Connection& c, control::Frame& frame, absl::Time now);
  void Send(Connection& c, const control::Frame& frame);
  void SendReject(Connection& c, const absl::Status& status);
  void Refuse(Connection& c, RefusalReason reason, const absl::Status& status, absl::Time now);
  void Drop(Connection& c, absl::string_view why);
  void Detach(Connection& c, absl::string_view why);
  // Tells every other joined process, unasked, that process `id` was lost (control.proto: Lost).
  void NoticeLoss(int32_t id);
  // Heartbeats due now, and the closing of connections silent for the limit.
  void KeepAlive(Connection& c, absl::Time now);
  // The loop woke `late` after the time it asked poll for (its own thread or host stalled):
  // silence counts only time the coordinator was there to hear, so every heartbeating
  // connection's last_heard moves forward by `late`.
  void DiscountOwnStall(absl::Duration late);
  void FlushAll();
  void Sweep(absl::Time now);
  absl::Time NextDeadline() const;
  void HandleTimers(absl::Time now);

  // Handshake and rendezvous.
  void HandleHello(Connection& c, const control::Hello& hello, absl::Time now);
  void HandleJoin(Connection& c, control::Join& join);
  void CompleteRendezvous();
  // A replacement for lost process `c.process` joined: checks its layout against the one it
  // replaces, starts it at the job's next collective, and sends the updated roster to everyone.
  void AdmitReplacement(Connection& c, control::Join& join, absl::Time now);
  void FailRendezvous(const absl::Status& status, absl::Time now);

  // Rendezvous progress (coordinator_progress.cc). NoteRefusal remembers the refusal of `c` (when
  // its Hello said who it is) before it is detached; ReportProgress sends RendezvousProgress to
  // the joined processes that asked for it when something changed and kProgressInterval passed;
  // MissingProcesses and RefusalsText describe the same for the rendezvous' own failure.
  void NoteRefusal(const Connection& c, const absl::Status& status, absl::Time now);
  // `wsync status` (coordinator_status.cc): checks the request's MAC and job, answers with the
  // StatusBody and closes the connection.
  void HandleStatusRequest(Connection& c, const control::StatusRequest& request, absl::Time now);
  control::JobStatusBody StatusBody(absl::Time now) const;
  // Keeps the progress a heartbeat of `c`'s process carries (when it is bound to one).
  void NoteProgress(const Connection& c, control::Heartbeat& heartbeat);
  // "; it last reported: transferring version 5: round 3 of 10, ..." for process `id`, or empty.
  std::string LastProgressNote(int32_t id) const;
  void ReportProgress(absl::Time now);
  absl::Time NextProgress() const;
  std::vector<std::string> MissingProcesses() const;
  std::string RefusalsText(absl::Time now) const;  // "; refused: ..." or empty.

  // Collectives.
  void HandleContribute(Connection& c, control::Contribute& contribute, absl::Time now);
  void Answer(int32_t id, uint64_t number, std::shared_ptr<const OutgoingFrame> encoded);
  void AnswerStatus(int32_t id, uint64_t number, const absl::Status& status);
  void CompleteRound(uint64_t number);
  void FailRound(uint64_t number, const absl::Status& status);
  void ExpireContributor(uint64_t number, int32_t id);
  void OnProcessLost(int32_t id);
  void EnforceRoundLimit();

  CoordinatorOptions options_;
  const UniqueFd listen_fd_;
  const UniqueFd wake_fd_;
  const int32_t world_;
  const absl::Time rendezvous_deadline_;
  std::atomic<bool> stop_{false};

  std::vector<std::unique_ptr<Connection>> connections_;
  std::vector<Process> processes_;
  int32_t joined_count_ = 0;
  bool rendezvous_done_ = false;
  bool rendezvous_failed_ = false;
  absl::Time accept_paused_until_ = absl::InfinitePast();
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

#endif  // WSYNC_TRANSPORT_CONTROL_COORDINATOR_IMPL_H_
