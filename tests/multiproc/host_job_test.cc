// Jobs of wsync_host (integration/host), the processes of wsync-bench's jobs: each loads
// libwsync.so and syncs through its C ABI, reports the library it has mapped, and a rollout's
// checks run before its commit vote, so a corrupted version fails the sync on every process.

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/harness/launcher.h"

namespace wsync::harness {
namespace {

using ::testing::HasSubstr;

int64_t Field(const std::map<std::string, std::string>& stats, const std::string& key) {
  auto it = stats.find(key);
  int64_t value = 0;
  if (it == stats.end() || !absl::SimpleAtoi(it->second, &value)) return -1;
  return value;
}

// The sum of the fields whose key starts with `prefix`.
int64_t SumFields(const std::map<std::string, std::string>& stats, const std::string& prefix) {
  int64_t sum = 0;
  for (const auto& [key, value] : stats) {
    if (absl::StartsWith(key, prefix)) sum += Field(stats, key);
  }
  return sum;
}

JobSpec VerifiedJob() {
  JobSpec spec;
  spec.tls = "sm,cma,self";
  spec.versions = 2;
  spec.timeout = absl::Seconds(120);
  spec.extra_worker_flags = {"--check_values=true", "--deadline_seconds=30"};
  return spec;
}

TEST(HostJobTest, EveryProcessRunsTheBuiltLibraryAndEveryRolloutChecksEveryElement) {
  const JobSpec spec = VerifiedJob();
  absl::StatusOr<JobResult> result = RunJob(spec, WSYNC_HOST, WSYNC_CLI);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->workers.size(), 4u);
  const std::filesystem::path plugin = std::filesystem::canonical(WSYNC_PLUGIN);
  for (int v = 0; v < spec.versions; ++v) {
    int64_t sent = 0, received = 0, wire_sent = 0, wire_received = 0;
    for (size_t p = 0; p < result->workers.size(); ++p) {
      const WorkerResult& worker = result->workers[p];
      ASSERT_EQ(worker.exit_code, 0) << "process " << p << ": " << worker.stderr_text;
      ASSERT_EQ(worker.stats.size(), 2u) << "process " << p;
      const auto& stats = worker.stats[v];
      EXPECT_EQ(Field(stats, "version"), v + 1);
      EXPECT_EQ(std::filesystem::canonical(stats.at("library")), plugin) << "process " << p;
      sent += Field(stats, "sent");
      received += Field(stats, "received");
      wire_sent += SumFields(stats, "wire_sent_");
      wire_received += SumFields(stats, "wire_received_");
    }
    EXPECT_GT(sent, 0);
    EXPECT_EQ(sent, received);
    // The library's own per-path counters of the sync agree with its stats.
    EXPECT_EQ(wire_sent, sent);
    EXPECT_EQ(wire_received, received);
  }
}

TEST(HostJobTest, ACorruptedVersionFailsItsSyncOnEveryProcess) {
  JobSpec spec = VerifiedJob();
  spec.versions = 3;
  spec.extra_worker_flags.push_back("--corrupt_version=2");
  absl::StatusOr<JobResult> result = RunJob(spec, WSYNC_HOST, WSYNC_CLI);
  ASSERT_TRUE(result.ok()) << result.status();
  std::string rollout_errors;
  for (size_t p = 0; p < result->workers.size(); ++p) {
    const WorkerResult& worker = result->workers[p];
    // Trainers too: the rollouts' checks ran before their commit votes.
    EXPECT_EQ(worker.exit_code, 1) << "process " << p << ": " << worker.stderr_text;
    ASSERT_EQ(worker.stats.size(), 1u) << "process " << p << ": only version 1 committed";
    if (p >= 2) rollout_errors += worker.stderr_text;
  }
  EXPECT_THAT(rollout_errors, HasSubstr("this rollout's check"));
  EXPECT_THAT(rollout_errors, HasSubstr("does not hold its value of version 2"));
}

}  // namespace
}  // namespace wsync::harness
