#include "control/loss_watch.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "common/failpoint.h"
#include "common/status.h"

namespace wsync {

LossWatch::LossWatch(ControlClient& client, OnLoss on_loss)
    : client_(client),
      on_loss_(std::move(on_loss)),
      first_(client.loss_count()),
      wake_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  // The exception firewall of the watch thread: an exception reports every other process lost with
  // it (so the sync in flight fails with it now), never terminates the host process.
  thread_ = std::thread([this] {
    try {
      Run();
    } catch (...) {
      const absl::Status failed = StatusOfCurrentException("wsync loss watch thread");
      try {
        for (int32_t process = 0; process < client_.size() && !stop_.load(); ++process) {
          if (process == client_.process()) continue;
          reported_.fetch_add(1);
          on_loss_(process, absl::UnavailableError(failed.message()));
        }
      } catch (...) {
      }
    }
  });
}

LossWatch::~LossWatch() {
  stop_.store(true);
  const uint64_t one = 1;
  if (wake_.valid()) (void)!write(wake_.get(), &one, sizeof(one));
  thread_.join();
}

void LossWatch::Run() {
  size_t next = first_;
  while (!stop_.load()) {
    failpoint::Evaluate("loss_watch_thread");
    // Without an eventfd (out of descriptors) the destructor waits one period at most.
    const absl::Status watching = client_.WatchLosses(absl::Now() + kLossWatchPeriod, wake_.get());
    for (const LossNotice& notice : client_.LossesSince(next)) {
      ++next;
      if (notice.process == client_.process()) continue;
      reported_.fetch_add(1);  // Before the action, which may end the owner's transfer.
      on_loss_(notice.process, absl::UnavailableError(notice.reason));
    }
    if (!watching.ok()) {
      // Nothing more can come. Unless the owner aborted, the coordinator is lost (closed, silent,
      // or talking nonsense): no sync can complete without it, so every peer counts as lost.
      if (absl::IsAborted(watching)) return;
      const absl::Status lost = CoordinatorLoss(watching.message());
      for (int32_t process = 0; process < client_.size() && !stop_.load(); ++process) {
        if (process == client_.process()) continue;
        reported_.fetch_add(1);
        on_loss_(process, lost);
      }
      return;
    }
  }
}

}  // namespace wsync
