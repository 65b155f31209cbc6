#include "integration/cli/demo_command.h"

#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "integration/cli/demo_progress_line.h"
#include "integration/cli/demo_report.h"
#include "integration/harness/launcher.h"
#include "integration/host/table_setting_args.h"
#include "integration/model_config/hf_config.h"
#include "planner/layout.h"
#include "planner/models.h"
#include "planner/named_layouts.h"
#include "plugin/settings.h"

// Shared with `wsync plan` and `wsync coordinator` (one flag registry per binary).
ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, from);
ABSL_DECLARE_FLAG(std::string, to);
ABSL_DECLARE_FLAG(int32_t, trainers);
ABSL_DECLARE_FLAG(int32_t, rollouts);
ABSL_FLAG(int32_t, layers, 0, "`wsync demo`: keep only the first N transformer layers (0: all).");
ABSL_DECLARE_FLAG(std::string, calibration);
ABSL_FLAG(int32_t, steps, 5, "`wsync demo`: RL steps to run.");
ABSL_FLAG(std::string, tls, "",
          "`wsync demo`: UCX transports of every path (default sm,cma,self).");
ABSL_FLAG(std::string, demo_process, "",
          "`wsync demo`: the wsync_demo_process binary (default: next to this build's wsync).");
ABSL_FLAG(std::string, library, "",
          "`wsync demo`: libwsync.so (default: $WSYNC_LIBRARY, else this build's plugin/).");
ABSL_FLAG(int32_t, demo_corrupt_step, 0,
          "`wsync demo`, testing only: trainer rank 0 corrupts the version of this step after "
          "writing it; the demo must then report that step FAILED and exit 1.");
ABSL_FLAG(double, demo_timeout_s, 300, "`wsync demo`: limit of the whole job, seconds.");
ABSL_FLAG(bool, metrics, false,
          "`wsync demo`: every process serves its Prometheus metrics on 127.0.0.1 (the URLs are "
          "printed) while it runs.");
ABSL_FLAG(bool, progress, true,
          "`wsync demo`: a progress line on stderr (when it is a terminal) while a step's sync "
          "runs longer than a second: rounds and bytes over every process, from the "
          "coordinator.");
ABSL_FLAG(double, linger_s, 0,
          "`wsync demo`: seconds every process stays alive after the last step (with --metrics: "
          "for a last scrape).");

namespace wsync::cli {
namespace {

constexpr absl::string_view kDefaultModel = "qwen2.5-0.5b";
constexpr absl::string_view kDefaultFrom = "megatron(tp=2)";
constexpr absl::string_view kDefaultTo = "vllm(tp=2)";
constexpr absl::string_view kDefaultTls = "sm,cma,self";
// The job secret's variable: the processes' secret_env default (they are given no --secret_env).
constexpr absl::string_view kSecretEnv = kDefaultSecretEnv;

struct DemoRequest {
  std::string model;
  int32_t layers = 0;
  std::string from;
  std::string to;
  int32_t trainers = 0;
  int32_t rollouts = 0;
  int32_t steps = 0;
  std::string path_transports;
  std::string process_binary;
  std::string library;
  int32_t corrupt_step = 0;
  absl::Duration timeout;
  bool metrics = false;
  double linger_s = 0;
  std::string calibration;  // The plugin's calibration_file; empty: none.
  // The settings given as arguments ("--<setting>=<value>"), handed to every process; those the
  // demo sets per process (port, node, metrics address, transports, calibration) are not here.
  std::vector<std::string> settings;
  bool progress = true;  // The progress line on stderr (demo_progress_line.h).
};

std::string SelfDirectory() {
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  const std::string path = n > 0 ? std::string(self, n) : std::string("./wsync");
  return path.substr(0, path.rfind('/'));
}

bool IsFile(const std::string& path) { return std::ifstream(path).good(); }

// `path` without "..", symbolic links and the like, when it exists; else as given.
std::string Canonical(const std::string& path) {
  char resolved[PATH_MAX];
  return realpath(path.c_str(), resolved) != nullptr ? std::string(resolved) : path;
}

// 32 random bytes from the kernel, in hex: the job secret. Never printed.
absl::StatusOr<std::string> NewSecret() {
  std::ifstream random("/dev/urandom", std::ios::binary);
  unsigned char bytes[32];
  if (!random.read(reinterpret_cast<char*>(bytes), sizeof(bytes))) {
    return absl::InternalError("cannot read /dev/urandom for the job secret");
  }
  std::string secret;
  for (unsigned char b : bytes) absl::StrAppendFormat(&secret, "%02x", b);
  return secret;
}

std::string Tail(const std::string& text, size_t lines = 8) {
  std::vector<absl::string_view> all = absl::StrSplit(text, '\n', absl::SkipWhitespace());
  if (all.size() > lines) all.erase(all.begin(), all.end() - lines);
  return absl::StrJoin(all, "\n    ");
}

// The job a request describes, checked before any process starts.
struct DemoJob {
  ModelSpec model;
  NamedJobLayouts layouts;
  // A placement key in either spec: every process reports its node (and, colocated, its GPU)
  // of the layouts (nodes simulated on this machine: path classes, plan and prediction follow
  // them); without, all report this machine's host name, as processes of one machine do.
  bool placed = false;
  int32_t trainers = 0;
  int32_t rollouts = 0;
  std::string secret;
  int port = 0;
  std::string name;
  std::vector<int> metrics_ports;  // By process, with --metrics.
};

// Both layouts, here too: bad options fail before any process starts, and the header can say
// what moves.
absl::StatusOr<DemoJob> PrepareDemo(const DemoRequest& request) {
  DemoJob job;
  WSYNC_ASSIGN_OR_RETURN(job.model, LoadModel(request.model));
  if (request.layers > 0) {
    WSYNC_ASSIGN_OR_RETURN(job.model, TruncateLayers(job.model, request.layers));
  }
  WSYNC_ASSIGN_OR_RETURN(job.layouts, BuildNamedJobLayouts(job.model, request.from, request.to));
  const Layout& from = job.layouts.source;
  const Layout& to = job.layouts.target;
  WSYNC_ASSIGN_OR_RETURN(const NamedPlacement from_placement, ParseNamedPlacement(request.from));
  WSYNC_ASSIGN_OR_RETURN(const NamedPlacement to_placement, ParseNamedPlacement(request.to));
  job.placed = from_placement.procs_per_node || from_placement.colocated ||
               to_placement.procs_per_node || to_placement.colocated;
  if (from.role != Role::kTrainer || to.role != Role::kRollout) {
    return absl::InvalidArgumentError(
        absl::StrCat("--from must be a trainer layout and --to a rollout layout; got a ",
                     RoleName(from.role), " and a ", RoleName(to.role), " layout"));
  }
  job.trainers = static_cast<int32_t>(from.processes.size());
  job.rollouts = static_cast<int32_t>(to.processes.size());
  if ((request.trainers != 0 && request.trainers != job.trainers) ||
      (request.rollouts != 0 && request.rollouts != job.rollouts)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s has %d processes and %s has %d; --trainers and --rollouts must match them",
        request.from, job.trainers, request.to, job.rollouts));
  }
  if (!IsFile(request.process_binary)) {
    return absl::NotFoundError(absl::StrCat(request.process_binary,
                                            " does not exist: build target wsync_demo_process "
                                            "(or give --demo_process)"));
  }
  if (!IsFile(request.library)) {
    return absl::NotFoundError(absl::StrCat(request.library,
                                            " does not exist: build target wsync_plugin (or give "
                                            "--library or $WSYNC_LIBRARY)"));
  }
  WSYNC_ASSIGN_OR_RETURN(job.secret, NewSecret());
  WSYNC_ASSIGN_OR_RETURN(job.port, harness::PickFreePort(std::string(kDefaultCoordinatorHost)));
  job.name = absl::StrCat("demo-", getpid());
  if (request.metrics) {
    for (int p = 0; p < job.trainers + job.rollouts; ++p) {
      WSYNC_ASSIGN_OR_RETURN(int metrics_port, harness::PickFreePort("127.0.0.1"));
      job.metrics_ports.push_back(metrics_port);
    }
  }
  return job;
}

void PrintDemoHeader(const DemoRequest& request, const DemoJob& job) {
  absl::PrintF(
      "wsync demo: %s (%.1fM parameters, %s), %d trainers %s -> %d rollouts %s, %d steps\n",
      job.model.name, job.model.TotalElements() / 1e6, DemoBytes(job.model.TotalBytes()),
      job.trainers, request.from, job.rollouts, request.to, request.steps);
  absl::PrintF("  transports: %s; every process loads %s with dlopen\n", request.path_transports,
               request.library);
  absl::PrintF("  coordinator: in trainer rank 0, %s:%d (job %s, secret in $%s)\n",
               kDefaultCoordinatorHost, job.port, job.name, kSecretEnv);
  absl::PrintF("  each step: trainers write version v, sync it; rollouts verify all %s they hold\n",
               DemoBytes(job.layouts.target.PieceBytes()));
  absl::PrintF("  calibration: %s\n",
               request.calibration.empty()
                   ? std::string("none (--calibration FILE predicts every step)")
                   : absl::StrCat(request.calibration, " (trainer rank 0 shares it at connect)"));
  if (request.metrics) {
    for (int p = 0; p < static_cast<int>(job.metrics_ports.size()); ++p) {
      absl::PrintF("  metrics: http://127.0.0.1:%d/metrics (%s %d)\n", job.metrics_ports[p],
                   p < job.trainers ? "trainer" : "rollout",
                   p < job.trainers ? p : p - job.trainers);
    }
  } else {
    absl::PrintF("  metrics: off (--metrics serves each process's metrics while it runs)\n");
  }
  std::fflush(stdout);
}

// The command line of process p (trainers first).
std::vector<std::string> DemoProcessArgv(const DemoRequest& request, const DemoJob& job, int p) {
  const bool trainer = p < job.trainers;
  std::vector<std::string> argv = {
      request.process_binary,
      absl::StrCat("--role=", trainer ? "trainer" : "rollout"),
      absl::StrCat("--rank=", trainer ? p : p - job.trainers),
      absl::StrCat("--trainers=", job.trainers),
      absl::StrCat("--rollouts=", job.rollouts),
      absl::StrCat("--job=", job.name),
      absl::StrCat("--coordinator_host=", kDefaultCoordinatorHost),
      absl::StrCat("--coordinator_port=", job.port),
      absl::StrCat("--model=", request.model),
      absl::StrCat("--layers=", request.layers),
      absl::StrCat("--layout=", trainer ? request.from : request.to),
      absl::StrCat("--path_transports=", request.path_transports),
      absl::StrCat("--steps=", request.steps),
      absl::StrCat("--library=", request.library),
  };
  if (p == 0) argv.push_back("--host_coordinator");
  if (job.placed) {
    const ProcessInfo& placed =
        trainer ? job.layouts.source.processes[p] : job.layouts.target.processes[p - job.trainers];
    argv.push_back(absl::StrCat("--node_id=", placed.node_id));
    if (placed.device != kUnknownDevice) {
      argv.push_back(absl::StrCat("--device_index=", placed.device));
    }
  }
  if (request.corrupt_step > 0) {
    argv.push_back(absl::StrCat("--corrupt_step=", request.corrupt_step));
  }
  if (request.metrics) {
    argv.push_back(absl::StrCat("--metrics_address=127.0.0.1:", job.metrics_ports[p]));
  }
  if (request.linger_s > 0) argv.push_back(absl::StrCat("--linger_s=", request.linger_s));
  argv.insert(argv.end(), request.settings.begin(), request.settings.end());
  if (!request.calibration.empty()) {
    argv.push_back(absl::StrCat("--calibration_file=", request.calibration));
  }
  return argv;
}

// Progress while the job runs: a line once every process has connected, then one per step every
// process finished. Called with every process's output so far (harness::ProcessesSpec::on_poll).
class DemoProgress {
 public:
  DemoProgress(const DemoRequest& request, const DemoJob& job, absl::Time start,
               DemoProgressLine& line)
      : request_(request), job_(job), start_(start), line_(line) {}

  void operator()(const std::vector<std::string>& outputs) {
    std::vector<ProcessReport> reports;
    for (const std::string& text : outputs) reports.push_back(ParseOutput(text));
    if (connected_shown_ && steps_shown_ < request_.steps) {
      line_.Poll(steps_shown_ + 1, request_.steps, step_started_);
    }
    if (!connected_shown_ && std::all_of(reports.begin(), reports.end(), [](const auto& r) {
          return r.connect_seconds.has_value();
        })) {
      connected_shown_ = true;
      step_started_ = absl::Now();
      double slowest = 0;
      for (const ProcessReport& r : reports) slowest = std::max(slowest, *r.connect_seconds);
      absl::PrintF("connected: %d processes (rendezvous, plan, schedule, agreement: %.2f s)\n",
                   job_.trainers + job_.rollouts, slowest);
      for (const std::string& line : reports[0].schedule) absl::PrintF("  %s\n", line);
      if (job_.rollouts > 0 && !reports[job_.trainers].schedule.empty()) {
        absl::PrintF("  %s\n", reports[job_.trainers].schedule[0]);
      }
    }
    while (steps_shown_ < request_.steps) {
      const StepSummary s = Summarize(reports, job_.trainers, steps_shown_ + 1);
      if (s.reported < job_.trainers + job_.rollouts) break;
      ++steps_shown_;
      step_started_ = absl::Now();
      line_.Clear();
      PrintStep(s);
      if (steps_shown_ == request_.steps && request_.metrics) PrintMetricsTotal(reports);
    }
    std::fflush(stdout);
  }

 private:
  void PrintStep(const StepSummary& s) const {
    absl::PrintF(
        "step %d/%d: transfer %.3f s, %.2f GB/s, %d rounds; sync call %.3f s; trainers wrote "
        "in %.2f s, %d/%d rollouts verified every byte in %.2f s%s  [%.1f s]\n",
        steps_shown_, request_.steps, s.seconds, s.GigabytesPerSecond(), s.rounds, s.sync_seconds,
        s.fill_seconds, s.verified, job_.rollouts, s.check_seconds,
        s.first_error.empty() ? "" : absl::StrCat(" -- ", s.first_error),
        absl::ToDoubleSeconds(absl::Now() - start_));
  }

  void PrintMetricsTotal(const std::vector<ProcessReport>& reports) const {
    int64_t received = 0;  // What the rollouts' wsync_bytes_received_total must add up to.
    for (int64_t v = 1; v <= request_.steps; ++v) {
      received += Summarize(reports, job_.trainers, v).received;
    }
    absl::PrintF(
        "metrics: after %d steps the rollouts received %d bytes in total "
        "(sum of wsync_bytes_received_total); version %d; serving for %.1f s more\n",
        request_.steps, received, request_.steps, request_.linger_s);
  }

  const DemoRequest& request_;
  const DemoJob& job_;
  const absl::Time start_;
  DemoProgressLine& line_;
  bool connected_shown_ = false;
  int64_t steps_shown_ = 0;
  absl::Time step_started_ = absl::InfiniteFuture();  // Of the step after the last one shown.
};

// Prints how each process that failed ended, with the tail of its stderr. True when all exited 0.
bool ReportExits(const std::vector<harness::ProcessResult>& results, int32_t trainers) {
  bool all_exited_ok = true;
  for (int p = 0; p < static_cast<int>(results.size()); ++p) {
    const harness::ProcessResult& r = results[p];
    if (r.exit_code == 0) continue;
    all_exited_ok = false;
    std::string how = absl::StrCat("exited with status ", r.exit_code);
    if (r.killed) {
      how = "was killed (the job's time limit, or a peer had failed)";
    } else if (r.term_signal != 0) {
      how = absl::StrCat("was ended by signal ", r.term_signal);
    }
    const std::string tail = Tail(r.stderr_text);
    absl::PrintF("%s %d %s%s%s\n", p < trainers ? "trainer" : "rollout",
                 p < trainers ? p : p - trainers, how, tail.empty() ? "" : ":\n    ", tail);
  }
  return all_exited_ok;
}

// The predicted column: the plugin's prediction from trainer rank 0's schedule report.
std::string PredictedColumn(const DemoRequest& request, const std::vector<ProcessReport>& reports) {
  if (request.calibration.empty()) return "n/a: no calibration";
  if (reports.empty() || !reports[0].predicted_seconds.has_value()) return "n/a: not priced";
  if (reports[0].unpriced.empty()) return absl::StrFormat("%.3f", *reports[0].predicted_seconds);
  // A lower bound: the priced part of the traffic.
  return *reports[0].predicted_seconds > 0
             ? absl::StrFormat(">=%.3f", *reports[0].predicted_seconds)
             : std::string("n/a: not priced");
}

// The table of every step; true when every step verified on every rollout.
bool PrintStepTable(const DemoRequest& request, const DemoJob& job,
                    const std::vector<ProcessReport>& reports) {
  absl::PrintF("\n%4s %9s %7s %6s %10s %10s %10s %10s %10s %20s  %s\n", "step", "seconds", "GB/s",
               "rounds", "sent", "received", "direct", "staged", "arena peak", "predicted",
               "verified");
  const std::string predicted = PredictedColumn(request, reports);
  const int32_t rollouts = job.rollouts;
  bool all_verified = true;
  for (int64_t v = 1; v <= request.steps; ++v) {
    const StepSummary s = Summarize(reports, job.trainers, v);
    std::string verified;
    if (s.reported == 0) {
      all_verified = false;
      absl::PrintF("%4s  not run\n",
                   v == request.steps ? absl::StrCat(v) : absl::StrCat(v, "-", request.steps));
      break;
    }
    if (s.verified == rollouts && s.first_error.empty() &&
        s.reported == job.trainers + job.rollouts) {
      verified = absl::StrFormat("ok (%d/%d rollouts)", s.verified, rollouts);
    } else {
      verified = absl::StrFormat("FAILED (%d/%d rollouts ok%s%s)", s.verified, rollouts,
                                 s.first_error.empty() ? "" : "; ", s.first_error);
    }
    if (verified.rfind("ok", 0) != 0) all_verified = false;
    absl::PrintF("%4d %9.3f %7.2f %6d %10s %10s %10s %10s %10s %20s  %s\n", v, s.seconds,
                 s.GigabytesPerSecond(), s.rounds, DemoBytes(s.sent), DemoBytes(s.received),
                 DemoBytes(s.direct), DemoBytes(s.staged), DemoBytes(s.arena), predicted, verified);
  }
  absl::PrintF(
      "seconds: the slowest process's transfer (agreement and commit excluded); GB/s: bytes "
      "received\nby all rollouts per second; direct and staged: bytes as the rollouts received "
      "them; arena peak:\nthe largest process's staging arenas; predicted: the plugin's "
      "prediction of the sync's seconds\nfrom --calibration (the same plan every step).\n");
  if (!reports.empty() && !reports[0].unpriced.empty()) {
    absl::PrintF("predicted: >= covers only the traffic the calibration prices; %s\n",
                 reports[0].unpriced);
  }
  return all_verified;
}

absl::StatusOr<int> RunDemo(const DemoRequest& request) {
  WSYNC_ASSIGN_OR_RETURN(const DemoJob job, PrepareDemo(request));
  PrintDemoHeader(request, job);

  harness::ProcessesSpec spec;
  spec.processes = job.trainers + job.rollouts;
  spec.env = {absl::StrCat(kSecretEnv, "=", job.secret)};
  spec.timeout = request.timeout;
  spec.command = [&](int p) { return DemoProcessArgv(request, job, p); };
  const absl::Time start = absl::Now();
  StatusQuery query;
  query.port = job.port;
  query.job_id = job.name;
  query.secret = job.secret;
  DemoProgressLine line(std::move(query), request.progress);
  DemoProgress progress(request, job, start, line);
  spec.on_poll = [&](const std::vector<std::string>& outputs) { progress(outputs); };
  // WSYNC_LOG (common/log.h) reaches every process through the environment: their trace lines
  // are shown as they come, those of one poll in the order of their time stamps.
  if (const char* trace = std::getenv("WSYNC_LOG"); trace != nullptr && *trace != '\0') {
    spec.on_stderr = [&line](const std::vector<std::string>& new_lines) {
      line.Clear();
      for (const std::string& merged : MergeTraceLines(new_lines)) {
        absl::FPrintF(stderr, "%s\n", merged);
      }
    };
  }
  absl::StatusOr<std::vector<harness::ProcessResult>> ran = harness::RunProcesses(spec);
  line.Clear();
  WSYNC_ASSIGN_OR_RETURN(std::vector<harness::ProcessResult> results, std::move(ran));

  std::vector<ProcessReport> reports;
  for (const harness::ProcessResult& r : results) reports.push_back(ParseOutput(r.stdout_text));
  const bool all_exited_ok = ReportExits(results, job.trainers);
  // The secret must not leak into anything the demo shows.
  for (const harness::ProcessResult& r : results) {
    if (r.stdout_text.find(job.secret) != std::string::npos ||
        r.stderr_text.find(job.secret) != std::string::npos) {
      return absl::InternalError("a process printed the job secret");
    }
  }
  const bool all_verified = PrintStepTable(request, job, reports) && all_exited_ok;
  absl::PrintF("%s\n", request.metrics ? "metrics: served at the URLs above while the processes ran"
                                       : "metrics: off (--metrics to export them)");
  absl::PrintF("%s in %.1f s\n",
               all_verified ? absl::StrFormat("every byte of all %d steps verified on all %d "
                                              "rollouts",
                                              request.steps, job.rollouts)
                            : std::string("FAILED: not every step verified"),
               absl::ToDoubleSeconds(absl::Now() - start));
  return all_verified ? 0 : 1;
}

}  // namespace

std::string DemoUsage() {
  return "usage: wsync demo [--model M] [--from LAYOUT] [--to LAYOUT] [--trainers N]\n"
         "                  [--rollouts N] [--steps K] [--tls T | --path_transports P]\n"
         "                  [--layers N] [--demo_process BIN] [--library SO]\n"
         "                  [--metrics] [--linger_s S] [--calibration FILE]\n"
         "                  [--<setting>=VALUE ...] (--verify=hash, --delta=on, ...)\n"
         "\n"
         "  Runs the main job on this machine: trainer and rollout processes that load\n"
         "  libwsync.so with dlopen and use its C ABI (trainer rank 0 hosts the coordinator),\n"
         "  K RL steps in which the trainers write version v and sync it and every rollout\n"
         "  verifies every byte; then a table per step.\n"
         "  --model     default qwen2.5-0.5b; a built-in model or a config.json path\n"
         "              (`wsync plan --help` lists the models)\n"
         "  --from      trainer layout, default megatron(tp=2) (separate q/k/v, gate/up)\n"
         "  --to        rollout layout, default vllm(tp=2) (fused qkv_proj, gate_up_proj)\n"
         "              with a placement key (ppn=K, colocated=0|1; `wsync plan --help`) in\n"
         "              either, processes report the layouts' nodes (simulated on this machine),\n"
         "              else all report this machine's host name\n"
         "  --trainers, --rollouts  process counts; default (and they must equal) the layouts'\n"
         "  --steps     default 5\n"
         "  --tls       UCX transports of every path, default sm,cma,self (shared memory)\n"
         "  --path_transports  (a setting) per path class, e.g.\n"
         "              'intra_node=ucx:sm,cma,self;*=ucx:tcp'\n"
         "  --layers    keep only the first N transformer layers (default: all)\n"
         "  --metrics   each process serves Prometheus metrics on 127.0.0.1 (URLs printed)\n"
         "  --linger_s  keep the processes alive S seconds after the last step (for a scrape)\n"
         "  --calibration  a calibration (wsync calibrate --out) given to the plugin (its\n"
         "              calibration_file); the table then shows each sync's predicted seconds\n"
         "  --<setting>=VALUE  any setting of the plugin (`wsync settings` lists them, with\n"
         "              their defaults and variables), handed to every process: e.g.\n"
         "              --verify=hash|keyed (a digest or MAC per chunk, checked before the\n"
         "              commit), --delta=off|auto|on, --deadline_seconds S,\n"
         "              --staging_budget_bytes B, --replica_policy P\n";
}

int DemoMain(int argc, char** argv) {
  // The settings first: absl does not know them (the compiled table, plugin/settings.h).
  absl::StatusOr<host::SettingArgs> settings = host::TakeCompiledSettings(&argc, argv);
  if (!settings.ok()) {
    absl::FPrintF(stderr, "wsync demo: %s\n", settings.status().message());
    return 2;
  }
  const std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    absl::FPrintF(stderr, "wsync demo: unexpected argument '%s'\n\n%s", positional[1], DemoUsage());
    return 2;
  }
  DemoRequest request;
  request.model =
      absl::GetFlag(FLAGS_model).empty() ? std::string(kDefaultModel) : absl::GetFlag(FLAGS_model);
  request.layers = absl::GetFlag(FLAGS_layers);
  request.from =
      absl::GetFlag(FLAGS_from).empty() ? std::string(kDefaultFrom) : absl::GetFlag(FLAGS_from);
  request.to = absl::GetFlag(FLAGS_to).empty() ? std::string(kDefaultTo) : absl::GetFlag(FLAGS_to);
  request.trainers = absl::GetFlag(FLAGS_trainers);
  request.rollouts = absl::GetFlag(FLAGS_rollouts);
  request.steps = absl::GetFlag(FLAGS_steps);
  const std::optional<std::string> path_transports = settings->Value("path_transports");
  if (!absl::GetFlag(FLAGS_tls).empty() && path_transports.has_value()) {
    absl::FPrintF(stderr, "wsync demo: give --tls or --path_transports, not both\n");
    return 2;
  }
  request.path_transports = path_transports.value_or("");
  if (request.path_transports.empty()) {
    request.path_transports = absl::StrCat(
        "*=ucx:", absl::GetFlag(FLAGS_tls).empty() ? kDefaultTls : absl::GetFlag(FLAGS_tls));
  }
  if (request.steps < 1 || request.trainers < 0 || request.rollouts < 0 || request.layers < 0) {
    absl::FPrintF(stderr, "wsync demo: --steps must be >= 1; counts and --layers >= 0\n");
    return 2;
  }
  const std::string self = SelfDirectory();
  request.process_binary = absl::GetFlag(FLAGS_demo_process).empty()
                               ? self + "/../demo/wsync_demo_process"
                               : absl::GetFlag(FLAGS_demo_process);
  request.library = absl::GetFlag(FLAGS_library);
  if (request.library.empty()) {
    const char* env = std::getenv("WSYNC_LIBRARY");
    request.library =
        env != nullptr && env[0] != '\0' ? std::string(env) : self + "/../../plugin/libwsync.so";
  }
  request.process_binary = Canonical(request.process_binary);
  request.library = Canonical(request.library);
  request.corrupt_step = absl::GetFlag(FLAGS_demo_corrupt_step);
  request.timeout = absl::Seconds(absl::GetFlag(FLAGS_demo_timeout_s));
  request.metrics = absl::GetFlag(FLAGS_metrics);
  request.linger_s = absl::GetFlag(FLAGS_linger_s);
  request.progress = absl::GetFlag(FLAGS_progress);
  // Every other setting goes to every process as given; the demo sets these per process itself.
  for (const std::string& argument : settings->Arguments()) {
    const absl::string_view name = absl::string_view(argument).substr(2, argument.find('=') - 2);
    if (name == "path_transports" || name == "calibration_file") continue;  // Read here.
    if (name == "coordinator_host" || name == "coordinator_port" || name == "secret_env" ||
        name == "node_id" || name == "metrics_address") {
      absl::FPrintF(stderr, "wsync demo: %s: the demo sets %s for each process\n", argument, name);
      return 2;
    }
    request.settings.push_back(argument);
  }
  std::string calibration = absl::GetFlag(FLAGS_calibration);
  if (const std::optional<std::string> file = settings->Value("calibration_file")) {
    if (!calibration.empty() && calibration != *file) {
      absl::FPrintF(stderr, "wsync demo: give --calibration or --calibration_file, not both\n");
      return 2;
    }
    calibration = *file;
  }
  if (!calibration.empty()) {
    if (!IsFile(calibration)) {
      absl::FPrintF(stderr, "wsync demo: cannot read --calibration %s\n", calibration);
      return 2;
    }
    request.calibration = Canonical(calibration);
  }
  if (request.linger_s < 0) {
    absl::FPrintF(stderr, "wsync demo: --linger_s must be >= 0\n");
    return 2;
  }
  const absl::StatusOr<int> result = RunDemo(request);
  if (!result.ok()) {
    absl::FPrintF(stderr, "wsync demo: %s\n", result.status().ToString());
    return result.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return *result;
}

}  // namespace wsync::cli
