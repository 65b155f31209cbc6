// Executor benchmarks (Google Benchmark 1.7.1): one process's run of many small messages over
// many peer directions (lanes), with no peers and no threads: the run's own bookkeeping (posting,
// completing, packing) is what is measured, not a transport. The process is the one trainer of a
// tensor that `lanes` rollout processes each need a part of, `messages` messages per lane of two
// 64-byte rows each, over test::SinkTransport (every request finishes, one per WaitAny, at a
// seeded random position of the wait list) and a group of one.
//   rows     each rollout needs a block of rows: every send is direct (from the weights)
//   columns  each rollout needs a block of columns: every send is staged (packed from strided
//            rows), and sibling blocks are packed ahead in one pass
// Arguments: lanes, messages per lane. Instruction counts are the figure to compare on a shared
// machine: run under `valgrind --tool=callgrind --toggle-collect='wsync::ExecuteTransfers*'` and
// divide by the iterations reported. Counters: messages and staged bytes per sync.

#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "executor/execute.h"
#include "executor/schedule.h"
#include "planner/job.h"
#include "planner/plan.h"
#include "planner/policy.h"
#include "tests/testing/fan_out_job.h"
#include "tests/testing/sink_transport.h"

namespace wsync {
namespace {

enum class Split { kRows, kColumns };

constexpr int64_t kColumnsPerLane = 16;  // float32: 64-byte rows.
constexpr int64_t kRowBytes = kColumnsPerLane * 4;
constexpr int64_t kRowsPerMessage = 2;  // So that a column block's message is strided.

// The job of a case: kRowsPerMessage rows per message.
absl::StatusOr<Job> MakeJob(Split split, int32_t lanes, int32_t messages) {
  const int64_t rows = kRowsPerMessage * messages;
  return split == Split::kRows ? test::FanOutJob({lanes * rows, kColumnsPerLane}, 0, lanes)
                               : test::FanOutJob({rows, lanes * kColumnsPerLane}, 1, lanes);
}

void BM_RunLanes(benchmark::State& state, Split split) {
  const int32_t lanes = static_cast<int32_t>(state.range(0));
  const int32_t messages = static_cast<int32_t>(state.range(1));
  absl::StatusOr<Job> job = MakeJob(split, lanes, messages);
  if (!job.ok()) {
    state.SkipWithError(job.status().ToString().c_str());
    return;
  }
  absl::StatusOr<Plan> plan = MakePlan(*job, *MakeFirstHolderPolicy());
  Endpoints endpoints;
  for (int32_t p = 0; p < job->num_processes(); ++p) endpoints.processes.push_back(p);
  // Messages of at most half the budget: kRowsPerMessage rows; two arena slots per lane.
  const StagingBudget budget{2 * kRowsPerMessage * kRowBytes};
  absl::StatusOr<ProcessSchedule> schedule =
      plan.ok() ? ScheduleTransfers(*job, plan->segments, endpoints, budget, 0)
                : absl::StatusOr<ProcessSchedule>(plan.status());
  if (!schedule.ok()) {
    state.SkipWithError(schedule.status().ToString().c_str());
    return;
  }
  int64_t scheduled = 0;
  for (const PeerSchedule& lane : schedule->peers) scheduled += std::ssize(lane.rounds);
  if (std::ssize(schedule->peers) != lanes || scheduled != int64_t{lanes} * messages) {
    state.SkipWithError("the schedule does not have the lanes and messages asked for");
    return;
  }
  std::vector<float> weights(Volume(WholeBox(job->source().params[0].shape)), 1.0f);
  const LocalBuffers buffers{{job->source().buffers[0].id, weights.data()}};
  test::SoloGroup group(0);
  ArenaCache arenas;
  uint64_t sync = 0;
  int64_t staged = 0;
  for (auto _ : state) {
    test::SinkTransport transport(0, test::SinkTransport::Order::kRandom, ++sync);
    ExecuteOptions options;
    options.sync_id = sync;
    options.deadline = absl::InfiniteFuture();
    options.arenas = &arenas;
    absl::StatusOr<TransferStats> stats = ExecuteTransfers(*job, plan->segments, endpoints, budget,
                                                           0, buffers, transport, group, options);
    if (!stats.ok()) {
      state.SkipWithError(stats.status().ToString().c_str());
      return;
    }
    benchmark::DoNotOptimize(stats->sent_bytes);
    staged = stats->staged_bytes;
  }
  state.counters["messages"] = static_cast<double>(scheduled);
  state.counters["staged_bytes"] = static_cast<double>(staged);
}

BENCHMARK_CAPTURE(BM_RunLanes, rows, Split::kRows)
    ->Args({64, 60})
    ->Args({256, 60})
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_RunLanes, columns, Split::kColumns)
    ->Args({64, 60})
    ->Args({256, 60})
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace wsync

BENCHMARK_MAIN();
