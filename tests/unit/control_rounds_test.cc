// The control plane's collectives over rounds: many rounds of every kind, the numbering after a
// deadline, and a replacement joining a running job after the process it replaces was lost.

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/control_job.h"
#include "transport/control/client.h"
#include "transport/control/coordinator.h"

namespace wsync {
namespace {

using control_testing::ClientOptions;
using control_testing::Job;
using control_testing::Options;
using control_testing::Parallel;
using control_testing::StartJob;
using ::testing::HasSubstr;

// A replacement of the same role and rank joins a running job after the process it replaces was
// lost: one with another layout part is refused; the next gets the roster (with its new address)
// and the job's next collective number, the others get the same roster unasked during their next
// collective, a process still behind runs through the rounds it missed at once, and then all
// three complete collectives together again.
TEST(CoordinatorTest, AReplacementForALostProcessJoinsTheRunningJob) {
  Job job = StartJob(2, 1, Options(2, 1));
  Parallel(3, [&](int id) {
    ASSERT_TRUE(job.clients[id]->AllGather("before", absl::Now() + absl::Seconds(5)).ok());
  });
  job.clients[2].reset();  // Rollout rank 0 dies.
  // While it is gone every round fails at once, naming it; trainer 0 runs ahead of trainer 1.
  for (int call = 0; call < 2; ++call) {
    absl::Status s = job.clients[0]->AllGather("lost", absl::Now() + absl::Seconds(5)).status();
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("process 2 (rollout rank 0"));
  }
  EXPECT_TRUE(absl::IsUnavailable(
      job.clients[1]->AllGather("lost", absl::Now() + absl::Seconds(5)).status()));

  auto connect_replacement = [&] {
    return ControlClient::Connect(ClientOptions(job.coordinator->port(), ControlRole::kRollout, 0));
  };
  {  // Another layout part cannot take the rank.
    absl::StatusOr<std::unique_ptr<ControlClient>> other = connect_replacement();
    ASSERT_TRUE(other.ok()) << other.status();
    JoinRequest request{"another-manifest", "address-x", "metadata"};
    absl::Status refused = (*other)->Join(request, absl::Now() + absl::Seconds(5)).status();
    EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
    EXPECT_THAT(refused.message(), HasSubstr("layout part differs"));
  }
  absl::StatusOr<std::unique_ptr<ControlClient>> replacement = connect_replacement();
  ASSERT_TRUE(replacement.ok()) << replacement.status();
  EXPECT_EQ((*replacement)->process(), 2);
  JoinRequest request{"rollout-manifest", "address-2-new", "metadata"};
  absl::StatusOr<Roster> roster = (*replacement)->Join(request, absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(roster.ok()) << roster.status();
  EXPECT_EQ(roster->epoch, 1u);
  EXPECT_EQ(roster->processes[2].address, "address-2-new");
  EXPECT_EQ(roster->processes[0].address, "address-0");
  EXPECT_EQ(roster->manifest(2), "rollout-manifest");
  job.clients[2] = *std::move(replacement);

  // Trainer 1 is one round behind: that round failed while the rank was lost, and says so at once.
  const absl::Time behind = absl::Now();
  EXPECT_FALSE(job.clients[1]->AllGather("late", behind + absl::Seconds(5)).ok());
  EXPECT_LT(absl::Now() - behind, absl::Seconds(1));
  Parallel(3, [&](int id) {
    absl::StatusOr<std::vector<std::string>> all =
        job.clients[id]->AllGather(absl::StrCat("again", id), absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(all.ok()) << all.status();
    EXPECT_EQ(*all, (std::vector<std::string>{"again0", "again1", "again2"}));
    ASSERT_TRUE(job.clients[id]->Decide(true, "", absl::Now() + absl::Seconds(5)).ok());
  });
  for (int id : {0, 1}) {
    std::optional<Roster> update = job.clients[id]->TakeRosterUpdate();
    ASSERT_TRUE(update.has_value()) << "process " << id << " did not learn the new address";
    EXPECT_EQ(update->epoch, 1u);
    EXPECT_EQ(update->processes[2].address, "address-2-new");
    EXPECT_FALSE(job.clients[id]->TakeRosterUpdate().has_value());
  }
  EXPECT_FALSE(job.clients[2]->TakeRosterUpdate().has_value());
  EXPECT_EQ(job.coordinator->counters().replaced, 1);
}

}  // namespace
}  // namespace wsync
