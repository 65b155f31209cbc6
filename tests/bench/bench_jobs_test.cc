#include "integration/bench/bench_jobs.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/models.h"

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

TEST_F(BinariesTest, BuildTreeLayoutFindsTheCliAndTheWorker) {
  const std::string self = File("build/integration/bench/wsync-bench");
  File("build/integration/cli/wsync");
  File("build/tests/multiproc/wsync_test_worker");
  JobOptions options;
  ASSERT_TRUE(ResolveBinaries(self, &options).ok());
  EXPECT_EQ(std::filesystem::canonical(options.wsync),
            std::filesystem::canonical(root_ + "/build/integration/cli/wsync"));
  EXPECT_EQ(std::filesystem::canonical(options.worker),
            std::filesystem::canonical(root_ + "/build/tests/multiproc/wsync_test_worker"));
}

TEST_F(BinariesTest, BundleLayoutPrefersSiblingsInTheSameFolder) {
  const std::string self = File("bin/wsync-bench");
  const std::string wsync = File("bin/wsync");
  const std::string worker = File("bin/wsync_test_worker");
  JobOptions options;
  ASSERT_TRUE(ResolveBinaries(self, &options).ok());
  EXPECT_EQ(options.wsync, wsync);
  EXPECT_EQ(options.worker, worker);
}

TEST_F(BinariesTest, MissingOrNotExecutableIsNotFoundNamingTheFlag) {
  const std::string self = File("build/integration/bench/wsync-bench");
  File("build/tests/multiproc/wsync_test_worker");
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
  options.worker = worker;
  ASSERT_TRUE(ResolveBinaries(self, &options).ok());
  EXPECT_EQ(options.wsync, wsync);
  EXPECT_EQ(options.worker, worker);

  JobOptions bad;
  bad.worker = File("mine/not-executable", 0600);
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
