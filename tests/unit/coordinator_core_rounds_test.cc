// The coordinator's protocol core without sockets, after the roster: collective rounds with
// out-of-order arrivals (a property), a contributor's deadline, and loss for silence on a fake
// clock (coordinator_core.h). Nothing here sleeps.

#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator_core_harness.h"

namespace wsync {
namespace {

using control_testing::Options;
using core_testing::Harness;
using core_testing::PeerView;
using core_testing::RandomOptions;
using core_testing::RejectOf;
using ::testing::HasSubstr;

// Property: processes contribute to rounds in a random interleaving (each in its own order, up to
// max_rounds_ahead unanswered); a round completes exactly when its last member arrives, and then
// every process gets the same result, every payload in process order.
TEST(CoordinatorCoreRoundsTest, RoundsCompleteExactlyWhenTheLastMemberArrives) {
  constexpr uint64_t kRounds = 12;
  for (uint32_t seed = 0; seed < 100; ++seed) {
    std::mt19937 rng(seed);
    Harness h(RandomOptions(rng, 3, 3));
    const int32_t world = h.core.options().num_trainers + h.core.options().num_rollouts;
    const std::vector<ConnectionId> ids = h.JoinAll();
    std::vector<uint64_t> next(world, 0);       // Each process's next contribution.
    std::vector<uint64_t> arrived(kRounds, 0);  // Contributions per round.
    uint64_t completed = 0;                     // Rounds below this completed.
    for (uint64_t step = 0; step < kRounds * world; ++step) {
      std::vector<int32_t> ready;
      for (int32_t p = 0; p < world; ++p) {
        if (next[p] < kRounds && next[p] < completed + 4) ready.push_back(p);
      }
      ASSERT_FALSE(ready.empty()) << seed;
      const int32_t p = ready[rng() % ready.size()];
      const uint64_t k = next[p]++;
      h.Contribute(ids[p], k, absl::StrCat("p", p, "-r", k));
      ++arrived[k];
      while (completed < kRounds && arrived[completed] == static_cast<uint64_t>(world)) {
        ++completed;
      }
      for (int32_t q = 0; q < world; ++q) {
        const std::vector<control::Frame> results = h.peers[ids[q]].Of(control::Frame::kResult);
        ASSERT_EQ(results.size(), completed) << seed << " process " << q;
        for (uint64_t r = 0; r < completed; ++r) {
          const control::Result& result = results[r].result();
          ASSERT_EQ(result.number(), r);
          ASSERT_EQ(result.code(), 0) << result.message();
          ASSERT_EQ(result.payloads_size(), world);
          for (int32_t i = 0; i < world; ++i) {
            ASSERT_EQ(result.payloads(i), absl::StrCat("p", i, "-r", r)) << seed;
          }
        }
      }
    }
    EXPECT_EQ(completed, kRounds) << seed;
    EXPECT_EQ(h.core.counters().rounds_completed, static_cast<int64_t>(kRounds)) << seed;
    EXPECT_EQ(h.core.counters().rounds_failed, 0) << seed;
  }
}

// One contribution more than max_rounds_ahead unanswered is refused and the process is lost.
TEST(CoordinatorCoreRoundsTest, TooFarAheadIsRefused) {
  Harness h(Options(2, 0));
  const std::vector<ConnectionId> ids = h.JoinAll();
  for (uint64_t k = 0; k < 4; ++k) h.Contribute(ids[0], k, "x");
  EXPECT_FALSE(h.peers[ids[0]].ended());
  h.Contribute(ids[0], 4, "x");
  EXPECT_EQ(h.peers[ids[0]].refusal, RefusalReason::kTooFarAhead);
  ASSERT_EQ(h.peers[ids[1]].Of(control::Frame::kLost).size(), 1u);
  // The rounds it opened fail for whoever contributes to them.
  h.Contribute(ids[1], 0, "y");
  const std::vector<control::Frame> results = h.peers[ids[1]].Of(control::Frame::kResult);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].result().code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_THAT(results[0].result().message(), HasSubstr("process 0 (trainer rank 0"));
}

// A contributor's deadline fails the round for all, naming who did not contribute; a late
// contributor gets the same failure at once; the next round completes as usual.
TEST(CoordinatorCoreRoundsTest, AContributorDeadlineFailsTheRoundForAll) {
  CoordinatorOptions options = Options(2, 1);
  options.heartbeat_interval = absl::ZeroDuration();
  Harness h(std::move(options));
  const std::vector<ConnectionId> ids = h.JoinAll();
  h.Contribute(ids[0], 0, "a", /*timeout_ms=*/1000);
  h.Contribute(ids[1], 0, "b", /*timeout_ms=*/5000);
  EXPECT_EQ(h.core.NextDeadline(), h.now + absl::Seconds(1));
  h.Advance(absl::Milliseconds(999));
  EXPECT_TRUE(h.peers[ids[0]].Of(control::Frame::kResult).empty());
  h.Advance(absl::Milliseconds(1));
  for (int p : {0, 1}) {
    const std::vector<control::Frame> results = h.peers[ids[p]].Of(control::Frame::kResult);
    ASSERT_EQ(results.size(), 1u);
    EXPECT_EQ(results[0].result().code(), static_cast<int>(absl::StatusCode::kDeadlineExceeded));
    EXPECT_EQ(results[0].result().message(),
              "AllGather #0: 1 of 3 processes did not contribute before the deadline: process 2 "
              "(rollout rank 0, node node-0)");
  }
  h.Contribute(ids[2], 0, "c");
  const std::vector<control::Frame> late = h.peers[ids[2]].Of(control::Frame::kResult);
  ASSERT_EQ(late.size(), 1u);
  EXPECT_EQ(late[0].result().code(), static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  for (int p : {2, 0, 1}) h.Contribute(ids[p], 1, absl::StrCat(p));
  for (int p : {0, 1, 2}) {
    const std::vector<control::Frame> results = h.peers[ids[p]].Of(control::Frame::kResult);
    ASSERT_EQ(results.size(), 2u);
    EXPECT_EQ(results[1].result().code(), 0);
    EXPECT_EQ(results[1].result().payloads_size(), 3);
  }
  EXPECT_EQ(h.core.counters().rounds_failed, 1);
  EXPECT_EQ(h.core.counters().rounds_completed, 1);
}

// Driven by the fake clock: the core heartbeats every interval; a process heard from stays, a
// silent one is lost at exactly the silence limit (Reject to it, Lost with its last report to the
// other, its open round failed); a stall of the driver itself is not charged to anyone.
TEST(CoordinatorCoreRoundsTest, ASilentProcessIsLostAtTheSilenceLimit) {
  Harness h(Options(1, 1));
  const std::vector<ConnectionId> ids = h.JoinAll();
  const absl::Time joined = h.now;
  EXPECT_EQ(h.core.NextDeadline(), joined + absl::Milliseconds(250));
  control::Frame beat;
  control::SyncProgress* progress = beat.mutable_heartbeat()->mutable_progress();
  progress->set_version(7);
  progress->set_phase(control::SYNC_PHASE_TRANSFERRING);
  progress->set_rounds_done(2);
  progress->set_rounds_total(9);
  h.Deliver(ids[1], beat);  // At `joined`: its last word.
  h.Contribute(ids[0], 0, "a");

  // A stall of the driver: 2 s late, charged to nobody.
  h.now += absl::Seconds(2);
  h.core.Stalled(absl::Seconds(2) - absl::Milliseconds(250));
  h.Advance(absl::ZeroDuration());
  for (int i = 0; i < 10; ++i) {  // To joined + 4.5 s: silent 2.75 s net of the stall.
    h.Advance(absl::Milliseconds(250));
    h.core.Heard(h.now, ids[0]);
  }
  EXPECT_FALSE(h.peers[ids[1]].ended());
  EXPECT_GE(h.peers[ids[1]].Of(control::Frame::kHeartbeat).size(), 10u);
  h.Advance(absl::Milliseconds(250));
  const PeerView& silent = h.peers[ids[1]];
  ASSERT_TRUE(silent.closed);
  EXPECT_FALSE(silent.refusal.has_value());
  EXPECT_EQ(RejectOf(silent).code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(RejectOf(silent).message(), HasSubstr("nothing arrived from this process for 3.0 s"));
  const std::vector<control::Frame> lost = h.peers[ids[0]].Of(control::Frame::kLost);
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_THAT(lost[0].lost().reason(),
              HasSubstr("process 1 (rollout rank 0, node node-0) was lost: silent for 3.0 s (no "
                        "frame, not even a heartbeat); it last reported: transferring version 7"));
  const std::vector<control::Frame> results = h.peers[ids[0]].Of(control::Frame::kResult);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].result().code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_FALSE(h.peers[ids[0]].ended());
  EXPECT_EQ(h.core.counters().silent, 1);
  EXPECT_EQ(h.core.counters().lost, 1);
  EXPECT_EQ(h.core.counters().in_phase[control::SYNC_PHASE_TRANSFERRING], 1);
}

// Property: random events — connections, good and bad Hellos, Joins, contributions of any number
// and kind, heartbeats, garbage, reader errors, closes, time and driver stalls — never make the
// core act on a connection after closing it (the harness checks), and after each Tick nothing it
// had due is left overdue (NextDeadline is in the future: a driver never spins).
TEST(CoordinatorCoreRoundsTest, RandomEventsNeverActAfterACloseOrLeaveATimerOverdue) {
  for (uint32_t seed = 0; seed < 300; ++seed) {
    std::mt19937 rng(seed);
    CoordinatorOptions options = RandomOptions(rng, 2, 2);
    options.max_pending_per_source = 3;
    options.max_open_rounds = 3;
    const int32_t world = options.num_trainers + options.num_rollouts;
    Harness h(std::move(options));
    std::vector<ConnectionId> conns;
    int64_t opened = 0;
    for (int event = 0; event < 300; ++event) {
      std::vector<ConnectionId> live;
      for (ConnectionId c : conns) {
        if (!h.peers[c].ended()) live.push_back(c);
      }
      const uint32_t what = rng() % 10;
      if (what == 0 || live.empty()) {
        conns.push_back(h.Open(absl::StrCat("10.0.0.", rng() % 3, ":1")));
        ++opened;
        continue;
      }
      const ConnectionId c = live[rng() % live.size()];
      const int32_t p = static_cast<int32_t>(rng() % world);
      const bool trainer = p < h.core.options().num_trainers;
      control::Frame frame;
      switch (what) {
        case 1:
          frame = h.Hello(c, trainer ? ControlRole::kTrainer : ControlRole::kRollout,
                          trainer ? p : p - h.core.options().num_trainers);
          if (rng() % 4 == 0) frame.mutable_hello()->set_rank(-1);
          h.Deliver(c, frame);
          break;
        case 2:
          h.Join(c, rng() % 4 == 0 ? "other" : "layout", "addr");
          break;
        case 3:
          h.Contribute(c, rng() % 3, std::string(rng() % 8, 'x'), rng() % 2000,
                       static_cast<int>(rng() % 6));
          break;
        case 4:
          frame.mutable_heartbeat()->mutable_progress()->set_bytes_done(rng());
          h.Deliver(c, frame);
          break;
        case 5: {
          std::string bytes(rng() % 12, '\0');
          for (char& b : bytes) b = static_cast<char>(rng());
          h.Deliver(c, DecodeFrameBody(bytes));
          break;
        }
        case 6:
          h.core.ReadFailed(h.now, c,
                            rng() % 2 ? absl::DataLossError("cut") : absl::UnavailableError("eof"));
          h.Apply();
          break;
        case 7:
          h.core.Closed(c, "closed");
          h.Apply();
          break;
        case 8:
          h.core.Stalled(absl::Milliseconds(rng() % 500));
          break;
        default:
          h.Advance(absl::Milliseconds(rng() % 1500));
          ASSERT_GT(h.core.NextDeadline(), h.now) << seed << " event " << event;
      }
    }
    EXPECT_EQ(h.core.counters().accepted, opened) << seed;
  }
}

}  // namespace
}  // namespace wsync
