// The executor: the schedule is what runs, runs are exact, and both the direct and the staged path
// are used (executor_refusals_test.cc: the budget is enforced, processes agree before any byte
// moves, a slow pair does not hold back the others).

#include <map>
#include <memory>
#include <random>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "executor/execute.h"
#include "executor/schedule.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/fill/fill.h"
#include "planner/builders.h"
#include "planner/policy.h"
#include "tests/testing/executor_checks.h"
#include "tests/testing/random_layouts.h"
#include "tests/unit/executor_test_support.h"
#include "transport/forwarding_transport.h"
#include "transport/loopback/loopback.h"

namespace wsync {
namespace {

using test::AllProcesses;
using test::BufferKey;
using test::ExpectStatsMatchSchedule;
using test::ExpectTargetsAsTheReferenceWrites;
using test::HostBuffers;
using test::executor::BatchRun;
using test::executor::FindLane;
using test::executor::LockstepTransport;
using test::executor::RowsToColumns;
using test::executor::RunBatch;
using test::executor::WrapTransport;
using ::testing::HasSubstr;

TEST(ExecutorTest, ScheduleIsWhatRunsAndRunsAreExact) {
  const int64_t kBudgets[] = {64, 256, 1024, 4096, int64_t{1} << 20};
  int64_t direct = 0, staged = 0, refused = 0, runs = 0;
  for (uint64_t seed = 0; seed < 160; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    std::mt19937_64 rng(seed);
    test::LayoutPair pair = test::RandomLayoutPair(rng);
    absl::StatusOr<Job> job = Job::Create(pair.source, pair.target);
    ASSERT_TRUE(job.ok()) << job.status();
    test::RandomAnswersPolicy policy(seed);
    absl::StatusOr<Plan> plan = MakePlan(*job, policy);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const StagingBudget budget{static_cast<double>(kBudgets[seed % 5])};

    absl::StatusOr<std::vector<ProcessSchedule>> schedules =
        ScheduleTransfers(*job, plan->segments, AllProcesses(*job), budget);
    HostBuffers source(job->source(), test::kSourceFill);
    ASSERT_TRUE(test::FillLogical(job->source(), 3, &source).ok());
    HostBuffers target(job->target(), test::kPoison);
    // Odd seeds run in lockstep rounds (a transport that needs round order), even ones lane by
    // lane: both are exact and run the schedule.
    const WrapTransport lockstep = [](int32_t, std::unique_ptr<Transport> inner) {
      return std::unique_ptr<Transport>(std::make_unique<LockstepTransport>(std::move(inner)));
    };
    BatchRun run = RunBatch(*job, plan->segments, budget, source, target, {}, -1, {}, false,
                            seed % 2 == 1 ? lockstep : WrapTransport());
    if (!schedules.ok()) {
      // A budget too small for some staged row: execution refuses it the same way, everywhere.
      ++refused;
      EXPECT_THAT(std::string(schedules.status().message()), HasSubstr("cannot be staged"));
      for (const auto& result : run.results) EXPECT_FALSE(result.ok());
      EXPECT_EQ(run.counters.TotalBytes(), 0);
      continue;
    }
    ++runs;
    for (int32_t p = 0; p < job->num_processes(); ++p) {
      ASSERT_TRUE(run.results[p].ok()) << "process " << p << ": " << run.results[p].status();
      const ProcessSchedule& schedule = (*schedules)[p];
      ExpectStatsMatchSchedule(schedule, *run.results[p]);
      direct += schedule.direct_bytes;
      staged += schedule.staged_bytes;
      for (const PeerSchedule& lane : schedule.peers) {
        EXPECT_LE(lane.arena_bytes(), kBudgets[seed % 5]);
        if (lane.direction != Direction::kSend) continue;
        // Both sides of every message agree on its size, and the fabric delivered exactly that.
        const PeerSchedule* other = FindLane((*schedules)[lane.peer], p, Direction::kReceive);
        ASSERT_NE(other, nullptr);
        ASSERT_EQ(other->rounds.size(), lane.rounds.size());
        int64_t bytes = 0;
        for (size_t r = 0; r < lane.rounds.size(); ++r) {
          EXPECT_EQ(other->rounds[r].bytes, lane.rounds[r].bytes);
          EXPECT_EQ(other->rounds[r].chunks, lane.rounds[r].chunks);
          bytes += lane.rounds[r].bytes;
        }
        EXPECT_EQ(run.counters.BytesDelivered(p, lane.peer), bytes);
      }
    }
    ExpectTargetsAsTheReferenceWrites(*job, plan->segments, source, target);
  }
  EXPECT_GT(runs, 100);
  EXPECT_GT(direct, 0);  // Both paths were exercised.
  EXPECT_GT(staged, 0);
  RecordProperty("refused", static_cast<int>(refused));
}

// Relayed plans on random multi-node layouts, each process running its own plan: the schedule of
// a process's own plan equals its schedule in the full plan (so both ends of every forward agree
// on its rounds), the run equals the schedule, the targets equal the reference's, and the bytes
// the fabric carried across nodes are the plan's inter-node bytes with relaying.
TEST(ExecutorTest, RelayedPlansRunAsScheduledOnEveryProcess) {
  const int64_t kBudgets[] = {256, 1024, 4096, int64_t{1} << 20};
  int64_t relayed_runs = 0, forwarded = 0, arena = 0, pipelined = 0;
  for (uint64_t seed = 0; seed < 120; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    const int64_t budget_bytes = kBudgets[seed % 4];
    absl::StatusOr<test::RelayedCase> relayed = test::MakeRelayedCase(seed, budget_bytes);
    ASSERT_TRUE(relayed.ok()) << relayed.status();
    const Job* job = &relayed->job;
    const Plan* plan = &relayed->plan;
    const std::vector<std::vector<Segment>>& own = relayed->own;
    if (plan->relays.empty()) continue;
    const StagingBudget budget{static_cast<double>(budget_bytes)};
    absl::StatusOr<std::vector<ProcessSchedule>> schedules =
        ScheduleTransfers(*job, plan->segments, AllProcesses(*job), budget);
    if (!schedules.ok()) {
      EXPECT_THAT(std::string(schedules.status().message()), HasSubstr("cannot be staged"));
      continue;
    }
    HostBuffers source(job->source(), test::kSourceFill);
    ASSERT_TRUE(test::FillLogical(job->source(), 3, &source).ok());
    HostBuffers target(job->target(), test::kPoison);
    // Odd seeds also check every received chunk end to end (verify=true), relay forwards included.
    const bool verify = seed % 2 == 1;
    BatchRun run = RunBatch(
        *job, plan->segments, budget, source, target, {}, -1, [&](int32_t p) { return own[p]; },
        verify);
    ++relayed_runs;
    int64_t saved = 0, inter_node = 0;
    for (int32_t p = 0; p < job->num_processes(); ++p) {
      ASSERT_TRUE(run.results[p].ok()) << "process " << p << ": " << run.results[p].status();
      const ProcessSchedule& schedule = (*schedules)[p];
      absl::StatusOr<ProcessSchedule> own_schedule =
          ScheduleTransfers(*job, own[p], AllProcesses(*job), budget, p);
      ASSERT_TRUE(own_schedule.ok()) << own_schedule.status();
      ASSERT_EQ(own_schedule->peers.size(), schedule.peers.size());
      for (size_t l = 0; l < schedule.peers.size(); ++l) {
        const PeerSchedule& a = schedule.peers[l];
        const PeerSchedule& b = own_schedule->peers[l];
        ASSERT_EQ(a.peer, b.peer);
        ASSERT_EQ(a.rounds.size(), b.rounds.size());
        for (size_t r = 0; r < a.rounds.size(); ++r) {
          EXPECT_EQ(a.rounds[r].round, b.rounds[r].round);
          EXPECT_EQ(a.rounds[r].bytes, b.rounds[r].bytes);
        }
        if (a.forwarding && a.direction == Direction::kSend) {
          // The receiving end numbers the rounds identically.
          const PeerSchedule* other = FindLane((*schedules)[a.peer], p, Direction::kReceive);
          ASSERT_NE(other, nullptr);
          ASSERT_EQ(other->rounds.size(), a.rounds.size());
          for (size_t r = 0; r < a.rounds.size(); ++r) {
            EXPECT_EQ(other->rounds[r].round, a.rounds[r].round);
          }
          // Forwarding began before the relay's last stage-1 message arrived.
          int32_t last_arrival = -1;
          for (const PeerSchedule& in : schedule.peers) {
            if (in.direction == Direction::kReceive && job->IsSource(in.peer)) {
              last_arrival = std::max(last_arrival, in.rounds.back().round);
            }
          }
          if (a.rounds.front().round <= last_arrival) ++pipelined;
        }
      }
      ExpectStatsMatchSchedule(schedule, *run.results[p]);
      int64_t received_chunks = 0;
      for (const PeerSchedule& lane : schedule.peers) {
        if (lane.direction != Direction::kReceive) continue;
        for (const ScheduledRound& round : lane.rounds) received_chunks += round.chunks;
      }
      EXPECT_EQ(run.results[p]->verified_chunks, verify ? received_chunks : 0);
      forwarded += schedule.forwarded_bytes;
      arena += schedule.relay_arena_bytes;
      saved += schedule.inter_node_bytes_saved;
      EXPECT_LE(schedule.relay_arena_bytes, budget_bytes);
      for (int32_t q = 0; q < job->num_processes(); ++q) {
        if (job->PathClass(p, q) == kPathInterNode) inter_node += run.counters.BytesDelivered(p, q);
      }
    }
    // With verify the fabric also carries the hash messages (verify.h).
    if (!verify) {
      EXPECT_EQ(inter_node, plan->inter_node_bytes);
    }
    EXPECT_EQ(saved, plan->inter_node_bytes_without_relay - plan->inter_node_bytes);
    ExpectTargetsAsTheReferenceWrites(*job, plan->segments, source, target);
  }
  EXPECT_GT(relayed_runs, 30);
  EXPECT_GT(forwarded, 0);
  EXPECT_GT(arena, 0);
  EXPECT_GT(pipelined, 0);
}

// One trainer sends an 8-chunk box to two rollouts of another node: the relay receives chunk i in
// round i and forwards it in round i + 1, so forwarding overlaps receiving and the whole transfer
// takes 9 rounds, not 16; the node boundary carries the box once.
TEST(ExecutorTest, ForwardingRoundRFollowsReceivingRoundR) {
  const Job job = test::OneTrainerToWholeCopies({64, 16}, {"b", "b"});
  PlanOptions options;
  options.relay.mode = RelayMode::kAlways;
  const Plan plan = *MakePlan(job, *MakeFirstHolderPolicy(), options);
  ASSERT_EQ(plan.relays.size(), 1u);
  const StagingBudget budget{1024};  // 512-byte chunks: 8 rows of 64 bytes each.
  absl::StatusOr<std::vector<ProcessSchedule>> schedules =
      ScheduleTransfers(job, plan.segments, AllProcesses(job), budget);
  ASSERT_TRUE(schedules.ok()) << schedules.status();
  const ProcessSchedule& relay = (*schedules)[1];
  const PeerSchedule* in = FindLane(relay, 0, Direction::kReceive);
  const PeerSchedule* out = FindLane(relay, 2, Direction::kSend);
  ASSERT_TRUE(in != nullptr && out != nullptr);
  ASSERT_EQ(in->rounds.size(), 8u);
  ASSERT_EQ(out->rounds.size(), 8u);
  EXPECT_TRUE(out->forwarding);
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(in->rounds[r].round, r);
    EXPECT_EQ(out->rounds[r].round, r + 1);
  }
  EXPECT_EQ(relay.rounds, 9);
  EXPECT_EQ(relay.forwarded_bytes, 4096);
  EXPECT_EQ(relay.relay_stage1_bytes, 4096);
  EXPECT_EQ(relay.inter_node_bytes_saved, 4096);
  EXPECT_EQ((*schedules)[2].forwarded_received_bytes, 4096);
  HostBuffers source(job.source(), test::kSourceFill);
  ASSERT_TRUE(test::FillLogical(job.source(), 3, &source).ok());
  HostBuffers target(job.target(), test::kPoison);
  BatchRun run = RunBatch(job, plan.segments, budget, source, target);
  for (int32_t p = 0; p < 3; ++p) {
    ASSERT_TRUE(run.results[p].ok()) << run.results[p].status();
    ExpectStatsMatchSchedule((*schedules)[p], *run.results[p]);
  }
  EXPECT_EQ(run.counters.BytesDelivered(0, 1) + run.counters.BytesDelivered(0, 2), 4096);
  EXPECT_TRUE(test::CheckLogical(job.target(), target, 3).ok());
}

// A forward whose stage-1 segment is not in the batch is refused by the schedule (the work that
// execution builds too), before any byte moves.
TEST(ExecutorTest, AForwardWithoutItsStageOneIsRefused) {
  const Job job = test::OneTrainerToWholeCopies({4, 4}, {"b", "b"});
  PlanOptions options;
  options.relay.mode = RelayMode::kAlways;
  std::vector<Segment> segments = MakePlan(job, *MakeFirstHolderPolicy(), options)->segments;
  std::erase_if(segments, [&](const Segment& s) { return job.IsSource(s.from.process); });
  absl::StatusOr<ProcessSchedule> schedule =
      ScheduleTransfers(job, segments, AllProcesses(job), StagingBudget{}, 2);
  ASSERT_FALSE(schedule.ok());
  EXPECT_THAT(std::string(schedule.status().message()),
              HasSubstr("has no segment from a trainer delivering it"));
}

TEST(ExecutorTest, SendersStageColumnBlocksAndReceiversLandInPlace) {
  // A column block of a row shard is strided: the sender packs it. The receiver's block of rows is
  // contiguous in its column shard: it lands in place. Forcing every chunk to staged makes the
  // receiver's direct_bytes 0 and its arena non-zero, failing this test.
  const Job job = RowsToColumns();
  const Plan plan = *MakePlan(job, *MakeFirstHolderPolicy());
  const StagingBudget budget{1 << 20};
  const ProcessSchedule sender =
      *ScheduleTransfers(job, plan.segments, AllProcesses(job), budget, 0);
  EXPECT_EQ(sender.peers.size(), 4u);
  EXPECT_EQ(sender.sent_bytes, 128);
  EXPECT_EQ(sender.staged_bytes, 128);
  EXPECT_EQ(sender.direct_bytes, 0);
  EXPECT_EQ(sender.arena_bytes, 4 * 32);  // One 32-byte slot per peer.
  EXPECT_EQ(sender.rounds, 1);
  const ProcessSchedule receiver =
      *ScheduleTransfers(job, plan.segments, AllProcesses(job), budget, 2);
  EXPECT_EQ(receiver.received_bytes, 64);
  EXPECT_EQ(receiver.direct_bytes, 64);
  EXPECT_EQ(receiver.staged_bytes, 0);
  EXPECT_EQ(receiver.arena_bytes, 0);
  for (const PeerSchedule& lane : receiver.peers) {
    ASSERT_EQ(lane.rounds.size(), 1u);
    EXPECT_TRUE(lane.rounds[0].direct);
  }
}

TEST(ExecutorTest, ExtentOneAxesDoNotMakeARowStrided) {
  // The trainer keeps "w" [8, 8] in a buffer with padded rows (row stride 16). Each rollout rank
  // takes one row: a [1, 8] chunk with strides (16, 1), contiguous because its extent-1 axis does
  // not count. Dropping the extent-1 rule makes these chunks staged and fails this test.
  LayoutBuilder source(Role::kTrainer);
  const int32_t w = source.AddParam("w", DType::kFloat32, {8, 8});
  source.AddProcess("n");
  source.AddPiece(w, 0, source.AddBuffer(0, 8 * 16 * 4), WholeBox({8, 8}), 0, {16, 1});
  LayoutBuilder target(Role::kRollout);
  target.AddParam("w", DType::kFloat32, {8, 8});
  for (int p = 0; p < 8; ++p) {
    target.AddProcess("n");
    target.AddPackedPiece(0, p, target.AddBuffer(p, 32), SplitBox({8, 8}, 0, 8, p), 0);
  }
  const Job job = *Job::Create(std::move(source).Build(), std::move(target).Build());
  const Plan plan = *MakePlan(job, *MakeFirstHolderPolicy());
  const ProcessSchedule sender =
      *ScheduleTransfers(job, plan.segments, AllProcesses(job), StagingBudget{1 << 20}, 0);
  EXPECT_EQ(sender.sent_bytes, 256);
  EXPECT_EQ(sender.direct_bytes, 256);
  EXPECT_EQ(sender.staged_bytes, 0);
  EXPECT_EQ(sender.arena_bytes, 0);
}

TEST(ExecutorTest, LargeSegmentsAreChunkedAndSmallOnesPackedTogether) {
  // 2 rollout ranks take column halves of a [64, 64] fp32 row shard: 64 rows of 128 bytes each.
  // A 1 KiB budget cuts each 8 KiB segment into 16 chunks of 4 rows (512 bytes = budget / 2),
  // staged by the sender and direct at the receiver.
  LayoutBuilder source(Role::kTrainer);
  const int32_t w = source.AddParam("w", DType::kFloat32, {64, 64});
  source.AddProcess("n");
  source.AddPackedPiece(w, 0, source.AddBuffer(0, 64 * 64 * 4), WholeBox({64, 64}), 0);
  LayoutBuilder target(Role::kRollout);
  target.AddParam("w", DType::kFloat32, {64, 64});
  for (int p = 0; p < 2; ++p) {
    target.AddProcess("n");
    target.AddPackedPiece(0, p, target.AddBuffer(p, 64 * 32 * 4), SplitBox({64, 64}, 1, 2, p), 0);
  }
  const Job job = *Job::Create(std::move(source).Build(), std::move(target).Build());
  const Plan plan = *MakePlan(job, *MakeFirstHolderPolicy());
  const ProcessSchedule sender =
      *ScheduleTransfers(job, plan.segments, AllProcesses(job), StagingBudget{1024}, 0);
  EXPECT_EQ(sender.chunks, 2 * 16);
  EXPECT_EQ(sender.rounds, 16);
  EXPECT_EQ(sender.staged_bytes, 2 * 64 * 32 * 4);
  for (const PeerSchedule& lane : sender.peers) {
    EXPECT_EQ(lane.arena_slots, 2);  // Two 512-byte slots fit the 1 KiB budget.
    EXPECT_EQ(lane.arena_slot_bytes, 512);
  }
  const ProcessSchedule receiver =
      *ScheduleTransfers(job, plan.segments, AllProcesses(job), StagingBudget{1024}, 1);
  EXPECT_EQ(receiver.direct_bytes, 64 * 32 * 4);
  EXPECT_EQ(receiver.rounds, 16);

  // Many small parameters between the same pair travel in few messages.
  LayoutBuilder small_source(Role::kTrainer);
  LayoutBuilder small_target(Role::kRollout);
  small_source.AddProcess("n");
  small_target.AddProcess("n");
  const uint64_t from = small_source.AddBuffer(0, 1000 * 16 * 2);
  const uint64_t to = small_target.AddBuffer(0, 1000 * 16 * 2);
  for (int i = 0; i < 1000; ++i) {
    const std::string name = "norm" + std::to_string(i);
    small_source.AddPackedPiece(small_source.AddParam(name, DType::kBFloat16, {16}), 0, from,
                                WholeBox({16}), 16 * i);
    small_target.AddPackedPiece(small_target.AddParam(name, DType::kBFloat16, {16}), 0, to,
                                WholeBox({16}), 16 * ((i * 7) % 1000));
  }
  const Job many = *Job::Create(std::move(small_source).Build(), std::move(small_target).Build());
  const Plan many_plan =
      *MakePlan(many, *MakeFirstHolderPolicy(),
                PlanOptions{.process = std::nullopt, .coalesce = false, .relay = {}});
  const ProcessSchedule packed =
      *ScheduleTransfers(many, many_plan.segments, AllProcesses(many), StagingBudget{4096}, 0);
  EXPECT_EQ(packed.chunks, 1000);
  EXPECT_EQ(packed.rounds, 16);  // 32 KB in 2 KB messages.
}

TEST(ExecutorTest, SiblingColumnBlocksArePackedAheadInOnePassAndLandExactly) {
  // One trainer holds "w" [256, 512] fp32 row-major (2 KiB rows); rollout 0 and 1 take its column
  // halves, and rollout 0 also takes "norm" [16], so its lane carries one more message: the halves
  // of each block of rows go out in different rounds (rollout 1 first). A 256 KiB budget cuts each
  // half into two 128 KiB chunks of 128 rows, each a staged send. The sender packs rollout 0's
  // half of each block ahead of its round, in one pass with rollout 1's half; the schedule is
  // still what runs and every byte lands as the reference writes it. Without the look-ahead
  // packed_ahead_messages is 0 and this test fails.
  LayoutBuilder source(Role::kTrainer);
  const int32_t norm = source.AddParam("norm", DType::kFloat32, {16});
  const int32_t w = source.AddParam("w", DType::kFloat32, {256, 512});
  source.AddProcess("n");
  const uint64_t buffer = source.AddBuffer(0, (16 + 256 * 512) * 4);
  source.AddPackedPiece(norm, 0, buffer, WholeBox({16}), 0);
  source.AddPackedPiece(w, 0, buffer, WholeBox({256, 512}), 16);
  LayoutBuilder target(Role::kRollout);
  target.AddParam("norm", DType::kFloat32, {16});
  target.AddParam("w", DType::kFloat32, {256, 512});
  for (int p = 0; p < 2; ++p) {
    target.AddProcess("n");
    const uint64_t to = target.AddBuffer(p, (16 + 256 * 256) * 4);
    if (p == 0) target.AddPackedPiece(0, p, to, WholeBox({16}), 0);
    target.AddPackedPiece(1, p, to, SplitBox({256, 512}, 1, 2, p), 16);
  }
  const Job job = *Job::Create(std::move(source).Build(), std::move(target).Build());
  const Plan plan = *MakePlan(job, *MakeFirstHolderPolicy());
  const StagingBudget budget{256 << 10};
  const std::vector<ProcessSchedule> schedules =
      *ScheduleTransfers(job, plan.segments, AllProcesses(job), budget);
  ASSERT_EQ(schedules[0].staged_bytes, 256 * 512 * 4);
  const PeerSchedule* to_first = FindLane(schedules[0], 1, Direction::kSend);
  const PeerSchedule* to_second = FindLane(schedules[0], 2, Direction::kSend);
  ASSERT_NE(to_first, nullptr);
  ASSERT_NE(to_second, nullptr);
  ASSERT_EQ(to_first->rounds.size(), 3u);  // norm (direct), then the two chunks of its half.
  ASSERT_EQ(to_second->rounds.size(), 2u);
  for (bool verify : {false, true}) {
    SCOPED_TRACE(verify ? "verified" : "not verified");
    HostBuffers source_memory(job.source(), test::kSourceFill);
    ASSERT_TRUE(test::FillLogical(job.source(), 3, &source_memory).ok());
    HostBuffers target_memory(job.target(), test::kPoison);
    BatchRun run =
        RunBatch(job, plan.segments, budget, source_memory, target_memory, {}, -1, {}, verify);
    for (int32_t p = 0; p < job.num_processes(); ++p) {
      ASSERT_TRUE(run.results[p].ok()) << "process " << p << ": " << run.results[p].status();
      ExpectStatsMatchSchedule(schedules[p], *run.results[p]);
    }
    EXPECT_EQ(run.results[0]->packed_ahead_messages, 2);
    ExpectTargetsAsTheReferenceWrites(job, plan.segments, source_memory, target_memory);
  }
}

}  // namespace
}  // namespace wsync
