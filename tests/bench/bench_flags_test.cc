#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "gtest/gtest.h"
#include "integration/bench/flags.h"

ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, to);
ABSL_DECLARE_FLAG(int32_t, repeats);
ABSL_DECLARE_FLAG(int32_t, layers);
ABSL_DECLARE_FLAG(bool, compare_long);
ABSL_DECLARE_FLAG(std::string, sync_worker);
ABSL_DECLARE_FLAG(std::string, wsync);
ABSL_DECLARE_FLAG(double, sync_timeout_s);
ABSL_DECLARE_FLAG(bool, verify_elements);
ABSL_DECLARE_FLAG(int32_t, sync_rounds);
ABSL_DECLARE_FLAG(std::string, sync_single_from);
ABSL_DECLARE_FLAG(std::string, sync_quant);
ABSL_DECLARE_FLAG(std::string, sync_quant_from);
ABSL_DECLARE_FLAG(std::string, sync_quant_to);
ABSL_DECLARE_FLAG(int32_t, delta_steps);
ABSL_DECLARE_FLAG(std::string, delta_lrs);
ABSL_DECLARE_FLAG(std::string, delta_links);
ABSL_DECLARE_FLAG(bool, delta_verify_timed);

namespace wsync::bench {
namespace {

// Every test starts from the flags' defaults and no session setting given.
class FlagsTest : public ::testing::Test {
 protected:
  FlagsTest() { Take({}); }
  ~FlagsTest() override { Take({}); }

  // TakeSettingFlags of "wsync-bench" followed by `arguments`; the arguments it leaves.
  static std::vector<std::string> Take(std::vector<std::string> arguments) {
    arguments.insert(arguments.begin(), "wsync-bench");
    std::vector<char*> argv;
    for (std::string& argument : arguments) argv.push_back(argument.data());
    argv.push_back(nullptr);
    int argc = static_cast<int>(arguments.size());
    EXPECT_TRUE(TakeSettingFlags(&argc, argv.data()).ok());
    return std::vector<std::string>(argv.begin() + 1, argv.begin() + argc);
  }

  absl::FlagSaver saver_;
};

// The defaults of `wsync bench <benchmark>` before the move, which `wsync-bench` keeps.
TEST_F(FlagsTest, DefaultsAreTheBenchmarksOwn) {
  const ExecutorBenchOptions executor = ExecutorOptionsFromFlags();
  EXPECT_EQ(executor.model, "llama-3-8b");
  EXPECT_EQ(executor.layers, 2);
  EXPECT_EQ(executor.repeats, 5);
  EXPECT_TRUE(executor.from.empty() && executor.to.empty());
  EXPECT_TRUE(executor.one_core);
  EXPECT_EQ(executor.policy, "local_first_least_loaded");

  const SyncBenchOptions sync = SyncOptionsFromFlags();
  EXPECT_EQ(sync.model, "qwen2.5-0.5b");
  EXPECT_EQ(sync.from, "megatron(tp=2)");
  EXPECT_EQ(sync.to, "vllm(tp=2)");
  EXPECT_EQ(sync.memory, "host");
  EXPECT_EQ(sync.syncs, 5);
  EXPECT_EQ(sync.warmup, 1);
  EXPECT_EQ(sync.rounds, 4);
  EXPECT_TRUE(sync.verify_first);
  EXPECT_FALSE(sync.verify);
  EXPECT_EQ(sync.shm_tls, "sm,cma,self");
  EXPECT_EQ(sync.tcp_tls, "tcp");
  EXPECT_EQ(sync.tcp_devices, "lo");
  EXPECT_EQ(sync.single_from, "megatron(tp=1)");
  EXPECT_EQ(sync.single_to, "vllm(tp=1)");
  EXPECT_EQ(sync.quant, "fp8_block");
  EXPECT_EQ(sync.quant_from, "megatron(tp=2)");
  EXPECT_EQ(sync.quant_to, "vllm(tp=1)");
  EXPECT_TRUE(sync.perftest_concurrent);
  EXPECT_TRUE(sync.perftest_wsync_settings);
  EXPECT_EQ(sync.job.timeout_s, 60);
  EXPECT_FALSE(sync.job.verify_elements);
  EXPECT_EQ(sync.job.budget, static_cast<double>(kDefaultStagingBudgetBytes));
  EXPECT_EQ(sync.cuda.from, "megatron(tp=1)");
  EXPECT_EQ(sync.cuda.to, "vllm(tp=1)");

  const CompareBenchOptions compare = CompareOptionsFromFlags("wsync-bench compare");
  EXPECT_EQ(compare.models, "qwen2.5-0.5b");
  EXPECT_EQ(compare.froms, "megatron(tp=2)");
  EXPECT_EQ(compare.tos, "vllm(tp=2)");
  EXPECT_EQ(compare.repeats, 2);
  EXPECT_EQ(compare.syncs, 3);
  EXPECT_EQ(compare.warmup, 1);
  EXPECT_EQ(compare.timeout_s, 600);
  EXPECT_EQ(compare.out_dir, "bench-results/compare");
  EXPECT_EQ(compare.command, "wsync-bench compare");

  const PredictBenchOptions predict = PredictOptionsFromFlags();
  EXPECT_EQ(predict.model, "qwen2.5-0.5b");
  EXPECT_EQ(predict.rounds, 2);
  EXPECT_EQ(predict.syncs, 5);
  EXPECT_EQ(predict.warmup, 2);
  EXPECT_EQ(predict.timeout_s, 300);

  const RelayBenchOptions relay = RelayOptionsFromFlags();
  EXPECT_EQ(relay.model, "qwen2.5-tiny");
  EXPECT_EQ(relay.to, "vllm(tp=2,dp=2)");
  EXPECT_EQ(relay.rate_mbit, 100);
  EXPECT_EQ(relay.timeout_s, 120);

  const DeltaBenchOptions delta = DeltaOptionsFromFlags();
  EXPECT_EQ(delta.model, "qwen2.5-0.5b");
  EXPECT_EQ(delta.from, "megatron(tp=2)");
  EXPECT_EQ(delta.to, "vllm(tp=2)");
  EXPECT_EQ(delta.steps, 4);
  EXPECT_EQ(delta.rounds, 1);
  EXPECT_EQ(delta.lrs, "1e-6");
  EXPECT_EQ(delta.verify_lrs, "1e-6,1e-5");
  EXPECT_EQ(delta.weight_decay, 0.01);
  EXPECT_EQ(delta.links, "tcp,shm,netns");
  EXPECT_EQ(delta.rate_mbit, 1000);
  EXPECT_FALSE(delta.verify_timed);
  EXPECT_EQ(delta.shm_tls, "sm,cma,self");
  EXPECT_EQ(delta.tcp_devices, "lo");
}

TEST_F(FlagsTest, DeltaFlagsReachItsOptions) {
  absl::SetFlag(&FLAGS_model, "qwen2.5-tiny");
  absl::SetFlag(&FLAGS_sync_worker, "/w");
  absl::SetFlag(&FLAGS_delta_steps, 5);
  absl::SetFlag(&FLAGS_delta_lrs, "1e-5");
  absl::SetFlag(&FLAGS_delta_links, "shm");
  absl::SetFlag(&FLAGS_delta_verify_timed, true);
  const DeltaBenchOptions delta = DeltaOptionsFromFlags();
  EXPECT_EQ(delta.model, "qwen2.5-tiny");
  EXPECT_EQ(delta.job.host, "/w");
  EXPECT_EQ(delta.steps, 5);
  EXPECT_EQ(delta.lrs, "1e-5");
  EXPECT_EQ(delta.links, "shm");
  EXPECT_TRUE(delta.verify_timed);
}

TEST_F(FlagsTest, FlagsReachTheOptionsOfEachBenchmark) {
  absl::SetFlag(&FLAGS_model, "qwen2.5-tiny");
  absl::SetFlag(&FLAGS_repeats, 7);
  absl::SetFlag(&FLAGS_layers, 3);
  absl::SetFlag(&FLAGS_sync_worker, "/w");
  absl::SetFlag(&FLAGS_wsync, "/c");
  absl::SetFlag(&FLAGS_sync_timeout_s, 9.5);
  absl::SetFlag(&FLAGS_verify_elements, true);
  absl::SetFlag(&FLAGS_sync_rounds, 1);
  absl::SetFlag(&FLAGS_sync_single_from, "");
  absl::SetFlag(&FLAGS_sync_quant, "fp8_channel");
  absl::SetFlag(&FLAGS_sync_quant_from, "megatron(tp=1)");
  absl::SetFlag(&FLAGS_sync_quant_to, "vllm(dp=2)");
  // The session settings are no Abseil flags: taken out of argv, the others left in order.
  EXPECT_EQ(Take({"--replica_policy=first_holder", "--sync_rounds=1", "--staging_budget_bytes",
                  "4096", "--verify=keyed"}),
            std::vector<std::string>({"--sync_rounds=1"}));
  const ExecutorBenchOptions executor = ExecutorOptionsFromFlags();
  EXPECT_EQ(executor.model, "qwen2.5-tiny");
  EXPECT_EQ(executor.layers, 3);
  EXPECT_EQ(executor.repeats, 7);
  EXPECT_EQ(executor.policy, "first_holder");
  const SyncBenchOptions sync = SyncOptionsFromFlags();
  EXPECT_EQ(sync.model, "qwen2.5-tiny");
  EXPECT_EQ(sync.rounds, 1);
  EXPECT_TRUE(sync.single_from.empty());
  EXPECT_EQ(sync.quant, "fp8_channel");
  EXPECT_EQ(sync.quant_from, "megatron(tp=1)");
  EXPECT_EQ(sync.quant_to, "vllm(dp=2)");
  for (const JobOptions& job : {sync.job, CompareOptionsFromFlags("").job,
                                PredictOptionsFromFlags().job, RelayOptionsFromFlags().job}) {
    EXPECT_EQ(job.host, "/w");
    EXPECT_EQ(job.wsync, "/c");
    EXPECT_EQ(job.timeout_s, 9.5);
    EXPECT_TRUE(job.verify_elements);
    EXPECT_EQ(job.policy, "first_holder");
    EXPECT_EQ(job.budget, 4096);
    EXPECT_EQ(job.settings,
              std::vector<std::string>({"--staging_budget_bytes=4096",
                                        "--replica_policy=first_holder", "--verify=keyed"}));
  }
  EXPECT_EQ(CompareOptionsFromFlags("").repeats, 7);
  EXPECT_EQ(CompareOptionsFromFlags("").models, "qwen2.5-tiny");
}

TEST_F(FlagsTest, CompareLongRunsBothModelsAndBothRolloutLayoutsUnlessNamed) {
  absl::SetFlag(&FLAGS_compare_long, true);
  CompareBenchOptions compare = CompareOptionsFromFlags("");
  EXPECT_EQ(compare.models, "qwen2.5-0.5b,llama-3.2-1b");
  EXPECT_EQ(compare.tos, "vllm(tp=2);vllm(tp=1,dp=2)");
  absl::SetFlag(&FLAGS_to, "vllm(tp=1)");
  compare = CompareOptionsFromFlags("");
  EXPECT_EQ(compare.tos, "vllm(tp=1)");
}

TEST_F(FlagsTest, ASettingsValueIsCheckedAsItsVariableIs) {
  std::vector<std::string> arguments = {"wsync-bench", "--staging_budget_bytes=64MiB"};
  std::vector<char*> argv = {arguments[0].data(), arguments[1].data(), nullptr};
  int argc = 2;
  const absl::Status status = TakeSettingFlags(&argc, argv.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("--staging_budget_bytes=64MiB: staging_budget_bytes takes"),
            std::string::npos)
      << status;
}

}  // namespace
}  // namespace wsync::bench
