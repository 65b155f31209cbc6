#include "transport/selector/selector.h"

#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
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

TEST(RoutedTransportTest, RefusesBadRoutes) {
  LoopbackFabric a(2);
  std::vector<std::unique_ptr<Transport>> backends;
  backends.push_back(*a.Connect(0));
  EXPECT_THAT(
      std::string(RoutedTransport::Create(0, std::move(backends), {0, 3}).status().message()),
      HasSubstr("route of peer 1 names backend 3 of 1"));
}

}  // namespace
}  // namespace wsync
