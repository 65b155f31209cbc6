// Delta sync (issue 44) across a process replacement, through the C++ Session with every process
// as a thread: a replacement holds no version and no base, so exactly the chunks it takes part in
// travel dense for one sync, while every other pair keeps moving deltas; every element of every
// version is checked on every rollout.

#include <fstream>
#include <functional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "cost/link_model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/fill/fill.h"
#include "plugin/session.h"
#include "tests/plugin/tiny_session.h"

namespace wsync {
namespace {

using Process = test::TinySessionProcess;
using ::testing::HasSubstr;

constexpr int32_t kChangedPerMille = 20;  // Each version after the first changes ~2 %.

Process MakeDeltaProcess(Role role, int32_t rank, int port, const std::string& job,
                         const std::string& calibration_file = "") {
  SessionConfig config = test::TinyJobConfig(role, rank, port, job, "WSYNC_SESSION_TEST_SECRET");
  config.deadline = absl::Seconds(20);
  config.delta = DeltaMode::kOn;
  config.calibration_file = calibration_file;
  return test::MakeTinySessionProcess(config);
}

class SessionDeltaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("WSYNC_SESSION_TEST_SECRET", "session-delta-secret-0123456789abcdef", 1);
    port_ = test::FreeLoopbackPort();
    MakeProcesses("");
  }

  void MakeProcesses(const std::string& calibration_file) {
    processes_.clear();
    for (int r = 0; r < 2; ++r)
      processes_.push_back(MakeDeltaProcess(Role::kTrainer, r, port_, job_, calibration_file));
    for (int r = 0; r < 2; ++r)
      processes_.push_back(MakeDeltaProcess(Role::kRollout, r, port_, job_, calibration_file));
  }

  // Runs `call` for each process of `ids`, one thread each; the results by process.
  std::vector<absl::Status> On(const std::vector<int>& ids,
                               const std::function<absl::Status(int)>& call) {
    std::vector<absl::Status> results(processes_.size());
    std::vector<std::thread> threads;
    for (int p : ids) threads.emplace_back([&, p] { results[p] = call(p); });
    for (std::thread& thread : threads) thread.join();
    return results;
  }

  // Version `v` on every process: trainers write it, rollouts check every element after the sync.
  void SyncAll(int64_t v) {
    const std::vector<absl::Status> results = On({0, 1, 2, 3}, [&](int p) -> absl::Status {
      Process& me = processes_[p];
      if (p < 2) {
        WSYNC_RETURN_IF_ERROR(
            test::FillSparseLogical(me.part, v, kChangedPerMille, me.memory.get()));
      }
      WSYNC_RETURN_IF_ERROR(me.session->Sync(v));
      return p < 2 ? absl::OkStatus()
                   : test::CheckSparseLogical(me.part, *me.memory, v, kChangedPerMille);
    });
    for (int p = 0; p < 4; ++p)
      ASSERT_TRUE(results[p].ok()) << "version " << v << ", " << p << ": " << results[p];
  }

  // Finalizes process `p` (the coordinator loses it) and connects a new session of the same role
  // and rank in its place, between two syncs.
  void Replace(int p) {
    const Role role = p < 2 ? Role::kTrainer : Role::kRollout;
    processes_[p].session->Finalize();
    processes_[p] = MakeDeltaProcess(role, p % 2, port_, job_);
    // The coordinator admits the replacement once it has taken the old process as lost.
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    absl::Status connected = processes_[p].session->Connect();
    while (!connected.ok() && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(100));
      processes_[p] = MakeDeltaProcess(role, p % 2, port_, job_);
      connected = processes_[p].session->Connect();
    }
    ASSERT_TRUE(connected.ok()) << connected;
  }

  int64_t DeltaMessages(int p) const {
    return processes_[p].session->LastStats().stats.delta_messages;
  }

  const std::string job_ = "delta-replace";
  int port_ = 0;
  std::vector<Process> processes_;
};

// Rollout rank 1 is replaced between versions 3 and 4: version 4 reaches the replacement dense
// (it holds nothing), while rollout rank 0, which committed version 3, still receives deltas.
TEST_F(SessionDeltaTest, AReplacedRolloutGetsDenseChunksAndTheOtherKeepsItsDeltas) {
  for (const absl::Status& s :
       On({0, 1, 2, 3}, [&](int p) { return processes_[p].session->Connect(); })) {
    ASSERT_TRUE(s.ok()) << s;
  }
  for (int64_t v = 1; v <= 3; ++v) {
    SyncAll(v);
    if (v == 1) continue;  // The first version primes the bases: dense everywhere.
    EXPECT_GT(DeltaMessages(2), 0) << "version " << v;
    EXPECT_GT(DeltaMessages(3), 0) << "version " << v;
  }
  Replace(3);
  EXPECT_EQ(processes_[3].session->State(), std::make_pair(int64_t{-1}, SessionState::kIdle));
  SyncAll(4);
  EXPECT_GT(DeltaMessages(2), 0) << "the rollout that holds version 3 keeps receiving deltas";
  EXPECT_EQ(DeltaMessages(3), 0) << "a replacement holds no base: dense";
  for (int64_t v = 5; v <= 6; ++v) {
    SyncAll(v);
    EXPECT_GT(DeltaMessages(2), 0) << "version " << v;
    EXPECT_GT(DeltaMessages(3), 0) << "version " << v << ": the replacement now holds a version";
  }
  for (int p = 0; p < 4; ++p) {
    EXPECT_EQ(processes_[p].session->State(), std::make_pair(int64_t{6}, SessionState::kIdle)) << p;
  }
}

// Trainer rank 1 is replaced between versions 2 and 3: it kept no bases, so its chunks travel
// dense at version 3, while trainer rank 0's still travel as deltas; every element is exact.
TEST_F(SessionDeltaTest, AReplacedTrainerSendsDenseWhileTheOtherTrainerKeepsSendingDeltas) {
  for (const absl::Status& s :
       On({0, 1, 2, 3}, [&](int p) { return processes_[p].session->Connect(); })) {
    ASSERT_TRUE(s.ok()) << s;
  }
  SyncAll(1);
  SyncAll(2);
  EXPECT_GT(DeltaMessages(0), 0);
  EXPECT_GT(DeltaMessages(1), 0);
  Replace(1);
  SyncAll(3);
  EXPECT_GT(DeltaMessages(0), 0) << "trainer rank 0 holds its bases of version 2";
  EXPECT_EQ(DeltaMessages(1), 0) << "a replaced trainer has no bases: dense";
  SyncAll(4);
  EXPECT_GT(DeltaMessages(1), 0) << "the replacement recorded its bases at version 3";
}

// The schedule report's delta prediction uses what the last sync's encodings cost: before any
// sync the assumed kDeltaEncodedPerChanged, after delta syncs this process's wire bytes per dense
// byte over its changed fraction, exactly as its stats state them.
TEST_F(SessionDeltaTest, ThePredictionUsesTheLastSyncsEncodingCost) {
  const std::string calibration_file =
      absl::StrCat(::testing::TempDir(), "/session_delta_calibration.pb");
  {
    const absl::StatusOr<proto::Calibration> calibration = SyntheticCalibration(
        "intra_node=5us,1GB/s;inter_node=5us,1GB/s;delta_encode=0us,4GB/s;"
        "delta_apply=0us,4GB/s");
    ASSERT_TRUE(calibration.ok()) << calibration.status();
    std::ofstream out(calibration_file, std::ios::binary);
    ASSERT_TRUE(calibration->SerializeToOstream(&out));
  }
  MakeProcesses(calibration_file);
  for (const absl::Status& s :
       On({0, 1, 2, 3}, [&](int p) { return processes_[p].session->Connect(); })) {
    ASSERT_TRUE(s.ok()) << s;
  }
  const absl::StatusOr<std::string> before = processes_[0].session->ScheduleReport();
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_THAT(*before, HasSubstr("changed and 1 encoded bytes per changed byte (assumed, none "
                                 "seen yet)"));
  for (int64_t v = 1; v <= 3; ++v) SyncAll(v);
  const TransferStats stats = processes_[0].session->LastStats().stats;
  ASSERT_GT(stats.delta_announced_sent_bytes, 0);
  ASSERT_GT(stats.delta_changed_elements, 0);
  EXPECT_LT(stats.delta_announced_wire_bytes, stats.delta_announced_sent_bytes);
  const double fraction = static_cast<double>(stats.delta_changed_elements) /
                          static_cast<double>(stats.delta_compared_elements);
  const double expected = static_cast<double>(stats.delta_announced_wire_bytes) /
                          static_cast<double>(stats.delta_announced_sent_bytes) / fraction;
  const absl::StatusOr<std::string> after = processes_[0].session->ScheduleReport();
  ASSERT_TRUE(after.ok()) << after.status();
  // At the fraction this sender saw in the last sync (what the next agreement sums), not the one
  // that sync ran with.
  EXPECT_THAT(*after, HasSubstr(absl::StrFormat("at %.2f %% changed and %.3g encoded bytes per "
                                                "changed byte (the last sync's)",
                                                100 * fraction, expected)));
}

}  // namespace
}  // namespace wsync
