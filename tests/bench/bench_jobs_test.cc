#include "integration/bench/bench_jobs.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/job.h"
#include "planner/models.h"
#include "planner/named_layouts.h"
#include "planner/plan.h"
#include "planner/policy.h"
#include "planner/quant_plan.h"

namespace wsync::bench {
namespace {

using ::testing::HasSubstr;

// A fresh folder under /tmp, removed with the fixture.
class BinariesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/wsync-bench-jobs-test-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    root_ = dir;
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  // Creates root/relative (and its folders) with `mode`; returns its path.
  std::string File(const std::string& relative, mode_t mode = 0755) {
    const std::string path = root_ + "/" + relative;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    std::ofstream(path) << "#!/bin/sh\n";
    EXPECT_EQ(chmod(path.c_str(), mode), 0);
    return path;
  }

  std::string root_;
};

TEST_F(BinariesTest, BuildTreeLayoutFindsTheCliAndTheHost) {
  const std::string self = File("build/integration/bench/wsync-bench");
  File("build/integration/cli/wsync");
  File("build/integration/host/wsync_host");
  // The multi-process tests' worker is no host of the benchmarks (issue 43): never picked.
  File("build/tests/multiproc/wsync_test_worker");
  JobOptions options;
  ASSERT_TRUE(ResolveBinaries(self, &options).ok());
  EXPECT_EQ(std::filesystem::canonical(options.wsync),
            std::filesystem::canonical(root_ + "/build/integration/cli/wsync"));
  EXPECT_EQ(std::filesystem::canonical(options.host),
            std::filesystem::canonical(root_ + "/build/integration/host/wsync_host"));
}

TEST_F(BinariesTest, TheTestWorkerAloneIsNotFound) {
  const std::string self = File("build/integration/bench/wsync-bench");
  File("build/integration/cli/wsync");
  File("build/tests/multiproc/wsync_test_worker");
  JobOptions options;
  const absl::Status status = ResolveBinaries(self, &options);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("integration/host/wsync_host"));
  EXPECT_THAT(status.message(), HasSubstr("--sync_worker"));
}

TEST_F(BinariesTest, BundleLayoutPrefersSiblingsInTheSameFolder) {
  const std::string self = File("bin/wsync-bench");
  const std::string wsync = File("bin/wsync");
  const std::string host = File("bin/wsync_host");
  JobOptions options;
  ASSERT_TRUE(ResolveBinaries(self, &options).ok());
  EXPECT_EQ(options.wsync, wsync);
  EXPECT_EQ(options.host, host);
}

TEST_F(BinariesTest, MissingOrNotExecutableIsNotFoundNamingTheFlag) {
  const std::string self = File("build/integration/bench/wsync-bench");
  File("build/integration/host/wsync_host");
  File("build/integration/cli/wsync", 0644);  // Not executable.
  JobOptions options;
  const absl::Status status = ResolveBinaries(self, &options);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("--wsync"));
  EXPECT_THAT(status.message(), HasSubstr("integration/cli/wsync"));
}

TEST_F(BinariesTest, GivenPathsWinAndMustBeExecutable) {
  const std::string self = File("elsewhere/wsync-bench");
  const std::string wsync = File("mine/wsync");
  const std::string worker = File("mine/worker");
  JobOptions options;
  options.wsync = wsync;
  options.host = worker;
  ASSERT_TRUE(ResolveBinaries(self, &options).ok());
  EXPECT_EQ(options.wsync, wsync);
  EXPECT_EQ(options.host, worker);

  JobOptions bad;
  bad.host = File("mine/not-executable", 0600);
  const absl::Status status = ResolveBinaries(self, &bad);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("--sync_worker"));
}

TEST(ScheduleFactsTest, UsesThePolicyItIsGiven) {
  const absl::StatusOr<ModelSpec> model = GetModel("qwen2.5-tiny");
  ASSERT_TRUE(model.ok());
  const double budget = static_cast<double>(kDefaultStagingBudgetBytes);
  EXPECT_FALSE(ScheduleFactsFor(*model, "megatron(tp=2)", "vllm(tp=2)", budget, "nonesuch").ok());
  const absl::StatusOr<ScheduleFacts> facts =
      ScheduleFactsFor(*model, "megatron(tp=2)", "vllm(tp=2)", budget, "local_first_least_loaded");
  ASSERT_TRUE(facts.ok()) << facts.status();
  EXPECT_EQ(facts->trainers, 2);
  EXPECT_EQ(facts->rollouts, 2);
  EXPECT_GT(facts->bytes_total, 0);
  EXPECT_GE(facts->bytes_total, facts->bytes_per_rollout);
}

// FP8 rollouts (the FP8 scenario's layouts): the facts count the quantization steps' bytes
// (e4m3, scales, gathers), which the workers' ExecuteTransfers receives, and the e4m3 elements
// the verification checks.
TEST(ScheduleFactsTest, CountsTheQuantizationStepsOfFp8Rollouts) {
  const absl::StatusOr<ModelSpec> model = GetModel("qwen2.5-0.5b");
  ASSERT_TRUE(model.ok());
  const double budget = static_cast<double>(kDefaultStagingBudgetBytes);
  const std::string policy = "local_first_least_loaded";
  const std::string to = "vllm(tp=1,quant=fp8_block)";
  const absl::StatusOr<ScheduleFacts> bf16 =
      ScheduleFactsFor(*model, "megatron(tp=2)", "vllm(tp=1)", budget, policy);
  const absl::StatusOr<ScheduleFacts> fp8 =
      ScheduleFactsFor(*model, "megatron(tp=2)", to, budget, policy);
  ASSERT_TRUE(bf16.ok() && fp8.ok()) << bf16.status() << fp8.status();
  EXPECT_EQ(bf16->fp8_elements, 0);

  absl::StatusOr<NamedJobLayouts> layouts = BuildNamedJobLayouts(*model, "megatron(tp=2)", to);
  ASSERT_TRUE(layouts.ok()) << layouts.status();
  absl::StatusOr<Job> job = Job::Create(layouts->source, layouts->target);
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<Plan> plan = MakePlan(*job, **MakeReplicaPolicy(policy));
  ASSERT_TRUE(plan.ok()) << plan.status();
  int64_t expected = CountQuantWireBytes(*job, plan->quant).total(), fp8_elements = 0;
  ASSERT_GT(expected, 0);
  for (const Segment& s : plan->segments) expected += s.elements() * job->ElementSize(s.param);
  for (const Piece& piece : job->target().pieces) {
    if (job->target().params[piece.param].quant.quantized()) fp8_elements += Volume(piece.box);
  }
  EXPECT_EQ(fp8->bytes_total, expected);
  EXPECT_EQ(fp8->quant.total(), CountQuantWireBytes(*job, plan->quant).total());
  EXPECT_EQ(fp8->plain_bytes + fp8->quant.total(), fp8->bytes_total);
  EXPECT_GT(fp8->quant.unquantized, fp8->quant.total());
  EXPECT_GT(fp8->quant.gathered, 0);  // The trainers' TP cuts q/k/v/o blocks.
  EXPECT_EQ(fp8->fp8_elements, fp8_elements);
  EXPECT_GT(fp8->fp8_elements, 0);
  EXPECT_LT(fp8->bytes_total, bf16->bytes_total);
  // The FP8 verification walks every element: its job gets the element check's allowance.
  EXPECT_GT(WsyncJobLimit(*fp8, 2, JobCheck::kChunkHashes, 60),
            WsyncJobLimit(*bf16, 2, JobCheck::kChunkHashes, 60));
}

TEST(QuantizedSpecTest, AddsTheQuantToANamedLayout) {
  EXPECT_EQ(*QuantizedSpec("vllm(tp=2)", "fp8_block"), "vllm(tp=2,quant=fp8_block)");
  EXPECT_EQ(*QuantizedSpec("vllm(tp=1,dp=2)", "fp8_channel"), "vllm(tp=1,dp=2,quant=fp8_channel)");
  EXPECT_EQ(*QuantizedSpec("vllm()", "fp8_tensor"), "vllm(quant=fp8_tensor)");
  for (const auto& [to, quant] :
       std::vector<std::pair<std::string, std::string>>{{"vllm(tp=2,quant=fp8_block)", "fp8_block"},
                                                        {"vllm", "fp8_block"},
                                                        {"vllm(tp=2", "fp8_block"},
                                                        {"", "fp8_block"},
                                                        {"vllm(tp=2)", ""}}) {
    const absl::StatusOr<std::string> spec = QuantizedSpec(to, quant);
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << to << " " << quant;
  }
}

TEST(JobLimitTest, GrowsWithTheGivenBaseAndTheElementCheck) {
  ScheduleFacts facts;
  facts.largest_process_bytes = int64_t{2} * 1000 * 1000 * 1000;
  const absl::Duration base = WsyncJobLimit(facts, 2, JobCheck::kChunkHashes, 60);
  EXPECT_EQ(WsyncJobLimit(facts, 2, JobCheck::kChunkHashes, 90) - base, absl::Seconds(30));
  EXPECT_GT(WsyncJobLimit(facts, 2, JobCheck::kElements, 60), base);
  EXPECT_GT(WsyncJobLimit(facts, 3, JobCheck::kChunkHashes, 60), base);
  EXPECT_EQ(VerificationCheck(true), JobCheck::kElements);
  EXPECT_EQ(VerificationCheck(false), JobCheck::kChunkHashes);
}

}  // namespace
}  // namespace wsync::bench
