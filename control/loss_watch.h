#ifndef WSYNC_CONTROL_LOSS_WATCH_H_
#define WSYNC_CONTROL_LOSS_WATCH_H_

// Turns the coordinator's loss notices (client.h: LossNotice) into an action while a sync moves
// data, when nobody else reads the control connection: from construction to destruction a thread
// of its own waits on the client (ControlClient::WatchLosses) and calls on_loss(process,
// Unavailable(notice)) once for every process lost after construction, other than this one. The
// caller typically fails its transport's requests with that process (Transport::PeerLost), so that
// a sync blocked on a dead peer fails within a round trip of the coordinator seeing the connection
// end (NCCL, and UCX over shared memory, would otherwise wait for the deadline).
//
// When the connection to the coordinator becomes unusable (it closed: the coordinator died; or the
// coordinator was silent for its silence limit, client.h: heartbeats; or a protocol error), no
// sync can complete any more, so the watch calls on_loss(process, CoordinatorLoss(the client's
// error): transport/transport.h) for every process other than this one, and ends: a sync in flight
// fails within a round trip of the close, or at the silence limit, instead of at its deadline. Not
// after the owner's own Abort (the owner is failing the sync already).
//
// The owner keeps using the client meanwhile (from any thread, as client.h says); the client's
// I/O thread records every notice as it arrives and wakes the watch, which reports it at once.

// Thread safety: on_loss runs on the watch's thread and must be safe against whatever the owner
// does meanwhile. The client must outlive the watch. Destruction wakes and joins the thread at
// once.

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "control/client.h"
#include "control/socket.h"

namespace wsync {

// How long the watch waits in one ControlClient::WatchLosses (a notice wakes it earlier).
inline constexpr absl::Duration kLossWatchPeriod = absl::Milliseconds(250);

class LossWatch {
 public:
  using OnLoss = std::function<void(int32_t process, const absl::Status& reason)>;

  LossWatch(ControlClient& client, OnLoss on_loss);
  ~LossWatch();
  LossWatch(const LossWatch&) = delete;
  LossWatch& operator=(const LossWatch&) = delete;

  // on_loss calls so far (counted before each call).
  int reported() const { return reported_.load(); }

 private:
  void Run();

  ControlClient& client_;
  const OnLoss on_loss_;
  const size_t first_;  // Notices before this index came before the watch.
  UniqueFd wake_;       // An eventfd the destructor writes to.
  std::atomic<bool> stop_{false};
  std::atomic<int> reported_{0};
  std::thread thread_;
};

}  // namespace wsync

#endif  // WSYNC_CONTROL_LOSS_WATCH_H_
