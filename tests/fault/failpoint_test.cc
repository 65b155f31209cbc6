// common/failpoint.h: the WSYNC_FAILPOINTS parser and when each action triggers.

#include "common/failpoint.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace wsync::failpoint {
namespace {

TEST(FailpointTest, ParsesTheDocumentedExample) {
  std::vector<std::pair<std::string, Rule>> rules;
  ASSERT_TRUE(
      Parse("send:fail@3,recv:delay=500ms@1,pack:flip@2,alloc:fail@1,control:fail@4", &rules).ok());
  ASSERT_EQ(rules.size(), 5u);
  EXPECT_EQ(rules[0].first, "send");
  EXPECT_EQ(rules[0].second.action, Action::kFail);
  EXPECT_EQ(rules[0].second.hit, 3);
  EXPECT_FALSE(rules[0].second.and_later);
  EXPECT_EQ(rules[1].second.action, Action::kDelay);
  EXPECT_EQ(rules[1].second.duration, absl::Milliseconds(500));
  EXPECT_EQ(rules[2].second.action, Action::kFlip);
  EXPECT_EQ(rules[4].second.hit, 4);
}

TEST(FailpointTest, DefaultsAndRepeats) {
  std::vector<std::pair<std::string, Rule>> rules;
  ASSERT_TRUE(Parse(" send:fail , recv:stop=2s@2+,x:kill,y:kill=25ms", &rules).ok());
  ASSERT_EQ(rules.size(), 4u);
  EXPECT_EQ(rules[3].second.action, Action::kKill);
  EXPECT_EQ(rules[3].second.duration, absl::Milliseconds(25));
  EXPECT_EQ(rules[0].second.hit, 1);
  EXPECT_EQ(rules[1].second.action, Action::kStop);
  EXPECT_EQ(rules[1].second.duration, absl::Seconds(2));
  EXPECT_TRUE(rules[1].second.and_later);
  EXPECT_EQ(rules[2].second.action, Action::kKill);
  ASSERT_TRUE(Parse("", &rules).ok());
  EXPECT_TRUE(rules.empty());
}

TEST(FailpointTest, RejectsMalformedEntries) {
  std::vector<std::pair<std::string, Rule>> rules;
  for (const char* bad :
       {"send", ":fail", "send:explode", "send:fail@0", "send:fail@x", "send:fail@-1", "send:delay",
        "send:delay=soon", "send:delay=-1s", "send:delay=inf", "send:kill=soon", "send:kill=-1s",
        "send:fail=3", "send:flip@", "send:fail@3++"}) {
    absl::Status status = Parse(bad, &rules);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(status.message().find("WSYNC_FAILPOINTS"), absl::string_view::npos) << bad;
  }
}

TEST(FailpointTest, DisabledDoesNothing) {
  ASSERT_TRUE(SetForTesting("").ok());
  EXPECT_FALSE(Enabled());
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(Check("send").ok());
  EXPECT_EQ(Hits("send"), 0);
}

TEST(FailpointTest, FailsExactlyTheKthEvaluation) {
  ASSERT_TRUE(SetForTesting("send:fail@3,recv:fail@2+").ok());
  EXPECT_TRUE(Enabled());
  EXPECT_TRUE(Check("send").ok());
  EXPECT_TRUE(Check("send").ok());
  absl::Status third = Check("send");
  EXPECT_TRUE(absl::IsUnavailable(third)) << third;
  EXPECT_NE(third.message().find("'send'"), absl::string_view::npos);
  EXPECT_TRUE(Check("send").ok());
  EXPECT_EQ(Hits("send"), 4);
  EXPECT_TRUE(Check("recv").ok());
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(Check("recv").ok());
  EXPECT_TRUE(Check("other").ok());  // Unnamed failpoints never trigger.
  ASSERT_TRUE(SetForTesting("").ok());
}

TEST(FailpointTest, DelaySleepsAndGoesOn) {
  ASSERT_TRUE(SetForTesting("recv:delay=200ms@2").ok());
  absl::Time start = absl::Now();
  EXPECT_TRUE(Check("recv").ok());
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(150));
  start = absl::Now();
  EXPECT_TRUE(Check("recv").ok());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(190));
  ASSERT_TRUE(SetForTesting("").ok());
}

TEST(FailpointTest, FlipInvertsOneByteOnTheKthPack) {
  ASSERT_TRUE(SetForTesting("pack:flip@2").ok());
  std::vector<unsigned char> data(9, 0x11);
  Flip("pack", data.data(), data.size());
  EXPECT_EQ(data, std::vector<unsigned char>(9, 0x11));
  Flip("pack", data.data(), data.size());
  int changed = 0;
  for (unsigned char c : data) changed += c != 0x11;
  EXPECT_EQ(changed, 1);
  EXPECT_EQ(data[4], 0xEE);
  ASSERT_TRUE(SetForTesting("").ok());
}

TEST(FailpointTest, KillEndsTheProcess) {
  EXPECT_EXIT(
      {
        (void)SetForTesting("x:kill");
        (void)Check("x");
      },
      testing::KilledBySignal(SIGKILL), "");
}

// kill=DUR: the call returns and the process runs on, then dies of SIGKILL.
TEST(FailpointTest, DelayedKillEndsTheProcessLater) {
  EXPECT_EXIT(
      {
        (void)SetForTesting("x:kill=200ms");
        (void)Check("x");
        std::fprintf(stderr, "ran on\n");
        absl::SleepFor(absl::Seconds(60));
        std::exit(0);
      },
      testing::KilledBySignal(SIGKILL), "ran on");
}

TEST(FailpointTest, MalformedEnvironmentAbortsAtFirstUse) {
  EXPECT_DEATH(
      {
        setenv("WSYNC_FAILPOINTS", "send:nonsense", 1);
        internal::g_state.store(0);
        (void)Check("send");
      },
      "unknown action");
}

}  // namespace
}  // namespace wsync::failpoint
