#ifndef WSYNC_TRANSPORT_UCX_UCX_STALE_H_
#define WSYNC_TRANSPORT_UCX_UCX_STALE_H_

// Private to the UCX backend: rejecting the unexpected messages of stale syncs.

#include <ucp/api/ucp.h>

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace wsync::ucx_internal {

// What one drain may spend. Messages it leaves are dropped by a later drain.
struct DrainBounds {
  absl::Time deadline;
  int64_t max_messages = 0;
  // Runs UCX progress (the transport's Progress, with its peer checks) while a drained message's
  // data arrives.
  absl::FunctionRef<unsigned()> progress;
  // True once the drain must return at once (an Abort is waiting for the worker).
  absl::FunctionRef<bool()> stop;
};

// Messages longer than this are truncated by the drain; their data is never moved.
inline constexpr size_t kDiscardScratchBytes = 64;

// Drops messages in `worker`'s unexpected queue whose tag carries one of the kStaleSyncWindow sync
// ids before `sync_id` (transport.h: IsStaleTag), and returns how many, until none is left or a
// bound of `bounds` is reached. Each message is received into `scratch` whatever length it
// announces: a longer one completes truncated (UCX answers a rendezvous without fetching its
// data), so a message allocates nothing here. A receive still unfinished when the drain stops (its
// data did not arrive) is cancelled and released to UCX, which may still write into `scratch`:
// `scratch` must outlive the worker. It is still counted. The caller holds the worker exclusively.
int64_t DiscardStaleMessages(ucp_worker_h worker, uint64_t sync_id, absl::Span<char> scratch,
                             const DrainBounds& bounds);

}  // namespace wsync::ucx_internal

#endif  // WSYNC_TRANSPORT_UCX_UCX_STALE_H_
