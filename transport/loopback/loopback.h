#ifndef WSYNC_TRANSPORT_LOOPBACK_LOOPBACK_H_
#define WSYNC_TRANSPORT_LOOPBACK_LOOPBACK_H_

// An in-process Transport and Group where threads stand in for processes. Unit tests and
// benchmarks run every process of a job as a thread of one test binary.
//
// A LoopbackFabric is created for N global process ids 0..N-1. Connect(p) makes the Transport of
// process p and MakeGroup(p) its Group; at most one of each per process is alive at a time.
//
// Matching: a send from s to r with tag t matches the oldest unmatched receive posted by r from s
// with tag t, and the other way round (FIFO among equal (sender, receiver, tag) keys). Whichever
// request is posted second copies the bytes, in its own thread inside PostSend / PostReceive, as
// a UCX rendezvous would; the other side's memory must stay valid until its request completes.
// Sizes must match exactly; a mismatch fails both requests. A process may send to itself.
// Eager sends (a fabric made with eager_bytes > 0): a send of at most eager_bytes that finds no
// receive copies its bytes when posted and completes at once, as UCX's eager protocol does below
// its rendezvous threshold (a network buffers what has left); the message waits in the fabric for
// its receive, also once its Transport was destroyed (so the executor's failure notices reach a
// peer that posts its receive after the sender gave up waiting, as they do over UCX). Larger
// sends, and every send of a fabric with eager_bytes 0, complete only when matched.
//
// Failures:
// - Transport::Abort(reason) on p fails p's outstanding and future requests (Aborted), p's Group
//   collectives, the requests of other processes whose peer is p, and the collectives of others
//   that still wait for p's contribution. Each error names p and carries the reason.
// - LoopbackFabric::Kill(p) simulates a dead process: the same, with Unavailable errors, and
//   permanently (a killed process cannot connect again).
// - Fault hooks: SetDropMessages loses messages (both sides then run into their deadline);
//   FailNthSend makes one future send of a process complete with an error.
//
// Memory: a request's memory is never touched once the request is released (by Test or WaitAll)
// or cancelled, nor after its Transport is destroyed (an eager send's bytes were copied when it
// was posted); a send matching a cancelled receive stays queued for a later receive.
//
// Lifetime: the fabric, its transports and its groups share one state; any of them may be
// destroyed first. Thread safety: every LoopbackFabric method is thread-safe. Transport and Group
// objects follow transport.h: one thread at a time, except Transport::Abort (any thread).

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "transport/transport.h"

namespace wsync {

namespace loopback_internal {
struct FabricState;
}  // namespace loopback_internal

// A snapshot of what the fabric delivered since it was created or last reset. Only completed
// deliveries count: a copy happens once per matched pair of equal size.
struct LoopbackCounters {
  int32_t processes = 0;
  std::vector<int64_t> bytes;  // Delivered bytes, indexed [from * processes + to].
  int64_t messages = 0;        // Delivered messages, empty ones included.
  int64_t largest_message_bytes = 0;
  int64_t dropped_messages = 0;  // Sends lost to SetDropMessages.

  // Delivered bytes from `from` to `to`; 0 for ids out of range.
  int64_t BytesDelivered(int32_t from, int32_t to) const;
  // Delivered bytes over all pairs.
  int64_t TotalBytes() const;
};

// An eager limit for fabrics that stand in for processes over UCX: messages this small (the
// executor's failure notices and chunk digests) go eagerly over UCX too, below its rendezvous
// threshold (UCX_RNDV_THRESH); chunks of real weights do not.
inline constexpr int64_t kUcxLikeEagerBytes = 8192;

class LoopbackFabric {
 public:
  // A fabric of `processes` processes (ids 0..processes-1); a negative count acts as 0. Sends of
  // at most `eager_bytes` are eager (above); 0: none.
  explicit LoopbackFabric(int32_t processes, int64_t eager_bytes = 0);
  ~LoopbackFabric();

  LoopbackFabric(const LoopbackFabric&) = delete;
  LoopbackFabric& operator=(const LoopbackFabric&) = delete;

  int32_t size() const;

  // The Transport of `process`. InvalidArgument out of range; FailedPrecondition while another
  // Transport of `process` is alive or once it was killed. A new Transport of a process starts
  // without its predecessor's abort; messages queued to the process stay queued for it.
  absl::StatusOr<std::unique_ptr<Transport>> Connect(int32_t process);

  // The Group of `process`, with the same errors as Connect. Collectives are numbered per process:
  // the k-th AllGather of every process forms one round, whatever the order of arrival. A
  // collective that failed still used its number; a contribution, once made, stays in its round.
  absl::StatusOr<std::unique_ptr<Group>> MakeGroup(int32_t process);

  // Simulates the death of `process` (see above). Idempotent; ids out of range are ignored.
  void Kill(int32_t process);
  bool IsKilled(int32_t process) const;

  LoopbackCounters counters() const;
  void ResetCounters();

  // Sends posted from `from` to `to` while `drop` is set are accepted and never delivered: they
  // stay in flight until cancelled, aborted or killed. Ids out of range are ignored.
  void SetDropMessages(int32_t from, int32_t to, bool drop);

  // The n-th send (n >= 1) that `process` posts from now on is accepted, delivers nothing and
  // completes with `error` (which must not be OK). n <= 0 clears the hook of `process`.
  void FailNthSend(int32_t process, int64_t n, absl::Status error);

  // Posted requests of any process not yet matched with their peer's (dropped sends excluded;
  // eager messages waiting for their receive included).
  int64_t UnmatchedRequests() const;

 private:
  std::shared_ptr<loopback_internal::FabricState> state_;
};

}  // namespace wsync

#endif  // WSYNC_TRANSPORT_LOOPBACK_LOOPBACK_H_
