#ifndef WSYNC_TESTS_TESTING_EXECUTOR_CHECKS_H_
#define WSYNC_TESTS_TESTING_EXECUTOR_CHECKS_H_

// Checks shared by the executor's test suites (host and CUDA memory): every process as an
// endpoint, a test sync's options, a process's buffer addresses in the test's host buffers, the
// run's stats against its schedule, and the targets against the reference copier. Header-only;
// include from gtest suites that link wsync::executor and wsync::testing.

#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "executor/execute.h"
#include "executor/schedule.h"
#include "gtest/gtest.h"
#include "integration/fill/fill.h"
#include "planner/relay.h"
#include "tests/testing/random_layouts.h"
#include "tests/testing/reference.h"

namespace wsync::test {

inline Endpoints AllProcesses(const Job& job) {
  Endpoints endpoints;
  for (int32_t p = 0; p < job.num_processes(); ++p) endpoints.processes.push_back(p);
  return endpoints;
}

// The options of one test sync of `plan`: its digest, `sync_id`, `verify`, a deadline `timeout`
// from now.
inline ExecuteOptions SyncOptionsOf(const Plan& plan, uint64_t sync_id,
                                    VerifyMode verify = VerifyMode::kOff,
                                    absl::Duration timeout = absl::Seconds(30)) {
  ExecuteOptions options;
  options.sync_id = sync_id;
  options.plan_digest = plan.digest;
  options.deadline = absl::Now() + timeout;
  options.verify = verify;
  return options;
}

// The addresses of process `p`'s buffers in `source` (trainers) or `target` (rollouts).
inline LocalBuffers BuffersOf(const Job& job, int32_t p, HostBuffers& source, HostBuffers& target) {
  const bool is_source = job.IsSource(p);
  const Layout& layout = is_source ? job.source() : job.target();
  HostBuffers& memory = is_source ? source : target;
  const int32_t rank = job.processes()[p].rank;
  LocalBuffers buffers;
  for (const BufferInfo& info : layout.buffers) {
    if (info.process == rank) buffers[info.id] = memory.data(BufferKey{rank, info.id});
  }
  return buffers;
}

inline void ExpectStatsMatchSchedule(const ProcessSchedule& schedule, const TransferStats& stats) {
  EXPECT_EQ(stats.segments, schedule.segments);
  EXPECT_EQ(stats.chunks, schedule.chunks);
  EXPECT_EQ(stats.rounds, schedule.rounds);
  EXPECT_EQ(stats.sent_bytes, schedule.sent_bytes);
  EXPECT_EQ(stats.received_bytes, schedule.received_bytes);
  EXPECT_EQ(stats.local_copy_bytes, schedule.local_copy_bytes);
  EXPECT_EQ(stats.direct_bytes, schedule.direct_bytes);
  EXPECT_EQ(stats.staged_bytes, schedule.staged_bytes);
  EXPECT_EQ(stats.forwarded_bytes, schedule.forwarded_bytes);
  EXPECT_EQ(stats.peak_arena_bytes, schedule.arena_bytes);
  EXPECT_EQ(stats.quantized_elements, schedule.quantized_elements);
  EXPECT_EQ(stats.quant_staging_bytes, schedule.quant_staging_bytes);
  EXPECT_LE(stats.quant_staging_written_bytes, stats.quant_staging_bytes);
}

// The run wrote exactly what the reference copier writes for the same plan (version 3), and no
// guard byte changed.
inline void ExpectTargetsAsTheReferenceWrites(const Job& job, const std::vector<Segment>& segments,
                                              const HostBuffers& source,
                                              const HostBuffers& target) {
  HostBuffers expected(job.target(), kPoison);
  WriteCounts counts(job.target());
  ASSERT_TRUE(ExecutePlanReference(job, segments, source, &expected, &counts).ok());
  ASSERT_TRUE(CheckTargets(job.target(), expected, counts, 3).ok());
  ASSERT_TRUE(target.CheckGuards().ok());
  for (const BufferKey& key : expected.keys()) {
    ASSERT_EQ(0, std::memcmp(expected.data(key), target.data(key), expected.bytes(key)))
        << "rollout process " << key.process << " buffer " << key.buffer;
  }
}

// A random job on up to 2 nodes (up to 8 processes a side) planned with relaying always on and a
// relay arena of `budget_bytes`: the whole plan and each process's own plan (PlanOptions::process).
// `place`, when given, may change the layouts (e.g. memory kinds) before the job is made.
struct RelayedCase {
  Job job;
  Plan plan;
  std::vector<std::vector<Segment>> own;  // By global process id.
};
inline absl::StatusOr<RelayedCase> MakeRelayedCase(
    uint64_t seed, int64_t budget_bytes,
    const std::function<void(std::mt19937_64&, LayoutPair&)>& place = {}) {
  std::mt19937_64 rng(seed);
  RandomLayoutOptions layout_options;
  layout_options.max_nodes = 2;
  layout_options.max_processes = 8;
  LayoutPair pair = RandomLayoutPair(rng, layout_options);
  if (place) place(rng, pair);
  absl::StatusOr<Job> job = Job::Create(pair.source, pair.target);
  if (!job.ok()) return job.status();
  RandomAnswersPolicy policy(seed);
  PlanOptions options;
  options.relay.mode = RelayMode::kAlways;
  options.relay.arena_bytes = budget_bytes;
  absl::StatusOr<Plan> plan = MakePlan(*job, policy, options);
  if (!plan.ok()) return plan.status();
  std::vector<std::vector<Segment>> own(job->num_processes());
  for (int32_t p = 0; p < job->num_processes(); ++p) {
    PlanOptions mine = options;
    mine.process = p;
    absl::StatusOr<Plan> plan_of_p = MakePlan(*job, policy, mine);
    if (!plan_of_p.ok()) return plan_of_p.status();
    own[p] = plan_of_p->segments;
  }
  return RelayedCase{*std::move(job), *std::move(plan), std::move(own)};
}

}  // namespace wsync::test

#endif  // WSYNC_TESTS_TESTING_EXECUTOR_CHECKS_H_
