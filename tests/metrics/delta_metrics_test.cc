// Delta sync's metrics and stats (issue 44): a qwen2.5-tiny megatron(tp=2) -> vllm(tp=2) job with
// every process as a thread (tests/plugin/tiny_session.h), delta on, versions 1 to 4 each changing
// about 2% of the elements (test::FillSparseLogical), every rollout element checked after each
// sync. Each sync moves the wsync_delta_* families by what its stats say: the bytes saved equal the
// dense bytes (version 1's, which no rollout holds a base for) minus the bytes that travelled, the
// changed fraction is changed / compared, encode time on the trainers and apply time on the
// rollouts. The bases' byte budget (SessionConfig::delta_budget_bytes, wsync_config_t's
// delta_budget_bytes): a budget too small for any chunk sends every chunk dense, half of the
// bytes some chunks, and the data are exact either way.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "integration/fill/fill.h"
#include "plugin/session.h"
#include "tests/plugin/tiny_session.h"

namespace wsync {
namespace {

constexpr int kVersions = 4;
constexpr int32_t kPerMille = 20;

// The sum of the samples of `name` in a text exposition; NaN when there is none.
double SampleSum(const std::string& text, absl::string_view name) {
  double sum = 0;
  bool found = false;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    const absl::string_view series = line.substr(0, space);
    if (series.substr(0, series.find('{')) != name) continue;
    double value = 0;
    if (!absl::SimpleAtod(line.substr(space + 1), &value)) continue;
    sum += value;
    found = true;
  }
  return found ? sum : std::nan("");
}

// What a process saw after one sync.
struct AfterSync {
  TransferStats stats;
  std::string text;
};

// Runs versions 1..kVersions of a 2 + 2 job with delta on and `budget` bytes for each trainer's
// bases (0: the default); per process, what it saw after each version (index version - 1).
std::vector<std::vector<AfterSync>> RunDeltaJob(const std::string& job, int64_t budget) {
  const int port = test::FreeLoopbackPort();
  std::vector<test::TinySessionProcess> processes;
  for (Role role : {Role::kTrainer, Role::kRollout}) {
    for (int32_t rank = 0; rank < 2; ++rank) {
      SessionConfig config =
          test::TinyJobConfig(role, rank, port, job, "WSYNC_DELTA_METRICS_TEST_SECRET");
      config.delta = DeltaMode::kOn;
      if (budget > 0) config.delta_budget_bytes = budget;
      processes.push_back(test::MakeTinySessionProcess(config));
    }
  }
  std::vector<std::vector<AfterSync>> seen(processes.size());
  std::vector<absl::Status> results(processes.size());
  std::vector<std::thread> threads;
  for (size_t p = 0; p < processes.size(); ++p) {
    threads.emplace_back([&, p] {
      test::TinySessionProcess& me = processes[p];
      absl::Status status = me.session->Connect();
      for (int v = 1; v <= kVersions && status.ok(); ++v) {
        if (p < 2) status = test::FillSparseLogical(me.part, v, kPerMille, me.memory.get());
        if (status.ok()) status = me.session->Sync(v);
        if (status.ok() && p >= 2) {
          status = test::CheckSparseLogical(me.part, *me.memory, v, kPerMille);
        }
        if (status.ok())
          seen[p].push_back({me.session->LastStats().stats, me.session->MetricsText()});
      }
      results[p] = status;
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (size_t p = 0; p < processes.size(); ++p) {
    EXPECT_TRUE(results[p].ok()) << "process " << p << ": " << results[p];
  }
  return seen;
}

class DeltaMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("WSYNC_DELTA_METRICS_TEST_SECRET", "delta-metrics-test-secret-0123456789ab", 1);
  }
};

TEST_F(DeltaMetricsTest, EachSyncMovesTheDeltaFamiliesByItsStats) {
  const std::vector<std::vector<AfterSync>> seen = RunDeltaJob("delta-metrics", 0);
  for (size_t p = 0; p < seen.size(); ++p) {
    SCOPED_TRACE(::testing::Message() << "process " << p);
    ASSERT_EQ(seen[p].size(), kVersions);
    const bool trainer = p < 2;
    const TransferStats& first = seen[p][0].stats;
    const int64_t dense = trainer ? first.sent_bytes : first.received_bytes;
    EXPECT_EQ(first.delta_messages, 0);  // No rollout holds a version yet.
    EXPECT_EQ(first.delta_saved_bytes, 0);
    EXPECT_EQ(SampleSum(seen[p][0].text, "wsync_delta_saved_bytes_total"), 0);
    EXPECT_EQ(SampleSum(seen[p][0].text, "wsync_delta_compared_elements_total"), 0);
    EXPECT_TRUE(std::isnan(SampleSum(seen[p][0].text, "wsync_delta_changed_fraction")));
    for (int v = 2; v <= kVersions; ++v) {
      SCOPED_TRACE(::testing::Message() << "version " << v);
      const TransferStats& stats = seen[p][v - 1].stats;
      const std::string& text = seen[p][v - 1].text;
      const std::string& before = seen[p][v - 2].text;
      auto moved = [&](absl::string_view name) {
        return SampleSum(text, name) - SampleSum(before, name);
      };
      const int64_t travelled = trainer ? stats.sent_bytes : stats.received_bytes;
      EXPECT_GT(stats.delta_messages, 0);
      EXPECT_LT(travelled * 4, dense);
      EXPECT_EQ(stats.delta_saved_bytes, dense - travelled);
      EXPECT_EQ(moved("wsync_delta_saved_bytes_total"), static_cast<double>(dense - travelled));
      // The path byte series count what travelled: the planned bytes (version 1's, dense) less
      // what the deltas saved on those paths.
      const char* path_family = trainer ? "wsync_bytes_sent_total" : "wsync_bytes_received_total";
      EXPECT_EQ(moved(path_family), SampleSum(seen[p][0].text, path_family) -
                                        static_cast<double>(stats.delta_saved_bytes));
      EXPECT_EQ(moved("wsync_delta_compared_elements_total"),
                static_cast<double>(stats.delta_compared_elements));
      EXPECT_EQ(moved("wsync_delta_changed_elements_total"),
                static_cast<double>(stats.delta_changed_elements));
      EXPECT_NEAR(moved("wsync_delta_encode_seconds_total"), stats.delta_encode_cpu_seconds, 1e-9);
      EXPECT_NEAR(moved("wsync_delta_apply_seconds_total"), stats.delta_apply_cpu_seconds, 1e-9);
      if (trainer) {
        ASSERT_GT(stats.delta_compared_elements, 0);
        const double fraction = static_cast<double>(stats.delta_changed_elements) /
                                static_cast<double>(stats.delta_compared_elements);
        EXPECT_DOUBLE_EQ(SampleSum(text, "wsync_delta_changed_fraction"), fraction);
        if (v == kVersions) {
          std::printf(
              "trainer %zu, version %d: %.4f of %lld elements changed; %lld bytes sent "
              "of %lld dense\n",
              p, v, fraction, static_cast<long long>(stats.delta_compared_elements),
              static_cast<long long>(travelled), static_cast<long long>(dense));
        }
        EXPECT_GT(fraction, 0.005);  // About kPerMille / 1000 of the elements changed.
        EXPECT_LT(fraction, 0.1);
        EXPECT_GT(stats.delta_encode_cpu_seconds, 0);
        EXPECT_EQ(stats.delta_apply_cpu_seconds, 0);
      } else {
        EXPECT_EQ(stats.delta_compared_elements, 0);  // Receivers compare nothing.
        EXPECT_TRUE(std::isnan(SampleSum(text, "wsync_delta_changed_fraction")));
        EXPECT_GT(stats.delta_apply_cpu_seconds, 0);
      }
    }
  }
}

TEST_F(DeltaMetricsTest, ChunksThatDoNotFitTheBasesBudgetTravelDense) {
  // One byte holds no chunk: every chunk dense, every version (CheckSparseLogical: exact).
  const std::vector<std::vector<AfterSync>> none = RunDeltaJob("delta-budget-none", 1);
  for (size_t p = 0; p < none.size(); ++p) {
    ASSERT_EQ(none[p].size(), kVersions) << p;
    for (int v = 1; v <= kVersions; ++v) {
      const TransferStats& stats = none[p][v - 1].stats;
      EXPECT_EQ(stats.delta_messages, 0) << "process " << p << " version " << v;
      EXPECT_EQ(stats.delta_saved_bytes, 0) << "process " << p << " version " << v;
      EXPECT_EQ(stats.sent_bytes + stats.received_bytes,
                none[p][0].stats.sent_bytes + none[p][0].stats.received_bytes);
    }
  }
  // Half of each trainer's dense bytes: the chunks recorded first keep their bases, the rest go
  // dense; less saved than with every base, more than none.
  const std::vector<std::vector<AfterSync>> all = RunDeltaJob("delta-budget-all", 0);
  ASSERT_EQ(all[0].size(), kVersions);
  const int64_t half = std::min(all[0][0].stats.sent_bytes, all[1][0].stats.sent_bytes) / 2;
  const std::vector<std::vector<AfterSync>> some = RunDeltaJob("delta-budget-half", half);
  for (size_t p = 0; p < 2; ++p) {
    ASSERT_EQ(some[p].size(), kVersions) << p;
    for (int v = 2; v <= kVersions; ++v) {
      SCOPED_TRACE(::testing::Message() << "trainer " << p << " version " << v);
      EXPECT_GT(some[p][v - 1].stats.delta_saved_bytes, 0);
      EXPECT_LT(some[p][v - 1].stats.delta_saved_bytes, all[p][v - 1].stats.delta_saved_bytes);
    }
  }
}

}  // namespace
}  // namespace wsync
