#include "transport/ucx/ucx_transport.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/failpoint.h"
#include "common/hash.h"
#include "common/process_identity.h"
#include "common/status.h"
#include "transport/ucx/ucx_impl.h"

namespace wsync {
namespace ucx_internal {

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

UcxTransportImpl::~UcxTransportImpl() {
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

absl::Status UcxTransportImpl::Init() {
  if (options_.process < 0 || options_.process >= kMaxProcesses) {
    return absl::InvalidArgumentError(absl::StrCat("ucx: process id ", options_.process,
                                                   " out of range [0, ", kMaxProcesses, ")"));
  }
  if (options_.drain_timeout < absl::ZeroDuration() || options_.max_sleep <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("ucx: drain_timeout must be >= 0 and max_sleep > 0");
  }
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return FromUcs(st, "ucx: ucp_config_read");
  std::vector<std::pair<std::string, std::string>> settings;
  for (const UcxDefaultSetting& d : UcxDefaultSettings()) {
    if (getenv(d.environment.c_str()) == nullptr &&
        UcxTlsMaySelect(options_.transports, d.transport)) {
      settings.emplace_back(d.name, d.value);
    }
  }
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
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (ucp_context_query(context_, &attr) == UCS_OK) memory_types_ = attr.memory_types;
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
  pid_namespace_ = OwnPidNamespace();
  address_ += ProcessTrailer(static_cast<int32_t>(getpid()), pid_namespace_);
  if (ucp_worker_get_efd(worker_, &efd_) != UCS_OK) efd_ = -1;  // Then WaitAll sleeps briefly.
  return absl::OkStatus();
}

namespace {
constexpr char kTrailerMagic[4] = {'w', 's', 'p', 'd'};
constexpr size_t kTrailerBytes = sizeof(uint64_t) + sizeof(int32_t) + sizeof(kTrailerMagic);
}  // namespace

std::string ProcessTrailer(int32_t pid, uint64_t pid_namespace) {
  std::string trailer(kTrailerBytes, '\0');
  std::memcpy(trailer.data(), &pid_namespace, sizeof(pid_namespace));
  std::memcpy(trailer.data() + sizeof(pid_namespace), &pid, sizeof(pid));
  std::memcpy(trailer.data() + sizeof(pid_namespace) + sizeof(pid), kTrailerMagic,
              sizeof(kTrailerMagic));
  return trailer;
}

bool ParseProcessTrailer(absl::string_view address, int32_t* pid, uint64_t* pid_namespace) {
  if (address.size() < kTrailerBytes ||
      std::memcmp(address.data() + address.size() - sizeof(kTrailerMagic), kTrailerMagic,
                  sizeof(kTrailerMagic)) != 0) {
    return false;
  }
  const char* trailer = address.data() + address.size() - kTrailerBytes;
  std::memcpy(pid_namespace, trailer, sizeof(*pid_namespace));
  std::memcpy(pid, trailer + sizeof(*pid_namespace), sizeof(*pid));
  return true;
}

bool ProcessHasExited(int32_t pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  // A zombie (exited, not yet reaped by its parent) still answers kill(), but its memory is gone.
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t name_end = line.rfind(')');  // The command name may hold spaces and parentheses.
  if (name_end == std::string::npos || name_end + 2 >= line.size()) return false;
  const char state = line[name_end + 2];
  return state == 'Z' || state == 'X';
}

absl::Status UcxTransportImpl::ConnectPeers(const std::vector<std::string>& addresses) {
  absl::MutexLock lock(&drive_mu_);
  WSYNC_RETURN_IF_ERROR(CheckAbort());
  // Losses reported before now concern the endpoints this call may replace: applied to them
  // first, a report of a process that was lost and replaced since cannot fail its replacement's
  // new endpoint later.
  TakeLostPeers();
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
    if (!ParseProcessTrailer(peer.address, &peer.pid, &peer.pid_namespace)) {
      peer.pid = 0;
      peer.pid_namespace = 0;
    }
    peer.failure = absl::OkStatus();
    peer.failure_pending = false;
    if (!peer.address.empty()) WSYNC_RETURN_IF_ERROR(Endpoint(peer).status());
  }
  return absl::OkStatus();
}

std::string UcxTransportImpl::EndpointInfo(int32_t peer) {
  absl::MutexLock lock(&drive_mu_);
  if (peer < 0 || static_cast<size_t>(peer) >= peers_.size() || peers_[peer]->ep == nullptr) {
    return "";
  }
  char* text = nullptr;
  size_t length = 0;
  FILE* stream = open_memstream(&text, &length);
  if (stream == nullptr) return "";
  ucp_ep_print_info(peers_[peer]->ep, stream);
  fclose(stream);
  std::string out = absl::StrCat("error handling: ", peers_[peer]->peer_mode ? "peer" : "none",
                                 "\n", absl::string_view(text, length));
  free(text);
  return out;
}

bool UcxTransportImpl::CarriesCudaMemory() const {
  return (memory_types_ & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
}

std::string UcxTransportImpl::MemoryTypes() const {
  std::vector<std::string> names;
  for (int type = UCS_MEMORY_TYPE_HOST; type < UCS_MEMORY_TYPE_LAST; ++type) {
    if ((memory_types_ & UCS_BIT(type)) != 0) names.push_back(ucs_memory_type_names[type]);
  }
  return names.empty() ? "none" : absl::StrJoin(names, ", ");
}

absl::StatusOr<RegistrationId> UcxTransportImpl::RegisterMemory(void* address, int64_t bytes,
                                                                MemoryKind kind) {
  if (kind == MemoryKind::kCuda && !CarriesCudaMemory()) {
    return absl::UnimplementedError(
        absl::StrCat("ucx: this UCX build cannot carry cuda memory (the memory types it reports: ",
                     MemoryTypes(), ")"));
  }
  if (kind != MemoryKind::kHost && kind != MemoryKind::kCuda) {
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
  reg.kind = kind;
  if (bytes > 0) {
    ucp_mem_map_params_t params{};
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                        UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    params.address = address;
    params.length = static_cast<size_t>(bytes);
    params.memory_type = kind == MemoryKind::kCuda ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
    const ucs_status_t st = ucp_mem_map(context_, &params, &reg.memh);
    if (st != UCS_OK) {
      return FromUcs(st, absl::StrCat("ucx: ucp_mem_map of ", bytes, " bytes at ", Hex(reg.begin)));
    }
  }
  const RegistrationId id = next_registration_++;
  registrations_[id] = reg;
  return id;
}

absl::Status UcxTransportImpl::DeregisterMemory(RegistrationId id) {
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

absl::StatusOr<RequestId> UcxTransportImpl::PostSend(int32_t peer, MessageTag tag, const void* data,
                                                     int64_t bytes) {
  return Post(Kind::kSend, peer, tag, const_cast<void*>(data), bytes);
}

absl::StatusOr<RequestId> UcxTransportImpl::PostReceive(int32_t peer, MessageTag tag, void* data,
                                                        int64_t bytes) {
  return Post(Kind::kReceive, peer, tag, data, bytes);
}

absl::Status UcxTransportImpl::UnknownRequest(RequestId id) const {
  return absl::NotFoundError(
      absl::StrCat("ucx: process ", options_.process, " has no outstanding request with id ", id));
}

absl::StatusOr<ucp_ep_h> UcxTransportImpl::Endpoint(Peer& peer) {
  if (peer.ep != nullptr) return peer.ep;
  if (!peer.failure.ok()) return peer.failure;
  if (peer.address.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ucx: process ", options_.process, " has no address for process ", peer.process));
  }
  using EH = UcxOptions::ErrorHandling;
  bool try_peer = options_.error_handling == EH::kPeer ||
                  (options_.error_handling == EH::kAuto && !OnlySharedMemory(options_.transports));
  for (;;) {
    ucp_ep_params_t params{};
    // The error callback goes on every endpoint, MODE_NONE included: UCX 1.13 takes a failed
    // transport operation on an endpoint without one (a CMA copy from or to an exited process)
    // as fatal and aborts this process; with one, it fails the endpoint and its requests
    // instead (ucp_ep_set_failed), calling the callback in MODE_PEER only.
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address = reinterpret_cast<const ucp_address_t*>(peer.address.data());
    params.err_mode = try_peer ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    params.err_handler.cb = &OnPeerError;
    params.err_handler.arg = &peer;
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

RegistrationId UcxTransportImpl::Covering(const void* data, int64_t bytes) {
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

absl::StatusOr<RequestId> UcxTransportImpl::Post(Kind kind, int32_t peer, MessageTag tag,
                                                 void* data, int64_t bytes) {
  absl::MutexLock lock(&drive_mu_);
  WSYNC_RETURN_IF_ERROR(CheckAbort());
  if (peers_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("ucx: process ", options_.process, " posted before ConnectPeers"));
  }
  if (peer < 0 || static_cast<size_t>(peer) >= peers_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("ucx: process ", options_.process,
                                                   " cannot reach peer ", peer, ": ids are in [0, ",
                                                   peers_.size(), ")"));
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
  // A receive can match a message its sender announced and run the copy inside the post, before
  // any progress: a process resumed after a stop must fail its exited peers here first.
  TakeLostPeers();
  FailExitedPeers();
  HandleFailures();
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
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.user_data = s;
  // A registered range states its memory type; outside one, a context without CUDA support has
  // host memory only, and one with it detects the type itself.
  if (!CarriesCudaMemory()) {
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    param.memory_type = UCS_MEMORY_TYPE_HOST;
  }
  if (RegistrationId reg = Covering(data, bytes); reg != 0) {
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH | UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    param.memory_type = registrations_.at(reg).kind == MemoryKind::kCuda ? UCS_MEMORY_TYPE_CUDA
                                                                         : UCS_MEMORY_TYPE_HOST;
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

}  // namespace ucx_internal

std::vector<UcxDefaultSetting> UcxDefaultSettings() {
  // Each TCP receive reads up to a segment into UCX's buffer before moving the payload to its
  // destination; UCX 1.13's 64 KiB segments cost about a sixth more CPU per byte received over
  // loopback than 1 MiB ones (docs/benchmarks.md: `wsync-bench sync`). The buffer is per
  // receiving endpoint.
  return {{"RX_SEG_SIZE", "UCX_TCP_RX_SEG_SIZE", "1m", "tcp"}};
}

bool UcxTlsMaySelect(absl::string_view tls, absl::string_view transport) {
  tls = absl::StripAsciiWhitespace(tls);
  const bool excluding = absl::ConsumePrefix(&tls, "^");
  bool listed = false;
  for (absl::string_view name : absl::StrSplit(tls, ',', absl::SkipWhitespace())) {
    name = absl::StripAsciiWhitespace(name);
    if (name == transport) listed = true;
    if (name == "all" && !excluding) return true;
  }
  if (tls.empty()) return true;
  return excluding ? !listed : listed;
}

absl::StatusOr<std::unique_ptr<UcxTransport>> UcxTransport::Create(const UcxOptions& options) {
  auto transport = std::make_unique<ucx_internal::UcxTransportImpl>(options);
  WSYNC_RETURN_IF_ERROR(transport->Init());
  return std::unique_ptr<UcxTransport>(std::move(transport));
}

}  // namespace wsync
