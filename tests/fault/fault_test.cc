// Real processes under faults: a coordinator (`wsync coordinator`) and wsync_test_worker trainers
// and rollouts (tests/multiproc/worker_main.cc) moving qwen2.5-tiny from megatron(tp=2) to
// vllm(tp=2) over UCX shared memory with a short deadline D. One process is killed or stopped at a
// failpoint (WSYNC_FAILPOINTS, common/failpoint.h) or the coordinator is killed or stopped by the
// test, and every surviving process must report an error naming the lost process (or the
// coordinator) within D + 2 s of the sync's start, or, with a long D, within a few seconds of the
// loss (a close at once; a frozen process or coordinator after the 3 s silence limit of the
// control plane's heartbeats); never a hang. The bounds are hang bounds with generous slack,
// not performance measures. Every test is bounded by ProcessesSpec::timeout and the ctest TIMEOUT.

#include <signal.h>
#include <sys/types.h>

#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "integration/harness/launcher.h"
#include "tests/fault/fault_job.h"

namespace wsync::harness {
namespace {

TEST(FaultTest, KillRolloutMidSync) {
  FaultJob job;
  job.failpoints[3] = "recv:kill@2";  // Rollout rank 1, at its second receive post.
  job.expected_dead = {3};
  FaultRun run = RunFaultJob(job);
  ASSERT_EQ(run.workers.size(), 4u);
  EXPECT_EQ(run.workers[3].term_signal, SIGKILL) << Describe(run, 3);
  ExpectSurvivorsReport(run, job, 3, {"process 3", "rollout rank 1"});
  // The next sync fails at once too: the job lost a process for good.
  for (int p : {0, 1, 2}) {
    ASSERT_EQ(run.results[p].size(), 2u) << Describe(run, p);
    EXPECT_FALSE(run.results[p][1].ok);
    EXPECT_LE(run.results[p][1].total_s, job.deadline_s + 2 + kSlackSeconds);
  }
}

// A rollout (at its second receive post) or a trainer (at its second send post) is killed, with
// a long deadline (30 s). UCX over shared memory may report nothing of a dead peer (a receive from
// it just waits), but the coordinator sees the connection end and tells every other process,
// whose LossWatch fails its requests with the dead one (Transport::PeerLost). Every survivor's
// sync fails within a few seconds, naming it, instead of at the deadline; the next sync fails at
// once (the job lost a process for good). The bound is one against waiting for the deadline, not a
// benchmark.
TEST(FaultTest, KilledProcessFailsEverySurvivorLongBeforeTheDeadline) {
  struct Victim {
    int process;
    std::string failpoint;
    std::string name;
  };
  // Named as "process 3 (rollout rank 1, ...)" by the notice, or as "send to process 3 (tag ...)"
  // where UCX's shared memory reported the failed send first.
  for (const Victim& victim :
       {Victim{3, "recv:kill@2", "process 3 ("}, Victim{1, "send:kill@2", "process 1 ("}}) {
    SCOPED_TRACE(victim.name);
    FaultJob job;
    job.deadline_s = 30;
    job.coordinator_linger_s = 1;  // Survivors with failed versions exit without a barrier.
    job.failpoints[victim.process] = victim.failpoint;
    job.expected_dead = {victim.process};
    FaultRun run = RunFaultJob(job);
    ASSERT_EQ(run.workers.size(), 4u);
    EXPECT_EQ(run.workers[victim.process].term_signal, SIGKILL) << Describe(run, victim.process);
    ExpectSurvivorsFailFast(run, victim.process, {victim.name}, /*bound_s=*/5.0);
  }
}

// A silent host: rollout rank 1 SIGSTOPs itself at its second receive post (frozen, its
// connections open; continued after 8 s), with a 30 s deadline and the coordinator's default
// 3 s silence limit. The coordinator hears nothing from it (no heartbeat) and takes it as lost:
// every survivor's sync fails within a few seconds, naming it and the silence, instead of at the
// deadline; the next sync fails at once. The frozen process, once continued, fails (its
// coordinator connection was closed) without hanging and without being killed: UCX would abort it
// on a shared-memory (CMA) copy from a peer that has exited meanwhile, so the transport fails the
// exited peers before its first progress (transport/ucx/README.md).
TEST(FaultTest, FrozenProcessIsLostForSilenceLongBeforeTheDeadline) {
  FaultJob job;
  job.deadline_s = 30;
  job.coordinator_linger_s = 1;
  job.failpoints[3] = "recv:stop=8s@2";
  job.expected_dead = {3};  // The others finish without waiting for it.
  FaultRun run = RunFaultJob(job);
  ASSERT_EQ(run.workers.size(), 4u);
  // Silence limit 3 s, plus slack for a loaded machine.
  ExpectSurvivorsFailFast(run, 3, {"process 3 (", "silent for"}, /*bound_s=*/10.0);
  SCOPED_TRACE(Describe(run, 3));
  EXPECT_FALSE(run.workers[3].killed) << "the frozen process hung once continued";
  EXPECT_EQ(run.workers[3].term_signal, 0) << "wsync must never kill its host process";
  for (const SyncResult& r : run.results[3]) {
    EXPECT_FALSE(r.ok) << "the frozen process committed version " << r.version
                       << " without the job";
  }
}

TEST(FaultTest, KillTrainerMidSync) {
  FaultJob job;
  job.failpoints[1] = "send:kill@2";  // Trainer rank 1, at its second send post.
  job.expected_dead = {1};
  FaultRun run = RunFaultJob(job);
  ASSERT_EQ(run.workers.size(), 4u);
  EXPECT_EQ(run.workers[1].term_signal, SIGKILL) << Describe(run, 1);
  ExpectSurvivorsReport(run, job, 1, {"process 1", "trainer rank 1"});
}

// Rollout rank 1 stops itself for 3 D (below the coordinator's silence limit, raised to 30 s here)
// at its second receive post of version 1 and is continued.
// Everyone fails version 1 (the stopped process included: it applies nothing from it). While it is
// stopped the others fail each sync at D naming it. Once it resumes it catches up at once: its
// calls to collective rounds the others already failed fail immediately (the coordinator fails a
// round for everyone when one contributor gives up, so every process sees the same outcome and
// stays in step), and it takes part in the very next sync the others run: from the first version
// it commits, every version commits on every process, verified element by element.
TEST(FaultTest, StopRolloutForThreeDeadlinesThenContinue) {
  FaultJob job;
  job.versions = 5;
  job.silence_limit_s = 30;  // Stopped for less than the silence limit: not lost, it catches up.
  job.failpoints[3] = absl::StrCat("recv:stop=", 3 * kDeadlineSeconds, "s@2");
  FaultRun run = RunFaultJob(job);
  ASSERT_EQ(run.workers.size(), 4u);
  ExpectSurvivorsReport(run, job, 3, {"process 3", "rollout rank 1"});
  SCOPED_TRACE(Describe(run, 3));
  EXPECT_FALSE(run.workers[3].killed) << "the stopped process hung";
  ASSERT_FALSE(run.results[3].empty());
  EXPECT_EQ(run.results[3][0].version, 1);
  EXPECT_FALSE(run.results[3][0].ok) << "the stopped rollout reported the fenced sync as done";
  for (int p = 0; p < 4; ++p) {
    ASSERT_EQ(run.results[p].size(), static_cast<size_t>(job.versions)) << Describe(run, p);
  }
  // The resumed process's versions after the fenced one: some that the others already finished
  // fail at once (no waiting: they were over), then the first one it really joins commits.
  size_t rejoined = 1;
  while (rejoined < run.results[3].size() && !run.results[3][rejoined].ok) {
    EXPECT_LT(run.results[3][rejoined].total_s, 1.0)
        << "version " << run.results[3][rejoined].version
        << " of the resumed process waited instead of catching up: "
        << run.results[3][rejoined].error;
    ++rejoined;
  }
  ASSERT_LT(rejoined, run.results[3].size()) << "the resumed process never committed again";
  const int64_t first_ok = run.results[3][rejoined].version;
  EXPECT_LE(first_ok, 4) << "the resumed process sat out a sync it could have joined";
  for (int p = 0; p < 4; ++p) {
    for (const SyncResult& r : run.results[p]) {
      if (r.version >= first_ok) {
        EXPECT_TRUE(r.ok) << "process " << p << " version " << r.version << ": " << r.error;
      }
    }
  }
  // It took part in the very next sync the others ran after it resumed: the others' failed
  // versions (one per D while it was stopped) end right before the first it committed.
  for (int p = 0; p < 3; ++p) {
    for (const SyncResult& r : run.results[p]) {
      if (r.version < first_ok) {
        EXPECT_FALSE(r.ok) << "process " << p << " version " << r.version;
      }
    }
  }
}

// The coordinator is killed (its connections close) or stopped (frozen: they stay open, and only
// its silence tells) while every process is in version 1's transfer, which trainer rank 1 holds
// up by sleeping 8 s at its second send post (deadline 30 s). The others fail within a few seconds
// with an error naming the coordinator: those moving data through their LossWatch (every peer
// counts as lost), those waiting in the commit decision through the call itself. The sleeper
// fails without hanging once it wakes, and is not killed (like the frozen process above).
TEST(FaultTest, LostCoordinatorFailsEveryTransferLongBeforeTheDeadline) {
  for (int signal : {SIGKILL, SIGSTOP}) {
    SCOPED_TRACE(signal == SIGKILL ? "killed" : "stopped");
    FaultJob job;
    job.deadline_s = 30;
    job.versions = 1;
    job.failpoints[1] = "send:delay=8s@2";
    job.expected_dead = {1};  // Asleep; the others finish without waiting for it.
    job.coordinator_signal = signal;
    job.kill_coordinator_when = [&](const std::vector<std::string>& outputs) {
      return AllPrinted(outputs, {}, "PHASE transfer version=1");
    };
    FaultRun run = RunFaultJob(job);
    ASSERT_TRUE(run.coordinator_killed.has_value()) << "the workers never reached the transfer";
    constexpr double kFewSeconds = 10.0;  // 3 s of silence (SIGSTOP) plus slack.
    for (int p = 0; p < kTrainers + kRollouts; ++p) {
      SCOPED_TRACE(Describe(run, p));
      EXPECT_FALSE(run.workers[p].killed) << "process " << p << " hung";
      if (p == 1) {  // Asleep in the failpoint for 8 s: it fails once it wakes.
        EXPECT_EQ(run.workers[p].term_signal, 0) << "wsync must never kill its host process";
        for (const SyncResult& r : run.results[p]) EXPECT_FALSE(r.ok);
        continue;
      }
      ASSERT_EQ(run.results[p].size(), 1u);
      const SyncResult& first = run.results[p][0];
      EXPECT_FALSE(first.ok) << "committed without the coordinator";
      std::printf("%s coordinator: process %d failed after %.3f s (deadline 30 s): %s\n",
                  signal == SIGKILL ? "killed" : "stopped", p, first.total_s, first.error.c_str());
      EXPECT_TRUE(absl::StrContains(first.error, "coordinator")) << first.error;
      // A transfer failed by the LossWatch blames the coordinator, not the peer it was moving
      // data with (which is alive).
      if (absl::StrContains(first.error, "ucx:")) {
        EXPECT_TRUE(absl::StrContains(
            first.error, "stopped because this process lost its connection to the coordinator"))
            << first.error;
        EXPECT_FALSE(absl::StrContains(first.error, "is gone")) << first.error;
      }
      EXPECT_LT(first.total_s, kFewSeconds) << first.error;
    }
  }
}

TEST(FaultTest, KillCoordinatorDuringRendezvous) {
  FaultJob job;
  job.deadline_s = 10;    // Longer than the expected error, so that a timeout cannot pass for it.
  job.not_started = {3};  // The rendezvous waits for rollout rank 1 forever.
  job.kill_coordinator_when = [&](const std::vector<std::string>& outputs) {
    return AllPrinted(outputs, job.not_started, "PHASE join");
  };
  FaultRun run = RunFaultJob(job);
  ASSERT_TRUE(run.coordinator_killed.has_value()) << "the workers never reached the rendezvous";
  EXPECT_LE(run.ended - *run.coordinator_killed, absl::Seconds(2 + kSlackSeconds));
  for (int p : {0, 1, 2}) {
    SCOPED_TRACE(Describe(run, p));
    EXPECT_FALSE(run.workers[p].killed) << "hung in the rendezvous";
    EXPECT_EQ(run.workers[p].exit_code, 1);
    EXPECT_TRUE(absl::StrContains(run.workers[p].stderr_text, "UNAVAILABLE: control:"))
        << run.workers[p].stderr_text;
    EXPECT_TRUE(absl::StrContains(run.workers[p].stderr_text,
                                  "waiting for the roster, lost the coordinator"))
        << run.workers[p].stderr_text;
    EXPECT_TRUE(run.results[p].empty());
  }
}

TEST(FaultTest, KillCoordinatorDuringCommit) {
  FaultJob job;
  job.versions = 1;
  job.pause_before_decide_s = 1;  // Every worker finished its transfer and waits to vote.
  job.kill_coordinator_when = [&](const std::vector<std::string>& outputs) {
    return AllPrinted(outputs, {}, "PHASE decide version=1");
  };
  FaultRun run = RunFaultJob(job);
  ASSERT_TRUE(run.coordinator_killed.has_value()) << "the workers never reached the commit";
  EXPECT_LE(run.ended - *run.coordinator_killed,
            absl::Seconds(job.pause_before_decide_s + 2 + kSlackSeconds));
  for (int p = 0; p < 4; ++p) {
    SCOPED_TRACE(Describe(run, p));
    EXPECT_FALSE(run.workers[p].killed) << "hung in the commit decision";
    ASSERT_EQ(run.results[p].size(), 1u);
    EXPECT_FALSE(run.results[p][0].ok) << "committed without the coordinator";
    EXPECT_TRUE(absl::StrContains(run.results[p][0].error, "coordinator"))
        << run.results[p][0].error;
    EXPECT_EQ(run.workers[p].exit_code, 1);
  }
}

}  // namespace
}  // namespace wsync::harness

namespace wsync::harness {
namespace {

// Version 1 fails on every process (on those in `named`, with an error that contains `reason`);
// version 2 commits on every process (verified by the rollouts): no restart, no stuck state.
void ExpectOneFailedSyncThenRecovery(const FaultRun& run, const std::string& reason,
                                     const std::set<int>& named) {
  for (int p = 0; p < kTrainers + kRollouts; ++p) {
    SCOPED_TRACE(Describe(run, p));
    EXPECT_FALSE(run.workers[p].killed);
    ASSERT_EQ(run.results[p].size(), 2u);
    EXPECT_FALSE(run.results[p][0].ok) << "a false success";
    if (named.count(p)) {
      EXPECT_TRUE(absl::StrContains(run.results[p][0].error, reason)) << run.results[p][0].error;
    }
    EXPECT_LE(run.results[p][0].total_s, WholeSyncBound(kDeadlineSeconds));
    EXPECT_TRUE(run.results[p][1].ok) << run.results[p][1].error;
  }
}

// A trainer's staging allocation fails: it votes no with the reason at once, and the coordinator
// decides the abort on that first "no": every process's error names trainer rank 0 and its
// reason (not the rollout still waiting for its bytes), and the next sync commits.
TEST(FaultTest, FailedArenaAllocationFailsTheSyncEverywhereThenRecovers) {
  FaultJob job;
  job.failpoints[0] = "alloc:fail@1";
  FaultRun run = RunFaultJob(job);
  ASSERT_EQ(run.workers.size(), 4u);
  ExpectOneFailedSyncThenRecovery(
      run, "aborted by process 0 (trainer rank 0, node local): ", {0, 1, 2, 3});
  for (int p = 0; p < kTrainers + kRollouts; ++p) {
    ASSERT_FALSE(run.results[p].empty());
    EXPECT_TRUE(absl::StrContains(run.results[p][0].error, "failpoint 'alloc'"))
        << run.results[p][0].error;
    EXPECT_FALSE(absl::StrContains(run.results[p][0].error, "did not contribute"))
        << "blamed a process that was only waiting: " << run.results[p][0].error;
  }
}

// A byte flipped after packing on both trainers: the rollouts' element check (the worker's
// verification; wsync's verify=true is off here) refuses it, so the commit
// decision aborts on every process: no false success; the next sync commits.
TEST(FaultTest, FlippedByteAfterPackIsNeverAFalseSuccess) {
  FaultJob job;
  job.failpoints[0] = "pack:flip@1";
  job.failpoints[1] = "pack:flip@1";
  FaultRun run = RunFaultJob(job);
  ASSERT_EQ(run.workers.size(), 4u);
  ExpectOneFailedSyncThenRecovery(run, "aborted by", {0, 1, 2, 3});
}

// Rollout rank 1's control client fails its second collective frame (the commit vote of version
// 1) and is finished: the others' vote fails naming it within D + 2 s.
TEST(FaultTest, FailedControlMessageIsNamedByEveryOtherProcess) {
  FaultJob job;
  job.failpoints[3] = "control:fail@2";
  FaultRun run = RunFaultJob(job);
  ASSERT_EQ(run.workers.size(), 4u);
  ExpectSurvivorsReport(run, job, 3, {"process 3", "rollout rank 1"});
  ASSERT_FALSE(run.results[3].empty()) << Describe(run, 3);
  EXPECT_TRUE(absl::StrContains(run.results[3][0].error, "failpoint 'control'"))
      << run.results[3][0].error;
}

// verify=true alone (the rollouts' element check is off, so nothing else could notice): a byte
// flipped after packing a trainer's first staged message, once per trainer (separate jobs). The
// rollout that received it votes no naming that trainer and the chunk; every process fails
// version 1 (zero false successes) and version 2 commits everywhere.
TEST(FaultTest, FlippedByteWithVerifyFailsTheSyncOnEveryProcess) {
  for (int trainer = 0; trainer < kTrainers; ++trainer) {
    SCOPED_TRACE(absl::StrCat("flip on trainer ", trainer));
    FaultJob job;
    job.verify_hashes = true;
    job.check_elements = false;
    job.failpoints[trainer] = "pack:flip@1";
    FaultRun run = RunFaultJob(job);
    ASSERT_EQ(run.workers.size(), 4u);
    ExpectOneFailedSyncThenRecovery(run, "verify: chunk", {0, 1, 2, 3});
    for (int p = 0; p < kTrainers + kRollouts; ++p) {
      ASSERT_FALSE(run.results[p].empty());
      EXPECT_TRUE(absl::StrContains(run.results[p][0].error,
                                    absl::StrCat("from process ", trainer, " differs")))
          << run.results[p][0].error;
    }
  }
}

// verify=true, the element check off: trainer 0's first send goes out without the second half of
// its last chunk. Every process fails version 1, version 2 commits.
TEST(FaultTest, TruncatedLastChunkWithVerifyFailsTheSyncOnEveryProcess) {
  FaultJob job;
  job.verify_hashes = true;
  job.check_elements = false;
  job.failpoints[0] = "truncate:fail@1";
  FaultRun run = RunFaultJob(job);
  ASSERT_EQ(run.workers.size(), 4u);
  ExpectOneFailedSyncThenRecovery(run, "size mismatch", {2, 3});
}

}  // namespace
}  // namespace wsync::harness
