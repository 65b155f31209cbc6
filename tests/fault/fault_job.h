#ifndef WSYNC_TESTS_FAULT_FAULT_JOB_H_
#define WSYNC_TESTS_FAULT_FAULT_JOB_H_

// The fault tests' job (fault_test.cc, stall_test.cc): a coordinator (`wsync coordinator`) and
// wsync_test_worker trainers and rollouts (tests/multiproc/worker_main.cc) moving qwen2.5-tiny
// from megatron(tp=2) to vllm(tp=2) over UCX shared memory with a short deadline D, with
// failpoints, left-out workers, wrong secrets and a coordinator the test may kill or stop; and the
// checks the tests share. Test code: the binaries come from WSYNC_TEST_WORKER and WSYNC_CLI.

#include <signal.h>
#include <sys/types.h>

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "integration/harness/launcher.h"

namespace wsync::harness {

inline constexpr double kDeadlineSeconds = 2.0;  // D
// Slack on top of the promised bounds: the machine may be loaded (a hang bound, not a benchmark).
inline constexpr double kSlackSeconds = 3.0;
inline constexpr int kTrainers = 2;
inline constexpr int kRollouts = 2;
struct SyncResult {
  int64_t version = 0;
  bool ok = false;
  double transfer_s = 0;
  double total_s = 0;
  std::string error;
};

// The worker's RESULT lines (worker_main.cc --markers).
std::vector<SyncResult> Results(const std::string& out);

std::optional<pid_t> PidOf(const std::string& out);

struct FaultJob {
  double deadline_s = kDeadlineSeconds;
  int versions = 2;
  // By global process id (trainers first): WSYNC_FAILPOINTS of that worker.
  std::map<int, std::string> failpoints;
  std::set<int> not_started;  // Workers left out (the rendezvous cannot complete).
  // By global process id: a job secret other than the coordinator's (the worker is refused).
  std::map<int, std::string> wrong_secrets;
  std::set<int> expected_dead;  // Workers that do not finish (killed by a failpoint).
  // A global process id: the other workers wait after their first failed sync for a replacement
  // of it (--await_replacement_s), which the harness starts (same role and rank, no failpoint)
  // once each of them printed 'PHASE await_replacement', at the version they sync next; its
  // outcome is FaultRun::replacement. The replacement is not started when they never wait.
  std::optional<int> replace;
  double pause_before_decide_s = 0;
  bool verify_hashes = false;  // wsync's verify=true (ExecuteOptions::verify).
  bool check_elements = true;  // The rollouts' element-by-element check (--check_values).
  // How long the coordinator outlives the last RESULT line (for the workers' closing barrier);
  // default D + 1 s.
  std::optional<double> coordinator_linger_s;
  // Called with the workers' outputs (by global id) while they run; returns true when the test
  // should kill the coordinator now (once), with coordinator_signal. SIGSTOP freezes it without
  // closing its connections (a silent host); it is SIGKILLed once the workers finished.
  std::function<bool(const std::vector<std::string>&)> kill_coordinator_when;
  int coordinator_signal = SIGKILL;
  // The coordinator's --silence_limit_s; unset: its default (3 s).
  std::optional<double> silence_limit_s;
  // Called every poll while the job runs (before kill_coordinator_when), with the coordinator's
  // port, the job id and the workers' outputs by global id: e.g. to run `wsync status`.
  std::function<void(int port, const std::string& job_id, const std::vector<std::string>& outputs)>
      on_poll;
};

// The secret of the job `job_id` (every worker's WSYNC_SECRET but wrong_secrets).
std::string FaultJobSecret(const std::string& job_id);

struct FaultRun {
  std::vector<ProcessResult> workers;  // By global process id.
  ProcessResult coordinator;
  std::vector<std::vector<SyncResult>> results;  // By global process id.
  // FaultJob::replace's replacement (empty when none was asked for or it was not started).
  ProcessResult replacement;
  std::vector<SyncResult> replacement_results;
  std::optional<absl::Time> coordinator_killed;
  absl::Time ended;
};

FaultRun RunFaultJob(const FaultJob& job);

std::string Describe(const FaultRun& run, int p);

// Promise 1's bound on a whole failed sync: the transfer and the commit decision share the
// deadline D (the decision gets kDecisionGrace = 1 s more), so D + 2 s holds with 1 s to spare.
// Asserted without slack: this is the promise itself (before the fix a failed sync lasted ~2 D).
inline double WholeSyncBound(double deadline_s) { return deadline_s + 2; }

// Every surviving worker: none killed by the harness (no hang); version 1 failed with an error
// naming `lost` (process id or the words of `names`); the first error came within D + 2 s of the
// start of the sync (plus slack), and so did the end of the whole sync, decision included.
void ExpectSurvivorsReport(const FaultRun& run, const FaultJob& job, int lost,
                           const std::vector<std::string>& names);

// With a long deadline: every process but `lost` ran two versions and none hung; version 1 failed
// within `bound_s` with an error containing each of `words`, and version 2 failed within it too.
void ExpectSurvivorsFailFast(const FaultRun& run, int lost, const std::vector<std::string>& words,
                             double bound_s);

// Whether every output but those in `skip` contains `marker`.
bool AllPrinted(const std::vector<std::string>& outputs, const std::set<int>& skip,
                const std::string& marker);

}  // namespace wsync::harness

#endif  // WSYNC_TESTS_FAULT_FAULT_JOB_H_
