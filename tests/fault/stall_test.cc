// Finding a stalled process: real jobs (fault_job.h) where a rollout never comes, is refused for a
// wrong secret, or is stopped (SIGSTOP) mid-sync. The survivors' errors name the missing, refused
// or stalled process and what they waited for, and `wsync status --json` (parsed here by Python's
// json module) shows the same from the coordinator while the job waits. Bounds are hang bounds
// with slack, not performance measures.

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
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/fault/fault_job.h"

namespace wsync::harness {
namespace {

// `wsync status --json` of the running job, parsed by Python's json module into lines:
// "rendezvous STATE JOINED", "process ID ROLE RANK STATE NODE HEARD_S_AGO" (HEARD -1: not heard),
// "missing ID,ID", "refused TEXT". Empty when the command failed (its error is printed).
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

// Rollout rank 1 stops itself (SIGSTOP) for 7 s at its second receive post of version 1, with
// D = 4 s and a 30 s silence limit (so it is stalled, not lost). `wsync status`, 2 s into the
// stall, shows every process joined and process 3 the one not heard from for the longest, at
// least a second. Every survivor's version 1 fails within D + 2 s naming process 3; the trainers'
// errors say what they still had outstanding with it.
TEST(StallTest, StoppedRolloutIsNamedByTheSurvivorsAndByStatus) {
  FaultJob job;
  job.versions = 1;
  job.deadline_s = 4;
  job.silence_limit_s = 30;
  job.failpoints[3] = "recv:stop=7s@2";
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
}

}  // namespace
}  // namespace wsync::harness
