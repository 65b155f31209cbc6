#include "transport/selector/selector.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/status.h"

namespace wsync {

std::map<std::string, TransportChoice>::const_iterator PathTransports::Find(
    absl::string_view path_class) const {
  auto it = by_path.find(std::string(path_class));
  if (it == by_path.end() && path_class == kSameDevicePathClass) {
    it = by_path.find(std::string(kIntraNodePathClass));
  }
  return it;
}

const TransportChoice& PathTransports::For(absl::string_view path_class) const {
  auto it = Find(path_class);
  return it == by_path.end() ? fallback : it->second;
}

std::vector<TransportChoice> PathTransports::Distinct() const {
  std::set<TransportChoice> distinct = {fallback};
  for (const auto& [path, choice] : by_path) distinct.insert(choice);
  return std::vector<TransportChoice>(distinct.begin(), distinct.end());
}

namespace {

// The entries of a spec: split at ';', and at a ',' whose next item holds '=' (so that
// "intra_node=nccl,inter_node=ucx:sm,cma" is two entries and "ucx:sm,cma" keeps its list).
std::vector<std::string> SplitEntries(absl::string_view spec) {
  std::vector<std::string> entries;
  for (absl::string_view part : absl::StrSplit(spec, ';', absl::SkipWhitespace())) {
    std::vector<absl::string_view> current;
    for (absl::string_view item : absl::StrSplit(part, ',')) {
      if (item.find('=') != absl::string_view::npos && !current.empty()) {
        entries.push_back(absl::StrJoin(current, ","));
        current.clear();
      }
      current.push_back(item);
    }
    entries.push_back(absl::StrJoin(current, ","));
  }
  return entries;
}

}  // namespace

absl::StatusOr<PathTransports> ParsePathTransports(absl::string_view spec) {
  PathTransports result;
  for (const std::string& raw : SplitEntries(spec)) {
    absl::string_view entry = absl::StripAsciiWhitespace(raw);
    if (entry.empty()) continue;
    const size_t equals = entry.find('=');
    if (equals == absl::string_view::npos || equals == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "path transport entry '", entry, "' is not <path class>=<backend>[:<transports>]"));
    }
    const absl::string_view path = entry.substr(0, equals);
    absl::string_view value = entry.substr(equals + 1);
    TransportChoice choice;
    if (const size_t at = value.find('@'); at != absl::string_view::npos) {
      choice.net_devices = std::string(value.substr(at + 1));
      value = value.substr(0, at);
    }
    if (const size_t colon = value.find(':'); colon != absl::string_view::npos) {
      choice.transports = std::string(value.substr(colon + 1));
      value = value.substr(0, colon);
    }
    choice.backend = std::string(value);
    if (choice.backend != "ucx" && choice.backend != "nccl" && choice.backend != "cuda_ipc" &&
        choice.backend != "loopback") {
      return absl::InvalidArgumentError(absl::StrCat("path transport entry '", entry,
                                                     "' names unknown backend '", choice.backend,
                                                     "' (known: ucx, nccl, cuda_ipc, loopback)"));
    }
    if ((choice.backend == "nccl" || choice.backend == "cuda_ipc") &&
        (!choice.transports.empty() || !choice.net_devices.empty())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "path transport entry '", entry, "': backend '", choice.backend, "' takes no settings"));
    }
    if (path == "*") {
      result.fallback = std::move(choice);
      result.fallback_given = true;
    } else if (!result.by_path.emplace(std::string(path), std::move(choice)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("path class '", path, "' is given twice in '", spec, "'"));
    }
  }
  return result;
}

bool IsSameNodePathClass(absl::string_view path_class) {
  return path_class == "local" || path_class == kIntraNodePathClass ||
         path_class == kSameDevicePathClass;
}

std::vector<BackendCapabilities> BuildCapabilities(bool ucx_reports_cuda, bool nccl_built,
                                                   bool cuda_ipc_built) {
  std::vector<BackendCapabilities> result;
  if (cuda_ipc_built) {
    result.push_back(BackendCapabilities{"cuda_ipc", false, true, true,
                                         "CUDA IPC carries CUDA memory within one node only"});
  }
  if (nccl_built) {
    result.push_back(
        BackendCapabilities{"nccl", false, true, false, "NCCL carries CUDA memory only"});
  }
  result.push_back(
      BackendCapabilities{"ucx", true, ucx_reports_cuda, false,
                          ucx_reports_cuda ? "" : "this UCX build reports no CUDA memory support"});
  result.push_back(BackendCapabilities{"loopback", true, false, false,
                                       "loopback is in-process, host memory only"});
  return result;
}

namespace {

const BackendCapabilities* FindBackend(absl::Span<const BackendCapabilities> available,
                                       absl::string_view backend) {
  for (const BackendCapabilities& caps : available) {
    if (caps.backend == backend) return &caps;
  }
  return nullptr;
}

bool Carries(const BackendCapabilities& caps, MemoryKind kind) {
  return kind == MemoryKind::kCuda ? caps.cuda_memory : caps.host_memory;
}

bool Reaches(const BackendCapabilities& caps, absl::string_view path_class) {
  return !caps.same_node_only || IsSameNodePathClass(path_class);
}

std::string AvailableNames(absl::Span<const BackendCapabilities> available, MemoryKind kind) {
  std::vector<std::string> names;
  for (const BackendCapabilities& caps : available) {
    if (Carries(caps, kind)) names.push_back(caps.backend);
  }
  return names.empty() ? "none" : absl::StrJoin(names, ", ");
}

}  // namespace

absl::StatusOr<TransportChoice> ChooseTransport(const PathTransports& paths,
                                                absl::string_view path_class, MemoryKind kind,
                                                absl::Span<const BackendCapabilities> available) {
  const auto entry = paths.Find(path_class);
  const bool explicit_choice = entry != paths.by_path.end() || paths.fallback_given;
  if (!explicit_choice && kind == MemoryKind::kCuda) {
    // Default for CUDA memory: CUDA IPC within a node, NCCL, else a UCX that reports CUDA support.
    for (absl::string_view backend : {"cuda_ipc", "nccl", "ucx"}) {
      const BackendCapabilities* caps = FindBackend(available, backend);
      if (caps != nullptr && caps->cuda_memory && Reaches(*caps, path_class)) {
        TransportChoice choice;
        choice.backend = std::string(backend);
        return choice;
      }
    }
    std::vector<std::string> notes;
    for (const BackendCapabilities& caps : available) {
      if (!caps.note.empty()) notes.push_back(absl::StrCat(caps.backend, ": ", caps.note));
    }
    return absl::UnimplementedError(
        absl::StrCat("path class '", path_class,
                     "' carries cuda memory but no backend of this build can "
                     "reach it (",
                     notes.empty() ? "no backend" : absl::StrJoin(notes, "; "),
                     "); build with NCCL (WSYNC_WITH_NCCL) or use a UCX with CUDA support"));
  }
  const TransportChoice* chosen = entry != paths.by_path.end() ? &entry->second : &paths.fallback;
  const BackendCapabilities* caps = FindBackend(available, chosen->backend);
  if (kind == MemoryKind::kHost && entry != paths.by_path.end() && caps != nullptr &&
      caps->cuda_memory && !caps->host_memory) {
    // A class mapped to a CUDA-only backend (nccl, cuda_ipc) names its CUDA pairs' transport; its
    // host pairs use the fallback.
    chosen = &paths.fallback;
    caps = FindBackend(available, chosen->backend);
  }
  const TransportChoice& choice = *chosen;
  if (caps == nullptr) {
    return absl::UnimplementedError(
        absl::StrCat("path class '", path_class, "' is configured for backend '", choice.backend,
                     "', which this build does not have (backends for ", MemoryKindName(kind),
                     " memory: ", AvailableNames(available, kind), ")"));
  }
  if (!Carries(*caps, kind)) {
    return absl::UnimplementedError(absl::StrCat(
        "path class '", path_class, "' carries ", MemoryKindName(kind),
        " memory but its configured backend '", choice.backend, "' cannot reach it",
        caps->note.empty() ? "" : absl::StrCat(" (", caps->note, ")"), "; backends for ",
        MemoryKindName(kind), " memory here: ", AvailableNames(available, kind)));
  }
  if (!Reaches(*caps, path_class)) {
    return absl::UnimplementedError(
        absl::StrCat("path class '", path_class, "' is configured for backend '", choice.backend,
                     "', which reaches only processes of the same node (", caps->note, ")"));
  }
  return choice;
}

absl::StatusOr<std::vector<TransportChoice>> ChooseTransports(
    const PathTransports& paths, absl::Span<const PathUse> uses,
    absl::Span<const BackendCapabilities> available) {
  std::vector<TransportChoice> result;
  for (const PathUse& use : uses) {
    WSYNC_ASSIGN_OR_RETURN(TransportChoice choice,
                           ChooseTransport(paths, use.path_class, use.kind, available));
    result.push_back(std::move(choice));
  }
  return result;
}

absl::StatusOr<std::unique_ptr<RoutedTransport>> RoutedTransport::Create(
    int32_t process, std::vector<std::unique_ptr<Transport>> backends, std::vector<int32_t> route,
    std::string name) {
  if (backends.empty()) return absl::InvalidArgumentError("a routed transport needs a backend");
  for (size_t peer = 0; peer < route.size(); ++peer) {
    if (route[peer] < 0 || route[peer] >= static_cast<int32_t>(backends.size())) {
      return absl::InvalidArgumentError(absl::StrCat("route of peer ", peer, " names backend ",
                                                     route[peer], " of ", backends.size()));
    }
  }
  auto routed = std::unique_ptr<RoutedTransport>(new RoutedTransport());
  routed->process_ = process;
  routed->name_ = std::move(name);
  routed->backends_ = std::move(backends);
  routed->route_ = std::move(route);
  return routed;
}

RoutedTransport::~RoutedTransport() {
  while (!backends_.empty()) backends_.pop_back();
}

std::string RoutedTransport::name() const {
  if (!name_.empty()) return name_;
  std::vector<std::string> names;
  for (const auto& backend : backends_) names.push_back(backend->name());
  return absl::StrCat("routed(", absl::StrJoin(names, ","), ")");
}

Transport* RoutedTransport::BackendFor(int32_t peer) const {
  if (peer < 0 || peer >= static_cast<int32_t>(route_.size())) return nullptr;
  return backends_[route_[peer]].get();
}

int32_t RoutedTransport::RouteOf(int32_t peer) const {
  if (peer < 0 || peer >= static_cast<int32_t>(route_.size())) return -1;
  return route_[peer];
}

Transport* RoutedTransport::backend(int32_t index) const {
  if (index < 0 || index >= static_cast<int32_t>(backends_.size())) return nullptr;
  return backends_[index].get();
}

absl::Status RoutedTransport::ReplaceBackend(int32_t index, std::unique_ptr<Transport> backend) {
  if (index < 0 || index >= static_cast<int32_t>(backends_.size()) || backend == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot replace backend ", index, " of ", backends_.size()));
  }
  for (auto it = requests_.begin(); it != requests_.end();) {
    it = it->second.backend == index ? requests_.erase(it) : std::next(it);
  }
  for (auto& [id, registration] : registrations_) registration.ids[index].reset();
  backends_[index] = std::move(backend);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Transport>> RoutedTransport::SwapBackend(
    int32_t index, std::unique_ptr<Transport> backend) {
  if (index < 0 || index >= static_cast<int32_t>(backends_.size()) || backend == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot swap backend ", index, " of ", backends_.size()));
  }
  std::map<RegistrationId, std::optional<RegistrationId>> carried;
  for (const auto& [id, registration] : registrations_) {
    absl::StatusOr<RegistrationId> made =
        backend->RegisterMemory(registration.address, registration.bytes, registration.kind);
    if (made.ok()) {
      carried[id] = *made;
    } else if (made.status().code() == absl::StatusCode::kUnimplemented) {
      carried[id] = std::nullopt;
    } else {
      for (const auto& [done, made_id] : carried) {
        if (made_id.has_value()) backend->DeregisterMemory(*made_id).IgnoreError();
      }
      return made.status();
    }
  }
  for (auto it = requests_.begin(); it != requests_.end();) {
    it = it->second.backend == index ? requests_.erase(it) : std::next(it);
  }
  for (auto& [id, registration] : registrations_) registration.ids[index] = carried[id];
  std::unique_ptr<Transport> old = std::move(backends_[index]);
  backends_[index] = std::move(backend);
  return old;
}

absl::StatusOr<RegistrationId> RoutedTransport::RegisterMemory(void* address, int64_t bytes,
                                                               MemoryKind kind) {
  std::vector<std::optional<RegistrationId>> ids;
  absl::Status refused;  // The backends that do not carry this kind, for when none does.
  bool any = false;
  for (auto& backend : backends_) {
    absl::StatusOr<RegistrationId> id = backend->RegisterMemory(address, bytes, kind);
    if (id.ok()) {
      ids.push_back(*id);
      any = true;
      continue;
    }
    if (id.status().code() == absl::StatusCode::kUnimplemented) {
      ids.push_back(std::nullopt);
      refused = refused.ok() ? id.status()
                             : absl::UnimplementedError(
                                   absl::StrCat(refused.message(), "; ", id.status().message()));
      continue;
    }
    for (size_t b = 0; b < ids.size(); ++b) {
      if (ids[b].has_value()) backends_[b]->DeregisterMemory(*ids[b]).IgnoreError();
    }
    return id.status();
  }
  if (!any) return refused;
  const RegistrationId id = next_registration_++;
  registrations_[id] = Registration{address, bytes, kind, std::move(ids)};
  return id;
}

absl::Status RoutedTransport::DeregisterMemory(RegistrationId id) {
  auto it = registrations_.find(id);
  if (it == registrations_.end()) {
    return absl::NotFoundError(absl::StrCat("no registration ", id));
  }
  absl::Status status;
  const std::vector<std::optional<RegistrationId>>& ids = it->second.ids;
  for (size_t b = 0; b < ids.size(); ++b) {
    if (ids[b].has_value()) status.Update(backends_[b]->DeregisterMemory(*ids[b]));
  }
  registrations_.erase(it);
  return status;
}

absl::StatusOr<RequestId> RoutedTransport::Remember(int32_t backend,
                                                    absl::StatusOr<RequestId> request) {
  WSYNC_RETURN_IF_ERROR(request.status());
  const RequestId id = next_request_++;
  requests_[id] = Routed{backend, *request};
  return id;
}

absl::StatusOr<RequestId> RoutedTransport::PostSend(int32_t peer, MessageTag tag, const void* data,
                                                    int64_t bytes) {
  if (BackendFor(peer) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("no route to process ", peer));
  }
  const int32_t backend = route_[peer];
  return Remember(backend, backends_[backend]->PostSend(peer, tag, data, bytes));
}

absl::StatusOr<RequestId> RoutedTransport::PostReceive(int32_t peer, MessageTag tag, void* data,
                                                       int64_t bytes) {
  if (BackendFor(peer) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("no route to process ", peer));
  }
  const int32_t backend = route_[peer];
  return Remember(backend, backends_[backend]->PostReceive(peer, tag, data, bytes));
}

absl::StatusOr<bool> RoutedTransport::Test(RequestId request) {
  auto it = requests_.find(request);
  if (it == requests_.end()) return absl::NotFoundError(absl::StrCat("no request ", request));
  absl::StatusOr<bool> done = backends_[it->second.backend]->Test(it->second.request);
  if (!done.ok() || *done) requests_.erase(it);
  return done;
}

void RoutedTransport::ProgressInFlight() {
  for (const std::unique_ptr<Transport>& backend : backends_) backend->ProgressInFlight();
}

absl::Status RoutedTransport::WaitAny(absl::Span<const RequestId> requests, absl::Time deadline,
                                      std::vector<size_t>* finished) {
  std::vector<RequestId> inner;
  inner.reserve(requests.size());
  int32_t backend = -1;
  for (RequestId request : requests) {
    auto it = requests_.find(request);
    if (it == requests_.end() || (backend >= 0 && it->second.backend != backend)) {
      return Transport::WaitAny(requests, deadline, finished);  // Polls Test, which names it.
    }
    backend = it->second.backend;
    inner.push_back(it->second.request);
  }
  if (backend < 0) return Transport::WaitAny(requests, deadline, finished);
  const size_t first = finished->size();
  const absl::Status status = backends_[backend]->WaitAny(inner, deadline, finished);
  for (size_t i = first; i < finished->size(); ++i) requests_.erase(requests[(*finished)[i]]);
  return status;
}

bool RoutedTransport::NeedsRoundOrder() const {
  return std::any_of(backends_.begin(), backends_.end(),
                     [](const auto& backend) { return backend->NeedsRoundOrder(); });
}

absl::Status RoutedTransport::WaitAll(absl::Span<const RequestId> requests, absl::Time deadline) {
  // Per backend, the backend's ids of the requests still in flight.
  std::vector<std::vector<RequestId>> pending(backends_.size());
  absl::Status status;
  for (RequestId request : requests) {
    auto it = requests_.find(request);
    if (it == requests_.end()) {
      status.Update(absl::NotFoundError(absl::StrCat("no request ", request)));
      continue;
    }
    pending[it->second.backend].push_back(it->second.request);
    requests_.erase(it);
  }
  const int busy = static_cast<int>(std::count_if(pending.begin(), pending.end(),
                                                  [](const auto& list) { return !list.empty(); }));
  if (busy == 1) {
    for (size_t b = 0; b < pending.size(); ++b) {
      if (!pending[b].empty()) status.Update(backends_[b]->WaitAll(pending[b], deadline));
    }
    return status;
  }
  // Several backends: poll them in turn so that none waits on another.
  absl::Duration pause = absl::ZeroDuration();
  while (status.ok()) {
    bool any_pending = false;
    bool progressed = false;
    for (size_t b = 0; b < pending.size() && status.ok(); ++b) {
      std::vector<RequestId>& list = pending[b];
      for (size_t i = 0; i < list.size();) {
        absl::StatusOr<bool> done = backends_[b]->Test(list[i]);
        if (!done.ok()) {
          status = done.status();
          list.erase(list.begin() + i);
          break;
        }
        if (*done) {
          list.erase(list.begin() + i);
          progressed = true;
        } else {
          ++i;
        }
      }
      any_pending |= !list.empty();
    }
    if (!status.ok() || !any_pending) break;
    if (absl::Now() >= deadline) {
      status = absl::DeadlineExceededError("requests on several transports missed the deadline");
      break;
    }
    pause = progressed ? absl::ZeroDuration()
                       : std::min(pause + absl::Microseconds(10), absl::Microseconds(200));
    if (pause > absl::ZeroDuration()) absl::SleepFor(pause);
  }
  // Cancel and release whatever is left; the backends name the peers of what they cancel.
  for (size_t b = 0; b < pending.size(); ++b) {
    if (pending[b].empty()) continue;
    absl::Status cancelled = backends_[b]->WaitAll(pending[b], absl::InfinitePast());
    if (status.code() == absl::StatusCode::kDeadlineExceeded && !cancelled.ok()) {
      status = absl::DeadlineExceededError(
          absl::StrCat(status.message(), "; ", backends_[b]->name(), ": ", cancelled.message()));
    }
  }
  return status;
}

int64_t RoutedTransport::DiscardStaleMessages(uint64_t sync_id) {
  int64_t rejected = 0;
  for (auto& backend : backends_) rejected += backend->DiscardStaleMessages(sync_id);
  return rejected;
}

void RoutedTransport::Abort(const absl::Status& reason) {
  for (auto& backend : backends_) backend->Abort(reason);
}

void RoutedTransport::PeerLost(int32_t peer, const absl::Status& reason) {
  if (peer < 0 || static_cast<size_t>(peer) >= route_.size()) return;
  backends_[route_[peer]]->PeerLost(peer, reason);
}

}  // namespace wsync
