// The product's executor run for every process of a job on SimGrid (integration/simulation over
// integration/simulation/simgrid): it moves exactly the scheduled messages between exactly the
// scheduled pairs, a job bound by one link takes that link's time, and a peer that never posts its
// side ends the simulation with errors instead of a hang.

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "executor/schedule.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/simulation/simgrid/platform.h"
#include "integration/simulation/simulate_sync.h"
#include "planner/models.h"
#include "planner/named_layouts.h"
#include "planner/plan.h"
#include "planner/policy.h"
#include "tests/testing/executor_checks.h"
#include "tests/testing/random_layouts.h"
#include "transport/forwarding_transport.h"

namespace wsync {
namespace {

using simgrid_backend::DeliveredMessage;
using simulation::InDeviceMemory;
using simulation::SimulateSync;
using simulation::SimulationOptions;
using simulation::SimulationResult;
using ::testing::HasSubstr;

// Every message the schedules send, as (sender, receiver, bytes), sorted.
std::vector<DeliveredMessage> ScheduledMessages(absl::Span<const ProcessSchedule> schedules) {
  std::vector<DeliveredMessage> messages;
  for (const ProcessSchedule& schedule : schedules) {
    for (const PeerSchedule& peer : schedule.peers) {
      if (peer.direction != Direction::kSend) continue;
      for (const ScheduledRound& round : peer.rounds) {
        messages.push_back({schedule.process, peer.peer, round.bytes});
      }
    }
  }
  std::sort(messages.begin(), messages.end());
  return messages;
}

Job DeviceJob(const Job& job) {
  absl::StatusOr<Job> device =
      Job::Create(InDeviceMemory(job.source()), InDeviceMemory(job.target()));
  EXPECT_TRUE(device.ok()) << device.status();
  return *std::move(device);
}

const simgrid_backend::StarPlatform kTenGigabytes({10e9, 5e-6});

// Runs `segments` of `job` on the star platform and checks the run against the schedule: each
// process's stats equal its schedule's, and the (sender, receiver, bytes) multiset of delivered
// messages equals the scheduled one.
void ExpectSimulatedAsScheduled(const Job& job, const std::vector<Segment>& segments,
                                StagingBudget budget, bool round_order) {
  absl::StatusOr<std::vector<ProcessSchedule>> schedules =
      ScheduleTransfers(job, segments, test::AllProcesses(job), budget);
  ASSERT_TRUE(schedules.ok()) << schedules.status();
  SimulationOptions options;
  options.platform = &kTenGigabytes;
  options.budget = budget;
  options.needs_round_order = round_order;
  options.record_messages = true;
  options.deadline = absl::Seconds(10);
  absl::StatusOr<SimulationResult> result = SimulateSync(job, segments, options);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_TRUE(result->FirstFailure().ok()) << result->FirstFailure();
  ASSERT_EQ(result->processes.size(), schedules->size());
  for (size_t p = 0; p < schedules->size(); ++p) {
    SCOPED_TRACE(absl::StrCat("process ", p));
    test::ExpectStatsMatchSchedule((*schedules)[p], result->processes[p].stats);
  }
  std::vector<DeliveredMessage> delivered = result->messages;
  std::sort(delivered.begin(), delivered.end());
  EXPECT_EQ(delivered, ScheduledMessages(*schedules));
  EXPECT_EQ(result->message_count, static_cast<int64_t>(delivered.size()));
  EXPECT_GT(result->sync_seconds, 0);
}

TEST(SimGridSyncTest, RowsToColumnsMovesTheScheduledMessages) {
  const Job job = DeviceJob(test::RowsToColumnsJob());  // 2 trainers -> 4 rollouts.
  absl::StatusOr<Plan> plan = MakePlan(job, *MakeFirstHolderPolicy(), PlanOptions{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const bool round_order : {true, false}) {
    SCOPED_TRACE(round_order ? "lockstep" : "independent lanes");
    ExpectSimulatedAsScheduled(job, plan->segments, StagingBudget{64}, round_order);
  }
}

// Random layout pairs on up to two nodes, relaying always on (relay forwards wait for their first
// hop), small budgets (many rounds, staged and direct messages), both lane drivers.
TEST(SimGridSyncTest, RandomRelayedPlansMoveTheScheduledMessages) {
  const int64_t kBudgets[] = {256, 1024, 4096};
  int32_t checked = 0;
  for (uint64_t seed = 0; seed < 12; ++seed) {
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    const int64_t budget_bytes = kBudgets[seed % 3];
    absl::StatusOr<test::RelayedCase> relayed =
        test::MakeRelayedCase(seed, budget_bytes, [](std::mt19937_64&, test::LayoutPair& pair) {
          pair.source = InDeviceMemory(pair.source);
          pair.target = InDeviceMemory(pair.target);
        });
    ASSERT_TRUE(relayed.ok()) << relayed.status();
    const StagingBudget budget{static_cast<double>(budget_bytes)};
    if (!ScheduleTransfers(relayed->job, relayed->plan.segments, test::AllProcesses(relayed->job),
                           budget)
             .ok()) {
      continue;  // A row that cannot be staged under this budget: refused, not simulated.
    }
    ExpectSimulatedAsScheduled(relayed->job, relayed->plan.segments, budget, seed % 2 == 0);
    ++checked;
  }
  EXPECT_GE(checked, 8);
}

// One trainer sends one 256 MiB tensor to one rollout process: 8 direct messages of 32 MiB over
// the sender's link up and the receiver's link down (10 GB/s each, 5 us each). The bound is
// N / B plus the route's latency; the simulated executor reaches it within 5 %.
TEST(SimGridSyncTest, OneLinkJobTakesTheLinkTime) {
  const Job job = DeviceJob(test::OneTrainerToWholeCopies({16384, 4096}, {"b"}));
  absl::StatusOr<Plan> plan = MakePlan(job, *MakeFirstHolderPolicy(), PlanOptions{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  const double bytes = 16384.0 * 4096 * 4;
  const double bound = bytes / 10e9 + 2 * 5e-6;
  for (const bool round_order : {true, false}) {
    SCOPED_TRACE(round_order ? "lockstep" : "independent lanes");
    SimulationOptions options;
    options.platform = &kTenGigabytes;
    options.needs_round_order = round_order;
    absl::StatusOr<SimulationResult> result = SimulateSync(job, plan->segments, options);
    ASSERT_TRUE(result.ok()) << result.status();
    ASSERT_TRUE(result->FirstFailure().ok()) << result->FirstFailure();
    EXPECT_EQ(result->processes[0].stats.rounds, 8);
    EXPECT_EQ(result->received_bytes[1], static_cast<int64_t>(bytes));
    EXPECT_GE(result->sync_seconds, bound * 0.999);
    EXPECT_NEAR(result->sync_seconds, bound, 0.05 * bound);
  }
}

// One trainer sends a whole 64 MiB copy to each of two rollout processes on two other nodes: its
// link up carries both, so the sync takes twice one copy's link time.
TEST(SimGridSyncTest, SendersLinkIsShared) {
  const Job one = DeviceJob(test::OneTrainerToWholeCopies({4096, 4096}, {"b", "c"}));
  absl::StatusOr<Plan> plan = MakePlan(one, *MakeFirstHolderPolicy(), PlanOptions{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  SimulationOptions options;
  options.platform = &kTenGigabytes;
  absl::StatusOr<SimulationResult> result = SimulateSync(one, plan->segments, options);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_TRUE(result->FirstFailure().ok()) << result->FirstFailure();
  const double bound = 2 * 4096.0 * 4096 * 4 / 10e9;
  EXPECT_EQ(result->sent_bytes[0], 2 * int64_t{4096} * 4096 * 4);
  EXPECT_NEAR(result->sync_seconds, bound, 0.05 * bound);
}

// A send that is accepted and never delivered: the message stays posted forever.
class SwallowedSends final : public ForwardingTransport {
 public:
  using ForwardingTransport::ForwardingTransport;
  absl::StatusOr<RequestId> PostSend(int32_t peer, MessageTag tag, const void* data,
                                     int64_t bytes) override {
    // A receive nobody ever sends to stands in for the send.
    return inner().PostReceive(process(), MessageTag{~uint64_t{0}}, nullptr, 0);
  }
};

SimulationResult RunWithSilentTrainer(absl::Duration deadline) {
  const Job job = DeviceJob(test::OneTrainerToWholeCopies({64, 64}, {"b"}));
  absl::StatusOr<Plan> plan = MakePlan(job, *MakeFirstHolderPolicy(), PlanOptions{});
  EXPECT_TRUE(plan.ok()) << plan.status();
  SimulationOptions options;
  options.platform = &kTenGigabytes;
  options.needs_round_order = false;
  options.deadline = deadline;
  options.wrap_transport = [](int32_t p, Transport& inner) -> std::unique_ptr<Transport> {
    if (p != 0) return nullptr;
    return std::make_unique<SwallowedSends>(inner);
  };
  absl::StatusOr<SimulationResult> result = SimulateSync(job, plan->segments, options);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? *std::move(result) : SimulationResult{};
}

TEST(SimGridSyncTest, SilentPeerMissesTheSimulatedDeadline) {
  const SimulationResult result = RunWithSilentTrainer(absl::Seconds(2));
  ASSERT_EQ(result.processes.size(), 2u);
  for (const simulation::ProcessOutcome& process : result.processes) {
    EXPECT_TRUE(absl::IsDeadlineExceeded(process.status)) << process.status;
    EXPECT_NEAR(process.finish_seconds, 2.0, 0.01);
  }
  EXPECT_THAT(std::string(result.processes[1].status.message()),
              HasSubstr("outstanding with 1 peer: receive from process 0"));
}

TEST(SimGridSyncTest, SilentPeerWithoutDeadlineIsADeadlockError) {
  const SimulationResult result = RunWithSilentTrainer(absl::InfiniteDuration());
  ASSERT_EQ(result.processes.size(), 2u);
  for (const simulation::ProcessOutcome& process : result.processes) {
    EXPECT_EQ(process.status.code(), absl::StatusCode::kInternal) << process.status;
    EXPECT_THAT(std::string(process.status.message()), HasSubstr("deadlocked"));
  }
  EXPECT_FALSE(result.FirstFailure().ok());
}

// A transport whose sends all fail at once.
class FailingSends final : public ForwardingTransport {
 public:
  using ForwardingTransport::ForwardingTransport;
  absl::StatusOr<RequestId> PostSend(int32_t peer, MessageTag tag, const void* data,
                                     int64_t bytes) override {
    if (bytes == 0) return inner().PostSend(peer, tag, data, bytes);  // The failure notice.
    return absl::UnavailableError("injected send failure");
  }
};

// The trainer's first send fails: it tells the rollout (a notice), which fails at once and then
// receives, for the executor's 200 ms grace, what the trainer might still send. Both grace periods
// are read on the simulated clock (ExecuteOptions::now): without it the grace would end 200 ms
// after the wall-clock time, decades of simulated time away.
TEST(SimGridSyncTest, FailedSenderReleasesItsPeerWithinTheSimulatedGrace) {
  const Job job = DeviceJob(test::OneTrainerToWholeCopies({8192, 4096}, {"b"}));  // 4 messages.
  absl::StatusOr<Plan> plan = MakePlan(job, *MakeFirstHolderPolicy(), PlanOptions{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  SimulationOptions options;
  options.platform = &kTenGigabytes;
  options.needs_round_order = false;
  options.wrap_transport = [](int32_t p, Transport& inner) -> std::unique_ptr<Transport> {
    if (p != 0) return nullptr;
    return std::make_unique<FailingSends>(inner);
  };
  absl::StatusOr<SimulationResult> result = SimulateSync(job, plan->segments, options);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->processes.size(), 2u);
  EXPECT_TRUE(absl::IsUnavailable(result->processes[0].status)) << result->processes[0].status;
  EXPECT_FALSE(result->processes[1].status.ok());
  EXPECT_LT(result->sync_seconds, 0.5);
  EXPECT_GE(result->sync_seconds, 0.2);  // The rollout waited out its grace for messages 2 and 3.
}

// A block-FP8 rollout (qwen2.5-tiny megatron(tp=2) -> vllm(tp=1,quant=fp8_block), the trainers
// cutting blocks the rollout quantizes) simulated with
// the plan's quantization steps: every process runs, its stats equal its schedule with the steps,
// the delivered messages are the scheduled ones (e4m3 bytes and scales), and the quantize steps
// take simulated time: at 100 MB/s of input the sync is later than at 1 PB/s by at least the
// busiest process's input bytes over 100 MB/s. Without the steps every process is refused.
TEST(SimGridSyncTest, QuantizedRolloutMovesTheScheduledBytesAndTakesTheQuantizeTime) {
  absl::StatusOr<ModelSpec> model = GetModel("qwen2.5-tiny");
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<NamedJobLayouts> layouts =
      BuildNamedJobLayouts(*model, "megatron(tp=2)", "vllm(tp=1,quant=fp8_block)");
  ASSERT_TRUE(layouts.ok()) << layouts.status();
  absl::StatusOr<Job> host_job = Job::Create(layouts->source, layouts->target);
  ASSERT_TRUE(host_job.ok()) << host_job.status();
  const Job job = DeviceJob(*host_job);
  ASSERT_TRUE(job.HasQuantizedParams());
  absl::StatusOr<Plan> plan = MakePlan(job, *MakeFirstHolderPolicy(), PlanOptions{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  int64_t source_element_bytes = 0;
  for (const ParamInfo& param : job.source().params) {
    if (source_element_bytes == 0) source_element_bytes = DTypeSize(param.dtype);
    ASSERT_EQ(DTypeSize(param.dtype), source_element_bytes) << param.name;
  }
  std::vector<ProcessSchedule> schedules;
  int64_t busiest_input_bytes = 0;
  for (int32_t p = 0; p < job.num_processes(); ++p) {
    absl::StatusOr<ProcessSchedule> schedule = ScheduleTransfers(
        job, plan->segments, plan->quant, test::AllProcesses(job), StagingBudget{}, p);
    ASSERT_TRUE(schedule.ok()) << schedule.status();
    busiest_input_bytes =
        std::max(busiest_input_bytes, schedule->quantized_elements * source_element_bytes);
    schedules.push_back(*std::move(schedule));
  }
  ASSERT_GT(busiest_input_bytes, 0);
  SimulationOptions options;
  options.platform = &kTenGigabytes;
  options.record_messages = true;
  options.quant = &plan->quant;
  double seconds[2] = {0, 0};
  for (const int slow : {0, 1}) {
    SCOPED_TRACE(slow ? "100 MB/s" : "1 PB/s");
    options.quantize_bytes_per_second = slow ? 1e8 : 1e15;
    absl::StatusOr<SimulationResult> result = SimulateSync(job, plan->segments, options);
    ASSERT_TRUE(result.ok()) << result.status();
    ASSERT_TRUE(result->FirstFailure().ok()) << result->FirstFailure();
    for (size_t p = 0; p < schedules.size(); ++p) {
      SCOPED_TRACE(absl::StrCat("process ", p));
      test::ExpectStatsMatchSchedule(schedules[p], result->processes[p].stats);
    }
    std::vector<DeliveredMessage> delivered = result->messages;
    std::sort(delivered.begin(), delivered.end());
    EXPECT_EQ(delivered, ScheduledMessages(schedules));
    seconds[slow] = result->sync_seconds;
  }
  EXPECT_GE(seconds[1] - seconds[0], 0.999 * static_cast<double>(busiest_input_bytes) / 1e8);
  options.quant = nullptr;
  absl::StatusOr<SimulationResult> refused = SimulateSync(job, plan->segments, options);
  ASSERT_TRUE(refused.ok()) << refused.status();
  for (const simulation::ProcessOutcome& process : refused->processes) {
    EXPECT_FALSE(process.status.ok());
    EXPECT_THAT(std::string(process.status.message()), HasSubstr("quantization steps"));
  }
}

TEST(SimGridSyncTest, HostMemoryIsRefused) {
  const Job job = test::RowsToColumnsJob();
  absl::StatusOr<Plan> plan = MakePlan(job, *MakeFirstHolderPolicy(), PlanOptions{});
  ASSERT_TRUE(plan.ok());
  SimulationOptions options;
  options.platform = &kTenGigabytes;
  absl::StatusOr<SimulationResult> result = SimulateSync(job, plan->segments, options);
  EXPECT_TRUE(absl::IsInvalidArgument(result.status())) << result.status();
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("host memory"));
}

}  // namespace
}  // namespace wsync
