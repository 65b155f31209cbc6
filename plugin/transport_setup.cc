#include "plugin/transport_setup.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "executor/memory_kinds.h"
#include "transport/forwarding_transport.h"
#include "transport/selector/addresses.pb.h"

#if WSYNC_HAVE_NCCL
#include "transport/cuda_ipc/cuda_ipc_transport.h"
#endif

namespace wsync {

absl::StatusOr<PathTransportSetup> PathTransportSetup::Create(int32_t process,
                                                              PathTransports paths) {
  PathTransportSetup setup;
  setup.process_ = process;
  setup.paths_ = std::move(paths);
  proto::AddressBundle bundle;
  for (const TransportChoice& choice : setup.paths_.Distinct()) {
    if (choice.backend == "nccl" || choice.backend == "cuda_ipc") continue;
    setup.choices_.push_back(choice);
    if (choice.backend != "ucx") {
      return absl::InvalidArgumentError(
          absl::StrCat("backend '", choice.backend, "' cannot carry host weights here"));
    }
    UcxOptions options;
    options.process = process;
    options.transports = choice.transports;
    options.net_devices = choice.net_devices;
    WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<UcxTransport> ucx, UcxTransport::Create(options));
    bundle.add_addresses(ucx->WorkerAddress());
    setup.backends_.push_back(std::move(ucx));
  }
  setup.bundle_ = bundle.SerializeAsString();
  return setup;
}

int32_t PathTransportSetup::MessengerIndex() const {
  const auto fallback = std::find(choices_.begin(), choices_.end(), paths_.fallback);
  if (fallback != choices_.end()) return static_cast<int32_t>(fallback - choices_.begin());
  return choices_.empty() ? -1 : 0;
}

std::vector<BackendCapabilities> PathTransportSetup::Capabilities(bool nccl_built) const {
  // UCX carries CUDA memory only when every UCX context this process made reports it.
  const bool ucx_reports_cuda =
      !backends_.empty() &&
      std::all_of(backends_.begin(), backends_.end(), [](const std::unique_ptr<UcxTransport>& ucx) {
        return ucx->CarriesCudaMemory();
      });
  // CUDA IPC lives in the same CUDA module as NCCL and needs a UCX worker for its descriptors.
  return BuildCapabilities(ucx_reports_cuda, nccl_built, nccl_built && MessengerIndex() >= 0);
}

std::vector<NcclPair> PathTransportSetup::NcclPairs(const Job& job, bool nccl_built) const {
  const std::vector<BackendCapabilities> available = Capabilities(nccl_built);
  const std::vector<int32_t> cuda = JobMemoryKinds(job).CudaProcesses();
  std::vector<NcclPair> pairs;
  for (size_t i = 0; i < cuda.size(); ++i) {
    for (size_t j = i + 1; j < cuda.size(); ++j) {
      absl::StatusOr<TransportChoice> choice =
          ChooseTransport(paths_, job.PathClass(cuda[i], cuda[j]), MemoryKind::kCuda, available);
      if (choice.ok() && choice->backend == "nccl") pairs.emplace_back(cuda[i], cuda[j]);
    }
  }
  return pairs;
}

absl::StatusOr<std::vector<TransportChoice>> PathTransportSetup::ChooseRoutes(
    const Job& job, absl::Span<const Segment> segments, bool nccl_built) const {
  const JobMemoryKinds kinds(job);
  const std::vector<BackendCapabilities> available = Capabilities(nccl_built);
  std::vector<bool> exchanges(job.num_processes(), false);
  for (const Segment& s : segments) {
    if (s.from.process == process_ && s.to.process != process_) exchanges[s.to.process] = true;
    if (s.to.process == process_ && s.from.process != process_) exchanges[s.from.process] = true;
  }
  std::vector<TransportChoice> routes(job.num_processes());
  for (int32_t p = 0; p < job.num_processes(); ++p) {
    const MemoryKind kind = p == process_ ? MemoryKind::kHost : kinds.Pair(process_, p);
    absl::StatusOr<TransportChoice> choice =
        ChooseTransport(paths_, job.PathClass(process_, p), kind, available);
    if (choice.ok()) {
      routes[p] = *choice;
    } else if (exchanges[p]) {
      return absl::Status(choice.status().code(), absl::StrCat("process ", process_, " to process ",
                                                               p, ": ", choice.status().message()));
    } else if (!choices_.empty()) {
      routes[p] = choices_.front();
    } else {
      return choice.status();
    }
  }
  return routes;
}

absl::StatusOr<std::unique_ptr<RoutedTransport>> PathTransportSetup::Connect(
    const Job& job, const std::vector<std::string>& bundles,
    const std::vector<TransportChoice>& routes, std::unique_ptr<Transport> nccl,
    const CudaIpcFactory& make_cuda_ipc) && {
  if (!routes.empty()) {
    return std::move(*this).ConnectRoutes(routes, bundles, std::move(nccl), make_cuda_ipc);
  }
  return std::move(*this).Connect(
      [&job](int32_t from, int32_t to) { return std::string(job.PathClass(from, to)); }, bundles);
}

absl::StatusOr<std::unique_ptr<RoutedTransport>> PathTransportSetup::Connect(
    const std::function<std::string(int32_t, int32_t)>& path_class,
    const std::vector<std::string>& bundles) && {
  std::vector<TransportChoice> routes(bundles.size());
  for (int32_t p = 0; p < static_cast<int32_t>(bundles.size()); ++p) {
    routes[p] = paths_.For(path_class(process_, p));
  }
  return std::move(*this).ConnectRoutes(routes, bundles, nullptr, nullptr);
}

absl::StatusOr<std::unique_ptr<RoutedTransport>> PathTransportSetup::ConnectRoutes(
    const std::vector<TransportChoice>& routes, const std::vector<std::string>& bundles,
    std::unique_ptr<Transport> nccl, const CudaIpcFactory& make_cuda_ipc) && {
  const int32_t processes = static_cast<int32_t>(bundles.size());
  if (static_cast<int32_t>(routes.size()) != processes) {
    return absl::InvalidArgumentError(
        absl::StrCat(routes.size(), " routes for ", processes, " processes"));
  }
  const int32_t nccl_index = static_cast<int32_t>(choices_.size());
  const int32_t cuda_ipc_index = nccl_index + (nccl != nullptr ? 1 : 0);
  const int32_t messenger = MessengerIndex();
  bool any_cuda_ipc = false;
  std::vector<int32_t> route(processes);
  std::vector<std::vector<std::string>> peers_of(choices_.size(),
                                                 std::vector<std::string>(processes));
  for (int32_t p = 0; p < processes; ++p) {
    proto::AddressBundle bundle;
    if (!bundle.ParseFromString(bundles[p]) ||
        bundle.addresses_size() != static_cast<int>(choices_.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "process ", p, " uses another path transport configuration than process ", process_));
    }
    if (routes[p].backend == "nccl") {
      if (nccl == nullptr) {
        return absl::UnimplementedError(absl::StrCat("process ", process_, " routes process ", p,
                                                     " over NCCL but has no communicator"));
      }
      route[p] = nccl_index;
      continue;
    }
    if (routes[p].backend == "cuda_ipc") {
      if (!make_cuda_ipc || messenger < 0) {
        return absl::UnimplementedError(
            absl::StrCat("process ", process_, " routes process ", p, " over CUDA IPC but has no ",
                         messenger < 0 ? "UCX worker for its descriptors" : "CUDA IPC backend"));
      }
      route[p] = cuda_ipc_index;
      peers_of[messenger][p] = bundle.addresses(messenger);
      any_cuda_ipc = true;
      continue;
    }
    const auto choice = std::find(choices_.begin(), choices_.end(), routes[p]);
    if (choice == choices_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("process ", process_, " has no worker for ",
                                                     routes[p].backend, ":", routes[p].transports,
                                                     " (route to process ", p, ")"));
    }
    route[p] = static_cast<int32_t>(choice - choices_.begin());
    peers_of[route[p]][p] = bundle.addresses(route[p]);
  }
  std::vector<std::unique_ptr<Transport>> routed;
  for (size_t b = 0; b < backends_.size(); ++b) {
    WSYNC_RETURN_IF_ERROR(backends_[b]->ConnectPeers(peers_of[b]));
    routed.push_back(std::move(backends_[b]));
  }
  if (nccl != nullptr) routed.push_back(std::move(nccl));
  if (any_cuda_ipc) {
    // The messenger is borrowed: the routed transport destroys its backends last to first.
    WSYNC_ASSIGN_OR_RETURN(
        std::unique_ptr<Transport> cuda_ipc,
        make_cuda_ipc(std::make_unique<ForwardingTransport>(*routed[messenger])));
    routed.push_back(std::move(cuda_ipc));
  }
  return RoutedTransport::Create(process_, std::move(routed), std::move(route));
}

namespace {

// Whether `peer`'s messages go over backend `b` or over a CUDA IPC backend whose messenger is
// backend `b`.
bool ReachedThrough(const RoutedTransport& transport, int32_t peer, int32_t b) {
  const int32_t route = transport.RouteOf(peer);
  if (route == b) return true;
#if WSYNC_HAVE_NCCL
  if (auto* cuda_ipc = dynamic_cast<CudaIpcTransport*>(transport.backend(route))) {
    auto* messenger = dynamic_cast<ForwardingTransport*>(&cuda_ipc->messenger());
    return messenger != nullptr && &messenger->inner() == transport.backend(b);
  }
#endif
  return false;
}

// The address over backend `b` of every peer `transport` reaches through it (empty for the
// others), from the peers' bundles.
absl::StatusOr<std::vector<std::string>> AddressesThrough(const RoutedTransport& transport,
                                                          const std::vector<std::string>& bundles,
                                                          int32_t b) {
  const int32_t processes = static_cast<int32_t>(bundles.size());
  std::vector<std::string> addresses(processes);
  for (int32_t p = 0; p < processes; ++p) {
    if (!ReachedThrough(transport, p, b)) continue;
    proto::AddressBundle bundle;
    if (!bundle.ParseFromString(bundles[p]) || bundle.addresses_size() <= b) {
      return absl::InvalidArgumentError(
          absl::StrCat("process ", p, " uses another path transport configuration than process ",
                       transport.process()));
    }
    addresses[p] = bundle.addresses(b);
  }
  return addresses;
}

}  // namespace

absl::Status PathTransportSetup::Reconnect(RoutedTransport& transport,
                                           const std::vector<std::string>& bundles) {
  for (int32_t b = 0; transport.backend(b) != nullptr; ++b) {
    auto* ucx = dynamic_cast<UcxTransport*>(transport.backend(b));
    if (ucx == nullptr) continue;
    WSYNC_ASSIGN_OR_RETURN(std::vector<std::string> addresses,
                           AddressesThrough(transport, bundles, b));
    WSYNC_RETURN_IF_ERROR(ucx->ConnectPeers(addresses));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::unique_ptr<Transport>>> PathTransportSetup::ConnectFreshWorkers(
    const RoutedTransport& transport, const std::vector<std::string>& bundles) && {
  const int32_t workers = static_cast<int32_t>(backends_.size());
  for (int32_t b = 0; b < workers || transport.backend(b) != nullptr; ++b) {
    if (b >= workers || dynamic_cast<UcxTransport*>(transport.backend(b)) == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "process ", process_, ": backend ", b, " of its transport is not one of its ", workers,
          " UCX workers; they cannot be replaced"));
    }
  }
  std::vector<std::unique_ptr<Transport>> fresh;
  for (int32_t b = 0; b < workers; ++b) {
    WSYNC_ASSIGN_OR_RETURN(std::vector<std::string> addresses,
                           AddressesThrough(transport, bundles, b));
    WSYNC_RETURN_IF_ERROR(backends_[b]->ConnectPeers(addresses));
    fresh.push_back(std::move(backends_[b]));
  }
  return fresh;
}

}  // namespace wsync
