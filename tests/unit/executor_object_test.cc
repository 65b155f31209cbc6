// The executor as an object (executor/executor.h): one Executor per process built once over one
// loopback fabric, then several syncs Run on it, as a connected job runs its steps. Each sync lands
// its own version in every target piece, its stats equal the schedule (ScheduleTransfers for one
// batch, ScheduleWaves for a streamed sync), and the arenas the first sync allocated are reused by
// the later ones (the executor's ArenaCache holds no more after them).

#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "executor/executor.h"
#include "executor/schedule.h"
#include "executor/waves.h"
#include "gtest/gtest.h"
#include "integration/fill/fill.h"
#include "planner/policy.h"
#include "planner/waves.h"
#include "tests/testing/executor_checks.h"
#include "tests/testing/random_layouts.h"
#include "transport/loopback/loopback.h"

namespace wsync {
namespace {

using test::AllProcesses;
using test::HostBuffers;

constexpr int kSyncs = 3;

// Every process of `job` with its loopback transport and group, its buffers and one Executor over
// `waves` (or `segments` as one batch when `waves` is empty), built once.
class Processes {
 public:
  Processes(const Job& job, const std::vector<Segment>& segments, const std::vector<Wave>& waves,
            const QuantPlan& quant, StagingBudget budget, HostBuffers& source, HostBuffers& target)
      : fabric_(job.num_processes()), endpoints_(AllProcesses(job)) {
    const int32_t n = job.num_processes();
    buffers_.resize(n);
    for (int32_t p = 0; p < n; ++p) {
      absl::StatusOr<std::unique_ptr<Transport>> transport = fabric_.Connect(p);
      absl::StatusOr<std::unique_ptr<Group>> group = fabric_.MakeGroup(p);
      EXPECT_TRUE(transport.ok() && group.ok());
      if (!transport.ok() || !group.ok()) return;
      transports_.push_back(*std::move(transport));
      groups_.push_back(*std::move(group));
      buffers_[p] = test::BuffersOf(job, p, source, target);
      if (waves.empty()) {
        executors_.push_back(std::make_unique<Executor>(job, segments, &quant, endpoints_, budget,
                                                        p, buffers_[p], *transports_[p],
                                                        *groups_[p]));
      } else {
        executors_.push_back(std::make_unique<Executor>(job, waves, &quant, endpoints_, budget, p,
                                                        buffers_[p], *transports_[p], *groups_[p]));
      }
    }
  }

  // Runs sync `sync_id` on every process at once (one thread each); `waves_seen[p]` records the
  // waves process p's callback saw, `agreed[p]` whether its agreement passed.
  std::vector<absl::StatusOr<TransferStats>> Sync(uint64_t sync_id, uint64_t digest,
                                                  std::vector<std::vector<int32_t>>& waves_seen,
                                                  std::vector<char>& agreed) {
    const int32_t n = static_cast<int32_t>(executors_.size());
    std::vector<absl::StatusOr<TransferStats>> results(n, absl::UnknownError("not run"));
    waves_seen.assign(n, {});
    agreed.assign(n, 0);
    std::vector<std::thread> threads;
    for (int32_t p = 0; p < n; ++p) {
      threads.emplace_back([&, p] {
        bool passed = false;
        SyncRequest sync;
        sync.sync_id = sync_id;
        sync.plan_digest = digest;
        sync.deadline = absl::Now() + absl::Seconds(30);
        sync.verify = VerifyMode::kHash;
        sync.agreed = &passed;
        sync.after_wave = [&waves_seen, p](int32_t wave) {
          waves_seen[p].push_back(wave);
          return absl::OkStatus();
        };
        results[p] = executors_[p]->Run(sync);
        agreed[p] = passed ? 1 : 0;
      });
    }
    for (std::thread& thread : threads) thread.join();
    return results;
  }

  const Executor& executor(int32_t p) const { return *executors_[p]; }

 private:
  LoopbackFabric fabric_;
  const Endpoints endpoints_;
  std::vector<std::unique_ptr<Transport>> transports_;
  std::vector<std::unique_ptr<Group>> groups_;
  std::vector<LocalBuffers> buffers_;
  std::vector<std::unique_ptr<Executor>> executors_;  // Destroyed first.
};

// Runs kSyncs syncs of `job` on executors built once, each with a new version of the sources, and
// checks each as the file comment says against `schedules` (by process). Returns the number of
// processes that held staging arenas.
int RunSyncsAndCheck(const Job& job, const Plan& plan, const std::vector<Wave>& waves,
                     const std::vector<ProcessSchedule>& schedules, StagingBudget budget) {
  HostBuffers source(job.source(), test::kSourceFill);
  HostBuffers target(job.target(), test::kPoison);
  Processes processes(job, plan.segments, waves, plan.quant, budget, source, target);
  const int32_t n = job.num_processes();
  std::vector<int64_t> held_after_first(n, 0);
  int holding = 0;
  for (int sync = 1; sync <= kSyncs; ++sync) {
    SCOPED_TRACE(testing::Message() << "sync " << sync);
    const uint64_t version = 10 + sync;
    EXPECT_TRUE(test::FillLogical(job.source(), version, &source).ok());
    std::vector<std::vector<int32_t>> waves_seen;
    std::vector<char> agreed;
    std::vector<absl::StatusOr<TransferStats>> results =
        processes.Sync(sync, plan.digest, waves_seen, agreed);
    for (int32_t p = 0; p < n; ++p) {
      SCOPED_TRACE(testing::Message() << "process " << p);
      if (!results[p].ok()) {
        ADD_FAILURE() << results[p].status();
        continue;
      }
      test::ExpectStatsMatchSchedule(schedules[p], *results[p]);
      EXPECT_TRUE(agreed[p]);
      std::vector<int32_t> expected_waves;
      for (const Wave& wave : waves) expected_waves.push_back(wave.wave);
      if (waves.empty()) expected_waves = {0};
      EXPECT_EQ(waves_seen[p], expected_waves);
      const int64_t held = processes.executor(p).arenas().held_bytes();
      EXPECT_GE(held, schedules[p].arena_bytes);
      if (sync == 1) {
        held_after_first[p] = held;
        if (held > 0) ++holding;
      } else {
        EXPECT_EQ(held, held_after_first[p]) << "the arenas of the first sync were not reused";
      }
    }
    EXPECT_TRUE(test::CheckLogical(job.target(), target, version).ok());
    EXPECT_TRUE(target.CheckGuards().ok());
  }
  return holding;
}

TEST(ExecutorObjectTest, OneBatchRunsManySyncsAndReusesItsArenas) {
  int holding = 0;
  for (uint64_t seed = 0; seed < 12; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    std::mt19937_64 rng(seed);
    const test::LayoutPair pair = test::RandomLayoutPair(rng);
    absl::StatusOr<Job> job = Job::Create(pair.source, pair.target);
    ASSERT_TRUE(job.ok()) << job.status();
    test::RandomAnswersPolicy policy(seed);
    absl::StatusOr<Plan> plan = MakePlan(*job, policy);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const StagingBudget budget{static_cast<double>(seed % 2 == 0 ? 256 : 4096)};
    absl::StatusOr<std::vector<ProcessSchedule>> schedules =
        ScheduleTransfers(*job, plan->segments, AllProcesses(*job), budget);
    ASSERT_TRUE(schedules.ok()) << schedules.status();
    holding += RunSyncsAndCheck(*job, *plan, {}, *schedules, budget);
  }
  EXPECT_GT(holding, 0) << "no process staged anything: the arenas were not exercised";
}

TEST(ExecutorObjectTest, StreamedSyncRunsManySyncsAndReusesItsArenas) {
  int streamed = 0;
  for (uint64_t seed = 100; seed < 112; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    std::mt19937_64 rng(seed);
    test::LayoutPair pair = test::RandomLayoutPair(rng);
    for (size_t i = 0; i < pair.target.params.size(); ++i) {
      pair.target.params[i].wave = static_cast<int32_t>(i % 3);
    }
    absl::StatusOr<Job> job = Job::Create(pair.source, pair.target);
    if (!job.ok()) continue;  // Waves this layout cannot take (e.g. a fused target tensor).
    test::RandomAnswersPolicy policy(seed);
    absl::StatusOr<Plan> plan = MakePlan(*job, policy);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const std::vector<Wave> waves = SplitIntoWaves(*job, plan->segments);
    if (waves.size() > 1) ++streamed;
    const StagingBudget budget{256};
    std::vector<ProcessSchedule> schedules;
    for (int32_t p = 0; p < job->num_processes(); ++p) {
      absl::StatusOr<ProcessSchedule> schedule =
          ScheduleWaves(*job, waves, plan->quant, AllProcesses(*job), budget, p);
      ASSERT_TRUE(schedule.ok()) << schedule.status();
      schedules.push_back(*std::move(schedule));
    }
    RunSyncsAndCheck(*job, *plan, waves, schedules, budget);
  }
  EXPECT_GT(streamed, 0) << "no seed made a streamed sync";
}

}  // namespace
}  // namespace wsync
