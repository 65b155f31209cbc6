#ifndef WSYNC_PLUGIN_TRANSPORT_SETUP_H_
#define WSYNC_PLUGIN_TRANSPORT_SETUP_H_

// The data-path transports of one process, in two steps around the rendezvous: before it, one UCX
// worker per distinct transport choice of the process's path configuration and the address bundle
// to publish; after it, once the job (and so every peer's path class) is known, the routed
// transport that carries each peer's messages over the choice for its path class. Used by the
// session and by test workers that drive the same steps by hand. Not thread-safe.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "planner/job.h"
#include "planner/plan.h"
#include "plugin/nccl_communicators.h"
#include "transport/selector/selector.h"
#include "transport/ucx/ucx_transport.h"

namespace wsync {

class PathTransportSetup {
 public:
  // Starts the UCX workers of the UCX choices (an "nccl" choice needs none: its communicator is
  // formed at connect, plugin/cuda_setup.h; nor does "cuda_ipc": its descriptors travel over the
  // fallback's UCX worker, or the first one). InvalidArgument for any other backend.
  static absl::StatusOr<PathTransportSetup> Create(int32_t process, PathTransports paths);

  // What this process publishes at rendezvous (an AddressBundle, one address per UCX choice).
  const std::string& address_bundle() const { return bundle_; }

  // The choice for every peer (indexed by global process id): ChooseTransport for the path class
  // of the pair and the memory kind its messages travel in (executor/memory_kinds.h), against the
  // backends of this build (UCX carries CUDA memory only when every UCX context of this process
  // reports it, which Debian's UCX does not; NCCL when `nccl_built`). Unimplemented
  // naming the peer, the path class and the reason when a pair this process exchanges segments
  // with (`segments`: its plan) cannot be carried. A pair that exchanges nothing gets its choice
  // when there is one and else the first UCX worker (it never carries a message), as does this
  // process itself (local copies only).
  absl::StatusOr<std::vector<TransportChoice>> ChooseRoutes(const Job& job,
                                                            absl::Span<const Segment> segments,
                                                            bool nccl_built) const;

  // The job's NCCL pairs: each pair of CUDA processes whose path class this configuration routes
  // CUDA memory over to NCCL (ChooseTransport as in ChooseRoutes), in ascending order. Every
  // process of a job computes the same list (the same configuration and build everywhere; a
  // process with another configuration is refused at Connect). The communicators that carry them
  // are planned at connect (plugin/cuda_setup.h).
  std::vector<NcclPair> NcclPairs(const Job& job, bool nccl_built) const;

  // Makes the CUDA IPC backend over `messenger` (a borrowed UCX worker of this setup) when a route
  // names "cuda_ipc" (plugin/cuda_setup.h: MakeCudaIpc).
  using CudaIpcFactory = std::function<absl::StatusOr<std::unique_ptr<Transport>>(
      std::unique_ptr<Transport> messenger)>;

  // Routes every peer by `routes` (from ChooseRoutes; host choices for every peer when empty),
  // connects each UCX worker to its peers from their published bundles (indexed by global process
  // id; the messenger worker also to the CUDA IPC peers) and returns the routed transport: the UCX
  // workers, then `nccl` (required when a route names it), then the CUDA IPC backend made by
  // `make_cuda_ipc` (required when a route names it). The setup is spent. InvalidArgument when a
  // peer published a bundle of another configuration.
  absl::StatusOr<std::unique_ptr<RoutedTransport>> Connect(
      const Job& job, const std::vector<std::string>& bundles,
      const std::vector<TransportChoice>& routes = {}, std::unique_ptr<Transport> nccl = nullptr,
      const CudaIpcFactory& make_cuda_ipc = nullptr) &&;
  // Host memory only, with each peer's path class from `path_class(this process, peer)`, for
  // callers that have no Job (the link calibration).
  absl::StatusOr<std::unique_ptr<RoutedTransport>> Connect(
      const std::function<std::string(int32_t, int32_t)>& path_class,
      const std::vector<std::string>& bundles) &&;

  // Points a transport made by Connect at the peers' current bundles (a replacement process took
  // a rank and published new addresses): each UCX worker reconnects to the peers whose address
  // changed or whose endpoint failed and keeps the others. InvalidArgument for a bundle of another
  // configuration. The CUDA IPC backend's messenger is its UCX worker, reconnected with it. The
  // NCCL communicator is not re-formed here (the session re-forms it right after, in the same
  // sync: plugin/cuda_setup.h, NcclBackendFormedAtFirstSync).
  static absl::Status Reconnect(RoutedTransport& transport,
                                const std::vector<std::string>& bundles);

  // Fresh UCX workers for a transport made by Connect from a setup of the same configuration, in
  // a job without NCCL or CUDA IPC backends: each of this setup's workers is connected to the
  // peers that `transport` routes through the backend of the same index, at their addresses in
  // `bundles` (every process's bundle of its own fresh workers, indexed by global process id), and
  // returned by backend index, for RoutedTransport::SwapBackend. A survivor's way past a worker
  // that a dead peer left wedged (transport/ucx/README.md). The setup is spent.
  // FailedPrecondition when `transport` has a backend other than such a worker; InvalidArgument
  // for a bundle of another configuration.
  absl::StatusOr<std::vector<std::unique_ptr<Transport>>> ConnectFreshWorkers(
      const RoutedTransport& transport, const std::vector<std::string>& bundles) &&;

 private:
  int32_t process_ = 0;
  PathTransports paths_;
  absl::StatusOr<std::unique_ptr<RoutedTransport>> ConnectRoutes(
      const std::vector<TransportChoice>& routes, const std::vector<std::string>& bundles,
      std::unique_ptr<Transport> nccl, const CudaIpcFactory& make_cuda_ipc) &&;
  // The backends this build and setup have (BuildCapabilities).
  std::vector<BackendCapabilities> Capabilities(bool nccl_built) const;
  // The UCX worker (index into backends_) that carries CUDA IPC descriptors: the fallback's when
  // it is a UCX choice, else the first; -1 without any.
  int32_t MessengerIndex() const;

  std::vector<TransportChoice> choices_;  // The UCX choices, one worker each.
  std::vector<std::unique_ptr<UcxTransport>> backends_;
  std::string bundle_;
};

}  // namespace wsync

#endif  // WSYNC_PLUGIN_TRANSPORT_SETUP_H_
