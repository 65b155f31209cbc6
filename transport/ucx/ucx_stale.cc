#include "transport/ucx/ucx_stale.h"

#include "absl/time/clock.h"
#include "transport/transport.h"

namespace wsync::ucx_internal {

int64_t DiscardStaleMessages(ucp_worker_h worker, uint64_t sync_id, absl::Span<char> scratch,
                             const DrainBounds& bounds) {
  constexpr ucp_tag_t kSyncMask = ucp_tag_t{0xffffff} << 40;  // MakeTag's sync id bits.
  auto spent = [&](int64_t rejected) {
    return rejected >= bounds.max_messages || bounds.stop() || absl::Now() >= bounds.deadline;
  };
  int64_t rejected = 0;
  for (uint64_t back = 1; back <= kStaleSyncWindow && !spent(rejected); ++back) {
    const ucp_tag_t stale = MakeTag(sync_id - back, 0, 0).value & kSyncMask;
    while (!spent(rejected)) {
      ucp_tag_recv_info_t info{};
      ucp_tag_message_h message = ucp_tag_probe_nb(worker, stale, kSyncMask, /*remove=*/1, &info);
      if (message == nullptr) break;
      ++rejected;
      ucp_request_param_t param{};
      ucs_status_ptr_t request =
          ucp_tag_msg_recv_nbx(worker, scratch.data(), scratch.size(), message, &param);
      if (request == nullptr || UCS_PTR_IS_ERR(request)) continue;
      // Done, truncated or failed alike: the message is gone from the queue either way.
      while (ucp_request_check_status(request) == UCS_INPROGRESS && !bounds.stop() &&
             absl::Now() < bounds.deadline) {
        bounds.progress();
      }
      // A matched receive ignores the cancel; freed unfinished, UCX completes it into `scratch`.
      if (ucp_request_check_status(request) == UCS_INPROGRESS) ucp_request_cancel(worker, request);
      ucp_request_free(request);
    }
  }
  return rejected;
}

}  // namespace wsync::ucx_internal
