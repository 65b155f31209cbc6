// The collectives of the loopback fabric (transport/loopback, LoopbackFabric::MakeGroup):
// all-gathers over rounds with skewed processes, deadlines naming the missing processes, killed or
// aborted processes failing the others' collective.

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/loopback_testing.h"
#include "transport/loopback/loopback.h"

namespace wsync {
namespace {

using ::testing::HasSubstr;

using test::In;
using test::MustConnect;
using test::MustGroup;

TEST(LoopbackGroupTest, AllGatherOverRepeatedRoundsWithSkew) {
  constexpr int32_t kProcesses = 5;
  constexpr int kRounds = 30;
  LoopbackFabric fabric(kProcesses);
  std::vector<absl::Status> results(kProcesses);
  std::vector<std::thread> threads;
  for (int32_t p = 0; p < kProcesses; ++p) {
    threads.emplace_back([&, p] {
      auto g = MustGroup(fabric, p);
      EXPECT_EQ(g->size(), kProcesses);
      EXPECT_EQ(g->process(), p);
      std::mt19937 rng(p);
      for (int round = 0; round < kRounds; ++round) {
        if (rng() % 3 == 0) absl::SleepFor(absl::Microseconds(rng() % 2000));
        absl::StatusOr<std::vector<std::string>> all =
            g->AllGather(absl::StrCat(p, ":", round), In(absl::Seconds(30)));
        if (!all.ok()) {
          results[p] = all.status();
          return;
        }
        std::vector<std::string> expected;
        for (int32_t q = 0; q < kProcesses; ++q) expected.push_back(absl::StrCat(q, ":", round));
        if (*all != expected) {
          results[p] = absl::InternalError(absl::StrCat("round ", round, " mixed payloads"));
          return;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int32_t p = 0; p < kProcesses; ++p) EXPECT_TRUE(results[p].ok()) << p << results[p];
}

TEST(LoopbackGroupTest, AllGatherDeadlineNamesMissingProcesses) {
  LoopbackFabric fabric(4);
  std::vector<absl::Status> results(2);
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (int32_t p = 0; p < 2; ++p) {
    threads.emplace_back([&, p] {
      auto g = MustGroup(fabric, p);
      results[p] = g->AllGather("x", In(absl::Milliseconds(100))).status();
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  for (const absl::Status& st : results) {
    EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_THAT(st.message(), HasSubstr("processes 2, 3 did not contribute"));
  }
}

TEST(LoopbackGroupTest, KilledOrAbortedProcessFailsTheOthersCollective) {
  LoopbackFabric fabric(3);
  auto g0 = MustGroup(fabric, 0);
  auto g1 = MustGroup(fabric, 1);
  auto t1 = MustConnect(fabric, 1);
  // Process 1 aborts through its transport while process 0 waits in a collective.
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(30));
    t1->Abort(absl::CancelledError("rollout engine stopped"));
  });
  absl::StatusOr<std::vector<std::string>> r0 = g0->AllGather("a", In(absl::Seconds(60)));
  aborter.join();
  EXPECT_EQ(r0.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(r0.status().message(), HasSubstr("process 1 aborted: rollout engine stopped"));
  EXPECT_EQ(g1->AllGather("b", In(absl::Seconds(60))).status().code(), absl::StatusCode::kAborted);

  LoopbackFabric fabric2(3);
  auto h0 = MustGroup(fabric2, 0);
  std::thread killer([&] {
    absl::SleepFor(absl::Milliseconds(30));
    fabric2.Kill(2);
  });
  absl::StatusOr<std::vector<std::string>> k0 = h0->AllGather("a", In(absl::Seconds(60)));
  killer.join();
  EXPECT_EQ(k0.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(k0.status().message(), HasSubstr("process 2 was killed"));
  EXPECT_EQ(fabric2.MakeGroup(2).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(LoopbackGroupTest, FastProcessesSecondRoundDoesNotMixWithSlowFirst) {
  LoopbackFabric fabric(2);
  auto fast = MustGroup(fabric, 0);
  auto slow = MustGroup(fabric, 1);
  std::thread t([&] {
    auto first = fast->AllGather("fast-1", In(absl::Seconds(30)));
    auto second = fast->AllGather("fast-2", In(absl::Seconds(30)));
    ASSERT_TRUE(first.ok() && second.ok());
    EXPECT_EQ(*first, (std::vector<std::string>{"fast-1", "slow-1"}));
    EXPECT_EQ(*second, (std::vector<std::string>{"fast-2", "slow-2"}));
  });
  absl::SleepFor(absl::Milliseconds(30));
  auto first = slow->AllGather("slow-1", In(absl::Seconds(30)));
  auto second = slow->AllGather("slow-2", In(absl::Seconds(30)));
  t.join();
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(*first, (std::vector<std::string>{"fast-1", "slow-1"}));
  EXPECT_EQ(*second, (std::vector<std::string>{"fast-2", "slow-2"}));
}

}  // namespace
}  // namespace wsync
