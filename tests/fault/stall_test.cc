// Finding a stalled process: real jobs (fault_job.h) where a rollout never comes, is refused for a
// wrong secret, or is stopped (SIGSTOP) mid-sync. The survivors' errors name the missing, refused
// or stalled process and what they waited for, and `wsync status --json` (parsed here by Python's
// json module) shows the same from the coordinator while the job waits, with the sync progress
// every process reports with its heartbeats (phase, rounds and bytes done of total, committed
// version). Bounds are hang bounds with slack, not performance measures.

#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/fault/fault_job.h"

namespace wsync::harness {
namespace {

// `wsync status --json` of the running job, parsed by Python's json module into lines:
// "rendezvous STATE JOINED", "process ID ROLE RANK STATE NODE HEARD_S_AGO" (HEARD -1: not heard),
// "progress ID VERSION PHASE ROUNDS_DONE ROUNDS_TOTAL BYTES_DONE BYTES_TOTAL COMMITTED"
// (COMMITTED -1: none; only for processes that reported progress), "missing ID,ID",
// "refused TEXT". Empty when the command failed (its error is printed).
std::string StatusLines(int port, const std::string& job_id) {
  setenv("WSYNC_STATUS_SECRET", FaultJobSecret(job_id).c_str(), 1);
  const std::string parse =
      "import json,sys\n"
      "d=json.load(sys.stdin)\n"
      "print('rendezvous', d['rendezvous'], d['joined'])\n"
      "for p in d['processes']:\n"
      "  h=p['heard_s_ago']\n"
      "  print('process', p['process'], p['role'], p['rank'], p['state'], p['node'] or '-',\n"
      "        -1 if h is None else h)\n"
      "  g=p['progress']\n"
      "  if g: print('progress', p['process'], g['version'], g['phase'], g['rounds_done'],\n"
      "              g['rounds_total'], g['bytes_done'], g['bytes_total'],\n"
      "              -1 if g['committed_version'] is None else g['committed_version'])\n"
      "print('missing', ','.join(str(m) for m in d['missing']))\n"
      "for r in d['refused']: print('refused', r['text'])\n";
  const std::string command = absl::StrCat(
      WSYNC_CLI, " status --coordinator 127.0.0.1:", port, " --job ", job_id,
      " --secret_env WSYNC_STATUS_SECRET --json | /usr/bin/python3 -c \"", parse, "\"");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return "";
  std::string out;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) out.append(buffer, n);
  const int status = pclose(pipe);
  std::printf("wsync status --json, parsed (exit %d):\n%s", status, out.c_str());
  return status == 0 ? out : "";
}

// The "process ID ..." line of `lines`, split into its words.
std::vector<std::string> ProcessLine(const std::string& lines, int id) {
  for (absl::string_view line : absl::StrSplit(lines, '\n')) {
    std::vector<std::string> words = absl::StrSplit(line, ' ');
    if (words.size() == 7 && words[0] == "process" && words[1] == absl::StrCat(id)) return words;
  }
  return {};
}

// The "progress ID ..." line of `lines` for process `id`, its numbers parsed; nullopt when absent.
struct Progress {
  int64_t version = 0;
  std::string phase;
  int64_t rounds_done = 0, rounds_total = 0, bytes_done = 0, bytes_total = 0, committed = 0;
};
std::optional<Progress> ProgressLine(const std::string& lines, int id) {
  for (absl::string_view line : absl::StrSplit(lines, '\n')) {
    std::vector<std::string> words = absl::StrSplit(line, ' ');
    if (words.size() != 9 || words[0] != "progress" || words[1] != absl::StrCat(id)) continue;
    Progress p;
    p.phase = words[3];
    if (absl::SimpleAtoi(words[2], &p.version) && absl::SimpleAtoi(words[4], &p.rounds_done) &&
        absl::SimpleAtoi(words[5], &p.rounds_total) && absl::SimpleAtoi(words[6], &p.bytes_done) &&
        absl::SimpleAtoi(words[7], &p.bytes_total) && absl::SimpleAtoi(words[8], &p.committed)) {
      return p;
    }
  }
  return std::nullopt;
}

// The number after " KEY=" in the worker's "STATS version=V ..." line (worker_main.cc), or -1.
int64_t StatsField(const std::string& out, int64_t version, const std::string& key) {
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    if (!absl::StartsWith(line, absl::StrCat("STATS version=", version, " "))) continue;
    for (absl::string_view word : absl::StrSplit(line, ' ')) {
      int64_t value = 0;
      if (absl::ConsumePrefix(&word, absl::StrCat(key, "=")) && absl::SimpleAtoi(word, &value)) {
        return value;
      }
    }
  }
  return -1;
}

// Rollout rank 1 (process 3) never comes (not started) or is refused (a wrong secret): every
// other process times out waiting for the roster (its deadline D = 4 s, the coordinator's 60 s)
// with an error that counts who joined and names the missing process (and any other that timed
// out just before and left: every survivor has the same deadline) and, for the refused one,
// the refusal: the identity it claimed, the address it came from, the reason and how long ago.
// `wsync status --json`, run while they wait, shows them joined and process 3 missing. The
// coordinator, which serves until it is stopped, is killed once the survivors had time to fail.
FaultRun ExpectRendezvousTimeoutNames(FaultJob job, const std::vector<std::string>& words,
                                      std::string* status) {
  job.deadline_s = 4;
  std::optional<absl::Time> joining;
  job.on_poll = [&](int port, const std::string& job_id, const std::vector<std::string>& outputs) {
    if (!joining && AllPrinted(outputs, {3}, "PHASE join")) joining = absl::Now();
    if (joining && status->empty() && absl::Now() - *joining > absl::Seconds(1)) {
      *status = StatusLines(port, job_id);
      if (status->empty()) *status = "failed";
    }
  };
  job.kill_coordinator_when = [&](const std::vector<std::string>&) {
    return joining && absl::Now() - *joining > absl::Seconds(job.deadline_s + kSlackSeconds);
  };
  FaultRun run = RunFaultJob(job);
  EXPECT_TRUE(run.coordinator_killed.has_value()) << "the workers never reached the rendezvous";
  if (run.workers.size() != 4) return run;
  for (int p : {0, 1, 2}) {
    SCOPED_TRACE(Describe(run, p));
    EXPECT_FALSE(run.workers[p].killed) << "hung in the rendezvous";
    EXPECT_EQ(run.workers[p].exit_code, 1);
    const std::string& error = run.workers[p].stderr_text;
    EXPECT_TRUE(absl::StrContains(error, "waiting for the roster")) << error;
    EXPECT_FALSE(absl::StrContains(error, "lost the coordinator")) << error;
    for (const std::string& word : words) EXPECT_TRUE(absl::StrContains(error, word)) << word;
  }
  EXPECT_TRUE(absl::StrContains(*status, "rendezvous pending 3\n")) << *status;
  EXPECT_TRUE(absl::StrContains(*status, "\nmissing 3\n")) << *status;
  for (int p : {0, 1, 2}) {
    const std::vector<std::string> words = ProcessLine(*status, p);
    EXPECT_EQ(words.size(), 7u) << *status;
    if (words.size() != 7) continue;
    EXPECT_EQ(words[4], "joined");
    EXPECT_EQ(words[5], "local");
  }
  const std::vector<std::string> missing = ProcessLine(*status, 3);
  EXPECT_EQ(missing.size(), 7u) << *status;
  if (missing.size() == 7) {
    EXPECT_EQ(missing[2] + " " + missing[3] + " " + missing[4], "rollout 1 missing");
  }
  return run;
}

TEST(StallTest, RendezvousTimeoutNamesTheMissingRollout) {
  FaultJob job;
  job.not_started = {3};
  std::string status;
  ExpectRendezvousTimeoutNames(
      job,
      {" of 4 processes joined (process ", "; missing: process ", "process 3 (rollout rank 1)"},
      &status);
  EXPECT_FALSE(absl::StrContains(status, "refused ")) << status;
}

TEST(StallTest, RendezvousTimeoutNamesTheRolloutRefusedForItsSecret) {
  FaultJob job;
  job.wrong_secrets[3] = "a-wrong-secret-for-this-job-0123456789";
  job.expected_dead = {3};
  std::string status;
  const FaultRun run = ExpectRendezvousTimeoutNames(
      job,
      {" of 4 processes joined", "; missing: process ", "process 3 (rollout rank 1)",
       "refused: rollout rank 1, node local claimed by a connection from 127.0.0.1:",
       "was refused: authentication failed, ", " s ago"},
      &status);
  EXPECT_TRUE(absl::StrContains(
      status, "refused rollout rank 1, node local claimed by a connection from 127.0.0.1:"))
      << status;
  EXPECT_TRUE(absl::StrContains(status, "was refused: authentication failed")) << status;
  ASSERT_EQ(run.workers.size(), 4u);
  EXPECT_TRUE(absl::StrContains(run.workers[3].stderr_text,
                                "refused by the coordinator: authentication failed"))
      << run.workers[3].stderr_text;
}

// Rollout rank 1 stops itself (SIGSTOP) for 7 s at its second receive post of version 1 (after
// waiting 0.5 s at its first, so that a heartbeat reports it transferring), with D = 4 s and a
// 30 s silence limit (so it is stalled, not lost). `wsync status`, 2 s into the sync, shows every
// process joined and process 3 the one not heard from for the longest, at least a second, and
// the progress each last reported: process 3 transferring version 1 with rounds and bytes done
// short of its totals, the other rollout further along in the same sync. Every survivor's
// version 1 fails within D + 2 s naming process 3; the trainers' errors say what they still had
// outstanding with it.
TEST(StallTest, StoppedRolloutIsNamedByTheSurvivorsAndByStatus) {
  FaultJob job;
  job.versions = 1;
  job.deadline_s = 4;
  job.silence_limit_s = 30;
  job.failpoints[3] = "recv:delay=500ms@1,recv:stop=7s@2";
  std::optional<absl::Time> transferring;
  std::string status;
  job.on_poll = [&](int port, const std::string& job_id, const std::vector<std::string>& outputs) {
    if (!transferring && AllPrinted(outputs, {}, "PHASE transfer version=1")) {
      transferring = absl::Now();
    }
    if (transferring && status.empty() && absl::Now() - *transferring > absl::Seconds(2)) {
      status = StatusLines(port, job_id);
      if (status.empty()) status = "failed";
    }
  };
  FaultRun run = RunFaultJob(job);
  ASSERT_EQ(run.workers.size(), 4u);
  ExpectSurvivorsReport(run, job, 3, {"process 3"});
  for (int p : {0, 1}) {
    ASSERT_FALSE(run.results[p].empty());
    EXPECT_TRUE(absl::StrContains(run.results[p][0].error, "send to process 3"))
        << run.results[p][0].error;
  }
  EXPECT_TRUE(absl::StrContains(status, "rendezvous done 4\n")) << status;
  double stalled = -1, others = 0;
  for (int p = 0; p < 4; ++p) {
    const std::vector<std::string> words = ProcessLine(status, p);
    ASSERT_EQ(words.size(), 7u) << status;
    EXPECT_EQ(words[4], "joined");
    double heard = -1;
    ASSERT_TRUE(absl::SimpleAtod(words[6], &heard)) << words[6];
    if (p == 3) {
      stalled = heard;
    } else {
      others = std::max(others, heard);
    }
  }
  EXPECT_GE(stalled, 1.0) << status;
  EXPECT_GT(stalled, others) << status;
  const std::optional<Progress> stopped = ProgressLine(status, 3);
  ASSERT_TRUE(stopped.has_value()) << status;
  EXPECT_EQ(stopped->version, 1);
  EXPECT_EQ(stopped->phase, "transferring") << status;
  EXPECT_LT(stopped->rounds_done, stopped->rounds_total) << status;
  EXPECT_LT(stopped->bytes_done, stopped->bytes_total) << status;
  EXPECT_EQ(stopped->committed, -1) << status;
  for (int p : {0, 1, 2}) {
    const std::optional<Progress> other = ProgressLine(status, p);
    ASSERT_TRUE(other.has_value()) << status;
    EXPECT_EQ(other->version, 1) << p;
    EXPECT_NE(other->phase, "idle") << p;
    EXPECT_NE(other->phase, "agreeing") << p;
  }
  // The other rollout (the same layout's rank 0) received all or more of the same sync.
  const std::optional<Progress> rollout0 = ProgressLine(status, 2);
  ASSERT_TRUE(rollout0.has_value());
  EXPECT_GT(rollout0->bytes_done, stopped->bytes_done) << status;
  EXPECT_GT(rollout0->rounds_done, stopped->rounds_done) << status;
}

// Rollout rank 1 stops (SIGSTOP, 8 s) mid-sync after a heartbeat reported it transferring, with
// a 30 s deadline and the default 3 s silence limit: the coordinator takes it as lost for its
// silence, and every survivor's error names it, the silence and what it last reported.
TEST(StallTest, ProcessLostForSilenceIsNamedWithItsLastProgress) {
  FaultJob job;
  job.deadline_s = 30;
  job.coordinator_linger_s = 1;
  job.failpoints[3] = "recv:delay=500ms@1,recv:stop=8s@2";
  job.expected_dead = {3};
  const FaultRun run = RunFaultJob(job);
  ASSERT_EQ(run.workers.size(), 4u);
  ExpectSurvivorsFailFast(
      run, 3, {"process 3 (", "silent for", "; it last reported: transferring version 1: round "},
      /*bound_s=*/10.0);
}

// A healthy job paused before the decision of version 2 (3 s: under ASan the status query comes
// 0.6 s after the last process printed its pause, and a process whose own pause ended first must
// not have committed yet): `wsync status` then shows every
// process committed at version 1, voting on version 2 with every round and byte of it done, and
// the totals equal what the run itself counted (the worker's STATS line of version 1, the same
// plan: its rounds, and its bytes sent plus received).
TEST(StallTest, StatusShowsTheCommittedVersionAndCompleteProgress) {
  FaultJob job;
  job.versions = 2;
  job.deadline_s = 8;
  job.pause_before_decide_s = 3.0;
  std::optional<absl::Time> deciding;
  std::string status;
  job.on_poll = [&](int port, const std::string& job_id, const std::vector<std::string>& outputs) {
    if (!deciding && AllPrinted(outputs, {}, "PHASE decide version=2")) deciding = absl::Now();
    if (deciding && status.empty() && absl::Now() - *deciding > absl::Milliseconds(600)) {
      status = StatusLines(port, job_id);
      if (status.empty()) status = "failed";
    }
  };
  const FaultRun run = RunFaultJob(job);
  ASSERT_EQ(run.workers.size(), 4u);
  for (int p = 0; p < 4; ++p) {
    SCOPED_TRACE(Describe(run, p));
    ASSERT_EQ(run.results[p].size(), 2u);
    EXPECT_TRUE(run.results[p][0].ok && run.results[p][1].ok);
    const std::optional<Progress> progress = ProgressLine(status, p);
    ASSERT_TRUE(progress.has_value()) << status;
    EXPECT_EQ(progress->committed, 1);
    EXPECT_EQ(progress->version, 2);
    EXPECT_EQ(progress->phase, "voting");
    const std::string& out = run.workers[p].stdout_text;
    EXPECT_EQ(progress->rounds_total, StatsField(out, 1, "rounds")) << status;
    EXPECT_EQ(progress->bytes_total, StatsField(out, 1, "sent") + StatsField(out, 1, "received"))
        << status;
    EXPECT_GT(progress->bytes_total, 0);
    EXPECT_EQ(progress->rounds_done, progress->rounds_total);
    EXPECT_EQ(progress->bytes_done, progress->bytes_total);
  }
}

}  // namespace
}  // namespace wsync::harness
