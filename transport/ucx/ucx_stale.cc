#include "transport/ucx/ucx_stale.h"

#include <memory>

#include "absl/time/clock.h"
#include "transport/transport.h"

namespace wsync::ucx_internal {

int64_t DiscardStaleMessages(ucp_worker_h worker, uint64_t sync_id, absl::Time deadline) {
  constexpr ucp_tag_t kSyncMask = ucp_tag_t{0xffffff} << 40;  // MakeTag's sync id bits.
  int64_t rejected = 0;
  for (uint64_t back = 1; back <= kStaleSyncWindow; ++back) {
    const ucp_tag_t stale = MakeTag(sync_id - back, 0, 0).value & kSyncMask;
    for (;;) {
      ucp_tag_recv_info_t info{};
      ucp_tag_message_h message = ucp_tag_probe_nb(worker, stale, kSyncMask, /*remove=*/1, &info);
      if (message == nullptr) break;
      ++rejected;
      auto scratch = std::make_unique_for_overwrite<char[]>(info.length > 0 ? info.length : 1);
      ucp_request_param_t param{};
      ucs_status_ptr_t request =
          ucp_tag_msg_recv_nbx(worker, scratch.get(), info.length, message, &param);
      if (request == nullptr || UCS_PTR_IS_ERR(request)) continue;
      while (ucp_request_check_status(request) == UCS_INPROGRESS) {
        if (absl::Now() >= deadline) {
          ucp_request_cancel(worker, request);
          while (ucp_request_check_status(request) == UCS_INPROGRESS) ucp_worker_progress(worker);
          break;
        }
        ucp_worker_progress(worker);
      }
      ucp_request_free(request);
    }
  }
  return rejected;
}

}  // namespace wsync::ucx_internal
