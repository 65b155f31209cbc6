// Rejecting stale messages over UCX (Transport::DiscardStaleMessages): messages of earlier syncs
// in a process's unexpected queue, eager and rendezvous sized, are consumed without touching any
// buffer of the caller and counted; messages of the current and of a later sync are left for
// their receives and arrive intact. Over shared memory and TCP on loopback.

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "transport/ucx/ucx_transport.h"

namespace wsync {
namespace {

struct Fabric {
  std::string name;
  std::string transports;
  std::string devices;
};

class StaleUcxTest : public ::testing::TestWithParam<Fabric> {};

std::vector<std::unique_ptr<UcxTransport>> MakePair(const Fabric& fabric) {
  std::vector<std::unique_ptr<UcxTransport>> pair;
  std::vector<std::string> addresses;
  for (int32_t p = 0; p < 2; ++p) {
    UcxOptions options;
    options.process = p;
    options.transports = fabric.transports;
    options.net_devices = fabric.devices;
    options.drain_timeout = absl::Seconds(1);
    absl::StatusOr<std::unique_ptr<UcxTransport>> t = UcxTransport::Create(options);
    EXPECT_TRUE(t.ok()) << t.status();
    if (!t.ok()) return {};
    addresses.push_back((*t)->WorkerAddress());
    pair.push_back(*std::move(t));
  }
  for (auto& t : pair) EXPECT_TRUE(t->ConnectPeers(addresses).ok());
  return pair;
}

TEST_P(StaleUcxTest, MessagesOfEarlierSyncsAreRejectedAndCountedOthersArrive) {
  auto pair = MakePair(GetParam());
  ASSERT_EQ(pair.size(), 2u);
  Transport& sender = *pair[0];
  Transport& receiver = *pair[1];
  constexpr uint64_t kCurrent = 5;
  const std::vector<char> small(64, 'a'), large(4 << 20, 'b'), current(256, 'c'), later(256, 'd');
  struct Message {
    uint64_t sync;
    const std::vector<char>* data;
  };
  // Two of sync 4 (eager and rendezvous sizes), one of sync 5 (current), one of sync 6 (later).
  const std::vector<Message> messages = {
      {kCurrent - 1, &small}, {kCurrent - 1, &large}, {kCurrent, &current}, {kCurrent + 1, &later}};
  std::vector<RequestId> sends;
  for (size_t i = 0; i < messages.size(); ++i) {
    absl::StatusOr<RequestId> id =
        sender.PostSend(1, MakeTag(messages[i].sync, static_cast<int64_t>(i), 0),
                        messages[i].data->data(), static_cast<int64_t>(messages[i].data->size()));
    ASSERT_TRUE(id.ok()) << id.status();
    sends.push_back(*id);
  }
  absl::Status sent;
  std::thread sending([&] { sent = sender.WaitAll(sends, absl::Now() + absl::Seconds(20)); });

  int64_t rejected = 0;
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (rejected < 2 && absl::Now() < until) {
    rejected += receiver.DiscardStaleMessages(kCurrent);
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(rejected, 2);
  // Nothing of sync 5 or 6 was rejected: both still arrive, intact.
  std::vector<char> got_current(current.size()), got_later(later.size());
  std::vector<RequestId> receives;
  receives.push_back(*receiver.PostReceive(0, MakeTag(kCurrent, 2, 0), got_current.data(),
                                           static_cast<int64_t>(got_current.size())));
  receives.push_back(*receiver.PostReceive(0, MakeTag(kCurrent + 1, 3, 0), got_later.data(),
                                           static_cast<int64_t>(got_later.size())));
  EXPECT_TRUE(receiver.WaitAll(receives, absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ(got_current, current);
  EXPECT_EQ(got_later, later);
  EXPECT_EQ(receiver.DiscardStaleMessages(kCurrent), 0);
  sending.join();
  EXPECT_TRUE(sent.ok()) << sent;
}

INSTANTIATE_TEST_SUITE_P(Fabrics, StaleUcxTest,
                         ::testing::Values(Fabric{"shm", "sm,cma,self", ""},
                                           Fabric{"tcp", "tcp", "lo"}),
                         [](const ::testing::TestParamInfo<Fabric>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace wsync
