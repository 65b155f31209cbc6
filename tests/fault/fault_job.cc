#include "tests/fault/fault_job.h"

#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace wsync::harness {

std::string FaultJobSecret(const std::string& job_id) {
  return absl::StrCat("fault-secret-0123456789abcdef-", job_id);
}

std::vector<SyncResult> Results(const std::string& out) {
  std::vector<SyncResult> results;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    if (!absl::StartsWith(line, "RESULT ")) continue;
    SyncResult r;
    const size_t error = line.find(" error=");
    if (error != absl::string_view::npos) r.error = std::string(line.substr(error + 7));
    for (absl::string_view field : absl::StrSplit(line.substr(0, error), ' ')) {
      std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(field, '=');
      if (kv.first == "version") (void)absl::SimpleAtoi(kv.second, &r.version);
      if (kv.first == "ok") r.ok = kv.second == "1";
      if (kv.first == "transfer_s") (void)absl::SimpleAtod(kv.second, &r.transfer_s);
      if (kv.first == "total_s") (void)absl::SimpleAtod(kv.second, &r.total_s);
    }
    results.push_back(r);
  }
  return results;
}

std::optional<pid_t> PidOf(const std::string& out) {
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    int pid = 0;
    if (absl::ConsumePrefix(&line, "PID ") && absl::SimpleAtoi(line, &pid) && pid > 0) return pid;
  }
  return std::nullopt;
}

namespace {

// FaultJob::replace: once every other worker awaits the replacement, writes the version they sync
// next to `version_file` (whole, by a rename), which starts the replacement. Returns whether it
// did.
bool StartReplacementWhenAwaited(const FaultJob& job, const std::vector<int>& ids,
                                 const std::vector<std::string>& by_id,
                                 const std::string& version_file) {
  const std::string marker = "PHASE await_replacement version=";
  std::string version;
  for (int p : ids) {
    if (p == *job.replace) continue;
    const size_t at = by_id[p].find(marker);
    if (at == std::string::npos) return false;
    const size_t end = by_id[p].find('\n', at);
    if (end == std::string::npos) return false;
    version = by_id[p].substr(at + marker.size(), end - at - marker.size());
  }
  const std::string partial = version_file + ".partial";
  FILE* file = std::fopen(partial.c_str(), "w");
  if (file == nullptr) return false;
  std::fprintf(file, "%s\n", version.c_str());
  std::fclose(file);
  return std::rename(partial.c_str(), version_file.c_str()) == 0;
}

}  // namespace

FaultRun RunFaultJob(const FaultJob& job) {
  FaultRun run;
  absl::StatusOr<int> port = PickFreePort();
  EXPECT_TRUE(port.ok()) << port.status();
  if (!port.ok()) return run;
  const int workers = kTrainers + kRollouts;
  const std::string job_id = absl::StrCat("fault-", getpid(), "-", absl::ToUnixMicros(absl::Now()));
  std::vector<int> ids;  // RunProcesses index 0: the coordinator; then these workers.
  for (int p = 0; p < workers; ++p) {
    if (!job.not_started.count(p)) ids.push_back(p);
  }
  ProcessesSpec spec;
  spec.processes = 1 + static_cast<int>(ids.size());
  // The replacement (job.replace) runs last; it starts once this file holds the version to start
  // at (written below when every other worker awaits it).
  const int replacement_index = job.replace ? spec.processes++ : -1;
  const std::string version_file = absl::StrCat(::testing::TempDir(), job_id, ".replace");
  bool replacement_started = false;
  spec.env = {absl::StrCat("WSYNC_SECRET=", FaultJobSecret(job_id))};
  spec.timeout = absl::Seconds(90);
  spec.failure_grace = absl::Seconds(40);
  spec.command = [&](int index) -> std::vector<std::string> {
    if (index == 0) {
      return {"/bin/sh",
              "-c",
              "echo PID $$; exec \"$@\"",
              "sh",
              WSYNC_CLI,
              "coordinator",
              "--job",
              job_id,
              "--trainers",
              absl::StrCat(kTrainers),
              "--rollouts",
              absl::StrCat(kRollouts),
              "--secret_env",
              "WSYNC_SECRET",
              "--port",
              absl::StrCat(*port),
              "--rendezvous_timeout_s",
              "60",
              absl::StrCat("--silence_limit_s=", job.silence_limit_s.value_or(3))};
    }
    const bool replacement = index == replacement_index;
    const int p = replacement ? *job.replace : ids[index - 1];
    const bool trainer = p < kTrainers;
    auto fp = replacement ? job.failpoints.end() : job.failpoints.find(p);
    auto secret = job.wrong_secrets.find(p);
    std::vector<std::string> args = {
        "env",
        absl::StrCat("WSYNC_FAILPOINTS=", fp == job.failpoints.end() ? "" : fp->second),
        secret == job.wrong_secrets.end() ? "WSYNC_UNUSED=" : "WSYNC_SECRET=" + secret->second,
        WSYNC_TEST_WORKER,
        "--coordinator_port",
        absl::StrCat(*port),
        "--job",
        job_id,
        absl::StrCat("--role=", trainer ? "trainer" : "rollout"),
        absl::StrCat("--rank=", trainer ? p : p - kTrainers),
        "--node_id=local",
        "--tls=sm,cma,self",
        absl::StrCat("--versions=", job.versions),
        absl::StrCat("--deadline_seconds=", job.deadline_s),
        absl::StrCat("--pause_before_decide_s=", job.pause_before_decide_s),
        absl::StrCat("--verify=", job.verify_hashes ? "hash" : "off"),
        absl::StrCat("--check_values=", job.check_elements),
        "--keep_going",
        "--markers"};
    if (job.replace && !replacement) args.push_back("--await_replacement_s=20");
    if (!replacement) return args;
    // Waits up to 60 s for the version, then becomes the worker starting at it.
    std::vector<std::string> wrapped = {
        "/bin/sh", "-c",
        "i=0; while [ ! -s \"$0\" ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; "
        "[ -s \"$0\" ] || exit 3; exec \"$@\" --first_version=$(cat \"$0\")",
        version_file};
    wrapped.insert(wrapped.end(), args.begin(), args.end());
    return wrapped;
  };
  // Kills the coordinator when the test asks for it, and once every worker that should finish
  // printed its last RESULT (the coordinator serves until it is stopped).
  bool coordinator_gone = false;
  spec.on_poll = [&](const std::vector<std::string>& outputs) {
    if (coordinator_gone) return;
    std::optional<pid_t> pid = PidOf(outputs[0]);
    if (!pid) return;
    std::vector<std::string> by_id(workers);
    for (size_t i = 0; i < ids.size(); ++i) by_id[ids[i]] = outputs[i + 1];
    if (job.on_poll) job.on_poll(*port, job_id, by_id);
    if (job.replace && !replacement_started) {
      replacement_started = StartReplacementWhenAwaited(job, ids, by_id, version_file);
    }
    if (!run.coordinator_killed && job.kill_coordinator_when && job.kill_coordinator_when(by_id)) {
      kill(*pid, job.coordinator_signal);
      run.coordinator_killed = absl::Now();
      coordinator_gone = job.coordinator_signal == SIGKILL;
      return;
    }
    bool all_done = true;
    for (int p : ids) {
      if (job.expected_dead.count(p)) continue;
      std::vector<SyncResult> results = Results(by_id[p]);
      if (results.empty() || results.back().version < job.versions) all_done = false;
    }
    if (replacement_started) {
      std::vector<SyncResult> results = Results(outputs[replacement_index]);
      if (results.empty() || results.back().version < job.versions) all_done = false;
    }
    if (all_done && run.coordinator_killed) {
      kill(*pid, SIGKILL);  // Stopped by the test: SIGTERM would stay pending.
      coordinator_gone = true;
    } else if (all_done) {
      // Let the workers finish their last call (a barrier after success) before it goes.
      absl::SleepFor(absl::Seconds(job.coordinator_linger_s.value_or(job.deadline_s + 1)));
      kill(*pid, SIGTERM);
      coordinator_gone = true;
    }
  };
  absl::StatusOr<std::vector<ProcessResult>> results = RunProcesses(spec);
  run.ended = absl::Now();
  EXPECT_TRUE(results.ok()) << results.status();
  if (!results.ok()) return run;
  run.coordinator = (*results)[0];
  run.workers.resize(workers);
  run.results.resize(workers);
  for (size_t i = 0; i < ids.size(); ++i) {
    run.workers[ids[i]] = (*results)[i + 1];
    run.results[ids[i]] = Results(run.workers[ids[i]].stdout_text);
  }
  if (job.replace) {
    std::remove(version_file.c_str());
    run.replacement = (*results)[replacement_index];
    run.replacement_results = Results(run.replacement.stdout_text);
    std::printf("replacement of process %d: started %d exit %d signal %d killed %d\n", *job.replace,
                replacement_started, run.replacement.exit_code, run.replacement.term_signal,
                run.replacement.killed);
    for (const SyncResult& r : run.replacement_results) {
      std::printf("  version %lld ok %d total %.3fs %s\n", static_cast<long long>(r.version), r.ok,
                  r.total_s, r.error.c_str());
    }
  }
  // What happened, for the log: every worker's sync results and its last error line.
  for (int p : ids) {
    const ProcessResult& w = run.workers[p];
    std::printf("process %d: exit %d signal %d killed %d\n", p, w.exit_code, w.term_signal,
                w.killed);
    for (const SyncResult& r : run.results[p]) {
      std::printf("  version %lld ok %d transfer %.3fs total %.3fs %s\n",
                  static_cast<long long>(r.version), r.ok, r.transfer_s, r.total_s,
                  r.error.c_str());
    }
    if (!w.stderr_text.empty()) std::printf("  stderr: %s", w.stderr_text.c_str());
  }
  std::fflush(stdout);
  return run;
}

std::string Describe(const FaultRun& run, int p) {
  return absl::StrCat("process ", p, " exit ", run.workers[p].exit_code, " signal ",
                      run.workers[p].term_signal, " killed ", run.workers[p].killed, "\nstdout:\n",
                      run.workers[p].stdout_text, "\nstderr:\n", run.workers[p].stderr_text);
}

void ExpectSurvivorsReport(const FaultRun& run, const FaultJob& job, int lost,
                           const std::vector<std::string>& names) {
  for (int p = 0; p < kTrainers + kRollouts; ++p) {
    if (p == lost || job.not_started.count(p)) continue;
    SCOPED_TRACE(Describe(run, p));
    EXPECT_FALSE(run.workers[p].killed) << "process " << p << " hung";
    ASSERT_FALSE(run.results[p].empty());
    const SyncResult& first = run.results[p][0];
    EXPECT_EQ(first.version, 1);
    EXPECT_FALSE(first.ok);
    bool named = false;
    for (const std::string& name : names) named = named || absl::StrContains(first.error, name);
    EXPECT_TRUE(named) << "the error does not name the lost process: " << first.error;
    const double first_error_s =
        first.error.rfind("OK |", 0) == 0 ? first.total_s : first.transfer_s;
    EXPECT_LE(first_error_s, job.deadline_s + 2 + kSlackSeconds) << first.error;
    EXPECT_LE(first.total_s, WholeSyncBound(job.deadline_s)) << first.error;
  }
}

void ExpectSurvivorsFailFast(const FaultRun& run, int lost, const std::vector<std::string>& words,
                             double bound_s) {
  for (int p = 0; p < kTrainers + kRollouts; ++p) {
    if (p == lost) continue;
    SCOPED_TRACE(Describe(run, p));
    EXPECT_FALSE(run.workers[p].killed) << "process " << p << " hung";
    ASSERT_EQ(run.results[p].size(), 2u);
    const SyncResult& first = run.results[p][0];
    EXPECT_EQ(first.version, 1);
    EXPECT_FALSE(first.ok);
    std::printf("process %d: version 1 failed after %.3f s\n", p, first.total_s);
    for (const std::string& word : words) {
      EXPECT_TRUE(absl::StrContains(first.error, word))
          << "the error does not name the lost process: " << first.error;
    }
    EXPECT_LT(first.total_s, bound_s) << first.error;
    EXPECT_FALSE(run.results[p][1].ok);
    EXPECT_LT(run.results[p][1].total_s, bound_s) << run.results[p][1].error;
  }
}

bool AllPrinted(const std::vector<std::string>& outputs, const std::set<int>& skip,
                const std::string& marker) {
  for (size_t p = 0; p < outputs.size(); ++p) {
    if (!skip.count(static_cast<int>(p)) && !absl::StrContains(outputs[p], marker)) return false;
  }
  return true;
}

}  // namespace wsync::harness
