#include "transport/ucx/ucx_transport.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/failpoint.h"
#include "common/status.h"
#include "transport/ucx/ucx_stale.h"

namespace wsync {
namespace {

constexpr int32_t kMaxProcesses = 1 << 16;
constexpr uint64_t kSenderMask = 0xffff;
constexpr ucp_tag_t kFullMask = ~ucp_tag_t{0};
constexpr int kProgressBurst = 64;  // ucp_worker_progress calls per Progress() at most.

enum class Kind : uint8_t { kSend, kReceive };

class UcxTransportImpl;

// One posted request. Owned by the transport's slot table; UCX's callbacks get its address as
// user_data, so a slot lives until UCX can no longer call back (done, or its handle freed).
struct Slot {
  UcxTransportImpl* owner = nullptr;
  RequestId id = 0;
  Kind kind = Kind::kSend;
  int32_t peer = 0;
  MessageTag tag;
  int64_t bytes = 0;
  RegistrationId registration = 0;  // The registration whose memory handle UCX uses, or 0.
  void* request = nullptr;          // UCX's handle while UCX may still finish the operation.
  bool done = false;
  absl::Status status;         // Final once `done`.
  absl::Status cancel_reason;  // Replaces a UCX error once this side cancelled the request.
  ucp_tag_recv_info_t info{};  // Filled by a receive that completes inside ucp_tag_recv_nbx.
};

// A peer process. Heap-allocated so its address can be the error callback's argument.
struct Peer {
  UcxTransportImpl* owner = nullptr;
  int32_t process = 0;
  std::string address;  // Empty: unknown.
  ucp_ep_h ep = nullptr;
  bool peer_mode = false;  // `ep` uses UCP_ERR_HANDLING_MODE_PEER.
  // Not OK once UCX reported the peer failed; sticky until ConnectPeers connects it again.
  absl::Status failure;
  bool failure_pending = false;  // `failure` was set by the error callback and not handled yet.
};

struct Registration {
  uintptr_t begin = 0;
  int64_t bytes = 0;
  ucp_mem_h memh = nullptr;  // Null for an empty range.
  int64_t users = 0;         // Requests using `memh` that UCX may still run.
};

std::string Hex(uint64_t v) { return absl::StrCat("0x", absl::Hex(v)); }

std::string Describe(const Slot& s) {
  return absl::StrCat(s.kind == Kind::kSend ? "send to" : "receive from", " process ", s.peer,
                      " (tag ", Hex(s.tag.value), ", ", s.bytes, " bytes)");
}

absl::Status FromUcs(ucs_status_t status, absl::string_view what) {
  const std::string text = absl::StrCat(what, ": ", ucs_status_string(status));
  switch (status) {
    case UCS_ERR_CANCELED:
      return absl::CancelledError(text);
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
      return absl::InvalidArgumentError(text);
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_EXCEEDS_LIMIT:
      return absl::ResourceExhaustedError(text);
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_NO_DEVICE:
    case UCS_ERR_NO_RESOURCE:
      return absl::UnavailableError(text);
    case UCS_ERR_UNSUPPORTED:
      return absl::UnimplementedError(text);
    default:
      return absl::InternalError(text);
  }
}

// True when every entry of a UCX_TLS list is a shared-memory or self transport, none of which
// has a peer failure handler in UCX 1.13.
bool OnlySharedMemory(absl::string_view transports) {
  constexpr absl::string_view kShared[] = {"sm",    "shm",  "mm",  "posix", "sysv",
                                           "xpmem", "knem", "cma", "self"};
  if (transports.empty()) return false;
  for (absl::string_view tl : absl::StrSplit(transports, ',', absl::SkipWhitespace())) {
    const std::string name = absl::AsciiStrToLower(absl::StripAsciiWhitespace(tl));
    // An exclusion list ("^tcp") keeps the rest, which may have failure handlers.
    if (std::find(std::begin(kShared), std::end(kShared), name) == std::end(kShared)) return false;
  }
  return true;
}

class UcxTransportImpl final : public UcxTransport {
 public:
  explicit UcxTransportImpl(const UcxOptions& options) : options_(options) {}

  ~UcxTransportImpl() override {
    absl::MutexLock lock(&drive_mu_);
    if (worker_ != nullptr) {
      const absl::Status reason = absl::CancelledError(
          absl::StrCat("ucx: the transport of process ", options_.process, " was destroyed"));
      CancelAndDrain(PendingSlots(), reason, /*close_all=*/true);
      const absl::Time until = absl::Now() + options_.drain_timeout;
      while (!closing_.empty() && absl::Now() < until) {
        if (Progress() == 0) Sleep(until, absl::ZeroDuration());
      }
      for (void* r : closing_) ucp_request_free(r);
      closing_.clear();
      slots_.clear();
      ucp_worker_destroy(worker_);
    }
    if (context_ != nullptr) {
      for (auto& [id, reg] : registrations_) {
        if (reg.memh != nullptr) ucp_mem_unmap(context_, reg.memh);
      }
      ucp_cleanup(context_);
    }
  }

  absl::Status Init() {
    if (options_.process < 0 || options_.process >= kMaxProcesses) {
      return absl::InvalidArgumentError(absl::StrCat("ucx: process id ", options_.process,
                                                     " out of range [0, ", kMaxProcesses, ")"));
    }
    if (options_.drain_timeout < absl::ZeroDuration() ||
        options_.max_sleep <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError("ucx: drain_timeout must be >= 0 and max_sleep > 0");
    }
    ucp_config_t* config = nullptr;
    ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
    if (st != UCS_OK) return FromUcs(st, "ucx: ucp_config_read");
    std::vector<std::pair<std::string, std::string>> settings;
    if (!options_.transports.empty()) settings.emplace_back("TLS", options_.transports);
    if (!options_.net_devices.empty()) settings.emplace_back("NET_DEVICES", options_.net_devices);
    for (const auto& kv : options_.config) settings.push_back(kv);
    for (const auto& [name, value] : settings) {
      st = ucp_config_modify(config, name.c_str(), value.c_str());
      if (st != UCS_OK) {
        ucp_config_release(config);
        return absl::InvalidArgumentError(
            absl::StrCat("ucx: cannot set UCX_", name, "=", value, ": ", ucs_status_string(st)));
      }
    }
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
    params.mt_workers_shared = 0;
    st = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    if (st != UCS_OK) {
      context_ = nullptr;
      return FromUcs(st, absl::StrCat("ucx: ucp_init with transports '", options_.transports,
                                      "' and devices '", options_.net_devices, "'"));
    }
    ucp_worker_params_t wparams{};
    wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wparams.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    st = ucp_worker_create(context_, &wparams, &worker_);
    if (st != UCS_OK) {
      worker_ = nullptr;
      return FromUcs(st, "ucx: ucp_worker_create");
    }
    ucp_address_t* address = nullptr;
    size_t length = 0;
    st = ucp_worker_get_address(worker_, &address, &length);
    if (st != UCS_OK) return FromUcs(st, "ucx: ucp_worker_get_address");
    address_.assign(reinterpret_cast<const char*>(address), length);
    ucp_worker_release_address(worker_, address);
    if (ucp_worker_get_efd(worker_, &efd_) != UCS_OK) efd_ = -1;  // Then WaitAll sleeps briefly.
    return absl::OkStatus();
  }

  int32_t process() const override { return options_.process; }
  std::string name() const override { return "ucx"; }
  std::string WorkerAddress() const override { return address_; }

  absl::Status ConnectPeers(const std::vector<std::string>& addresses) override {
    absl::MutexLock lock(&drive_mu_);
    WSYNC_RETURN_IF_ERROR(CheckAbort());
    if (addresses.size() > static_cast<size_t>(kMaxProcesses) ||
        addresses.size() <= static_cast<size_t>(options_.process)) {
      return absl::InvalidArgumentError(
          absl::StrCat("ucx: process ", options_.process, " got ", addresses.size(),
                       " addresses; need one per process, at most ", kMaxProcesses));
    }
    const size_t n = std::max(peers_.size(), addresses.size());
    while (peers_.size() < n) {
      auto peer = std::make_unique<Peer>();
      peer->owner = this;
      peer->process = static_cast<int32_t>(peers_.size());
      peers_.push_back(std::move(peer));
    }
    for (size_t p = 0; p < n; ++p) {
      Peer& peer = *peers_[p];
      std::string address = p < addresses.size() ? addresses[p] : std::string();
      if (p == static_cast<size_t>(options_.process) && address.empty()) address = address_;
      if (address == peer.address && peer.failure.ok()) continue;
      CloseEndpoint(peer, absl::UnavailableError(absl::StrCat(
                              "ucx: ConnectPeers replaced the endpoint to process ", p)));
      peer.address = std::move(address);
      peer.failure = absl::OkStatus();
      peer.failure_pending = false;
      if (!peer.address.empty()) WSYNC_RETURN_IF_ERROR(Endpoint(peer).status());
    }
    return absl::OkStatus();
  }

  std::string EndpointInfo(int32_t peer) override {
    absl::MutexLock lock(&drive_mu_);
    if (peer < 0 || static_cast<size_t>(peer) >= peers_.size() || peers_[peer]->ep == nullptr) {
      return "";
    }
    char* text = nullptr;
    size_t length = 0;
    FILE* stream = open_memstream(&text, &length);
    if (stream == nullptr) return "";
    fprintf(stream, "error handling: %s\n", peers_[peer]->peer_mode ? "peer" : "none");
    ucp_ep_print_info(peers_[peer]->ep, stream);
    fclose(stream);
    std::string out(text, length);
    free(text);
    return out;
  }

  absl::StatusOr<RegistrationId> RegisterMemory(void* address, int64_t bytes,
                                                MemoryKind kind) override {
    if (kind == MemoryKind::kCuda) {
      return absl::UnimplementedError("ucx: only host memory can be registered, not cuda");
    }
    if (kind != MemoryKind::kHost) {
      return absl::InvalidArgumentError(
          absl::StrCat("ucx: invalid memory kind ", static_cast<int>(kind)));
    }
    if (bytes < 0 || (address == nullptr && bytes > 0)) {
      return absl::InvalidArgumentError(absl::StrCat("ucx: cannot register ", bytes, " bytes at ",
                                                     Hex(reinterpret_cast<uintptr_t>(address))));
    }
    WSYNC_RETURN_IF_ERROR(failpoint::Check("register"));
    absl::MutexLock lock(&drive_mu_);
    Registration reg;
    reg.begin = reinterpret_cast<uintptr_t>(address);
    reg.bytes = bytes;
    if (bytes > 0) {
      ucp_mem_map_params_t params{};
      params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                          UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
      params.address = address;
      params.length = static_cast<size_t>(bytes);
      params.memory_type = UCS_MEMORY_TYPE_HOST;
      const ucs_status_t st = ucp_mem_map(context_, &params, &reg.memh);
      if (st != UCS_OK) {
        return FromUcs(st,
                       absl::StrCat("ucx: ucp_mem_map of ", bytes, " bytes at ", Hex(reg.begin)));
      }
    }
    const RegistrationId id = next_registration_++;
    registrations_[id] = reg;
    return id;
  }

  absl::Status DeregisterMemory(RegistrationId id) override {
    absl::MutexLock lock(&drive_mu_);
    auto it = registrations_.find(id);
    if (it == registrations_.end()) {
      return absl::NotFoundError(
          absl::StrCat("ucx: process ", options_.process, " has no registration with id ", id));
    }
    if (it->second.users > 0) {
      return absl::FailedPreconditionError(absl::StrCat("ucx: registration ", id, " is used by ",
                                                        it->second.users,
                                                        " requests UCX has not finished"));
    }
    if (it->second.memh != nullptr) {
      const ucs_status_t st = ucp_mem_unmap(context_, it->second.memh);
      if (st != UCS_OK) return FromUcs(st, absl::StrCat("ucx: ucp_mem_unmap of registration ", id));
    }
    registrations_.erase(it);
    return absl::OkStatus();
  }

  absl::StatusOr<RequestId> PostSend(int32_t peer, MessageTag tag, const void* data,
                                     int64_t bytes) override {
    return Post(Kind::kSend, peer, tag, const_cast<void*>(data), bytes);
  }

  absl::StatusOr<RequestId> PostReceive(int32_t peer, MessageTag tag, void* data,
                                        int64_t bytes) override {
    return Post(Kind::kReceive, peer, tag, data, bytes);
  }

  absl::StatusOr<bool> Test(RequestId request) override {
    absl::MutexLock lock(&drive_mu_);
    if (abort_requested_.load(std::memory_order_acquire)) AbortNow();
    Progress();
    auto it = slots_.find(request);
    if (it == slots_.end()) return UnknownRequest(request);
    if (!it->second->done) return false;
    absl::Status status = std::move(it->second->status);
    slots_.erase(it);
    if (!status.ok()) return status;
    return true;
  }

  absl::Status WaitAll(absl::Span<const RequestId> requests, absl::Time deadline) override {
    absl::MutexLock lock(&drive_mu_);
    std::vector<Slot*> waited;
    absl::flat_hash_set<RequestId> seen;
    absl::Status unknown;
    for (RequestId id : requests) {
      if (!seen.insert(id).second) continue;
      auto it = slots_.find(id);
      if (it == slots_.end()) {
        if (unknown.ok()) unknown = UnknownRequest(id);
      } else {
        waited.push_back(it->second.get());
      }
    }
    if (!unknown.ok()) {
      CancelAndDrain(waited, absl::CancelledError("ucx: cancelled by a WaitAll with an unknown id"),
                     /*close_all=*/false);
      for (Slot* s : waited) slots_.erase(s->id);
      return unknown;
    }

    absl::Status failure;  // The first request that failed while waiting.
    bool timed_out = false;
    absl::Time active = absl::Now();  // When progress last did something.
    for (;;) {
      if (abort_requested_.load(std::memory_order_acquire)) AbortNow();
      if (Progress() > 0) active = absl::Now();
      bool all_done = true;
      for (Slot* s : waited) {
        if (!s->done) {
          all_done = false;
        } else if (!s->status.ok() && failure.ok()) {
          failure = s->status;
        }
      }
      if (all_done || !failure.ok()) break;
      const absl::Time now = absl::Now();
      if (now >= deadline) {
        timed_out = true;
        break;
      }
      if (now - active >= options_.idle_spin) Sleep(deadline, options_.max_sleep);
    }

    std::vector<std::string> missed;
    if (!failure.ok()) {
      const absl::Status collateral = absl::CancelledError(
          absl::StrCat("ucx: cancelled after another request failed: ", failure.message()));
      CancelAndDrain(waited, collateral, /*close_all=*/false);
    } else if (timed_out) {
      std::vector<Slot*> pending;
      for (Slot* s : waited) {
        if (!s->done) pending.push_back(s);
      }
      CancelAndDrain(pending,
                     absl::DeadlineExceededError(absl::StrCat("ucx: process ", options_.process,
                                                              ": request missed its deadline")),
                     /*close_all=*/false);
      for (Slot* s : pending) {
        if (s->status.code() == absl::StatusCode::kDeadlineExceeded) {
          missed.push_back(Describe(*s));
        } else if (!s->status.ok() && failure.ok()) {
          failure = s->status;
        }
      }
    }
    for (Slot* s : waited) slots_.erase(s->id);
    if (!failure.ok()) return failure;
    if (!missed.empty()) {
      return absl::DeadlineExceededError(
          absl::StrCat("ucx: process ", options_.process, ": ", missed.size(),
                       " requests missed the deadline: ", absl::StrJoin(missed, "; ")));
    }
    return absl::OkStatus();
  }

  int64_t DiscardStaleMessages(uint64_t sync_id) override {
    absl::MutexLock lock(&drive_mu_);
    Progress();
    return ucx_internal::DiscardStaleMessages(worker_, sync_id, absl::Now() + absl::Seconds(1));
  }

  void Abort(const absl::Status& reason) override {
    {
      absl::MutexLock lock(&abort_mu_);
      if (!abort_requested_.load(std::memory_order_relaxed)) {
        std::string why(reason.message());
        if (why.empty()) why = reason.ok() ? "aborted" : absl::StatusCodeToString(reason.code());
        abort_status_ =
            absl::AbortedError(absl::StrCat("ucx: process ", options_.process, " aborted: ", why));
        abort_requested_.store(true, std::memory_order_release);
      }
    }
    if (worker_ != nullptr) ucp_worker_signal(worker_);  // Wakes a WaitAll sleeping in poll().
    absl::MutexLock lock(&drive_mu_);
    AbortNow();
  }

 private:
  static void OnSendDone(void* /*request*/, ucs_status_t status,
                         void* user_data) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    Slot* s = static_cast<Slot*>(user_data);
    s->owner->Complete(*s, status, nullptr);
  }

  static void OnReceiveDone(void* /*request*/, ucs_status_t status, const ucp_tag_recv_info_t* info,
                            void* user_data) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    Slot* s = static_cast<Slot*>(user_data);
    s->owner->Complete(*s, status, info);
  }

  // Runs inside ucp_worker_progress: only records the failure; HandleFailures acts on it.
  static void OnPeerError(void* arg, ucp_ep_h ep, ucs_status_t status) {
    Peer* peer = static_cast<Peer*>(arg);
    if (peer->ep != ep || !peer->failure.ok()) return;
    peer->failure = absl::UnavailableError(absl::StrCat("ucx: peer process ", peer->process,
                                                        " failed (", ucs_status_string(status),
                                                        "); ConnectPeers connects it again"));
    peer->failure_pending = true;
    peer->owner->failures_pending_ = true;
  }

  absl::Status UnknownRequest(RequestId id) const {
    return absl::NotFoundError(absl::StrCat("ucx: process ", options_.process,
                                            " has no outstanding request with id ", id));
  }

  // The abort status once Abort was called, else OK; performs the abort first if needed.
  absl::Status CheckAbort() ABSL_EXCLUSIVE_LOCKS_REQUIRED(drive_mu_) {
    if (!abort_requested_.load(std::memory_order_acquire)) return absl::OkStatus();
    AbortNow();
    absl::MutexLock lock(&abort_mu_);
    return abort_status_;
  }

  // Fails every unfinished request with the abort status and closes every endpoint. Idempotent.
  void AbortNow() ABSL_EXCLUSIVE_LOCKS_REQUIRED(drive_mu_) {
    if (abort_done_ || !abort_requested_.load(std::memory_order_acquire)) return;
    abort_done_ = true;
    absl::Status reason;
    {
      absl::MutexLock lock(&abort_mu_);
      reason = abort_status_;
    }
    CancelAndDrain(PendingSlots(), reason, /*close_all=*/true);
  }

  std::vector<Slot*> PendingSlots() ABSL_EXCLUSIVE_LOCKS_REQUIRED(drive_mu_) {
    std::vector<Slot*> pending;
    for (auto& [id, slot] : slots_) {
      if (!slot->done) pending.push_back(slot.get());
    }
    return pending;
  }

  // Records a completion reported by UCX or by a post that completed at once. UCX calls back only
  // inside calls made with drive_mu_ held (progress, post, cancel, close).
  void Complete(Slot& s, ucs_status_t status, const ucp_tag_recv_info_t* info)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(drive_mu_) {
    if (s.done) return;
    s.done = true;
    if (s.request != nullptr) {
      ucp_request_free(s.request);
      s.request = nullptr;
    }
    if (s.registration != 0) {
      auto it = registrations_.find(s.registration);
      if (it != registrations_.end()) --it->second.users;
    }
    const std::string head = absl::StrCat("ucx: process ", options_.process, ": ", Describe(s));
    if (status == UCS_OK) {
      if (s.kind == Kind::kReceive && info != nullptr &&
          static_cast<int64_t>(info->length) != s.bytes) {
        s.status = absl::InvalidArgumentError(
            absl::StrCat(head, ": size mismatch: the message has ", info->length,
                         " bytes, the receive expects ", s.bytes, " bytes"));
      } else {
        s.status = absl::OkStatus();
      }
    } else if (status == UCS_ERR_MESSAGE_TRUNCATED) {
      const bool known = info != nullptr && static_cast<int64_t>(info->length) > s.bytes;
      s.status = absl::InvalidArgumentError(
          absl::StrCat(head, ": size mismatch: the message has ",
                       known ? absl::StrCat(info->length) : absl::StrCat("more than ", s.bytes),
                       " bytes, the receive expects ", s.bytes, " bytes"));
    } else if (!s.cancel_reason.ok()) {
      s.status = absl::Status(s.cancel_reason.code(),
                              absl::StrCat(s.cancel_reason.message(), " [", Describe(s), "]"));
    } else {
      s.status = FromUcs(status, head);
    }
  }

  // Gives an unfinished request back to UCX, which then never calls back; its memory may still be
  // used, so its registration stays pinned. `why` says why it was not waited for.
  void Abandon(Slot& s, const absl::Status& reason, absl::string_view why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(drive_mu_) {
    if (s.done) return;
    ucp_request_free(s.request);
    s.request = nullptr;
    s.done = true;
    s.status = absl::Status(reason.code(), absl::StrCat(reason.message(), " [", Describe(s), "; ",
                                                        why, "; its memory may still be read]"));
  }

  // Cancels `slots` with `reason`: receives with ucp_request_cancel, sends by closing their
  // endpoints (all endpoints if `close_all`). Waits up to drain_timeout for UCX to finish them,
  // then abandons the rest. Every slot is done afterwards.
  void CancelAndDrain(const std::vector<Slot*>& slots, const absl::Status& reason, bool close_all)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(drive_mu_) {
    absl::flat_hash_set<int32_t> close;
    for (Slot* s : slots) {
      if (s->done) continue;
      if (s->cancel_reason.ok()) s->cancel_reason = reason;
      if (s->kind == Kind::kReceive) {
        ucp_request_cancel(worker_, s->request);
      } else {
        close.insert(s->peer);
      }
    }
    for (auto& peer : peers_) {
      if (close_all || close.contains(peer->process)) {
        CloseEndpoint(*peer, absl::CancelledError(
                                 absl::StrCat("ucx: the endpoint to process ", peer->process,
                                              " was closed to cancel a send: ", reason.message())));
      }
    }
    const absl::Time until = absl::Now() + options_.drain_timeout;
    for (;;) {
      const bool all_done =
          std::all_of(slots.begin(), slots.end(), [](const Slot* s) { return s->done; });
      if (all_done) break;
      if (absl::Now() >= until) {
        const std::string why = absl::StrCat("UCX did not finish it within ",
                                             absl::FormatDuration(options_.drain_timeout));
        for (Slot* s : slots) Abandon(*s, reason, why);
        break;
      }
      if (Progress() == 0) Sleep(until, absl::Microseconds(100));
    }
  }

  // Force-closes the endpoint to `peer`; its unfinished sends fail with `reason` unless they
  // already have one. The next send to the peer creates a new endpoint.
  void CloseEndpoint(Peer& peer, const absl::Status& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(drive_mu_) {
    if (peer.ep == nullptr) return;
    for (auto& [id, slot] : slots_) {
      if (!slot->done && slot->kind == Kind::kSend && slot->peer == peer.process &&
          slot->cancel_reason.ok()) {
        slot->cancel_reason = reason;
      }
    }
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucp_ep_h ep = peer.ep;
    peer.ep = nullptr;  // Before the call: callbacks inside it see the endpoint as gone.
    void* r = ucp_ep_close_nbx(ep, &param);
    if (r != nullptr && UCS_PTR_IS_PTR(r)) closing_.push_back(r);
    if (peer.peer_mode) return;
    // UCX 1.13 completes the sends of a force-closed endpoint only in UCP_ERR_HANDLING_MODE_PEER;
    // the others would never finish, so they are released now.
    for (auto& [id, slot] : slots_) {
      if (!slot->done && slot->kind == Kind::kSend && slot->peer == peer.process) {
        Abandon(*slot, slot->cancel_reason,
                "its endpoint has no error handling, so UCX cannot cancel it");
      }
    }
  }

  // The endpoint to `peer`, created on demand.
  absl::StatusOr<ucp_ep_h> Endpoint(Peer& peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(drive_mu_) {
    if (peer.ep != nullptr) return peer.ep;
    if (!peer.failure.ok()) return peer.failure;
    if (peer.address.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ucx: process ", options_.process, " has no address for process ", peer.process));
    }
    using EH = UcxOptions::ErrorHandling;
    bool try_peer =
        options_.error_handling == EH::kPeer ||
        (options_.error_handling == EH::kAuto && !OnlySharedMemory(options_.transports));
    for (;;) {
      ucp_ep_params_t params{};
      params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
      params.address = reinterpret_cast<const ucp_address_t*>(peer.address.data());
      params.err_mode = try_peer ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
      if (try_peer) {
        params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
        params.err_handler.cb = &OnPeerError;
        params.err_handler.arg = &peer;
      }
      ucp_ep_h ep = nullptr;
      const ucs_status_t st = ucp_ep_create(worker_, &params, &ep);
      if (st == UCS_OK) {
        peer.ep = ep;
        peer.peer_mode = try_peer;
        return ep;
      }
      if (st == UCS_ERR_UNREACHABLE && try_peer && options_.error_handling == EH::kAuto) {
        try_peer = false;  // No transport to this peer has a failure handler (shared memory).
        continue;
      }
      return FromUcs(st, absl::StrCat("ucx: process ", options_.process,
                                      " cannot create an endpoint to process ", peer.process));
    }
  }

  // A registration covering [data, data + bytes), or 0. Linear: a process registers a few
  // hundred buffers at most, and a lookup costs far less than the message it serves.
  RegistrationId Covering(const void* data, int64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(drive_mu_) {
    if (bytes <= 0) return 0;
    const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
    for (const auto& [id, reg] : registrations_) {
      if (reg.memh != nullptr && begin >= reg.begin &&
          static_cast<uint64_t>(bytes) <= static_cast<uint64_t>(reg.bytes) &&
          begin - reg.begin <= static_cast<uint64_t>(reg.bytes - bytes)) {
        return id;
      }
    }
    return 0;
  }

  absl::StatusOr<RequestId> Post(Kind kind, int32_t peer, MessageTag tag, void* data,
                                 int64_t bytes) {
    absl::MutexLock lock(&drive_mu_);
    WSYNC_RETURN_IF_ERROR(CheckAbort());
    if (peers_.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("ucx: process ", options_.process, " posted before ConnectPeers"));
    }
    if (peer < 0 || static_cast<size_t>(peer) >= peers_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("ucx: process ", options_.process,
                                                     " cannot reach peer ", peer,
                                                     ": ids are in [0, ", peers_.size(), ")"));
    }
    if (bytes < 0 || (data == nullptr && bytes > 0)) {
      return absl::InvalidArgumentError(absl::StrCat("ucx: bad buffer of ", bytes, " bytes at ",
                                                     Hex(reinterpret_cast<uintptr_t>(data)),
                                                     " for peer ", peer));
    }
    const int32_t sender = kind == Kind::kSend ? options_.process : peer;
    const uint64_t sender_bits = static_cast<uint64_t>(sender) & kSenderMask;
    const uint64_t low = tag.value & kSenderMask;
    if (low != 0 && low != sender_bits) {
      return absl::InvalidArgumentError(absl::StrCat("ucx: tag ", Hex(tag.value), " names sender ",
                                                     low, " but the sender is process ", sender,
                                                     " (see MakeTag)"));
    }
    const ucp_tag_t wire = (tag.value & ~kSenderMask) | sender_bits;
    Peer& p = *peers_[peer];
    ucp_ep_h ep = nullptr;
    if (kind == Kind::kSend) {
      WSYNC_ASSIGN_OR_RETURN(ep, Endpoint(p));
    } else if (!p.failure.ok()) {
      return p.failure;
    } else if (p.address.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("ucx: process ", options_.process, " has no address for process ", peer));
    }

    auto owned = std::make_unique<Slot>();
    Slot* s = owned.get();
    s->owner = this;
    s->id = next_request_++;
    s->kind = kind;
    s->peer = peer;
    s->tag = tag;
    s->bytes = bytes;
    ucp_request_param_t param{};
    param.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    param.user_data = s;
    param.memory_type = UCS_MEMORY_TYPE_HOST;
    if (RegistrationId reg = Covering(data, bytes); reg != 0) {
      param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
      param.memh = registrations_.at(reg).memh;
      s->registration = reg;
      ++registrations_.at(reg).users;
    }
    slots_.emplace(s->id, std::move(owned));
    ucs_status_ptr_t r;
    if (kind == Kind::kSend) {
      param.cb.send = &OnSendDone;
      r = ucp_tag_send_nbx(ep, data, static_cast<size_t>(bytes), wire, &param);
    } else {
      // UCX 1.13 does not fill recv_info on immediate completion (openucx/ucx#9425, fixed in
      // 1.16), so the received length would be unknown: NO_IMM_CMPL makes UCX call back inside
      // the post instead. recv_info stays for UCX versions that honour it.
      param.op_attr_mask |= UCP_OP_ATTR_FIELD_RECV_INFO | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
      param.recv_info.tag_info = &s->info;
      param.cb.recv = &OnReceiveDone;
      r = ucp_tag_recv_nbx(worker_, data, static_cast<size_t>(bytes), wire, kFullMask, &param);
    }
    if (r == nullptr) {
      Complete(*s, UCS_OK, kind == Kind::kReceive ? &s->info : nullptr);
    } else if (UCS_PTR_IS_ERR(r)) {
      const ucs_status_t st = UCS_PTR_STATUS(r);
      Complete(*s, st, nullptr);
      if (st != UCS_ERR_MESSAGE_TRUNCATED) {  // A truncated receive is a failed request.
        absl::Status error = std::move(s->status);
        slots_.erase(s->id);
        return error;
      }
    } else if (s->done) {
      ucp_request_free(r);  // The callback ran inside the post.
    } else {
      s->request = r;
    }
    return s->id;
  }

  // Acts on failures the error callback recorded, outside UCX callbacks: closes the endpoint
  // (failing its sends) and cancels the receives from the peer. No new endpoint is created until
  // ConnectPeers: UCX 1.13's tcp transport can hit an internal assertion when a new endpoint
  // connects to a peer whose old connection is still failing.
  void HandleFailures() ABSL_EXCLUSIVE_LOCKS_REQUIRED(drive_mu_) {
    if (!failures_pending_) return;
    failures_pending_ = false;
    for (auto& peer : peers_) {
      if (!peer->failure_pending) continue;
      peer->failure_pending = false;
      CloseEndpoint(*peer, peer->failure);
      std::vector<Slot*> receives;
      for (auto& [id, slot] : slots_) {
        if (!slot->done && slot->kind == Kind::kReceive && slot->peer == peer->process) {
          if (slot->cancel_reason.ok()) slot->cancel_reason = peer->failure;
          receives.push_back(slot.get());
        }
      }
      for (Slot* s : receives) ucp_request_cancel(worker_, s->request);
    }
  }

  // One burst of UCX progress plus the bookkeeping after it; returns UCX's event count.
  unsigned Progress() ABSL_EXCLUSIVE_LOCKS_REQUIRED(drive_mu_) {
    unsigned total = 0;
    for (int i = 0; i < kProgressBurst; ++i) {
      const unsigned n = ucp_worker_progress(worker_);
      total += n;
      if (n == 0) break;
    }
    HandleFailures();
    for (size_t i = 0; i < closing_.size();) {
      if (ucp_request_check_status(closing_[i]) != UCS_INPROGRESS) {
        ucp_request_free(closing_[i]);
        closing_[i] = closing_.back();
        closing_.pop_back();
      } else {
        ++i;
      }
    }
    return total;
  }

  // Sleeps until the worker has an event, `until`, or `cap` (zero: max_sleep), whichever is first.
  void Sleep(absl::Time until, absl::Duration cap) ABSL_EXCLUSIVE_LOCKS_REQUIRED(drive_mu_) {
    if (cap <= absl::ZeroDuration()) cap = options_.max_sleep;
    const absl::Duration left = std::min(until - absl::Now(), cap);
    if (left <= absl::ZeroDuration()) return;
    if (efd_ < 0) {
      absl::SleepFor(std::min(left, absl::Microseconds(50)));
      return;
    }
    const ucs_status_t st = ucp_worker_arm(worker_);
    if (st == UCS_ERR_BUSY) return;  // Events are pending: progress again.
    if (st != UCS_OK) {
      absl::SleepFor(std::min(left, absl::Microseconds(50)));
      return;
    }
    if (abort_requested_.load(std::memory_order_acquire)) return;
    pollfd pfd{efd_, POLLIN, 0};
    const int ms = static_cast<int>(
        std::max<int64_t>(1, absl::ToInt64Milliseconds(left + absl::Microseconds(999))));
    poll(&pfd, 1, ms);
  }

  const UcxOptions options_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;  // Set once by Init; read without the lock by Abort.
  int efd_ = -1;
  std::string address_;

  // Serializes every use of the worker, the context and the tables below (the worker runs in
  // UCS_THREAD_MODE_SERIALIZED). Held by the driving thread for a whole WaitAll.
  absl::Mutex drive_mu_;
  std::vector<std::unique_ptr<Peer>> peers_ ABSL_GUARDED_BY(drive_mu_);
  absl::flat_hash_map<RequestId, std::unique_ptr<Slot>> slots_ ABSL_GUARDED_BY(drive_mu_);
  RequestId next_request_ ABSL_GUARDED_BY(drive_mu_) = 1;
  std::vector<void*> closing_ ABSL_GUARDED_BY(drive_mu_);  // Unfinished ucp_ep_close_nbx.
  bool failures_pending_ = false;  // Set by OnPeerError during progress (under drive_mu_).
  absl::flat_hash_map<RegistrationId, Registration> registrations_ ABSL_GUARDED_BY(drive_mu_);
  RegistrationId next_registration_ ABSL_GUARDED_BY(drive_mu_) = 1;
  bool abort_done_ ABSL_GUARDED_BY(drive_mu_) = false;

  absl::Mutex abort_mu_;
  std::atomic<bool> abort_requested_{false};
  absl::Status abort_status_ ABSL_GUARDED_BY(abort_mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<UcxTransport>> UcxTransport::Create(const UcxOptions& options) {
  auto transport = std::make_unique<UcxTransportImpl>(options);
  WSYNC_RETURN_IF_ERROR(transport->Init());
  return std::unique_ptr<UcxTransport>(std::move(transport));
}

}  // namespace wsync
