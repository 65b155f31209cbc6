// Sync progress with the heartbeat: a client's SyncProgress (common/sync_progress.h) reaches its
// coordinator with every heartbeat; `wsync status`'s body (QueryJobStatus) shows each process's
// latest report, the coordinator's counters sum them by phase and bytes (each process counted
// once, its previous report replaced), values from the wire are bounded, and a client without
// progress reports none. Also the words of a report (DescribeSyncProgress).

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "control/client.h"
#include "control/coordinator.h"
#include "control/status_client.h"
#include "control/sync_progress_wire.h"
#include "gtest/gtest.h"
#include "tests/unit/control_job.h"

namespace wsync {
namespace {

using control_testing::ClientOptions;
using control_testing::Options;

CoordinatorOptions FastHeartbeats() {
  CoordinatorOptions o = Options(1, 1);
  o.heartbeat_interval = absl::Milliseconds(20);
  o.silence_limit = absl::Seconds(5);
  return o;
}

// The job's status once `done` holds for it, polled for up to 10 s; the last one otherwise.
control::JobStatusBody StatusWhen(const Coordinator& coordinator,
                                  const std::function<bool(const control::JobStatusBody&)>& done) {
  StatusQuery query;
  query.port = coordinator.port();
  query.job_id = control_testing::kJob;
  query.secret = control_testing::kSecret;
  control::JobStatusBody body;
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (absl::Now() < give_up) {
    query.deadline = absl::Now() + absl::Seconds(2);
    absl::StatusOr<control::JobStatusBody> got = QueryJobStatus(query);
    EXPECT_TRUE(got.ok()) << got.status();
    if (!got.ok()) break;
    body = *std::move(got);
    if (done(body)) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return body;
}

TEST(SyncProgressTest, HeartbeatsCarryTheProgressToStatusAndCounters) {
  absl::StatusOr<std::unique_ptr<Coordinator>> c = Coordinator::Start(FastHeartbeats());
  ASSERT_TRUE(c.ok()) << c.status();
  SyncProgress progress;
  ControlClientOptions options = ClientOptions((*c)->port(), ControlRole::kTrainer, 0);
  options.progress = &progress;
  progress.Begin(7);
  progress.SetTotals(10, 1000);
  progress.SetPhase(SyncPhase::kTransferring);
  progress.SetDone(3, 300);
  absl::StatusOr<std::unique_ptr<ControlClient>> client = ControlClient::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();

  control::JobStatusBody body = StatusWhen(
      **c, [](const control::JobStatusBody& b) { return b.processes(0).has_progress(); });
  ASSERT_TRUE(body.processes(0).has_progress());
  const control::SyncProgress& first = body.processes(0).progress();
  EXPECT_EQ(first.version(), 7);
  EXPECT_EQ(first.phase(), control::SYNC_PHASE_TRANSFERRING);
  EXPECT_EQ(first.rounds_done(), 3);
  EXPECT_EQ(first.rounds_total(), 10);
  EXPECT_EQ(first.bytes_done(), 300);
  EXPECT_EQ(first.bytes_total(), 1000);
  EXPECT_EQ(first.committed_version(), -1);
  EXPECT_FALSE(body.processes(1).has_progress());  // Never connected.
  CoordinatorCounters counters = (*c)->counters();
  EXPECT_EQ(counters.in_phase[static_cast<int>(SyncPhase::kTransferring)], 1);
  EXPECT_EQ(counters.sync_bytes_done, 300);
  EXPECT_EQ(counters.sync_bytes_total, 1000);

  // The sync ends and commits: the next heartbeats replace the report, counted once.
  progress.SetDone(10, 1000);
  progress.SetPhase(SyncPhase::kVoting);
  progress.End(/*committed=*/true);
  body = StatusWhen(**c, [](const control::JobStatusBody& b) {
    return b.processes(0).progress().committed_version() == 7;
  });
  const control::SyncProgress& second = body.processes(0).progress();
  EXPECT_EQ(second.phase(), control::SYNC_PHASE_IDLE);
  EXPECT_EQ(second.committed_version(), 7);
  EXPECT_EQ(second.bytes_done(), 1000);
  counters = (*c)->counters();
  EXPECT_EQ(counters.in_phase[static_cast<int>(SyncPhase::kIdle)], 1);
  EXPECT_EQ(counters.in_phase[static_cast<int>(SyncPhase::kTransferring)], 0);
  EXPECT_EQ(counters.sync_bytes_done, 1000);
  EXPECT_EQ(counters.sync_bytes_total, 1000);
}

// Rounds and bytes from the wire are bounded to [0, 2^50] before the coordinator keeps or sums
// them; a phase it does not know is shown as such and counted in no phase.
TEST(SyncProgressTest, ValuesFromTheWireAreBounded) {
  absl::StatusOr<std::unique_ptr<Coordinator>> c = Coordinator::Start(FastHeartbeats());
  ASSERT_TRUE(c.ok()) << c.status();
  SyncProgress progress;
  progress.Begin(1);
  progress.SetTotals(std::numeric_limits<int64_t>::max(), -5);
  progress.SetDone(-1, std::numeric_limits<int64_t>::max());
  progress.SetPhase(static_cast<SyncPhase>(99));
  ControlClientOptions options = ClientOptions((*c)->port(), ControlRole::kTrainer, 0);
  options.progress = &progress;
  absl::StatusOr<std::unique_ptr<ControlClient>> client = ControlClient::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  const control::JobStatusBody body = StatusWhen(
      **c, [](const control::JobStatusBody& b) { return b.processes(0).has_progress(); });
  const control::SyncProgress& p = body.processes(0).progress();
  EXPECT_EQ(p.rounds_total(), int64_t{1} << 50);
  EXPECT_EQ(p.bytes_total(), 0);
  EXPECT_EQ(p.rounds_done(), 0);
  EXPECT_EQ(p.bytes_done(), int64_t{1} << 50);
  EXPECT_EQ(SyncPhaseName(p.phase()), "unknown");
  const CoordinatorCounters counters = (*c)->counters();
  int64_t counted = 0;
  for (int64_t n : counters.in_phase) counted += n;
  EXPECT_EQ(counted, 0);
  EXPECT_EQ(counters.sync_bytes_done, int64_t{1} << 50);
}

// A client without progress (an older one, or one that keeps none) still heartbeats; its status
// has no progress.
TEST(SyncProgressTest, ClientWithoutProgressReportsNone) {
  absl::StatusOr<std::unique_ptr<Coordinator>> c = Coordinator::Start(FastHeartbeats());
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<std::unique_ptr<ControlClient>> client =
      ControlClient::Connect(ClientOptions((*c)->port(), ControlRole::kTrainer, 0));
  ASSERT_TRUE(client.ok()) << client.status();
  absl::SleepFor(absl::Milliseconds(200));  // About ten heartbeats.
  const control::JobStatusBody body =
      StatusWhen(**c, [](const control::JobStatusBody&) { return true; });
  EXPECT_EQ(body.processes(0).state(), "connected");
  EXPECT_GE(body.processes(0).heard_ms_ago(), 0);
  EXPECT_FALSE(body.processes(0).has_progress());
}

TEST(SyncProgressTest, DescribesAReport) {
  control::SyncProgress p;
  p.set_version(5);
  p.set_phase(control::SYNC_PHASE_TRANSFERRING);
  p.set_rounds_done(3);
  p.set_rounds_total(10);
  p.set_bytes_done(int64_t{3} << 19);
  p.set_bytes_total(int64_t{4} << 20);
  p.set_committed_version(4);
  EXPECT_EQ(DescribeSyncProgress(p),
            "transferring version 5: round 3 of 10, 1.5 of 4.0 MiB; committed 4");
  p.set_phase(control::SYNC_PHASE_IDLE);
  EXPECT_EQ(DescribeSyncProgress(p), "idle; committed 4");
  p.set_phase(control::SYNC_PHASE_VOTING);
  p.set_committed_version(-1);
  EXPECT_EQ(DescribeSyncProgress(p), "voting version 5; nothing committed yet");
}

}  // namespace
}  // namespace wsync
