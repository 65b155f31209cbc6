// Session::RebindBuffer (the C ABI's rebind_buffer): buffers that moved between syncs, as an
// engine's weights move across vLLM's sleep and wake_up, are written (rollout) and read
// (trainer) at their new addresses by the next sync, without reconnecting and with the same
// plan; the old memory is left alone; bad calls are refused and change nothing.

#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "integration/fill/fill.h"
#include "plugin/session.h"
#include "tests/plugin/tiny_session.h"

namespace wsync {
namespace {

using Process = test::TinySessionProcess;

constexpr int kTrainers = 2;

// Runs `step(p)` for the four processes at once; the statuses by process.
std::vector<absl::Status> OnAll(const std::function<absl::Status(int)>& step) {
  std::vector<absl::Status> results(4);
  std::vector<std::thread> threads;
  for (int p = 0; p < 4; ++p) threads.emplace_back([&, p] { results[p] = step(p); });
  for (std::thread& thread : threads) thread.join();
  return results;
}

// Moves every buffer of `process` to fresh poisoned memory through RebindBuffer; returns the old
// memory (the session no longer uses it).
std::unique_ptr<test::HostBuffers> MoveBuffers(Process& process, int32_t rank) {
  auto moved = std::make_unique<test::HostBuffers>(process.part, test::kPoison);
  for (const BufferInfo& buffer : process.part.buffers) {
    EXPECT_TRUE(process.session->RebindBuffer(buffer.id, moved->data({rank, buffer.id})).ok());
  }
  std::swap(moved, process.memory);
  return moved;
}

TEST(RebindBufferTest, MovedBuffersSyncAtTheirNewAddressesWithTheSamePlan) {
  setenv("WSYNC_REBIND_TEST_SECRET", "rebind-test-secret-0123456789abcdefgh", 1);
  const int port = test::FreeLoopbackPort();
  std::vector<Process> processes;
  for (int p = 0; p < 4; ++p) {
    const Role role = p < kTrainers ? Role::kTrainer : Role::kRollout;
    SessionConfig config =
        test::TinyJobConfig(role, p % kTrainers, port, "rebind", "WSYNC_REBIND_TEST_SECRET");
    config.deadline = absl::Seconds(20);
    processes.push_back(test::MakeTinySessionProcess(config));
  }
  // Refused before connect (REGISTERED): nothing is connected to rebind.
  EXPECT_EQ(processes[2]
                .session
                ->RebindBuffer(processes[2].part.buffers[0].id,
                               processes[2].memory->data({0, processes[2].part.buffers[0].id}))
                .code(),
            absl::StatusCode::kFailedPrecondition);
  auto sync = [&](int64_t version) {
    return OnAll([&](int p) -> absl::Status {
      Process& me = processes[p];
      if (p < kTrainers)
        WSYNC_RETURN_IF_ERROR(test::FillLogical(me.part, version, me.memory.get()));
      WSYNC_RETURN_IF_ERROR(me.session->Sync(version));
      return p < kTrainers ? absl::OkStatus() : test::CheckLogical(me.part, *me.memory, version);
    });
  };
  for (const absl::Status& s : OnAll([&](int p) { return processes[p].session->Connect(); })) {
    ASSERT_TRUE(s.ok()) << s;
  }
  for (const absl::Status& s : sync(1)) ASSERT_TRUE(s.ok()) << s;
  const absl::StatusOr<std::string> plan_before = processes[2].session->ScheduleReport();
  ASSERT_TRUE(plan_before.ok());

  // Bad calls change nothing: an id this process did not register, a NULL address.
  Process& rollout = processes[2];
  EXPECT_EQ(rollout.session->RebindBuffer(987654, rollout.memory->data({0, 0})).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rollout.session->RebindBuffer(rollout.part.buffers[0].id, nullptr).code(),
            absl::StatusCode::kInvalidArgument);

  // Rollout rank 0 and trainer rank 1 move every buffer. The trainer's new memory holds version 2
  // (what the next sync must send); its old memory keeps version 1.
  const std::unique_ptr<test::HostBuffers> rollout_old = MoveBuffers(rollout, 0);
  const std::unique_ptr<test::HostBuffers> trainer_old = MoveBuffers(processes[1], 1);
  for (const absl::Status& s : sync(2)) EXPECT_TRUE(s.ok()) << s;  // Checks the new memory.
  // The old memory was neither written nor read as the sync's source: it still holds version 1.
  EXPECT_TRUE(test::CheckLogical(rollout.part, *rollout_old, 1).ok());
  EXPECT_TRUE(test::CheckLogical(processes[1].part, *trainer_old, 1).ok());
  // The same plan and schedule, no reconnect.
  const absl::StatusOr<std::string> plan_after = processes[2].session->ScheduleReport();
  ASSERT_TRUE(plan_after.ok());
  EXPECT_EQ(*plan_after, *plan_before);
  for (const absl::Status& s : sync(3)) EXPECT_TRUE(s.ok()) << s;
  for (Process& process : processes) process.session->Finalize();
}

TEST(RebindBufferTest, ATrainerTriggeredSessionRefusesIt) {
  setenv("WSYNC_REBIND_TEST_SECRET", "rebind-test-secret-0123456789abcdefgh", 1);
  const int port = test::FreeLoopbackPort();
  std::vector<Process> processes;
  for (int p = 0; p < 4; ++p) {
    const Role role = p < kTrainers ? Role::kTrainer : Role::kRollout;
    SessionConfig config = test::TinyJobConfig(role, p % kTrainers, port, "rebind-triggered",
                                               "WSYNC_REBIND_TEST_SECRET");
    config.deadline = absl::Seconds(20);
    processes.push_back(test::MakeTinySessionProcess(config));
  }
  for (int p = kTrainers; p < 4; ++p) {
    ASSERT_TRUE(
        processes[p]
            .session->SetUpdateCallbacks([](int64_t) {}, [](int64_t, const absl::Status&) {})
            .ok());
  }
  for (const absl::Status& s : OnAll([&](int p) { return processes[p].session->Connect(); })) {
    ASSERT_TRUE(s.ok()) << s;
  }
  Process& rollout = processes[2];
  const absl::Status refused =
      rollout.session->RebindBuffer(rollout.part.buffers[0].id, rollout.memory->data({0, 0}));
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("host-driven"), absl::string_view::npos) << refused;
  for (Process& process : processes) process.session->Finalize();
}

}  // namespace
}  // namespace wsync
