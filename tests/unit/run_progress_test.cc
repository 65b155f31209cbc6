// RunProgress (executor/run_progress.h): random works whose lanes complete their messages in a
// random interleaving (each lane in order, as runs complete them) against a reference: after every
// completion the published rounds done are the rounds all of whose messages completed, the bytes
// done the sum of the completed messages, and the totals the work's; without a SyncProgress
// nothing is published; with the log's round category on, one line per round of the process.

#include "executor/run_progress.h"

#include <stdlib.h>

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/sync_progress.h"
#include "executor/work.h"
#include "gtest/gtest.h"

namespace wsync::executor_internal {
namespace {

// Lanes of 0..5 messages with strictly increasing rounds below 12 (gaps included), random bytes.
Work RandomWork(std::mt19937_64& random) {
  Work work;
  const int lanes = std::uniform_int_distribution<int>(0, 6)(random);
  for (int l = 0; l < lanes; ++l) {
    Lane lane;
    lane.direction = l % 2 == 0 ? Direction::kSend : Direction::kReceive;
    int32_t round = std::uniform_int_distribution<int>(0, 3)(random);
    const int messages = std::uniform_int_distribution<int>(0, 5)(random);
    for (int m = 0; m < messages && round < 12; ++m) {
      Message message;
      message.round = round;
      message.bytes = std::uniform_int_distribution<int64_t>(1, 1 << 20)(random);
      lane.messages.push_back(message);
      round += std::uniform_int_distribution<int>(1, 3)(random);
    }
    work.lanes.push_back(lane);
  }
  return work;
}

TEST(RunProgressTest, RoundsAndBytesDoneMatchAReference) {
  std::mt19937_64 random(20261202);
  for (int trial = 0; trial < 500; ++trial) {
    SCOPED_TRACE(trial);
    const Work work = RandomWork(random);
    SyncProgress published;
    published.Begin(3);
    RunProgress progress(work, &published);
    progress.Start();
    const int32_t rounds = RoundsOf(work);
    int64_t bytes_total = 0;
    std::vector<int> left(rounds, 0);
    for (const Lane& lane : work.lanes) {
      for (const Message& m : lane.messages) {
        bytes_total += m.bytes;
        ++left[m.round];
      }
    }
    SyncProgressSnapshot s = published.Read();
    EXPECT_EQ(s.phase, SyncPhase::kTransferring);
    EXPECT_EQ(s.rounds_total, rounds);
    EXPECT_EQ(s.bytes_total, bytes_total);
    std::vector<size_t> next(work.lanes.size(), 0);
    int64_t bytes_done = 0;
    for (;;) {
      std::vector<size_t> open;
      for (size_t l = 0; l < work.lanes.size(); ++l) {
        if (next[l] < work.lanes[l].messages.size()) open.push_back(l);
      }
      int32_t reference_rounds = 0;
      while (reference_rounds < rounds && left[reference_rounds] == 0) ++reference_rounds;
      s = published.Read();
      ASSERT_EQ(s.rounds_done, reference_rounds);
      ASSERT_EQ(s.bytes_done, bytes_done);
      if (open.empty()) break;
      const size_t lane = open[std::uniform_int_distribution<size_t>(0, open.size() - 1)(random)];
      const Message& m = work.lanes[lane].messages[next[lane]++];
      progress.Completed(m);
      --left[m.round];
      bytes_done += m.bytes;
    }
    EXPECT_EQ(s.rounds_done, s.rounds_total);
    EXPECT_EQ(s.bytes_done, s.bytes_total);
    progress.Verifying();
    EXPECT_EQ(published.Read().phase, SyncPhase::kVerifying);
    EXPECT_EQ(published.Read().version, 3);
  }
}

TEST(RunProgressTest, WithoutASyncProgressNothingIsPublished) {
  std::mt19937_64 random(7);
  Work work;
  while (RoundsOf(work) == 0) work = RandomWork(random);
  RunProgress progress(work, nullptr);
  progress.Start();
  for (const Lane& lane : work.lanes) {
    for (const Message& m : lane.messages) progress.Completed(m);
  }
  progress.Verifying();  // No crash, nothing to look at: the run's cost is one branch.
}

// With the log's round category on (common/log.h) and no SyncProgress: one line per round that
// has a message of this process, in round order, each with that round's message count and bytes,
// whatever order the lanes complete in; none with the category off.
TEST(RunProgressTest, OneLogLinePerRoundWithMessages) {
  unsetenv("WSYNC_LOG");  // It would take precedence over the filter set here.
  unsetenv("WSYNC_LOG_LEVEL");
  log::ResetForTesting();
  std::vector<std::string> lines;
  // The round category on, or every category but it.
  auto keep_lines = [&lines](bool rounds) {
    const uint32_t round = 1u << static_cast<int>(log::Category::kRound);
    return log::Configure(
        [&lines](log::Level, log::Category, absl::string_view line) { lines.emplace_back(line); },
        rounds ? round : log::kAllCategories & ~round, log::Level::kDebug);
  };
  std::mt19937_64 random(43);
  for (int trial = 0; trial < 200; ++trial) {
    SCOPED_TRACE(trial);
    Work work = RandomWork(random);
    work.process = trial % 5;
    const int32_t rounds = RoundsOf(work);
    std::vector<int> messages(rounds, 0);
    std::vector<int64_t> bytes(rounds, 0);
    std::vector<std::pair<size_t, size_t>> order;  // (lane, message): lanes interleaved at random.
    std::vector<size_t> next(work.lanes.size(), 0);
    for (;;) {
      std::vector<size_t> open;
      for (size_t l = 0; l < work.lanes.size(); ++l) {
        if (next[l] < work.lanes[l].messages.size()) open.push_back(l);
      }
      if (open.empty()) break;
      const size_t lane = open[std::uniform_int_distribution<size_t>(0, open.size() - 1)(random)];
      const Message& m = work.lanes[lane].messages[next[lane]];
      order.emplace_back(lane, next[lane]++);
      ++messages[m.round];
      bytes[m.round] += m.bytes;
    }
    // Odd trials with the round category off: no line.
    ASSERT_TRUE(keep_lines(trial % 2 == 0).ok());
    lines.clear();
    RunProgress progress(work, nullptr, /*sync_id=*/trial);
    progress.Start();
    for (const auto& [lane, index] : order) progress.Completed(work.lanes[lane].messages[index]);
    if (trial % 2 == 1) {
      EXPECT_TRUE(lines.empty());
      continue;
    }
    std::vector<std::string> expected;
    for (int32_t r = 0; r < rounds; ++r) {
      if (messages[r] == 0) continue;
      expected.push_back(absl::StrCat("process ", work.process, ": sync ", trial, " round ", r + 1,
                                      "/", rounds, " done: ", log::Count(messages[r], "message"),
                                      ", ", log::Bytes(bytes[r]), ", at "));
    }
    ASSERT_EQ(lines.size(), expected.size());
    for (size_t i = 0; i < lines.size(); ++i) {
      EXPECT_EQ(lines[i].substr(0, expected[i].size()), expected[i]);
    }
  }
  ASSERT_TRUE(log::Configure(nullptr, std::nullopt, std::nullopt).ok());
}

TEST(SyncProgressStateTest, BeginEndAndCommittedVersion) {
  SyncProgress p;
  EXPECT_EQ(p.Read().version, -1);
  EXPECT_EQ(p.Read().committed_version, -1);
  EXPECT_EQ(p.Read().phase, SyncPhase::kIdle);
  p.Begin(4);
  p.SetTotals(2, 10);
  p.SetDone(2, 10);
  p.End(/*committed=*/true);
  EXPECT_EQ(p.Read().committed_version, 4);
  EXPECT_EQ(p.Read().phase, SyncPhase::kIdle);
  p.Begin(5);  // A new sync: nothing done or known yet; the committed version stays.
  EXPECT_EQ(p.Read().phase, SyncPhase::kAgreeing);
  EXPECT_EQ(p.Read().bytes_total, 0);
  EXPECT_EQ(p.Read().rounds_done, 0);
  p.End(/*committed=*/false);
  EXPECT_EQ(p.Read().committed_version, 4);
  EXPECT_EQ(p.Read().version, 5);
  EXPECT_EQ(SyncPhaseName(static_cast<int32_t>(SyncPhase::kVoting)), "voting");
  EXPECT_EQ(SyncPhaseName(42), "unknown");
}

}  // namespace
}  // namespace wsync::executor_internal
