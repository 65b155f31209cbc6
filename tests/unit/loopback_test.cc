#include "transport/loopback/loopback.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/wait_any_checks.h"
#include "tests/unit/loopback_testing.h"

namespace wsync {
namespace {

using ::testing::HasSubstr;

using test::In;
using test::MustConnect;
using test::MustGroup;

std::vector<uint8_t> Pattern(int64_t bytes, uint32_t seed) {
  std::vector<uint8_t> v(bytes);
  for (int64_t i = 0; i < bytes; ++i) v[i] = static_cast<uint8_t>((seed * 131 + i * 7) >> 1);
  return v;
}

// The default Transport::WaitAny (polling Test) keeps its contract over loopback.
TEST(LoopbackTest, WaitAnyReturnsTheFirstFinishedAndLeavesTheRestPosted) {
  LoopbackFabric fabric(2);
  std::unique_ptr<Transport> sender = MustConnect(fabric, 0);
  std::unique_ptr<Transport> receiver = MustConnect(fabric, 1);
  test::ExpectWaitAnyContract(*sender, *receiver);
}

TEST(LoopbackTest, SendBeforeReceiveAndReceiveBeforeSend) {
  LoopbackFabric fabric(2);
  auto a = MustConnect(fabric, 0);
  auto b = MustConnect(fabric, 1);
  EXPECT_EQ(a->name(), "loopback");
  EXPECT_EQ(b->process(), 1);
  const std::vector<uint8_t> data = Pattern(1000, 1);

  // Send first: the receive copies.
  std::vector<uint8_t> out(1000, 0);
  absl::StatusOr<RequestId> s = a->PostSend(1, MessageTag{5}, data.data(), 1000);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*a->Test(*s), false);
  absl::StatusOr<RequestId> r = b->PostReceive(0, MessageTag{5}, out.data(), 1000);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(out, data);
  EXPECT_EQ(*a->Test(*s), true);
  EXPECT_EQ(b->Test(*r).value_or(false), true);
  EXPECT_EQ(a->Test(*s).status().code(), absl::StatusCode::kNotFound);  // Released.

  // Receive first: the send copies.
  std::vector<uint8_t> out2(1000, 0);
  r = b->PostReceive(0, MessageTag{6}, out2.data(), 1000);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*b->Test(*r), false);
  s = a->PostSend(1, MessageTag{6}, data.data(), 1000);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(out2, data);
  EXPECT_TRUE(a->WaitAll({*s}, In(absl::Seconds(5))).ok());
  EXPECT_TRUE(b->WaitAll({*r}, In(absl::Seconds(5))).ok());

  const LoopbackCounters c = fabric.counters();
  EXPECT_EQ(c.BytesDelivered(0, 1), 2000);
  EXPECT_EQ(c.BytesDelivered(1, 0), 0);
  EXPECT_EQ(c.BytesDelivered(7, 0), 0);
  EXPECT_EQ(c.TotalBytes(), 2000);
  EXPECT_EQ(c.messages, 2);
  EXPECT_EQ(c.largest_message_bytes, 1000);
  fabric.ResetCounters();
  EXPECT_EQ(fabric.counters().TotalBytes(), 0);
  EXPECT_EQ(fabric.UnmatchedRequests(), 0);
}

// A fabric with eager sends: a send of at most eager_bytes completes when posted, with its bytes
// copied then (changing the sender's memory afterwards changes nothing), and waits for its receive
// also after the sender's transport is destroyed; a message of another size still fails the
// receive at once; larger sends complete only when matched and go with their transport.
TEST(LoopbackTest, EagerSendsCompleteAtOnceAndOutliveTheirTransport) {
  LoopbackFabric fabric(2, /*eager_bytes=*/64);
  auto b = MustConnect(fabric, 1);
  {
    auto a = MustConnect(fabric, 0);
    std::vector<uint8_t> data = Pattern(64, 4);
    absl::StatusOr<RequestId> eager = a->PostSend(1, MessageTag{9}, data.data(), 64);
    ASSERT_TRUE(eager.ok()) << eager.status();
    EXPECT_TRUE(a->WaitAll({*eager}, In(absl::Milliseconds(1))).ok());
    std::fill(data.begin(), data.end(), 0);
    static const char kEmpty = 0;
    ASSERT_TRUE(a->PostSend(1, MessageTag{10}, &kEmpty, 0).ok());  // A notice.
    const std::vector<uint8_t> large = Pattern(65, 5);
    absl::StatusOr<RequestId> rendezvous = a->PostSend(1, MessageTag{11}, large.data(), 65);
    ASSERT_TRUE(rendezvous.ok());
    EXPECT_EQ(*a->Test(*rendezvous), false);
    EXPECT_EQ(fabric.UnmatchedRequests(), 3);
  }  // The sender's transport is gone: its eager messages stay, its rendezvous send goes.
  EXPECT_EQ(fabric.UnmatchedRequests(), 2);
  std::vector<uint8_t> out(64, 0);
  absl::StatusOr<RequestId> r = b->PostReceive(0, MessageTag{9}, out.data(), 64);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(b->WaitAll({*r}, In(absl::Seconds(5))).ok());
  EXPECT_EQ(out, Pattern(64, 4));
  std::vector<uint8_t> expected(16, 0x33);
  r = b->PostReceive(0, MessageTag{10}, expected.data(), 16);
  ASSERT_TRUE(r.ok());
  const absl::Status mismatch = b->WaitAll({*r}, In(absl::Seconds(5)));
  EXPECT_EQ(mismatch.code(), absl::StatusCode::kInvalidArgument) << mismatch;
  EXPECT_THAT(std::string(mismatch.message()), HasSubstr("from process 0"));
  EXPECT_EQ(expected, std::vector<uint8_t>(16, 0x33));
  std::vector<uint8_t> never(65, 0);
  r = b->PostReceive(0, MessageTag{11}, never.data(), 65);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(b->WaitAll({*r}, In(absl::Milliseconds(50))).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(fabric.UnmatchedRequests(), 0);
  EXPECT_EQ(fabric.counters().BytesDelivered(0, 1), 64);
}

// Without eager_bytes (the default), even an empty send completes only when matched and is
// cancelled with its transport.
TEST(LoopbackTest, WithoutEagerSendsEvenAnEmptySendWaitsForItsReceive) {
  LoopbackFabric fabric(2);
  auto b = MustConnect(fabric, 1);
  {
    auto a = MustConnect(fabric, 0);
    static const char kEmpty = 0;
    absl::StatusOr<RequestId> s = a->PostSend(1, MessageTag{10}, &kEmpty, 0);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(a->WaitAll({*s}, In(absl::Milliseconds(10))).code(),
              absl::StatusCode::kDeadlineExceeded);
    s = a->PostSend(1, MessageTag{10}, &kEmpty, 0);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(fabric.UnmatchedRequests(), 1);
  }
  EXPECT_EQ(fabric.UnmatchedRequests(), 0);
}

TEST(LoopbackTest, SelfSendEmptyMessageAndBadArguments) {
  LoopbackFabric fabric(2);
  auto a = MustConnect(fabric, 0);
  const std::vector<uint8_t> data = Pattern(64, 2);
  std::vector<uint8_t> out(64, 0);
  auto r = a->PostReceive(0, MessageTag{1}, out.data(), 64);
  auto s = a->PostSend(0, MessageTag{1}, data.data(), 64);
  ASSERT_TRUE(r.ok() && s.ok());
  EXPECT_TRUE(a->WaitAll({*r, *s}, In(absl::Seconds(5))).ok());
  EXPECT_EQ(out, data);

  auto e1 = a->PostSend(1, MessageTag{2}, nullptr, 0);
  auto b = MustConnect(fabric, 1);
  auto e2 = b->PostReceive(0, MessageTag{2}, nullptr, 0);
  ASSERT_TRUE(e1.ok() && e2.ok());
  EXPECT_TRUE(a->WaitAll({*e1}, In(absl::Seconds(5))).ok());
  EXPECT_TRUE(b->WaitAll({*e2}, In(absl::Seconds(5))).ok());
  EXPECT_EQ(fabric.counters().messages, 2);

  for (int32_t bad : {-1, 2, 100}) {
    auto p = a->PostSend(bad, MessageTag{1}, data.data(), 64);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(p.status().message(), HasSubstr(absl::StrCat("peer ", bad)));
    EXPECT_FALSE(a->PostReceive(bad, MessageTag{1}, out.data(), 64).ok());
  }
  EXPECT_FALSE(a->PostSend(1, MessageTag{1}, data.data(), -1).ok());
  EXPECT_FALSE(a->PostReceive(1, MessageTag{1}, nullptr, 8).ok());
  EXPECT_EQ(a->WaitAll({12345}, In(absl::Seconds(1))).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(fabric.UnmatchedRequests(), 0);
}

TEST(LoopbackTest, ConnectOnceAtATime) {
  LoopbackFabric fabric(2);
  EXPECT_EQ(fabric.size(), 2);
  auto a = MustConnect(fabric, 0);
  EXPECT_EQ(fabric.Connect(0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(fabric.Connect(2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fabric.MakeGroup(-1).status().code(), absl::StatusCode::kInvalidArgument);
  auto g = MustGroup(fabric, 0);
  EXPECT_EQ(fabric.MakeGroup(0).status().code(), absl::StatusCode::kFailedPrecondition);
  a.reset();
  g.reset();
  EXPECT_TRUE(fabric.Connect(0).ok());
  EXPECT_TRUE(fabric.MakeGroup(0).ok());
  EXPECT_EQ(LoopbackFabric(-3).size(), 0);
}

TEST(LoopbackTest, FifoAmongEqualKeys) {
  LoopbackFabric fabric(2);
  auto a = MustConnect(fabric, 0);
  auto b = MustConnect(fabric, 1);
  std::vector<std::vector<uint8_t>> sent;
  for (uint32_t i = 0; i < 4; ++i) sent.push_back(Pattern(100, 10 + i));
  std::vector<std::vector<uint8_t>> got(4, std::vector<uint8_t>(100, 0));
  std::vector<RequestId> sends, receives;
  // Two sends queued first, then four receives, then two more sends.
  for (int i = 0; i < 2; ++i) sends.push_back(*a->PostSend(1, MessageTag{9}, sent[i].data(), 100));
  for (int i = 0; i < 4; ++i)
    receives.push_back(*b->PostReceive(0, MessageTag{9}, got[i].data(), 100));
  for (int i = 2; i < 4; ++i) sends.push_back(*a->PostSend(1, MessageTag{9}, sent[i].data(), 100));
  EXPECT_TRUE(a->WaitAll(sends, In(absl::Seconds(5))).ok());
  EXPECT_TRUE(b->WaitAll(receives, In(absl::Seconds(5))).ok());
  EXPECT_EQ(got, sent);
}

TEST(LoopbackTest, SizeMismatchFailsBothSides) {
  LoopbackFabric fabric(3);
  auto a = MustConnect(fabric, 1);
  auto b = MustConnect(fabric, 2);
  std::vector<uint8_t> data(100), out(200);
  auto s = a->PostSend(2, MessageTag{0xabc}, data.data(), 100);
  auto r = b->PostReceive(1, MessageTag{0xabc}, out.data(), 200);
  ASSERT_TRUE(s.ok() && r.ok());
  const absl::Status se = a->WaitAll({*s}, In(absl::Seconds(5)));
  const absl::Status re = b->Test(*r).status();
  for (const absl::Status& e : {se, re}) {
    EXPECT_EQ(e.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(e.message(), HasSubstr("100 bytes"));
    EXPECT_THAT(e.message(), HasSubstr("200 bytes"));
    EXPECT_THAT(e.message(), HasSubstr("process 1"));
    EXPECT_THAT(e.message(), HasSubstr("process 2"));
    EXPECT_THAT(e.message(), HasSubstr("0xabc"));
  }
  EXPECT_EQ(fabric.counters().messages, 0);
  EXPECT_EQ(fabric.UnmatchedRequests(), 0);
}

// Every process sends to every process (itself included) a few messages of random size on a few
// tags, and posts its sends and receives interleaved in random order while keeping the order of
// each (peer, direction, tag) so that FIFO matching pairs them as planned.
TEST(LoopbackTest, ManyThreadsRandomSizesAndTags) {
  constexpr int32_t kProcesses = 6;
  constexpr int kPerPair = 12;
  struct Message {
    int32_t from, to;
    uint64_t tag;
    int64_t bytes;
    uint32_t seed;
  };
  std::mt19937 rng(1234);
  std::vector<Message> messages;
  std::vector<int64_t> pair_bytes(kProcesses * kProcesses, 0);
  int64_t largest = 0;
  for (int32_t from = 0; from < kProcesses; ++from) {
    for (int32_t to = 0; to < kProcesses; ++to) {
      for (int i = 0; i < kPerPair; ++i) {
        const int64_t bytes = rng() % 3 == 0 ? rng() % 16 : rng() % 70000;
        messages.push_back({from, to, rng() % 3, bytes, static_cast<uint32_t>(messages.size())});
        pair_bytes[from * kProcesses + to] += bytes;
        largest = std::max(largest, bytes);
      }
    }
  }
  LoopbackFabric fabric(kProcesses);
  std::vector<std::vector<uint8_t>> payloads, received;
  for (const Message& m : messages) {
    payloads.push_back(Pattern(m.bytes, m.seed));
    received.emplace_back(m.bytes, 0xee);
  }
  std::vector<absl::Status> results(kProcesses);
  std::vector<std::thread> threads;
  for (int32_t p = 0; p < kProcesses; ++p) {
    threads.emplace_back([&, p] {
      auto t = MustConnect(fabric, p);
      // (peer, is_send, tag) -> message indices in plan order.
      std::map<std::tuple<int32_t, bool, uint64_t>, std::deque<size_t>> queues;
      for (size_t i = 0; i < messages.size(); ++i) {
        if (messages[i].from == p) queues[{messages[i].to, true, messages[i].tag}].push_back(i);
        if (messages[i].to == p) queues[{messages[i].from, false, messages[i].tag}].push_back(i);
      }
      std::mt19937 order(p);
      std::vector<RequestId> ids;
      while (!queues.empty()) {
        auto it = std::next(queues.begin(), order() % queues.size());
        const auto [peer, is_send, tag] = it->first;
        const size_t i = it->second.front();
        it->second.pop_front();
        if (it->second.empty()) queues.erase(it);
        absl::StatusOr<RequestId> id =
            is_send ? t->PostSend(peer, MessageTag{tag}, payloads[i].data(), messages[i].bytes)
                    : t->PostReceive(peer, MessageTag{tag}, received[i].data(), messages[i].bytes);
        if (!id.ok()) {
          results[p] = id.status();
          return;
        }
        // Poll some requests now and then, as an executor would.
        if (order() % 4 == 0) {
          absl::StatusOr<bool> done = t->Test(*id);
          if (!done.ok()) {
            results[p] = done.status();
            return;
          }
          if (*done) continue;
        }
        ids.push_back(*id);
      }
      results[p] = t->WaitAll(ids, In(absl::Seconds(30)));
    });
  }
  for (std::thread& t : threads) t.join();
  for (int32_t p = 0; p < kProcesses; ++p) EXPECT_TRUE(results[p].ok()) << p << results[p];
  for (size_t i = 0; i < messages.size(); ++i) ASSERT_EQ(received[i], payloads[i]) << i;
  const LoopbackCounters c = fabric.counters();
  for (int32_t from = 0; from < kProcesses; ++from) {
    for (int32_t to = 0; to < kProcesses; ++to) {
      EXPECT_EQ(c.BytesDelivered(from, to), pair_bytes[from * kProcesses + to]);
    }
  }
  EXPECT_EQ(c.messages, static_cast<int64_t>(messages.size()));
  EXPECT_EQ(c.largest_message_bytes, largest);
  EXPECT_EQ(fabric.UnmatchedRequests(), 0);
}

TEST(LoopbackTest, DeadlineWithNothingMatchingCancelsAndNamesPeers) {
  LoopbackFabric fabric(4);
  auto a = MustConnect(fabric, 0);
  std::vector<uint8_t> buf(16);
  auto r = a->PostReceive(2, MessageTag{0x77}, buf.data(), 16);
  auto s = a->PostSend(3, MessageTag{0x88}, buf.data(), 16);
  ASSERT_TRUE(r.ok() && s.ok());
  const absl::Time start = absl::Now();
  const absl::Status st = a->WaitAll({*r, *s}, start + absl::Milliseconds(100));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(st.message(), HasSubstr("receive from process 2 (tag 0x77"));
  EXPECT_THAT(st.message(), HasSubstr("send to process 3 (tag 0x88"));
  EXPECT_GE(took, absl::Milliseconds(100));
  EXPECT_LT(took, absl::Seconds(2));  // A bound on hanging, not a performance figure.
  EXPECT_EQ(a->Test(*r).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(a->Test(*s).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(fabric.UnmatchedRequests(), 0);
  // A deadline already in the past returns at once.
  auto r2 = a->PostReceive(2, MessageTag{1}, buf.data(), 16);
  EXPECT_EQ(a->WaitAll({*r2}, absl::InfinitePast()).code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(LoopbackTest, CancelledReceiveIsNeverWritten) {
  LoopbackFabric fabric(2);
  auto a = MustConnect(fabric, 0);
  auto b = MustConnect(fabric, 1);
  std::vector<uint8_t> cancelled(256, 0xaa);
  auto r = b->PostReceive(0, MessageTag{3}, cancelled.data(), 256);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(b->WaitAll({*r}, In(absl::Milliseconds(10))).code(),
            absl::StatusCode::kDeadlineExceeded);
  const std::vector<uint8_t> data = Pattern(256, 3);
  auto s = a->PostSend(1, MessageTag{3}, data.data(), 256);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(cancelled, std::vector<uint8_t>(256, 0xaa));
  EXPECT_EQ(*a->Test(*s), false);  // The late send stays queued.
  EXPECT_EQ(fabric.UnmatchedRequests(), 1);
  std::vector<uint8_t> fresh(256, 0);
  auto r2 = b->PostReceive(0, MessageTag{3}, fresh.data(), 256);
  ASSERT_TRUE(r2.ok());
  EXPECT_TRUE(b->WaitAll({*r2}, In(absl::Seconds(5))).ok());
  EXPECT_TRUE(a->WaitAll({*s}, In(absl::Seconds(5))).ok());
  EXPECT_EQ(fresh, data);
  EXPECT_EQ(cancelled, std::vector<uint8_t>(256, 0xaa));
}

// Receives and sends on one key with deadlines so short that cancellations race with copies: a
// receive either completes with the whole message or is cancelled and stays untouched forever.
TEST(LoopbackTest, CancellationRacingWithCopies) {
  constexpr int kIterations = 1500;
  constexpr int64_t kBytes = 32 << 10;
  LoopbackFabric fabric(2);
  const std::vector<uint8_t> data = Pattern(kBytes, 5);
  std::vector<std::vector<uint8_t>> buffers(kIterations, std::vector<uint8_t>(kBytes, 0));
  std::vector<int> outcome(kIterations, -1);  // 1 received, 0 cancelled.
  std::thread sender([&] {
    auto a = MustConnect(fabric, 0);
    std::mt19937 rng(7);
    for (int i = 0; i < kIterations; ++i) {
      auto s = a->PostSend(1, MessageTag{1}, data.data(), kBytes);
      ASSERT_TRUE(s.ok());
      const absl::Status st = a->WaitAll({*s}, In(absl::Microseconds(rng() % 60)));
      ASSERT_TRUE(st.ok() || st.code() == absl::StatusCode::kDeadlineExceeded) << st;
    }
  });
  auto b = MustConnect(fabric, 1);
  std::mt19937 rng(8);
  for (int i = 0; i < kIterations; ++i) {
    auto r = b->PostReceive(0, MessageTag{1}, buffers[i].data(), kBytes);
    ASSERT_TRUE(r.ok());
    const absl::Status st = b->WaitAll({*r}, In(absl::Microseconds(rng() % 60)));
    ASSERT_TRUE(st.ok() || st.code() == absl::StatusCode::kDeadlineExceeded) << st;
    outcome[i] = st.ok() ? 1 : 0;
  }
  sender.join();
  int received = 0;
  for (int i = 0; i < kIterations; ++i) {
    if (outcome[i] == 1) {
      ++received;
      ASSERT_EQ(buffers[i], data) << i;
    } else {
      ASSERT_EQ(buffers[i], std::vector<uint8_t>(kBytes, 0)) << i;
    }
  }
  EXPECT_EQ(fabric.counters().messages, received);
}

TEST(LoopbackTest, DestroyedTransportsRequestsAreNeverWritten) {
  LoopbackFabric fabric(2);
  auto a = MustConnect(fabric, 0);
  std::vector<uint8_t> buf(32, 0x11);
  {
    auto b = MustConnect(fabric, 1);
    ASSERT_TRUE(b->PostReceive(0, MessageTag{4}, buf.data(), 32).ok());
  }
  EXPECT_EQ(fabric.UnmatchedRequests(), 0);
  const std::vector<uint8_t> data(32, 0x22);
  auto s = a->PostSend(1, MessageTag{4}, data.data(), 32);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(buf, std::vector<uint8_t>(32, 0x11));
  // A new transport of process 1 receives the queued message.
  auto b = MustConnect(fabric, 1);
  std::vector<uint8_t> out(32, 0);
  auto r = b->PostReceive(0, MessageTag{4}, out.data(), 32);
  EXPECT_TRUE(b->WaitAll({*r}, In(absl::Seconds(5))).ok());
  EXPECT_EQ(out, data);
}

TEST(LoopbackTest, AbortFromAnotherThreadWakesWaiterAndFailsPeers) {
  LoopbackFabric fabric(3);
  auto a = MustConnect(fabric, 0);
  auto b = MustConnect(fabric, 1);
  std::vector<uint8_t> buf(8);
  auto r = a->PostReceive(2, MessageTag{1}, buf.data(), 8);
  auto peer = b->PostReceive(0, MessageTag{2}, buf.data(), 8);
  ASSERT_TRUE(r.ok() && peer.ok());
  absl::Notification waiting;
  std::thread aborter([&] {
    waiting.WaitForNotification();
    absl::SleepFor(absl::Milliseconds(50));
    a->Abort(absl::CancelledError("trainer went away"));
    a->Abort(absl::InternalError("second reason is ignored"));
  });
  const absl::Time start = absl::Now();
  waiting.Notify();
  const absl::Status st = a->WaitAll({*r}, In(absl::Seconds(60)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  aborter.join();
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(st.message(), HasSubstr("trainer went away"));
  // Future requests fail at once.
  auto later = a->PostSend(1, MessageTag{1}, buf.data(), 8);
  EXPECT_EQ(later.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(later.status().message(), HasSubstr("trainer went away"));
  // The peer's request with the aborted process fails, naming it; new ones fail at once.
  const absl::Status ps = b->WaitAll({*peer}, In(absl::Seconds(5)));
  EXPECT_EQ(ps.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(ps.message(), HasSubstr("peer process 0"));
  EXPECT_THAT(ps.message(), HasSubstr("trainer went away"));
  EXPECT_EQ(b->PostSend(0, MessageTag{1}, buf.data(), 8).status().code(),
            absl::StatusCode::kAborted);
  // Others are unaffected.
  auto x = b->PostSend(1, MessageTag{5}, buf.data(), 8);
  auto y = b->PostReceive(1, MessageTag{5}, buf.data(), 8);
  EXPECT_TRUE(b->WaitAll({*x, *y}, In(absl::Seconds(5))).ok());
}

TEST(LoopbackTest, KillFailsThePeersRequests) {
  LoopbackFabric fabric(3);
  auto a = MustConnect(fabric, 0);
  auto c = MustConnect(fabric, 2);
  std::vector<uint8_t> buf(8);
  auto r = a->PostReceive(2, MessageTag{1}, buf.data(), 8);
  auto own = c->PostReceive(0, MessageTag{9}, buf.data(), 8);
  ASSERT_TRUE(r.ok() && own.ok());
  std::thread killer([&] {
    absl::SleepFor(absl::Milliseconds(50));
    fabric.Kill(2);
  });
  const absl::Time start = absl::Now();
  const absl::Status st = a->WaitAll({*r}, In(absl::Seconds(60)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  killer.join();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(st.message(), HasSubstr("process 2 was killed"));
  EXPECT_TRUE(fabric.IsKilled(2));
  EXPECT_FALSE(fabric.IsKilled(0));
  EXPECT_EQ(a->PostSend(2, MessageTag{1}, buf.data(), 8).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(c->Test(*own).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(c->PostSend(0, MessageTag{1}, buf.data(), 8).status().code(),
            absl::StatusCode::kUnavailable);
  c.reset();
  EXPECT_EQ(fabric.Connect(2).status().code(), absl::StatusCode::kFailedPrecondition);
  fabric.Kill(2);  // Idempotent.
  fabric.Kill(99);
}

TEST(LoopbackTest, DroppedMessagesAndInjectedSendFailure) {
  LoopbackFabric fabric(2);
  auto a = MustConnect(fabric, 0);
  auto b = MustConnect(fabric, 1);
  std::vector<uint8_t> data(64, 1), out(64, 0);
  fabric.SetDropMessages(0, 1, true);
  auto s = a->PostSend(1, MessageTag{1}, data.data(), 64);
  auto r = b->PostReceive(0, MessageTag{1}, out.data(), 64);
  ASSERT_TRUE(s.ok() && r.ok());
  EXPECT_EQ(a->WaitAll({*s}, In(absl::Milliseconds(20))).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(b->WaitAll({*r}, In(absl::Milliseconds(20))).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(out, std::vector<uint8_t>(64, 0));
  EXPECT_EQ(fabric.counters().dropped_messages, 1);
  fabric.SetDropMessages(0, 1, false);

  fabric.FailNthSend(0, 2, absl::DataLossError("injected"));
  std::vector<RequestId> sends, receives;
  for (uint64_t tag = 0; tag < 3; ++tag) {
    sends.push_back(*a->PostSend(1, MessageTag{tag}, data.data(), 64));
  }
  EXPECT_EQ(*a->Test(sends[0]), false);
  EXPECT_EQ(a->Test(sends[1]).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(*a->Test(sends[2]), false);
  for (uint64_t tag : {0, 2}) {
    receives.push_back(*b->PostReceive(0, MessageTag{tag}, out.data(), 64));
  }
  EXPECT_TRUE(a->WaitAll({sends[0], sends[2]}, In(absl::Seconds(5))).ok());
  EXPECT_TRUE(b->WaitAll(receives, In(absl::Seconds(5))).ok());
  // The failure fires once.
  auto again = a->PostSend(1, MessageTag{1}, data.data(), 64);
  auto match = b->PostReceive(0, MessageTag{1}, out.data(), 64);
  EXPECT_TRUE(a->WaitAll({*again}, In(absl::Seconds(5))).ok());
  EXPECT_TRUE(b->WaitAll({*match}, In(absl::Seconds(5))).ok());
}

TEST(LoopbackTest, WaitAllReturnsTheFailureAndReleasesEveryId) {
  LoopbackFabric fabric(2);
  auto a = MustConnect(fabric, 0);
  std::vector<uint8_t> data(64, 1);
  fabric.FailNthSend(0, 1, absl::InternalError("boom"));
  auto failing = a->PostSend(1, MessageTag{1}, data.data(), 64);
  auto pending = a->PostSend(1, MessageTag{2}, data.data(), 64);
  const absl::Status st = a->WaitAll({*pending, *failing}, In(absl::Seconds(60)));
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(st.message(), HasSubstr("boom"));
  EXPECT_EQ(a->Test(*pending).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(fabric.UnmatchedRequests(), 0);
}

TEST(LoopbackTest, RegistersHostMemoryOnly) {
  LoopbackFabric fabric(1);
  auto a = MustConnect(fabric, 0);
  std::vector<uint8_t> buf(128);
  absl::StatusOr<RegistrationId> id = a->RegisterMemory(buf.data(), 128, MemoryKind::kHost);
  ASSERT_TRUE(id.ok()) << id.status();
  absl::StatusOr<RegistrationId> id2 = a->RegisterMemory(buf.data(), 64, MemoryKind::kHost);
  ASSERT_TRUE(id2.ok());
  EXPECT_NE(*id, *id2);
  EXPECT_EQ(a->RegisterMemory(buf.data(), 128, MemoryKind::kCuda).status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(a->RegisterMemory(nullptr, 8, MemoryKind::kHost).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(a->DeregisterMemory(*id).ok());
  EXPECT_EQ(a->DeregisterMemory(*id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(a->DeregisterMemory(999).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace wsync
