#ifndef WSYNC_CONTROL_COORDINATOR_H_
#define WSYNC_CONTROL_COORDINATOR_H_

// The control-plane coordinator of one job: authenticates each process, gathers the processes'
// manifests and transport addresses into a roster, and relays small collectives (star topology).
//
// Protocol per connection (frames of control.proto, see framing.h):
//   coordinator: Challenge{fresh nonce}      client: Hello{job, role, rank, node, HelloMac}
//   coordinator: Welcome{process, WelcomeMac} or Reject{reason} and close
//   client: Join{manifest, address, metadata}
//   coordinator, once all num_trainers + num_rollouts processes joined: Roster to every process
//   then any number of: client Contribute{number k} -> coordinator Result{number k}
//
// Refusals (the connection gets Reject{reason} and is closed; the coordinator keeps serving the
// others, and counts each by RefusalReason): wrong HMAC ("authentication failed", nothing more),
// unknown job id, rank out of range, duplicate rank, bad enum or field, protocol version, oversized
// / truncated / malformed / unexpected frame, a handshake not done within handshake_timeout,
// too many connections still in their handshake, and any Hello once the rendezvous is over or has
// failed. Frames before the Welcome are capped at max_handshake_frame_bytes, so an
// unauthenticated peer never makes the coordinator hold more than that.
//
// Rendezvous: if not every process joined within rendezvous_timeout of Start, every connected
// process gets Reject(DeadlineExceeded) listing the missing (role, rank)s, and the job is over. A
// process that leaves before the roster frees its rank for a new connection.
//
// Replacement: after the roster, a process whose connection ended (lost) may be replaced by a new
// one of the same role and rank (authenticated like any other) whose Join carries the same
// manifest: it gets the roster with its new address and the number of the job's next collective,
// and every other live process gets the same roster unasked, so that it can reach the new
// address. From then on rounds wait for it again. A different manifest is refused.
//
// Collectives: the k-th Contribute of every process forms round k. The round completes when all
// processes contributed; then each gets the Result. When a contributor's timeout_ms passes first
// the round fails for everyone with DeadlineExceeded naming the processes still missing, and a
// process that contributes to it later gets that failure at once, so every process sees the same
// outcome of every round and all stay in step. A Decide fails (Aborted) as soon as one process
// says not ok, naming it and its reason to every process. A process whose connection ends after the
// roster is lost for good (the job cannot complete another round with it): every other joined
// process gets a Lost notice at once, unasked ("process 3 (rollout rank 1, node n) was lost:
// disconnected"), so that one moving data with it can stop waiting; every open round, and every
// later one, fails at once (Unavailable) naming it. Calls of different kinds (or Broadcast
// roots) in one round fail the round for all. At most max_open_rounds rounds are kept; the oldest
// is then failed and forgotten.
//
// Heartbeats: a process whose Hello offers them (every ControlClient does) is told the
// coordinator's heartbeat_interval and silence_limit in its Welcome. From then on each side sends a
// Heartbeat frame every interval while nothing else is queued to the other, and the coordinator
// takes a welcomed process from which nothing at all arrived for silence_limit (a frozen or
// partitioned host: its connection never closes) as if its connection had ended: it is closed with
// Reject(Unavailable), and after the roster the process is lost exactly as above ("process 3
// (rollout rank 1, node n) was lost: silent for 3.0 s"), within silence_limit plus one poll turn.
// Silence counts only time the coordinator was there to hear: when its own thread (or host)
// stalled, waking later than it asked poll to, the stall does not count against any process.
// Heartbeats are ignored wherever they arrive after the Welcome (mid-collective included). A
// process that did not offer heartbeats (an older client) gets none and is never timed out.
//
// Thread safety: Start, Stop and the accessors may be called from any thread. The coordinator
// serves every connection from one thread with poll, so no connection can block another.
//
// Structure: every decision above is made by the protocol core (coordinator_core.h: events in,
// actions out, no I/O, no clock); this class is the poll loop that owns the sockets and the clock
// and drives it.

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/sync_progress.h"
#include "control/framing.h"

namespace wsync {

enum class RefusalReason : int {
  kAuthenticationFailed = 0,
  kUnknownJob,
  kRankOutOfRange,
  kDuplicateRank,
  kBadField,         // Bad enum value, id, nonce or MAC length.
  kProtocolVersion,  // The client speaks another protocol version.
  kOversizedFrame,
  kTruncatedFrame,
  kMalformedFrame,
  kUnexpectedFrame,  // A frame the protocol does not allow at that point.
  kHandshakeTimeout,
  kFrameTimeout,  // A welcomed process started a frame and did not finish it in time.
  kTooManyConnections,
  kRendezvousClosed,  // A Hello after the rendezvous completed (for a lost rank) or failed.
  kTooFarAhead,       // More unanswered contributions or held payload bytes than allowed.
};
inline constexpr int kNumRefusalReasons = static_cast<int>(RefusalReason::kTooFarAhead) + 1;

// "authentication_failed", "unknown_job", ... (metric label values).
absl::string_view RefusalReasonName(RefusalReason reason);

struct CoordinatorCounters {
  int64_t accepted = 0;  // TCP connections accepted.
  int64_t welcomed = 0;  // Hellos accepted.
  int64_t joined = 0;    // Joins accepted.
  int64_t lost = 0;      // Processes whose connection ended after the roster was sent.
  int64_t silent = 0;    // Welcomed processes closed for silence (after the roster, also lost).
  int64_t status_queries = 0;  // StatusRequests answered (`wsync status`).
  int64_t replaced = 0;        // Replacements admitted for lost processes (also counted in joined).
  int64_t rounds_completed = 0;
  int64_t rounds_failed = 0;  // Counted once per round, whatever the number of processes told.
  std::array<int64_t, kNumRefusalReasons> refused = {};
  // From the processes' latest heartbeats (control.proto: SyncProgress; a lost process's last
  // report stays): how many report each phase (SyncPhase values; others are not counted), and
  // their bytes done and total summed.
  std::array<int64_t, kSyncPhaseCount> in_phase = {};
  int64_t sync_bytes_done = 0;
  int64_t sync_bytes_total = 0;
  // Bytes queued to all connections and not yet written, now and at most since Start (see
  // CoordinatorOptions::max_queued_bytes_per_connection).
  int64_t queued_bytes = 0;
  int64_t peak_queued_bytes = 0;

  int64_t Refused(RefusalReason reason) const { return refused[static_cast<int>(reason)]; }
  int64_t TotalRefused() const;
};

// The heartbeats' defaults (CoordinatorOptions; the plugin's settings heartbeat_interval_seconds
// and silence_limit_seconds, plugin/settings.h).
inline constexpr absl::Duration kDefaultHeartbeatInterval = absl::Milliseconds(250);
inline constexpr absl::Duration kDefaultSilenceLimit = absl::Seconds(3);

struct CoordinatorOptions {
  std::string job_id;  // CheckIdentifier rules.
  std::string secret;  // At least kMinSecretBytes; see LoadSecret. Wiped when the coordinator ends.
  int32_t num_trainers = 0;
  int32_t num_rollouts = 0;

  // A literal IPv4 or IPv6 address. The wildcard ("0.0.0.0", "::") is refused unless
  // allow_any_address is set.
  std::string address = "127.0.0.1";
  int port = 0;  // 0 picks a free port; see Coordinator::port().
  bool allow_any_address = false;
  std::string coordinator_id = "wsync-coordinator";

  // From accept to Welcome: a real client sends its Hello within a round trip of the Challenge,
  // so a connection silent for this long is closed (and a refused client retries).
  absl::Duration handshake_timeout = absl::Seconds(3);
  absl::Duration rendezvous_timeout = absl::Minutes(10);  // From Start to the roster.
  // A welcomed process that started a frame must finish it within this.
  absl::Duration frame_timeout = absl::Seconds(60);
  // A connection being refused or closed gets this long to take its Reject frame.
  absl::Duration close_timeout = absl::Seconds(1);
  // See "Heartbeats" above. Zero heartbeat_interval: none (no silence limit either). Otherwise
  // silence_limit must be at least 2 * heartbeat_interval; a few intervals leave room for a loaded
  // machine's scheduling delays.
  absl::Duration heartbeat_interval = kDefaultHeartbeatInterval;
  absl::Duration silence_limit = kDefaultSilenceLimit;

  int64_t max_frame_bytes = kDefaultMaxFrameBytes;
  int64_t max_handshake_frame_bytes = int64_t{64} << 10;
  // Work before authentication is bounded. Connections accepted and not yet welcomed (pending), in
  // all and per source address (the peer's IP), each source with a fair share of the total:
  // - beyond the per-source limit, a new connection displaces the oldest pending connection of its
  //   own source that has been pending for at least pending_grace;
  // - at the total limit, a new connection from a source holding fewer pending connections than
  //   another displaces the oldest pending connection of a source holding the most, whatever its
  //   age; from a source holding the most itself, the oldest pending connection of any source
  //   pending for at least pending_grace.
  // The displaced connection is closed at once; when none may go, the new one is closed at once
  // instead (a client retries). Both count as too_many_connections. So a flood of silent
  // connections, from one source address or from many (8 loopback addresses at any rate:
  // control_bounds_test), cannot keep a real process (which sends its Hello within a round trip of
  // the Challenge) out: its source holds fewer pending connections than the flood's. A flood from
  // the process's own source address faster than max_pending_per_source / pending_grace (640 a
  // second by default) still delays it: its connections are then refused more often than not,
  // and it retries until its connect_timeout. handshake_timeout above closes silent connections.
  int32_t max_pending_connections = 256;
  int32_t max_pending_per_source = 64;
  absl::Duration pending_grace = absl::Milliseconds(100);
  int32_t max_open_rounds = 256;
  // Work after authentication is bounded too. A process may have at most this many contributions
  // not yet answered (a process calls one collective at a time, so 1 in a real job); one more is
  // refused (too_far_ahead) and the process is lost.
  int32_t max_rounds_ahead = 4;
  // Payload bytes of one process's contributions the coordinator holds at once (open rounds); a
  // contribution beyond it is refused (too_far_ahead).
  int64_t max_held_bytes_per_process = kDefaultMaxFrameBytes;
  // Bytes queued to one connection and not yet taken by its peer (frames are shared between
  // connections, so this bounds what a connection keeps alive). A frame that would queue more, or
  // a peer that takes none of what is queued for write_stall_timeout, ends the connection as if
  // it had closed: after the roster the process is lost ("process 3 (...) was lost: did not read
  // what the coordinator sent: ..."). 0: twice max_frame_bytes; else at least max_frame_bytes plus
  // kMaxFrameOverheadBytes, so that any one frame fits an empty queue.
  int64_t max_queued_bytes_per_connection = 0;
  absl::Duration write_stall_timeout = absl::Seconds(10);
};

class Coordinator {
 public:
  // Validates `options`, binds the listening socket and starts the serving thread. Errors:
  // InvalidArgument for bad options, PermissionDenied for a wildcard address without
  // allow_any_address, Unavailable when the address cannot be bound. Error messages never contain
  // the secret.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Start(CoordinatorOptions options);

  // Stop()s.
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // The bound port and address, for clients to connect to.
  int port() const { return port_; }
  const std::string& address() const { return address_; }

  // Closes every connection (each gets a best-effort Reject(Unavailable)) and the listening socket,
  // and joins the serving thread. Idempotent; returns once nothing of the coordinator runs.
  void Stop();

  CoordinatorCounters counters() const;
  // Unavailable while the rendezvous is pending, OK once the roster was sent, the error every
  // process got when it failed.
  absl::Status rendezvous_status() const;

 private:
  class Impl;
  Coordinator() = default;

  std::unique_ptr<Impl> impl_;
  absl::Mutex stop_mu_;  // Serializes Stop calls.
  std::thread thread_ ABSL_GUARDED_BY(stop_mu_);
  int port_ = 0;
  std::string address_;
};

}  // namespace wsync

#endif  // WSYNC_CONTROL_COORDINATOR_H_
