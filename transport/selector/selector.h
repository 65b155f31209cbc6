#ifndef WSYNC_TRANSPORT_SELECTOR_SELECTOR_H_
#define WSYNC_TRANSPORT_SELECTOR_SELECTOR_H_

// Transport choice per path class. A job's peers differ in how they are reached: the same process,
// the same node (shared memory, CMA) or another node (TCP, RDMA). A PathTransports configuration
// names, per path class, the backend and its settings; a RoutedTransport then carries every
// message to a peer on the transport chosen for the path class of that peer.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/memory_kind.h"
#include "transport/transport.h"

namespace wsync {

// One backend with its settings, e.g. backend "ucx" with transports "sm,cma,self".
struct TransportChoice {
  std::string backend = "ucx";
  std::string transports;   // The backend's transport list (UCX_TLS for UCX); empty: default.
  std::string net_devices;  // UCX_NET_DEVICES; empty: default.

  friend bool operator==(const TransportChoice&, const TransportChoice&) = default;
  friend auto operator<=>(const TransportChoice&, const TransportChoice&) = default;
};

// The path classes the selector knows by name (planner/job.h defines the same strings).
inline constexpr absl::string_view kIntraNodePathClass = "intra_node";
inline constexpr absl::string_view kSameDevicePathClass = "same_device";

// Path class ("local", "same_device", "intra_node", "inter_node", or any label a path function
// returns) to the transport that carries it. A class not listed uses `fallback`, except
// "same_device", which uses the "intra_node" entry when the map has one and no entry of its own.
struct PathTransports {
  std::map<std::string, TransportChoice> by_path;
  TransportChoice fallback;
  // True when the spec set the fallback ('*'); otherwise the memory kind picks the default backend
  // (ChooseTransport).
  bool fallback_given = false;

  const TransportChoice& For(absl::string_view path_class) const;
  // The entry For uses (by_path.end(): the fallback).
  std::map<std::string, TransportChoice>::const_iterator Find(absl::string_view path_class) const;
  // The distinct choices, in a deterministic order; RoutedTransport builds one backend per entry.
  std::vector<TransportChoice> Distinct() const;
};

// Parses "intra_node=ucx:sm,cma,self;inter_node=ucx:tcp@eth0;*=ucx:tcp": entries separated by ';'
// (or by ',' before an item holding '=': "intra_node=nccl,inter_node=ucx:tcp" is two entries),
// each "<path class or *>=<backend>[:<transports>][@<net devices>]". '*' sets the fallback. An
// empty spec is UCX with its defaults for every class. InvalidArgument names the bad entry.
absl::StatusOr<PathTransports> ParsePathTransports(absl::string_view spec);

// What a backend of this build, on this machine, can carry. Filled at connect time from runtime
// checks (UCX: whether the context reports CUDA memory support; NCCL: whether it was built).
struct BackendCapabilities {
  std::string backend;  // "ucx", "nccl", "cuda_ipc", "loopback".
  bool host_memory = false;
  bool cuda_memory = false;
  // Reaches only processes of this node (path classes "local" and "intra_node"): CUDA IPC.
  bool same_node_only = false;
  // Why a memory kind is missing, for refusals, e.g. "this UCX build has no CUDA support".
  std::string note;
};

// The backends of a build: UCX (host memory; CUDA memory when `ucx_reports_cuda`), NCCL (CUDA
// memory) when `nccl_built`, CUDA IPC (CUDA memory within a node) when `cuda_ipc_built` (it needs
// the CUDA module and a UCX worker for its descriptors), loopback (host memory, in-process tests).
std::vector<BackendCapabilities> BuildCapabilities(bool ucx_reports_cuda, bool nccl_built,
                                                   bool cuda_ipc_built);

// Whether `path_class` joins processes of one node ("local", "same_device", "intra_node").
bool IsSameNodePathClass(absl::string_view path_class);

// The transport for messages of `kind` memory over `path_class`. An entry for the class, or a
// given fallback ('*'), is the user's explicit choice and is used as is (for both memory kinds,
// except that host memory on a class whose entry names a CUDA-only backend, nccl or cuda_ipc,
// uses the fallback); otherwise host memory goes over the fallback (UCX) and CUDA memory over the
// first available
// backend that carries it: within a node CUDA IPC, then NCCL, then UCX; across nodes NCCL, then
// UCX. A choice whose backend is not in `available`, cannot carry `kind`, or reaches only this
// node while the class leaves it (CUDA IPC for "inter_node") is refused with Unimplemented
// (WSYNC_UNSUPPORTED at the C ABI) naming the path class, the memory kind, the backend and the
// reason, so that connect fails before any byte moves.
absl::StatusOr<TransportChoice> ChooseTransport(const PathTransports& paths,
                                                absl::string_view path_class, MemoryKind kind,
                                                absl::Span<const BackendCapabilities> available);

// One (path class, memory kind) a process will send or receive over.
struct PathUse {
  std::string path_class;
  MemoryKind kind = MemoryKind::kHost;
};

// ChooseTransport for every use; the first refusal, or the choice per use in order.
absl::StatusOr<std::vector<TransportChoice>> ChooseTransports(
    const PathTransports& paths, absl::Span<const PathUse> uses,
    absl::Span<const BackendCapabilities> available);

// A Transport over several backends: a message to `peer` goes over backends[route[peer]]. Request
// ids are its own. Test and WaitAll drive every backend that has requests in flight, so progress
// on one never waits on another (a rendezvous on one backend may need this process's progress
// while it waits for a message on another). Abort aborts every backend. Registration registers the
// memory with every backend that carries its kind (a backend answering Unimplemented, e.g. NCCL for
// host memory or UCX without CUDA support for CUDA memory, is skipped); it fails when none does,
// or with the first other error. Thread safety as Transport.
class RoutedTransport final : public Transport {
 public:
  // `route` is indexed by peer process id; every entry must index `backends`. `name`: what name()
  // answers when not empty (several NCCL communicators routed as one backend answer "nccl");
  // otherwise "routed(<each backend's name>)".
  static absl::StatusOr<std::unique_ptr<RoutedTransport>> Create(
      int32_t process, std::vector<std::unique_ptr<Transport>> backends, std::vector<int32_t> route,
      std::string name = "");
  // Destroys the backends last to first, so that a backend may borrow an earlier one (the CUDA IPC
  // backend's messenger is a UCX worker listed before it).
  ~RoutedTransport() override;

  int32_t process() const override { return process_; }
  std::string name() const override;
  absl::StatusOr<RegistrationId> RegisterMemory(void* address, int64_t bytes,
                                                MemoryKind kind) override;
  absl::Status DeregisterMemory(RegistrationId id) override;
  absl::StatusOr<RequestId> PostSend(int32_t peer, MessageTag tag, const void* data,
                                     int64_t bytes) override;
  absl::StatusOr<RequestId> PostReceive(int32_t peer, MessageTag tag, void* data,
                                        int64_t bytes) override;
  absl::StatusOr<bool> Test(RequestId request) override;
  void ProgressInFlight() override;
  absl::Status WaitAll(absl::Span<const RequestId> requests, absl::Time deadline) override;
  // Waits in the backend's own WaitAny when every request is on one backend (UCX sleeps on its
  // wakeup event); requests on several backends are polled in turn (Transport::WaitAny).
  absl::Status WaitAny(absl::Span<const RequestId> requests, absl::Time deadline,
                       std::vector<size_t>* finished) override;
  // True when any backend needs it (a sync that mixes NCCL and UCX runs in lockstep rounds).
  bool NeedsRoundOrder() const override;
  void Abort(const absl::Status& reason) override;
  // Tells the backend that carries `peer`'s messages (ignored for a peer out of range).
  void PeerLost(int32_t peer, const absl::Status& reason) override;
  int64_t DiscardStaleMessages(uint64_t sync_id) override;

  // Replaces backend `index` (e.g. an NCCL communicator re-formed after an abort). Requests still
  // routed to the old backend are forgotten and its registrations dropped (registration is
  // optional). Not concurrent with any other call, Abort included: the caller serialises.
  // InvalidArgument for an index out of range or a null backend.
  absl::Status ReplaceBackend(int32_t index, std::unique_ptr<Transport> backend);
  // Replaces backend `index` by `backend` (a fresh UCX worker, e.g.) and hands the old one back,
  // for the caller to destroy outside its lock. Every live registration is registered with the new
  // backend first (a backend answering Unimplemented is skipped for it); on any other error the
  // registrations made are undone, nothing is replaced and `backend` is destroyed. Requests still
  // routed to the old backend are forgotten. Not concurrent with any other call, Abort included.
  // InvalidArgument for an index out of range or a null backend.
  absl::StatusOr<std::unique_ptr<Transport>> SwapBackend(int32_t index,
                                                         std::unique_ptr<Transport> backend);

  // The backend carrying messages to `peer`, for reports; nullptr out of range.
  Transport* BackendFor(int32_t peer) const;
  // The index of that backend (-1 out of range), and the backend of an index (nullptr out of
  // range), for reconnecting peers.
  int32_t RouteOf(int32_t peer) const;
  Transport* backend(int32_t index) const;

 private:
  RoutedTransport() = default;
  struct Routed {
    int32_t backend;
    RequestId request;
  };
  absl::StatusOr<RequestId> Remember(int32_t backend, absl::StatusOr<RequestId> request);

  int32_t process_ = 0;
  std::string name_;
  std::vector<std::unique_ptr<Transport>> backends_;
  std::vector<int32_t> route_;
  std::map<RequestId, Routed> requests_;
  RequestId next_request_ = 1;
  // Per routed registration, the region and each backend's id; nullopt where the backend does not
  // carry that memory kind (Unimplemented).
  struct Registration {
    void* address = nullptr;
    int64_t bytes = 0;
    MemoryKind kind = MemoryKind::kHost;
    std::vector<std::optional<RegistrationId>> ids;
  };
  std::map<RegistrationId, Registration> registrations_;
  RegistrationId next_registration_ = 1;
};

}  // namespace wsync

#endif  // WSYNC_TRANSPORT_SELECTOR_SELECTOR_H_
