// A session job with a calibration: trainer rank 0 alone names the file; every process gets it at
// connect, plans with cost_aware, syncs exactly, and reports the same prediction (the one the link
// model gives for the whole sync) in its schedule report and its predicted-seconds metric. Without
// a calibration cost_aware is refused on every process; an unreadable file fails every process.
// A calibration without a path class the job uses prices the rest and names what it left out.

#include "plugin/prediction.h"

#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "cost/link_model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/plugin/tiny_session.h"

namespace wsync {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kLinks[] = "local=1us,20GB/s;intra_node=5us,4GB/s";

class PredictionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("WSYNC_PREDICTION_TEST_SECRET", "prediction-test-secret-0123456789abcdef", 1);
    path_ = absl::StrCat(::testing::TempDir(), "/prediction-test-", getpid(), ".pb");
    std::ofstream(path_, std::ios::binary) << SerializeCalibration(*SyntheticCalibration(kLinks));
  }
  void TearDown() override { std::remove(path_.c_str()); }

  // Runs the 2 + 2 job: connect, then (when every connect succeeded) one verified sync.
  // With `two_nodes` the trainers report node "a" and the rollouts node "b".
  std::vector<absl::Status> RunJob(const std::string& job, const std::string& policy,
                                   const std::string& file_on_rank0,
                                   std::vector<test::TinySessionProcess>* processes,
                                   bool two_nodes = false) {
    const int port = test::FreeLoopbackPort();
    for (int p = 0; p < 4; ++p) {
      const Role role = p < 2 ? Role::kTrainer : Role::kRollout;
      SessionConfig config =
          test::TinyJobConfig(role, p % 2, port, job, "WSYNC_PREDICTION_TEST_SECRET");
      config.deadline = absl::Seconds(20);
      config.replica_policy = policy;
      if (p == 0) config.calibration_file = file_on_rank0;
      if (two_nodes) config.node_id = p < 2 ? "a" : "b";
      processes->push_back(test::MakeTinySessionProcess(config));
    }
    std::vector<absl::Status> results(4);
    std::vector<std::thread> threads;
    for (int p = 0; p < 4; ++p) {
      threads.emplace_back([&, p] {
        test::TinySessionProcess& me = (*processes)[p];
        results[p] = me.session->Connect();
        if (!results[p].ok()) return;
        if (p < 2) results[p] = test::FillLogical(me.part, 1, me.memory.get());
        if (results[p].ok()) results[p] = me.session->Sync(1);
        if (results[p].ok() && p >= 2) results[p] = test::CheckLogical(me.part, *me.memory, 1);
      });
    }
    for (std::thread& thread : threads) thread.join();
    return results;
  }

  std::string path_;
};

// The value of the first sample of `name` in a Prometheus text exposition; NaN when absent.
double Gauge(const std::string& text, const std::string& name) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, name) || line.size() <= name.size() ||
        (line[name.size()] != '{' && line[name.size()] != ' ')) {
      continue;
    }
    double value = 0;
    const size_t space = line.rfind(' ');
    if (absl::SimpleAtod(line.substr(space + 1), &value)) return value;
  }
  return std::nan("");
}

// The whole job as the sessions merge it: every process on node "local", or with `two_nodes` the
// trainers on "a" and the rollouts on "b".
Job TinyJob(bool two_nodes = false) {
  const ModelSpec model = *GetModel("qwen2.5-tiny");
  Layout from = *BuildNamedLayout(model, "megatron(tp=2)");
  Layout to = *BuildNamedLayout(model, "vllm(tp=2)");
  for (ProcessInfo& process : from.processes) process.node_id = two_nodes ? "a" : "local";
  for (ProcessInfo& process : to.processes) process.node_id = two_nodes ? "b" : "local";
  return *Job::Create(std::move(from), std::move(to));
}

TEST_F(PredictionTest, EveryProcessReportsTheSamePredictionOfTheWholeSync) {
  std::vector<test::TinySessionProcess> processes;
  const std::vector<absl::Status> results = RunJob("predict", "cost_aware", path_, &processes);
  for (int p = 0; p < 4; ++p) ASSERT_TRUE(results[p].ok()) << p << ": " << results[p];

  const LinkFits fits = *FitLinks(*SyntheticCalibration(kLinks));
  const Job job = TinyJob();
  const absl::StatusOr<Prediction> expected =
      PredictSync(job, **MakeSessionPolicy("cost_aware", &fits), fits, StagingBudget{});
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_GT(expected->seconds, 0);
  const std::string line = absl::StrFormat("predicted time %.6f s", expected->seconds);
  for (int p = 0; p < 4; ++p) {
    const absl::StatusOr<std::string> report = processes[p].session->ScheduleReport();
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_THAT(*report, HasSubstr(line)) << *report;
    EXPECT_THAT(*report, HasSubstr(absl::StrCat("binding resource: ", expected->binding)));
    EXPECT_NEAR(Gauge(processes[p].session->MetricsText(), "wsync_sync_predicted_seconds"),
                expected->seconds, 1e-9 + 1e-6 * expected->seconds);
    EXPECT_EQ(Gauge(processes[p].session->MetricsText(), "wsync_sync_unpriced_bytes"), 0);
    EXPECT_THAT(*report, Not(HasSubstr("not priced")));
  }
}

TEST_F(PredictionTest, AMissingPathClassIsLeftOutAndNamedWithItsCommand) {
  // kLinks has no inter_node fit; every byte of this job crosses from node a to node b.
  std::vector<test::TinySessionProcess> processes;
  const std::vector<absl::Status> results =
      RunJob("partial", "first_holder", path_, &processes, /*two_nodes=*/true);
  for (int p = 0; p < 4; ++p) ASSERT_TRUE(results[p].ok()) << p << ": " << results[p];

  const LinkFits fits = *FitLinks(*SyntheticCalibration(kLinks));
  const absl::StatusOr<Prediction> expected =
      PredictSync(TinyJob(/*two_nodes=*/true), **MakeSessionPolicy("first_holder", &fits), fits,
                  StagingBudget{});
  ASSERT_TRUE(expected.ok()) << expected.status();
  ASSERT_EQ(expected->unpriced_bytes.size(), 1u);
  const int64_t unpriced = expected->unpriced_bytes.at("inter_node");
  EXPECT_GT(unpriced, 0);
  for (int p = 0; p < 4; ++p) {
    const absl::StatusOr<std::string> report = processes[p].session->ScheduleReport();
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_THAT(*report, HasSubstr("for the priced traffic only")) << *report;
    EXPECT_THAT(*report, HasSubstr(absl::StrCat("not priced: inter_node ", unpriced, " B")));
    EXPECT_THAT(*report,
                HasSubstr("measure with: wsync calibrate --processes 4 --nodes a,a,b,b --netns"));
    const std::string metrics = processes[p].session->MetricsText();
    EXPECT_EQ(Gauge(metrics, "wsync_sync_unpriced_bytes"), static_cast<double>(unpriced));
    EXPECT_NEAR(Gauge(metrics, "wsync_sync_predicted_seconds"), expected->seconds, 1e-9);
  }
  // A calibration that prices everything leaves nothing out.
  EXPECT_EQ(UnpricedNote(Prediction{}), "");
  EXPECT_EQ(CalibrateCommandFor({{"intra_node", 1}}, "cal.pb"),
            "wsync calibrate --processes 4 --out cal.pb");
  EXPECT_EQ(CalibrateCommandFor({{"intra_node", 1}, {"nvlink", 1}}), "");
}

TEST_F(PredictionTest, CostAwareWithoutCalibrationIsRefusedEverywhere) {
  std::vector<test::TinySessionProcess> processes;
  const std::vector<absl::Status> results = RunJob("nocal", "cost_aware", "", &processes);
  for (int p = 0; p < 4; ++p) {
    EXPECT_EQ(results[p].code(), absl::StatusCode::kFailedPrecondition) << p << results[p];
    EXPECT_THAT(std::string(results[p].message()), HasSubstr("needs a calibration"));
  }
}

TEST_F(PredictionTest, AnUnreadableFileFailsEveryProcess) {
  std::vector<test::TinySessionProcess> processes;
  const std::vector<absl::Status> results =
      RunJob("badfile", "first_holder", path_ + ".missing", &processes);
  EXPECT_EQ(results[0].code(), absl::StatusCode::kNotFound) << results[0];
  for (int p = 1; p < 4; ++p) {
    EXPECT_EQ(results[p].code(), absl::StatusCode::kUnavailable) << p << results[p];
  }
}

TEST_F(PredictionTest, WithoutCalibrationTheReportSaysWhatItNeeds) {
  std::vector<test::TinySessionProcess> processes;
  const std::vector<absl::Status> results = RunJob("plain", "first_holder", "", &processes);
  for (int p = 0; p < 4; ++p) ASSERT_TRUE(results[p].ok()) << p << ": " << results[p];
  EXPECT_THAT(*processes[2].session->ScheduleReport(), HasSubstr("needs calibration"));
}

}  // namespace
}  // namespace wsync
