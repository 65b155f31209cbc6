#ifndef WSYNC_TRANSPORT_UCX_UCX_STALE_H_
#define WSYNC_TRANSPORT_UCX_UCX_STALE_H_

// Private to the UCX backend: rejecting the unexpected messages of stale syncs.

#include <ucp/api/ucp.h>

#include <cstdint>

#include "absl/time/time.h"

namespace wsync::ucx_internal {

// Receives into scratch memory and drops every message in `worker`'s unexpected queue whose tag
// carries one of the kStaleSyncWindow sync ids before `sync_id` (transport.h: IsStaleTag), and
// returns how many. A message whose data does not arrive by `deadline` (a rendezvous from a peer
// that went away) is cancelled and still counted. The caller holds the worker exclusively.
int64_t DiscardStaleMessages(ucp_worker_h worker, uint64_t sync_id, absl::Time deadline);

}  // namespace wsync::ucx_internal

#endif  // WSYNC_TRANSPORT_UCX_UCX_STALE_H_
