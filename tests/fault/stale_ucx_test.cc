// Rejecting stale messages over UCX (Transport::DiscardStaleMessages): messages of earlier syncs
// in a process's unexpected queue, eager and rendezvous sized, are consumed without touching any
// buffer of the caller and counted; messages of the current and of a later sync are left for
// their receives and arrive intact. A rogue that knows a process's worker address and sends it
// forged messages (a claimed length of up to 2^46 bytes, stale tags, sender bits of no process of
// the job or of another process) costs the receiver no allocation and no hang: drains drop them
// in bounded time, a receive they match fails naming the sizes, and Abort returns within 1 s.
// Over shared memory and TCP on loopback.

#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
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

absl::StatusOr<std::unique_ptr<UcxTransport>> MakeTransport(const Fabric& fabric, int32_t process) {
  UcxOptions options;
  options.process = process;
  options.transports = fabric.transports;
  options.net_devices = fabric.devices;
  options.drain_timeout = absl::Seconds(1);
  return UcxTransport::Create(options);
}

std::vector<std::unique_ptr<UcxTransport>> MakePair(const Fabric& fabric) {
  std::vector<std::unique_ptr<UcxTransport>> pair;
  std::vector<std::string> addresses;
  for (int32_t p = 0; p < 2; ++p) {
    absl::StatusOr<std::unique_ptr<UcxTransport>> t = MakeTransport(fabric, p);
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

// A worker that announces messages it never lets anyone read: it joins the job's UCX fabric from
// the victim's published address alone, as process `process` (0: impersonating the trainer).
class Rogue {
 public:
  Rogue(const Fabric& fabric, int32_t process, int32_t victim, const std::string& victim_address) {
    absl::StatusOr<std::unique_ptr<UcxTransport>> t = MakeTransport(fabric, process);
    EXPECT_TRUE(t.ok()) << t.status();
    if (!t.ok()) return;
    transport_ = *std::move(t);
    std::vector<std::string> addresses(std::max(process, victim) + 1);
    addresses[victim] = victim_address;
    EXPECT_TRUE(transport_->ConnectPeers(addresses).ok());
    // The largest range the address space gives, never touched: only its length is sent.
    for (claimed_ = int64_t{1} << 46; claimed_ >= (int64_t{1} << 36); claimed_ /= 2) {
      void* p = mmap(nullptr, static_cast<size_t>(claimed_), PROT_READ,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p != MAP_FAILED) {
        huge_ = static_cast<char*>(p);
        break;
      }
    }
    EXPECT_NE(huge_, nullptr) << "no range of 64 GiB or more to claim";
  }

  ~Rogue() {
    transport_.reset();
    if (huge_ != nullptr) munmap(huge_, static_cast<size_t>(claimed_));
  }

  // Announces the whole mapped range's bytes to `victim` under `tag`; never waits for the send.
  void ClaimHuge(int32_t victim, MessageTag tag) {
    absl::StatusOr<RequestId> id = transport_->PostSend(victim, tag, huge_, claimed_);
    ASSERT_TRUE(id.ok()) << id.status();
    posted_.push_back(*id);
  }

  // Progresses the rogue's worker (its sends go out, its connections answer) and forgets the
  // sends that finished, whatever their outcome.
  void Pump() {
    std::vector<RequestId> pending;
    for (RequestId id : posted_) {
      absl::StatusOr<bool> done = transport_->Test(id);
      if (done.ok() && !*done) pending.push_back(id);
    }
    posted_ = std::move(pending);
  }

  // Sends `bytes` bytes to `victim` under `tag` and waits until they left (so its endpoint is
  // wired up and what it posts next goes out at once).
  void Send(int32_t victim, MessageTag tag, int64_t bytes) {
    data_.emplace_back(bytes, 'r');
    absl::StatusOr<RequestId> id = transport_->PostSend(victim, tag, data_.back().data(), bytes);
    ASSERT_TRUE(id.ok()) << id.status();
    EXPECT_TRUE(transport_->WaitAll({*id}, absl::Now() + absl::Seconds(20)).ok());
  }

  // Posts a send of `bytes` bytes, progressed by Pump.
  void Post(int32_t victim, MessageTag tag, int64_t bytes) {
    data_.emplace_back(bytes, 'r');
    absl::StatusOr<RequestId> id = transport_->PostSend(victim, tag, data_.back().data(), bytes);
    ASSERT_TRUE(id.ok()) << id.status();
    posted_.push_back(*id);
  }

 private:
  std::unique_ptr<UcxTransport> transport_;
  char* huge_ = nullptr;
  int64_t claimed_ = 0;
  std::deque<std::string> data_;   // What Send and Post sent (never moved).
  std::vector<RequestId> posted_;  // Sends not known to have finished.
};

// Resident memory of this process.
int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

// Runs `f` and fails if it does not return within `limit`; a call that hangs ends the test
// binary (a hung call cannot be joined).
void WithinOrDie(absl::Duration limit, const char* what, std::function<void()> f) {
  auto done = std::async(std::launch::async, std::move(f));
  if (done.wait_for(absl::ToChronoSeconds(limit)) != std::future_status::ready) {
    fprintf(stderr, "FAILED: %s did not return within %s\n", what,
            absl::FormatDuration(limit).c_str());
    fflush(stderr);
    std::_Exit(1);
  }
  done.get();
}

// Drains on another thread until stopped, as executor runs do at their start and end.
class Drainer {
 public:
  Drainer(Transport& receiver, uint64_t sync)
      : thread_([this, &receiver, sync] {
          while (!stop_.load()) {
            rejected_ += receiver.DiscardStaleMessages(sync);
            absl::SleepFor(absl::Milliseconds(1));
          }
        }) {}
  ~Drainer() { Stop(); }
  int64_t rejected() const { return rejected_.load(); }
  // Waits until `count` messages were rejected, up to `limit`, pumping `rogues` meanwhile.
  bool AwaitRejected(int64_t count, absl::Duration limit, std::vector<Rogue*> rogues = {}) const {
    const absl::Time until = absl::Now() + limit;
    while (rejected() < count && absl::Now() < until) {
      for (Rogue* rogue : rogues) rogue->Pump();
      absl::SleepFor(absl::Milliseconds(1));
    }
    return rejected() >= count;
  }
  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> rejected_{0};
  std::thread thread_;
};

TEST_P(StaleUcxTest, ForgedHugeStaleMessagesAreDroppedWithoutAllocatingAndSyncsGoOn) {
  auto pair = MakePair(GetParam());
  ASSERT_EQ(pair.size(), 2u);
  Transport& sender = *pair[0];
  Transport& receiver = *pair[1];
  constexpr uint64_t kCurrent = 9;
  // Sender bits of no process of the job, and of the trainer (process 0).
  Rogue stranger(GetParam(), 77, 1, pair[1]->WorkerAddress());
  Rogue impostor(GetParam(), 0, 1, pair[1]->WorkerAddress());
  const int64_t resident = ResidentBytes();
  // The drains progress the receiver's worker, which the rogues' connections need.
  Drainer drainer(receiver, kCurrent);
  stranger.Send(1, MakeTag(kCurrent - 2, 0, 0), 64);
  impostor.Send(1, MakeTag(kCurrent - 1, 0, 0), 64);
  for (int i = 0; i < 4; ++i) {
    stranger.ClaimHuge(1, MakeTag(kCurrent - 1 - i, i, 0));
    impostor.ClaimHuge(1, MakeTag(kCurrent - 1 - i, i, 0));
  }
  stranger.Post(1, MakeTag(kCurrent - 3, 7, 0), 1 << 20);
  WithinOrDie(absl::Seconds(30), "draining", [&] {
    EXPECT_TRUE(drainer.AwaitRejected(11, absl::Seconds(20), {&stranger, &impostor}))
        << drainer.rejected();
  });
  drainer.Stop();
  EXPECT_EQ(drainer.rejected(), 11);
  EXPECT_LT(ResidentBytes() - resident, int64_t{64} << 20);
  // The receiver still syncs: a message of the current sync arrives intact.
  const std::vector<char> current(4096, 'c');
  std::vector<char> got(current.size());
  absl::StatusOr<RequestId> receive =
      receiver.PostReceive(0, MakeTag(kCurrent, 0, 0), got.data(), 4096);
  absl::StatusOr<RequestId> send =
      sender.PostSend(1, MakeTag(kCurrent, 0, 0), current.data(), 4096);
  ASSERT_TRUE(receive.ok() && send.ok());
  std::thread sending(
      [&] { EXPECT_TRUE(sender.WaitAll({*send}, absl::Now() + absl::Seconds(20)).ok()); });
  EXPECT_TRUE(receiver.WaitAll({*receive}, absl::Now() + absl::Seconds(20)).ok());
  sending.join();
  EXPECT_EQ(got, current);
}

TEST_P(StaleUcxTest, AForgedHugeMessageFailsTheReceiveItMatchesAndAbortReturnsWithinASecond) {
  auto pair = MakePair(GetParam());
  ASSERT_EQ(pair.size(), 2u);
  Transport& receiver = *pair[1];
  constexpr uint64_t kCurrent = 9;
  Rogue impostor(GetParam(), 0, 1, pair[1]->WorkerAddress());
  Drainer drainer(receiver, kCurrent);
  impostor.Send(1, MakeTag(kCurrent - 1, 0, 0), 64);
  ASSERT_TRUE(drainer.AwaitRejected(1, absl::Seconds(20)));
  drainer.Stop();
  std::vector<char> got(4096);
  absl::StatusOr<RequestId> receive =
      receiver.PostReceive(0, MakeTag(kCurrent, 3, 0), got.data(), 4096);
  ASSERT_TRUE(receive.ok()) << receive.status();
  impostor.ClaimHuge(1, MakeTag(kCurrent, 3, 0));
  absl::Status received;
  std::atomic<bool> waited{false};
  std::thread waiting([&] {
    received = receiver.WaitAll({*receive}, absl::Now() + absl::Seconds(20));
    waited.store(true);
  });
  while (!waited.load()) {
    impostor.Pump();
    absl::SleepFor(absl::Milliseconds(1));
  }
  waiting.join();
  EXPECT_EQ(received.code(), absl::StatusCode::kInvalidArgument) << received;
  EXPECT_TRUE(absl::StrContains(received.message(), "size mismatch")) << received;
  Drainer draining(receiver, kCurrent);
  const absl::Time start = absl::Now();
  WithinOrDie(absl::Seconds(30), "Abort", [&] { receiver.Abort(absl::CancelledError("test")); });
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
}

INSTANTIATE_TEST_SUITE_P(Fabrics, StaleUcxTest,
                         ::testing::Values(Fabric{"shm", "sm,cma,self", ""},
                                           Fabric{"tcp", "tcp", "lo"}),
                         [](const ::testing::TestParamInfo<Fabric>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace wsync
