#include "transport/selector/selector.h"

#include <set>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/forwarding_transport.h"
#include "transport/loopback/loopback.h"

namespace wsync {
namespace {

using ::testing::HasSubstr;

TEST(PathTransportsTest, ParsesClassesFallbackAndDevices) {
  absl::StatusOr<PathTransports> config =
      ParsePathTransports("intra_node=ucx:sm,cma,self; inter_node=ucx:tcp@eth0,eth1; *=loopback");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->For("intra_node"), (TransportChoice{"ucx", "sm,cma,self", ""}));
  EXPECT_EQ(config->For("inter_node"), (TransportChoice{"ucx", "tcp", "eth0,eth1"}));
  EXPECT_EQ(config->For("local"), (TransportChoice{"loopback", "", ""}));
  EXPECT_EQ(config->Distinct().size(), 3u);
  absl::StatusOr<PathTransports> empty = ParsePathTransports("");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->For("inter_node"), TransportChoice{});
  EXPECT_EQ(empty->Distinct().size(), 1u);
}

TEST(PathTransportsTest, CommasSeparateEntriesBeforeAnItemWithEquals) {
  absl::StatusOr<PathTransports> config =
      ParsePathTransports("intra_node=nccl,inter_node=ucx:tcp,sm@eth0,*=ucx:sm,cma,self");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->For("intra_node"), (TransportChoice{"nccl", "", ""}));
  EXPECT_EQ(config->For("inter_node"), (TransportChoice{"ucx", "tcp,sm", "eth0"}));
  EXPECT_EQ(config->For("local"), (TransportChoice{"ucx", "sm,cma,self", ""}));
  EXPECT_TRUE(config->fallback_given);
  EXPECT_THAT(std::string(ParsePathTransports("tcp,intra_node=nccl").status().message()),
              HasSubstr("'tcp' is not <path class>=<backend>"));
}

TEST(PathTransportsTest, RefusesBadEntries) {
  EXPECT_THAT(std::string(ParsePathTransports("intra_node").status().message()),
              HasSubstr("is not <path class>=<backend>"));
  EXPECT_THAT(std::string(ParsePathTransports("inter_node=rdma:verbs").status().message()),
              HasSubstr("unknown backend 'rdma'"));
  EXPECT_THAT(std::string(ParsePathTransports("local=ucx;local=loopback").status().message()),
              HasSubstr("path class 'local' is given twice"));
}

// Processes 0, 1 on one node and 2, 3 on another: intra-node messages go over one fabric,
// inter-node messages over the other, and waits that mix both complete.
TEST(RoutedTransportTest, CarriesEachPeerOnItsPathClassTransport) {
  constexpr int kProcesses = 4;
  LoopbackFabric intra(kProcesses), inter(kProcesses);
  auto node = [](int p) { return p / 2; };
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(kProcesses);
  for (int p = 0; p < kProcesses; ++p) {
    threads.emplace_back([&, p] {
      std::vector<std::unique_ptr<Transport>> backends;
      backends.push_back(*intra.Connect(p));
      backends.push_back(*inter.Connect(p));
      std::vector<int32_t> route(kProcesses);
      for (int q = 0; q < kProcesses; ++q) route[q] = node(q) == node(p) ? 0 : 1;
      auto routed = RoutedTransport::Create(p, std::move(backends), route);
      if (!routed.ok()) {
        results[p] = routed.status();
        return;
      }
      std::vector<std::vector<int32_t>> inbox(kProcesses, std::vector<int32_t>(256, -1));
      std::vector<int32_t> outbox(256);
      for (int i = 0; i < 256; ++i) outbox[i] = p * 1000 + i;
      std::vector<RequestId> requests;
      for (int q = 0; q < kProcesses; ++q) {
        if (q == p) continue;
        requests.push_back(*(*routed)->PostReceive(q, MakeTag(1, 0, q), inbox[q].data(), 1024));
        requests.push_back(*(*routed)->PostSend(q, MakeTag(1, 0, p), outbox.data(), 1024));
      }
      results[p] = (*routed)->WaitAll(requests, absl::Now() + absl::Seconds(10));
      for (int q = 0; q < kProcesses && results[p].ok(); ++q) {
        if (q != p && inbox[q][255] != q * 1000 + 255) {
          results[p] = absl::DataLossError(absl::StrCat("wrong bytes from ", q));
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int p = 0; p < kProcesses; ++p) EXPECT_TRUE(results[p].ok()) << p << ": " << results[p];
  const LoopbackCounters intra_counters = intra.counters();
  const LoopbackCounters inter_counters = inter.counters();
  for (int from = 0; from < kProcesses; ++from) {
    for (int to = 0; to < kProcesses; ++to) {
      if (from == to) continue;
      const bool same_node = node(from) == node(to);
      EXPECT_EQ(intra_counters.BytesDelivered(from, to), same_node ? 1024 : 0);
      EXPECT_EQ(inter_counters.BytesDelivered(from, to), same_node ? 0 : 1024);
    }
  }
}

TEST(RoutedTransportTest, MixedWaitMissesItsDeadlineAndReleasesEverything) {
  LoopbackFabric a(2), b(2);
  std::vector<std::unique_ptr<Transport>> backends;
  backends.push_back(*a.Connect(0));
  backends.push_back(*b.Connect(0));
  auto routed = *RoutedTransport::Create(0, std::move(backends), {0, 1});
  char byte = 0;
  std::vector<RequestId> requests = {*routed->PostReceive(0, MakeTag(1, 0, 0), &byte, 1),
                                     *routed->PostReceive(1, MakeTag(1, 0, 1), &byte, 1)};
  const absl::Time start = absl::Now();
  const absl::Status status = routed->WaitAll(requests, start + absl::Milliseconds(100));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));  // A bound on hanging, not a timing test.
  EXPECT_EQ(routed->Test(requests[0]).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(a.UnmatchedRequests() + b.UnmatchedRequests(), 0);
}

// A backend replaced after an abort (a re-formed NCCL communicator) carries the next messages;
// the old one's aborted requests are gone.
TEST(RoutedTransportTest, AReplacedBackendCarriesTheNextMessages) {
  LoopbackFabric old_fabric(2), new_fabric(2);
  std::vector<std::unique_ptr<Transport>> backends;
  backends.push_back(*old_fabric.Connect(0));
  auto routed = *RoutedTransport::Create(0, std::move(backends), {0, 0});
  routed->backend(0)->Abort(absl::AbortedError("communicator failed"));
  char byte = 0;
  EXPECT_FALSE(routed->PostSend(1, MakeTag(1, 0, 0), &byte, 1).ok());
  EXPECT_FALSE(routed->ReplaceBackend(1, *new_fabric.Connect(0)).ok());  // Out of range.
  ASSERT_TRUE(routed->ReplaceBackend(0, *new_fabric.Connect(0)).ok());
  std::unique_ptr<Transport> peer = *new_fabric.Connect(1);
  char sent = 42, received = 0;
  const RequestId send = *routed->PostSend(1, MakeTag(2, 0, 0), &sent, 1);
  const RequestId receive = *peer->PostReceive(0, MakeTag(2, 0, 0), &received, 1);
  ASSERT_TRUE(routed->WaitAll({send}, absl::Now() + absl::Seconds(10)).ok());
  ASSERT_TRUE(peer->WaitAll({receive}, absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ(received, 42);
}

// Records the regions registered with it (and refuses them when `refuse` is set).
class RecordingTransport : public ForwardingTransport {
 public:
  using ForwardingTransport::ForwardingTransport;
  absl::StatusOr<RegistrationId> RegisterMemory(void* address, int64_t bytes,
                                                MemoryKind kind) override {
    if (refuse) return absl::InternalError("refused");
    regions.insert(address);
    return ForwardingTransport::RegisterMemory(address, bytes, kind);
  }
  bool refuse = false;
  std::set<void*> regions;
};

// A swapped-in backend (a fresh UCX worker) gets every live registration, carries the next
// messages, and the old one comes back to the caller; a backend that refuses a registration is
// not swapped in.
TEST(RoutedTransportTest, ASwappedBackendTakesTheRegistrationsAndTheOldOneIsHandedBack) {
  LoopbackFabric old_fabric(2), new_fabric(2);
  std::vector<std::unique_ptr<Transport>> backends;
  backends.push_back(*old_fabric.Connect(0));
  Transport* const old_backend = backends.back().get();
  auto routed = *RoutedTransport::Create(0, std::move(backends), {0, 0});
  char kept = 0, dropped = 0;
  ASSERT_TRUE(routed->RegisterMemory(&kept, 1, MemoryKind::kHost).ok());
  const RegistrationId gone = *routed->RegisterMemory(&dropped, 1, MemoryKind::kHost);
  ASSERT_TRUE(routed->DeregisterMemory(gone).ok());

  auto refusing = std::make_unique<RecordingTransport>(*new_fabric.Connect(0));
  refusing->refuse = true;
  EXPECT_FALSE(routed->SwapBackend(0, std::move(refusing)).ok());
  EXPECT_EQ(routed->backend(0), old_backend);
  EXPECT_FALSE(routed->SwapBackend(1, *new_fabric.Connect(0)).ok());  // Out of range.

  auto fresh = std::make_unique<RecordingTransport>(*new_fabric.Connect(0));
  RecordingTransport* const recorded = fresh.get();
  absl::StatusOr<std::unique_ptr<Transport>> old = routed->SwapBackend(0, std::move(fresh));
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->get(), old_backend);
  EXPECT_EQ(recorded->regions, std::set<void*>{&kept});
  std::unique_ptr<Transport> peer = *new_fabric.Connect(1);
  char sent = 42, received = 0;
  const RequestId send = *routed->PostSend(1, MakeTag(2, 0, 0), &sent, 1);
  const RequestId receive = *peer->PostReceive(0, MakeTag(2, 0, 0), &received, 1);
  ASSERT_TRUE(routed->WaitAll({send}, absl::Now() + absl::Seconds(10)).ok());
  ASSERT_TRUE(peer->WaitAll({receive}, absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ(received, 42);
}

TEST(RoutedTransportTest, RefusesBadRoutes) {
  LoopbackFabric a(2);
  std::vector<std::unique_ptr<Transport>> backends;
  backends.push_back(*a.Connect(0));
  EXPECT_THAT(
      std::string(RoutedTransport::Create(0, std::move(backends), {0, 3}).status().message()),
      HasSubstr("route of peer 1 names backend 3 of 1"));
}

// A backend that carries CUDA memory only (like NCCL), forwarding messages to a loopback.
class CudaOnlyBackend final : public ForwardingTransport {
 public:
  using ForwardingTransport::ForwardingTransport;
  std::string name() const override { return "cuda-only"; }
  bool NeedsRoundOrder() const override { return true; }
  absl::StatusOr<RegistrationId> RegisterMemory(void*, int64_t, MemoryKind kind) override {
    if (kind != MemoryKind::kCuda) return absl::UnimplementedError("cuda-only: host refused");
    ++registered;
    return 7;
  }
  absl::Status DeregisterMemory(RegistrationId id) override {
    --registered;
    return id == 7 ? absl::OkStatus() : absl::NotFoundError("no such registration");
  }
  int registered = 0;
};

// NCCL for CUDA memory next to UCX (here loopback) for host memory: each kind registers with the
// backends that carry it; a kind no backend carries is refused.
TEST(RoutedTransportTest, RegistersEachMemoryKindWithTheBackendsThatCarryIt) {
  LoopbackFabric a(2), b(2);
  std::vector<std::unique_ptr<Transport>> backends;
  backends.push_back(*a.Connect(0));
  auto cuda_only = std::make_unique<CudaOnlyBackend>(*b.Connect(0));
  CudaOnlyBackend* cuda = cuda_only.get();
  backends.push_back(std::move(cuda_only));
  auto routed = *RoutedTransport::Create(0, std::move(backends), {0, 1});
  char memory[64];
  absl::StatusOr<RegistrationId> host = routed->RegisterMemory(memory, 64, MemoryKind::kHost);
  ASSERT_TRUE(host.ok()) << host.status();
  absl::StatusOr<RegistrationId> device = routed->RegisterMemory(memory, 64, MemoryKind::kCuda);
  ASSERT_TRUE(device.ok()) << device.status();
  EXPECT_EQ(cuda->registered, 1);
  EXPECT_TRUE(routed->DeregisterMemory(*device).ok());
  EXPECT_TRUE(routed->DeregisterMemory(*host).ok());
  EXPECT_EQ(cuda->registered, 0);
  // One backend that needs round order (as NCCL does) puts the whole routed transport in lockstep.
  EXPECT_TRUE(routed->NeedsRoundOrder());

  LoopbackFabric c(1);
  std::vector<std::unique_ptr<Transport>> host_only;
  host_only.push_back(*c.Connect(0));
  auto plain = *RoutedTransport::Create(0, std::move(host_only), {0});
  EXPECT_EQ(plain->RegisterMemory(memory, 64, MemoryKind::kCuda).status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_FALSE(plain->NeedsRoundOrder());
}

// Transport choice per (path class, memory kind), with capability checks (issue 8).
TEST(ChooseTransportTest, DefaultsByMemoryKind) {
  const PathTransports paths = *ParsePathTransports("");
  const auto with_nccl =
      BuildCapabilities(/*ucx_reports_cuda=*/false, /*nccl_built=*/true, /*cuda_ipc_built=*/false);
  EXPECT_EQ(ChooseTransport(paths, "intra_node", MemoryKind::kCuda, with_nccl)->backend, "nccl");
  EXPECT_EQ(ChooseTransport(paths, "intra_node", MemoryKind::kHost, with_nccl)->backend, "ucx");
  // Without NCCL, a UCX that reports CUDA support carries CUDA memory.
  const auto cuda_ucx =
      BuildCapabilities(/*ucx_reports_cuda=*/true, /*nccl_built=*/false, /*cuda_ipc_built=*/false);
  EXPECT_EQ(ChooseTransport(paths, "inter_node", MemoryKind::kCuda, cuda_ucx)->backend, "ucx");
}

TEST(ChooseTransportTest, RefusesCudaWithoutABackendThatReachesIt) {
  const auto plain =
      BuildCapabilities(/*ucx_reports_cuda=*/false, /*nccl_built=*/false, /*cuda_ipc_built=*/false);
  absl::StatusOr<TransportChoice> none =
      ChooseTransport(*ParsePathTransports(""), "intra_node", MemoryKind::kCuda, plain);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(none.status().message()),
              HasSubstr("this UCX build reports no CUDA memory support"));
  // An explicit UCX choice for CUDA memory on a UCX without CUDA support is refused with why.
  const auto with_nccl = BuildCapabilities(false, true, false);
  absl::StatusOr<TransportChoice> ucx = ChooseTransport(*ParsePathTransports("intra_node=ucx:sm"),
                                                        "intra_node", MemoryKind::kCuda, with_nccl);
  EXPECT_EQ(ucx.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(ucx.status().message()),
              HasSubstr("path class 'intra_node' carries cuda memory but its configured backend "
                        "'ucx' cannot reach it"));
  EXPECT_THAT(std::string(ucx.status().message()), HasSubstr("here: nccl"));
  // NCCL for host memory, and NCCL in a build without it.
  EXPECT_EQ(ChooseTransport(*ParsePathTransports("*=nccl"), "local", MemoryKind::kHost, with_nccl)
                .status()
                .code(),
            absl::StatusCode::kUnimplemented);
  absl::StatusOr<TransportChoice> missing = ChooseTransport(*ParsePathTransports("intra_node=nccl"),
                                                            "intra_node", MemoryKind::kCuda, plain);
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("backend 'nccl', which this build does not have"));
}

TEST(ChooseTransportTest, ExplicitMixedMappingPerPathClass) {
  const PathTransports paths = *ParsePathTransports("intra_node=nccl;inter_node=ucx:tcp");
  EXPECT_FALSE(paths.fallback_given);
  const auto cuda_ucx =
      BuildCapabilities(/*ucx_reports_cuda=*/true, /*nccl_built=*/true, /*cuda_ipc_built=*/false);
  absl::StatusOr<std::vector<TransportChoice>> choices = ChooseTransports(
      paths,
      {PathUse{"intra_node", MemoryKind::kCuda}, PathUse{"inter_node", MemoryKind::kCuda},
       PathUse{"local", MemoryKind::kCuda}, PathUse{"local", MemoryKind::kHost}},
      cuda_ucx);
  ASSERT_TRUE(choices.ok()) << choices.status();
  EXPECT_EQ((*choices)[0].backend, "nccl");
  EXPECT_EQ((*choices)[1], (TransportChoice{"ucx", "tcp", ""}));
  EXPECT_EQ((*choices)[2].backend, "nccl");  // Unlisted class, CUDA memory: the default.
  EXPECT_EQ((*choices)[3].backend, "ucx");
  // The same mapping with a UCX that has no CUDA support fails at the inter_node use.
  absl::StatusOr<std::vector<TransportChoice>> refused = ChooseTransports(
      paths, {PathUse{"inter_node", MemoryKind::kCuda}}, BuildCapabilities(false, true, false));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("'inter_node' carries cuda"));
}

// CUDA IPC: the default for CUDA memory within a node when built; never across nodes.
TEST(PathTransportsTest, SameDeviceFallsBackToIntraNodesEntry) {
  const auto all = BuildCapabilities(/*ucx_reports_cuda=*/false, /*nccl_built=*/true,
                                     /*cuda_ipc_built=*/true);
  // Without an entry of its own, same_device takes intra_node's, before the fallback.
  const PathTransports intra = *ParsePathTransports("intra_node=nccl;*=ucx:tcp");
  EXPECT_EQ(intra.For("same_device"), (TransportChoice{"nccl", "", ""}));
  EXPECT_EQ(ChooseTransport(intra, "same_device", MemoryKind::kCuda, all)->backend, "nccl");
  // Its own entry wins; without either it is the fallback.
  const PathTransports own = *ParsePathTransports("same_device=cuda_ipc;intra_node=nccl");
  EXPECT_EQ(own.For("same_device").backend, "cuda_ipc");
  EXPECT_EQ(ChooseTransport(own, "same_device", MemoryKind::kCuda, all)->backend, "cuda_ipc");
  EXPECT_EQ(ParsePathTransports("*=ucx:tcp")->For("same_device"),
            (TransportChoice{"ucx", "tcp", ""}));
  // By default CUDA memory of a same-GPU pair goes over CUDA IPC, which reaches it.
  EXPECT_EQ(
      ChooseTransport(*ParsePathTransports(""), "same_device", MemoryKind::kCuda, all)->backend,
      "cuda_ipc");
  EXPECT_TRUE(IsSameNodePathClass("same_device"));
}

TEST(ChooseTransportTest, CudaIpcWithinANodeNcclAcross) {
  const auto all = BuildCapabilities(/*ucx_reports_cuda=*/false, /*nccl_built=*/true,
                                     /*cuda_ipc_built=*/true);
  const PathTransports defaults = *ParsePathTransports("");
  EXPECT_EQ(ChooseTransport(defaults, "intra_node", MemoryKind::kCuda, all)->backend, "cuda_ipc");
  EXPECT_EQ(ChooseTransport(defaults, "local", MemoryKind::kCuda, all)->backend, "cuda_ipc");
  EXPECT_EQ(ChooseTransport(defaults, "inter_node", MemoryKind::kCuda, all)->backend, "nccl");
  EXPECT_EQ(ChooseTransport(defaults, "intra_node", MemoryKind::kHost, all)->backend, "ucx");
  // A class mapped to a CUDA-only backend carries its host pairs over the fallback.
  EXPECT_EQ(ChooseTransport(*ParsePathTransports("intra_node=nccl;*=ucx:sm"), "intra_node",
                            MemoryKind::kHost, all)
                .value(),
            (TransportChoice{"ucx", "sm", ""}));
  EXPECT_EQ(ChooseTransport(*ParsePathTransports("intra_node=cuda_ipc"), "intra_node",
                            MemoryKind::kHost, all)
                ->backend,
            "ucx");
  // Without NCCL, a class leaving the node has no default for CUDA memory.
  const auto ipc_only = BuildCapabilities(false, false, true);
  absl::StatusOr<TransportChoice> across =
      ChooseTransport(defaults, "inter_node", MemoryKind::kCuda, ipc_only);
  EXPECT_EQ(across.status().code(), absl::StatusCode::kUnimplemented);
  // Explicit choices: NCCL within a node is kept; CUDA IPC across nodes or for host memory is
  // refused with the reason.
  EXPECT_EQ(
      ChooseTransport(*ParsePathTransports("intra_node=nccl"), "intra_node", MemoryKind::kCuda, all)
          ->backend,
      "nccl");
  absl::StatusOr<TransportChoice> ipc_across = ChooseTransport(
      *ParsePathTransports("inter_node=cuda_ipc"), "inter_node", MemoryKind::kCuda, all);
  EXPECT_EQ(ipc_across.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(ipc_across.status().message()),
              HasSubstr("'cuda_ipc', which reaches only processes of the same node"));
  absl::StatusOr<TransportChoice> ipc_host =
      ChooseTransport(*ParsePathTransports("*=cuda_ipc"), "intra_node", MemoryKind::kHost, all);
  EXPECT_EQ(ipc_host.status().code(), absl::StatusCode::kUnimplemented);
  // CUDA IPC configured in a build without it.
  absl::StatusOr<TransportChoice> not_built =
      ChooseTransport(*ParsePathTransports("intra_node=cuda_ipc"), "intra_node", MemoryKind::kCuda,
                      BuildCapabilities(false, true, false));
  EXPECT_THAT(std::string(not_built.status().message()),
              HasSubstr("backend 'cuda_ipc', which this build does not have"));
  // Settings are refused for the backends that take none.
  EXPECT_EQ(ParsePathTransports("intra_node=cuda_ipc:sm").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParsePathTransports("inter_node=nccl@eth0").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParsePathTransports("intra_node=cuda_ipc,inter_node=nccl")->For("intra_node").backend,
            "cuda_ipc");
}

}  // namespace
}  // namespace wsync
