// The per-process runtime (plugin/runtime.h) without a session: four processes of a
// qwen2.5-tiny megatron(tp=2) -> vllm(tp=2) job as threads connect, run steps and vote; a failed
// check is every process's decision; a connect that waits on the job ends when it is aborted.

#include "plugin/runtime.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "integration/fill/fill.h"
#include "planner/layout_parts.h"
#include "planner/models.h"
#include "planner/named_layouts.h"
#include "tests/plugin/tiny_session.h"

namespace wsync {
namespace {

constexpr char kSecret[] = "runtime-test-secret-0123456789abcdef";

struct RuntimeProcess {
  Layout part;
  std::unique_ptr<test::HostBuffers> memory;
  RuntimeConfig config;
};

RuntimeProcess MakeProcess(Role role, int32_t rank, int port, const std::string& job) {
  RuntimeProcess process;
  const ModelSpec model = *GetModel("qwen2.5-tiny");
  const Layout whole =
      *BuildNamedLayout(model, role == Role::kTrainer ? "megatron(tp=2)" : "vllm(tp=2)");
  process.part = LayoutPart(whole, rank);
  process.part.processes[0].node_id = "local";
  process.memory = std::make_unique<test::HostBuffers>(process.part, test::kPoison);
  RuntimeConfig& config = process.config;
  config.role = role;
  config.rank = rank;
  config.num_trainers = 2;
  config.num_rollouts = 2;
  config.job_id = job;
  config.coordinator_port = port;
  config.host_coordinator = role == Role::kTrainer && rank == 0;
  config.node_id = "local";
  config.deadline = absl::Seconds(30);
  config.part = process.part;
  for (const BufferInfo& buffer : process.part.buffers) {
    config.buffer_addresses.push_back(process.memory->data({rank, buffer.id}));
  }
  config.path_transports = *ParsePathTransports("*=ucx:sm,cma,self");
  return process;
}

// Runs `body(index, process)` for the four processes of the job, each on its own thread
// (trainer 0, trainer 1, rollout 0, rollout 1); trainer 0 hosts the coordinator.
template <typename Body>
void RunJob(const std::string& job, Body body) {
  const int port = test::FreeLoopbackPort();
  std::vector<RuntimeProcess> processes;
  for (int i = 0; i < 4; ++i) {
    processes.push_back(MakeProcess(i < 2 ? Role::kTrainer : Role::kRollout, i % 2, port, job));
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] { body(i, processes[i]); });
  }
  for (std::thread& thread : threads) thread.join();
}

TEST(RuntimeTest, StepsMoveEveryElementAndCallThePhasesInOrder) {
  RunJob("runtime-steps", [](int index, RuntimeProcess& process) {
    const bool trainer = index < 2;
    absl::StatusOr<std::unique_ptr<ConnectedJob>> connected =
        ConnectedJob::Connect(process.config, kSecret);
    ASSERT_TRUE(connected.ok()) << connected.status();
    EXPECT_EQ((*connected)->job().num_processes(), 4);
    EXPECT_EQ((*connected)->coordinator() != nullptr, index == 0);
    for (int64_t version = 1; version <= 3; ++version) {
      if (trainer) {
        ASSERT_TRUE(test::FillLogical(process.part, version, process.memory.get()).ok());
      }
      std::vector<StepPhase> phases;
      StepOptions step;
      step.version = version;
      step.on_phase = [&](StepPhase phase) { phases.push_back(phase); };
      const StepResult result = (*connected)->RunStep(step);
      ASSERT_TRUE(result.status().ok()) << result.status();
      ASSERT_TRUE(result.stats.ok());
      EXPECT_EQ(phases, (std::vector<StepPhase>{StepPhase::kTransfer, StepPhase::kTransferred,
                                                StepPhase::kDecide, StepPhase::kVote}));
      if (!trainer) {
        EXPECT_TRUE(test::CheckLogical(process.part, *process.memory, version).ok())
            << "version " << version;
      }
    }
  });
}

TEST(RuntimeTest, AFailedCheckIsEveryProcessesDecisionAndTheNextStepCommits) {
  RunJob("runtime-check", [](int index, RuntimeProcess& process) {
    absl::StatusOr<std::unique_ptr<ConnectedJob>> connected =
        ConnectedJob::Connect(process.config, kSecret);
    ASSERT_TRUE(connected.ok()) << connected.status();
    for (int64_t version = 1; version <= 2; ++version) {
      StepOptions step;
      step.version = version;
      bool checked = false;
      step.check = [&]() -> absl::Status {
        checked = true;
        if (index == 3 && version == 1) return absl::DataLossError("rollout 1 saw a bad element");
        return absl::OkStatus();
      };
      const StepResult result = (*connected)->RunStep(step);
      EXPECT_TRUE(checked) << "the check runs after every successful transfer";
      EXPECT_TRUE(result.stats.ok()) << result.stats.status();
      if (version == 1) {
        EXPECT_FALSE(result.decision.ok()) << "process " << index << " committed a failed check";
        EXPECT_TRUE(absl::StrContains(result.status().message(), "bad element")) << result.status();
        EXPECT_EQ(result.outcome.ok(), index != 3) << result.outcome;
      } else {
        EXPECT_TRUE(result.status().ok()) << result.status();
      }
    }
  });
}

TEST(RuntimeTest, ARejectedStepMovesNothingAndFailsEveryProcess) {
  RunJob("runtime-reject", [](int index, RuntimeProcess& process) {
    absl::StatusOr<std::unique_ptr<ConnectedJob>> connected =
        ConnectedJob::Connect(process.config, kSecret);
    ASSERT_TRUE(connected.ok()) << connected.status();
    StepOptions step;
    step.version = 1;
    if (index == 1) step.rejection = absl::FailedPreconditionError("trainer 1 refuses");
    const StepResult result = (*connected)->RunStep(step);
    EXPECT_FALSE(result.status().ok()) << "process " << index;
    EXPECT_TRUE(absl::StrContains(result.status().message(), "trainer 1 refuses"))
        << result.status();
    if (index == 1) {
      EXPECT_FALSE(result.stats.ok());
    }
  });
}

TEST(RuntimeTest, AnAbortEndsAConnectThatWaitsForTheJob) {
  // Trainer 0 alone: its join waits for three processes that never come.
  RuntimeProcess process =
      MakeProcess(Role::kTrainer, 0, test::FreeLoopbackPort(), "runtime-abort");
  ConnectAbort abort;
  std::atomic<int32_t> port{0};
  std::atomic<bool> joining{false};
  ConnectHooks hooks;
  hooks.coordinator_started = [&](int32_t p) { port = p; };
  hooks.before_join = [&] { joining = true; };
  hooks.abort = &abort;
  std::thread aborter([&] {
    while (!joining) absl::SleepFor(absl::Milliseconds(10));
    absl::SleepFor(absl::Milliseconds(200));
    abort.Abort(absl::CancelledError("the host gave up"));
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<ConnectedJob>> connected =
      ConnectedJob::Connect(process.config, kSecret, hooks);
  aborter.join();
  EXPECT_FALSE(connected.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "waited for the deadline instead";
  EXPECT_GT(port.load(), 0);
  EXPECT_TRUE(abort.aborted().has_value());
}

TEST(RuntimeTest, ConnectRefusesAddressesThatDoNotMatchTheBuffers) {
  RuntimeProcess process = MakeProcess(Role::kTrainer, 0, test::FreeLoopbackPort(), "runtime-bad");
  process.config.buffer_addresses.pop_back();
  absl::StatusOr<std::unique_ptr<ConnectedJob>> connected =
      ConnectedJob::Connect(process.config, kSecret);
  EXPECT_TRUE(absl::IsInvalidArgument(connected.status())) << connected.status();
}

}  // namespace
}  // namespace wsync
