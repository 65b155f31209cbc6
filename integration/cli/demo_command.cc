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
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "integration/harness/launcher.h"
#include "planner/layout.h"
#include "planner/models.h"
#include "planner/named_layouts.h"

// Shared with `wsync plan`, `wsync bench` and `wsync coordinator` (one flag registry per binary).
ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, from);
ABSL_DECLARE_FLAG(std::string, to);
ABSL_DECLARE_FLAG(int32_t, trainers);
ABSL_DECLARE_FLAG(int32_t, rollouts);
ABSL_DECLARE_FLAG(int32_t, layers);
ABSL_DECLARE_FLAG(bool, verify);
ABSL_FLAG(bool, verify_keyed, false,
          "wsync demo: the plugin's keyed verify (verify=2): a MAC per chunk keyed from the job "
          "secret, which a forged chunk or digest cannot pass.");
ABSL_DECLARE_FLAG(std::string, calibration);
ABSL_FLAG(int32_t, steps, 5, "`wsync demo`: RL steps to run.");
ABSL_FLAG(std::string, tls, "",
          "`wsync demo`: UCX transports of every path (default sm,cma,self).");
ABSL_FLAG(std::string, path_transports, "",
          "`wsync demo`: transport per path class, e.g. 'intra_node=ucx:sm,cma,self'.");
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
ABSL_FLAG(double, linger_s, 0,
          "`wsync demo`: seconds every process stays alive after the last step (with --metrics: "
          "for a last scrape).");

namespace wsync::cli {
namespace {

constexpr absl::string_view kDefaultModel = "qwen2.5-0.5b";
constexpr absl::string_view kDefaultFrom = "megatron(tp=2)";
constexpr absl::string_view kDefaultTo = "vllm(tp=2)";
constexpr absl::string_view kDefaultTls = "sm,cma,self";
constexpr absl::string_view kSecretEnv = "WSYNC_SECRET";

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
  bool verify = false;        // The plugin's verify=true (xxh3 per chunk).
  bool verify_keyed = false;  // The plugin's keyed verify (a MAC per chunk); wins over verify.
  std::string calibration;    // The plugin's calibration_file; empty: none.
};

// One STEP line of a process (see integration/demo/demo_process.cc).
struct StepReport {
  double seconds = 0;
  int64_t sent = 0;
  int64_t received = 0;
  int64_t direct = 0;
  int64_t staged = 0;
  int64_t rounds = 0;
  int64_t arena = 0;
  double sync_seconds = 0;
  double work_seconds = 0;
  std::string verified;  // "ok" or the error.
};

struct ProcessReport {
  std::optional<double> connect_seconds;
  std::map<int64_t, StepReport> steps;  // By version.
  std::vector<std::string> schedule;
  std::optional<double> predicted_seconds;  // From the schedule report, with a calibration.
  std::string unpriced;  // The report's "not priced: ..." note: the prediction is partial.
};

ProcessReport ParseOutput(absl::string_view text) {
  ProcessReport report;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::ConsumePrefix(&line, "CONNECTED seconds=")) {
      double seconds = 0;
      if (absl::SimpleAtod(line, &seconds)) report.connect_seconds = seconds;
      continue;
    }
    if (absl::ConsumePrefix(&line, "SCHEDULE ")) {
      report.schedule.emplace_back(line);
      // "... predicted time 0.123456 s (transfer ...": the plugin's prediction of every sync.
      constexpr absl::string_view kPredicted = "predicted time ";
      if (const size_t at = line.find(kPredicted); at != absl::string_view::npos) {
        absl::string_view number = line.substr(at + kPredicted.size());
        number = number.substr(0, number.find(' '));
        double seconds = 0;
        if (absl::SimpleAtod(number, &seconds)) report.predicted_seconds = seconds;
      }
      if (const size_t at = line.find("not priced: "); at != absl::string_view::npos) {
        report.unpriced = std::string(line.substr(at));
      }
      continue;
    }
    if (!absl::ConsumePrefix(&line, "STEP ")) continue;
    // `verified` is last and may contain spaces; a line still being written has none yet.
    const size_t verified_at = line.find(" verified=");
    if (verified_at == absl::string_view::npos) continue;
    StepReport step;
    step.verified = std::string(line.substr(verified_at + 10));
    int64_t version = -1;
    for (absl::string_view field : absl::StrSplit(line.substr(0, verified_at), ' ')) {
      const std::pair<absl::string_view, absl::string_view> kv =
          absl::StrSplit(field, absl::MaxSplits('=', 1));
      const auto integer = [&](int64_t* out) { absl::SimpleAtoi(kv.second, out); };
      const auto real = [&](double* out) { absl::SimpleAtod(kv.second, out); };
      if (kv.first == "v") integer(&version);
      if (kv.first == "seconds") real(&step.seconds);
      if (kv.first == "sent") integer(&step.sent);
      if (kv.first == "received") integer(&step.received);
      if (kv.first == "direct") integer(&step.direct);
      if (kv.first == "staged") integer(&step.staged);
      if (kv.first == "rounds") integer(&step.rounds);
      if (kv.first == "arena") integer(&step.arena);
      if (kv.first == "sync_seconds") real(&step.sync_seconds);
      if (kv.first == "work_seconds") real(&step.work_seconds);
    }
    if (version >= 0) report.steps[version] = std::move(step);
  }
  return report;
}

// One step over every process.
struct StepSummary {
  int reported = 0;    // Processes with a STEP line for it.
  int verified = 0;    // Rollouts that verified it.
  double seconds = 0;  // Slowest process's transfer.
  double sync_seconds = 0;
  double fill_seconds = 0;   // Slowest trainer.
  double check_seconds = 0;  // Slowest rollout.
  int64_t rounds = 0;
  int64_t sent = 0;
  int64_t received = 0;  // By all rollouts.
  int64_t direct = 0;    // As the rollouts received them.
  int64_t staged = 0;
  int64_t arena = 0;  // Largest process.
  std::string first_error;

  double GigabytesPerSecond() const { return seconds > 0 ? received / seconds / 1e9 : 0; }
};

StepSummary Summarize(const std::vector<ProcessReport>& reports, int32_t trainers,
                      int64_t version) {
  StepSummary s;
  std::string missing;  // A process that did not report a step others reported.
  for (int p = 0; p < static_cast<int>(reports.size()); ++p) {
    auto it = reports[p].steps.find(version);
    if (it == reports[p].steps.end()) {
      if (missing.empty()) {
        missing = absl::StrCat(p < trainers ? "trainer " : "rollout ",
                               p < trainers ? p : p - trainers, " did not report it");
      }
      continue;
    }
    const StepReport& r = it->second;
    const bool rollout = p >= trainers;
    ++s.reported;
    s.seconds = std::max(s.seconds, r.seconds);
    s.sync_seconds = std::max(s.sync_seconds, r.sync_seconds);
    s.rounds = std::max(s.rounds, r.rounds);
    s.arena = std::max(s.arena, r.arena);
    s.sent += r.sent;
    if (rollout) {
      s.check_seconds = std::max(s.check_seconds, r.work_seconds);
      s.received += r.received;
      s.direct += r.direct;
      s.staged += r.staged;
      if (r.verified == "ok") ++s.verified;
    } else {
      s.fill_seconds = std::max(s.fill_seconds, r.work_seconds);
    }
    if (r.verified != "ok" && s.first_error.empty()) {
      s.first_error = absl::StrCat(rollout ? "rollout " : "trainer ", rollout ? p - trainers : p,
                                   ": ", r.verified);
    }
  }
  if (s.first_error.empty() && s.reported > 0) s.first_error = missing;
  return s;
}

std::string Bytes(double bytes) {
  if (bytes >= 1e9) return absl::StrFormat("%.2f GB", bytes / 1e9);
  if (bytes >= 1e6) return absl::StrFormat("%.1f MB", bytes / 1e6);
  if (bytes >= 1e3) return absl::StrFormat("%.1f kB", bytes / 1e3);
  return absl::StrFormat("%.0f B", bytes);
}

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

absl::StatusOr<int> RunDemo(const DemoRequest& request) {
  // Both layouts, here too: bad options fail before any process starts, and the header can say
  // what moves.
  WSYNC_ASSIGN_OR_RETURN(ModelSpec model, GetModel(request.model));
  if (request.layers > 0) {
    WSYNC_ASSIGN_OR_RETURN(model, TruncateLayers(model, request.layers));
  }
  WSYNC_ASSIGN_OR_RETURN(NamedJobLayouts layouts,
                         BuildNamedJobLayouts(model, request.from, request.to));
  const Layout& from = layouts.source;
  const Layout& to = layouts.target;
  // With a placement key in either spec every process reports its node of the layouts (nodes
  // simulated on this machine: path classes, plan and prediction follow them); without, all
  // report this machine's host name, as processes of one machine do.
  WSYNC_ASSIGN_OR_RETURN(const NamedPlacement from_placement, ParseNamedPlacement(request.from));
  WSYNC_ASSIGN_OR_RETURN(const NamedPlacement to_placement, ParseNamedPlacement(request.to));
  const bool placed = from_placement.procs_per_node || from_placement.colocated ||
                      to_placement.procs_per_node || to_placement.colocated;
  if (from.role != Role::kTrainer || to.role != Role::kRollout) {
    return absl::InvalidArgumentError(
        absl::StrCat("--from must be a trainer layout and --to a rollout layout; got a ",
                     RoleName(from.role), " and a ", RoleName(to.role), " layout"));
  }
  const int32_t trainers = static_cast<int32_t>(from.processes.size());
  const int32_t rollouts = static_cast<int32_t>(to.processes.size());
  if ((request.trainers != 0 && request.trainers != trainers) ||
      (request.rollouts != 0 && request.rollouts != rollouts)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s has %d processes and %s has %d; --trainers and --rollouts must match them",
        request.from, trainers, request.to, rollouts));
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
  WSYNC_ASSIGN_OR_RETURN(std::string secret, NewSecret());
  WSYNC_ASSIGN_OR_RETURN(int port, harness::PickFreePort("127.0.0.1"));
  const std::string job = absl::StrCat("demo-", getpid());

  absl::PrintF(
      "wsync demo: %s (%.1fM parameters, %s), %d trainers %s -> %d rollouts %s, %d steps\n",
      model.name, model.TotalElements() / 1e6, Bytes(model.TotalBytes()), trainers, request.from,
      rollouts, request.to, request.steps);
  absl::PrintF("  transports: %s; every process loads %s with dlopen\n", request.path_transports,
               request.library);
  absl::PrintF("  coordinator: in trainer rank 0, 127.0.0.1:%d (job %s, secret in $%s)\n", port,
               job, kSecretEnv);
  absl::PrintF("  each step: trainers write version v, sync it; rollouts verify all %s they hold\n",
               Bytes(to.PieceBytes()));
  absl::PrintF("  calibration: %s\n",
               request.calibration.empty()
                   ? std::string("none (--calibration FILE predicts every step)")
                   : absl::StrCat(request.calibration, " (trainer rank 0 shares it at connect)"));
  std::vector<int> metrics_ports;  // By process, with --metrics.
  if (request.metrics) {
    for (int p = 0; p < trainers + rollouts; ++p) {
      WSYNC_ASSIGN_OR_RETURN(int metrics_port, harness::PickFreePort("127.0.0.1"));
      metrics_ports.push_back(metrics_port);
      absl::PrintF("  metrics: http://127.0.0.1:%d/metrics (%s %d)\n", metrics_port,
                   p < trainers ? "trainer" : "rollout", p < trainers ? p : p - trainers);
    }
  } else {
    absl::PrintF("  metrics: off (--metrics serves each process's metrics while it runs)\n");
  }
  std::fflush(stdout);

  const int total = trainers + rollouts;
  harness::ProcessesSpec spec;
  spec.processes = total;
  spec.env = {absl::StrCat(kSecretEnv, "=", secret)};
  spec.timeout = request.timeout;
  spec.command = [&](int p) {
    const bool trainer = p < trainers;
    std::vector<std::string> argv = {
        request.process_binary,
        absl::StrCat("--role=", trainer ? "trainer" : "rollout"),
        absl::StrCat("--rank=", trainer ? p : p - trainers),
        absl::StrCat("--trainers=", trainers),
        absl::StrCat("--rollouts=", rollouts),
        absl::StrCat("--job=", job),
        "--coordinator_host=127.0.0.1",
        absl::StrCat("--coordinator_port=", port),
        absl::StrCat("--secret_env=", kSecretEnv),
        absl::StrCat("--model=", request.model),
        absl::StrCat("--layers=", request.layers),
        absl::StrCat("--layout=", trainer ? request.from : request.to),
        absl::StrCat("--path_transports=", request.path_transports),
        absl::StrCat("--steps=", request.steps),
        absl::StrCat("--library=", request.library),
    };
    if (p == 0) argv.push_back("--host_coordinator");
    if (placed) {
      argv.push_back(absl::StrCat(
          "--node_id=", trainer ? from.processes[p].node_id : to.processes[p - trainers].node_id));
    }
    if (request.corrupt_step > 0) {
      argv.push_back(absl::StrCat("--corrupt_step=", request.corrupt_step));
    }
    if (request.metrics) {
      argv.push_back(absl::StrCat("--metrics_address=127.0.0.1:", metrics_ports[p]));
    }
    if (request.linger_s > 0) argv.push_back(absl::StrCat("--linger_s=", request.linger_s));
    if (request.verify) argv.push_back("--verify");
    if (request.verify_keyed) argv.push_back("--verify_keyed");
    if (!request.calibration.empty()) {
      argv.push_back(absl::StrCat("--calibration_file=", request.calibration));
    }
    return argv;
  };
  // Progress: a line once every process has connected, then one per step every process finished.
  bool connected_shown = false;
  int64_t steps_shown = 0;
  const absl::Time start = absl::Now();
  spec.on_poll = [&](const std::vector<std::string>& outputs) {
    std::vector<ProcessReport> reports;
    for (const std::string& text : outputs) reports.push_back(ParseOutput(text));
    if (!connected_shown && std::all_of(reports.begin(), reports.end(), [](const ProcessReport& r) {
          return r.connect_seconds.has_value();
        })) {
      connected_shown = true;
      double slowest = 0;
      for (const ProcessReport& r : reports) slowest = std::max(slowest, *r.connect_seconds);
      absl::PrintF("connected: %d processes (rendezvous, plan, schedule, agreement: %.2f s)\n",
                   total, slowest);
      for (const std::string& line : reports[0].schedule) absl::PrintF("  %s\n", line);
      if (rollouts > 0 && !reports[trainers].schedule.empty()) {
        absl::PrintF("  %s\n", reports[trainers].schedule[0]);
      }
    }
    while (steps_shown < request.steps) {
      const StepSummary s = Summarize(reports, trainers, steps_shown + 1);
      if (s.reported < total) break;
      ++steps_shown;
      absl::PrintF(
          "step %d/%d: transfer %.3f s, %.2f GB/s, %d rounds; sync call %.3f s; trainers wrote "
          "in %.2f s, %d/%d rollouts verified every byte in %.2f s%s  [%.1f s]\n",
          steps_shown, request.steps, s.seconds, s.GigabytesPerSecond(), s.rounds, s.sync_seconds,
          s.fill_seconds, s.verified, rollouts, s.check_seconds,
          s.first_error.empty() ? "" : absl::StrCat(" -- ", s.first_error),
          absl::ToDoubleSeconds(absl::Now() - start));
      if (steps_shown == request.steps && request.metrics) {
        int64_t received = 0;  // What the rollouts' wsync_bytes_received_total must add up to.
        for (int64_t v = 1; v <= request.steps; ++v) {
          received += Summarize(reports, trainers, v).received;
        }
        absl::PrintF(
            "metrics: after %d steps the rollouts received %d bytes in total "
            "(sum of wsync_bytes_received_total); version %d; serving for %.1f s more\n",
            request.steps, received, request.steps, request.linger_s);
      }
    }
    std::fflush(stdout);
  };
  WSYNC_ASSIGN_OR_RETURN(std::vector<harness::ProcessResult> results, harness::RunProcesses(spec));

  std::vector<ProcessReport> reports;
  bool all_exited_ok = true;
  for (int p = 0; p < total; ++p) {
    const harness::ProcessResult& r = results[p];
    reports.push_back(ParseOutput(r.stdout_text));
    if (r.exit_code != 0) {
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
  }
  // The secret must not leak into anything the demo shows.
  for (const harness::ProcessResult& r : results) {
    if (r.stdout_text.find(secret) != std::string::npos ||
        r.stderr_text.find(secret) != std::string::npos) {
      return absl::InternalError("a process printed the job secret");
    }
  }

  absl::PrintF("\n%4s %9s %7s %6s %10s %10s %10s %10s %10s %20s  %s\n", "step", "seconds", "GB/s",
               "rounds", "sent", "received", "direct", "staged", "arena peak", "predicted",
               "verified");
  bool all_verified = all_exited_ok;
  std::string predicted = "n/a: no calibration";
  if (!request.calibration.empty()) {
    if (reports.empty() || !reports[0].predicted_seconds.has_value()) {
      predicted = "n/a: not priced";
    } else if (reports[0].unpriced.empty()) {
      predicted = absl::StrFormat("%.3f", *reports[0].predicted_seconds);
    } else {  // A lower bound: the priced part of the traffic.
      predicted = *reports[0].predicted_seconds > 0
                      ? absl::StrFormat(">=%.3f", *reports[0].predicted_seconds)
                      : std::string("n/a: not priced");
    }
  }
  for (int64_t v = 1; v <= request.steps; ++v) {
    const StepSummary s = Summarize(reports, trainers, v);
    std::string verified;
    if (s.reported == 0) {
      all_verified = false;
      absl::PrintF("%4s  not run\n",
                   v == request.steps ? absl::StrCat(v) : absl::StrCat(v, "-", request.steps));
      break;
    }
    if (s.verified == rollouts && s.first_error.empty() && s.reported == total) {
      verified = absl::StrFormat("ok (%d/%d rollouts)", s.verified, rollouts);
    } else {
      verified = absl::StrFormat("FAILED (%d/%d rollouts ok%s%s)", s.verified, rollouts,
                                 s.first_error.empty() ? "" : "; ", s.first_error);
    }
    if (verified.rfind("ok", 0) != 0) all_verified = false;
    absl::PrintF("%4d %9.3f %7.2f %6d %10s %10s %10s %10s %10s %20s  %s\n", v, s.seconds,
                 s.GigabytesPerSecond(), s.rounds, Bytes(s.sent), Bytes(s.received),
                 Bytes(s.direct), Bytes(s.staged), Bytes(s.arena), predicted, verified);
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
  absl::PrintF("%s\n", request.metrics ? "metrics: served at the URLs above while the processes ran"
                                       : "metrics: off (--metrics to export them)");
  absl::PrintF("%s in %.1f s\n",
               all_verified ? absl::StrFormat("every byte of all %d steps verified on all %d "
                                              "rollouts",
                                              request.steps, rollouts)
                            : std::string("FAILED: not every step verified"),
               absl::ToDoubleSeconds(absl::Now() - start));
  return all_verified ? 0 : 1;
}

}  // namespace

std::string DemoUsage() {
  return "usage: wsync demo [--model M] [--from LAYOUT] [--to LAYOUT] [--trainers N]\n"
         "                  [--rollouts N] [--steps K] [--tls T | --path_transports P]\n"
         "                  [--layers N] [--demo_process BIN] [--library SO]\n"
         "                  [--metrics] [--linger_s S] [--verify] [--verify_keyed] [--calibration "
         "FILE]\n"
         "\n"
         "  Runs the main job on this machine: trainer and rollout processes that load\n"
         "  libwsync.so with dlopen and use its C ABI (trainer rank 0 hosts the coordinator),\n"
         "  K RL steps in which the trainers write version v and sync it and every rollout\n"
         "  verifies every byte; then a table per step.\n"
         "  --model     default qwen2.5-0.5b (`wsync plan --help` lists the models)\n"
         "  --from      trainer layout, default megatron(tp=2) (separate q/k/v, gate/up)\n"
         "  --to        rollout layout, default vllm(tp=2) (fused qkv_proj, gate_up_proj)\n"
         "              with a placement key (ppn=K, colocated=0|1; `wsync plan --help`) in\n"
         "              either, processes report the layouts' nodes (simulated on this machine),\n"
         "              else all report this machine's host name\n"
         "  --trainers, --rollouts  process counts; default (and they must equal) the layouts'\n"
         "  --steps     default 5\n"
         "  --tls       UCX transports of every path, default sm,cma,self (shared memory)\n"
         "  --path_transports  per path class, e.g. 'intra_node=ucx:sm,cma,self;*=ucx:tcp'\n"
         "  --layers    keep only the first N transformer layers (default: all)\n"
         "  --metrics   each process serves Prometheus metrics on 127.0.0.1 (URLs printed)\n"
         "  --linger_s  keep the processes alive S seconds after the last step (for a scrape)\n"
         "  --verify    the plugin's verify=true: every chunk hashed (xxh3) by sender and "
         "receiver\n"
         "  --verify_keyed  the plugin's keyed verify: a MAC per chunk keyed from the job secret\n"
         "  --calibration  a calibration (wsync calibrate --out) given to the plugin; the table\n"
         "              then shows each sync's predicted seconds\n";
}

int DemoMain(int argc, char** argv) {
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
  if (!absl::GetFlag(FLAGS_tls).empty() && !absl::GetFlag(FLAGS_path_transports).empty()) {
    absl::FPrintF(stderr, "wsync demo: give --tls or --path_transports, not both\n");
    return 2;
  }
  request.path_transports = absl::GetFlag(FLAGS_path_transports);
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
  request.verify = absl::GetFlag(FLAGS_verify);
  request.verify_keyed = absl::GetFlag(FLAGS_verify_keyed);
  if (!absl::GetFlag(FLAGS_calibration).empty()) {
    if (!IsFile(absl::GetFlag(FLAGS_calibration))) {
      absl::FPrintF(stderr, "wsync demo: cannot read --calibration %s\n",
                    absl::GetFlag(FLAGS_calibration));
      return 2;
    }
    request.calibration = Canonical(absl::GetFlag(FLAGS_calibration));
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
