#include "integration/bench/bench_compare.h"

#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

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
#include "absl/time/time.h"
#include "common/status.h"
#include "integration/bench/bench_broadcast.h"
#include "integration/bench/bench_jobs.h"
#include "integration/bench/bench_report.h"
#include "integration/bench/machine.h"
#include "integration/bench/perftest.h"
#include "integration/harness/launcher.h"
#include "integration/model_config/hf_config.h"
#include "planner/layout.h"
#include "planner/models.h"
#include "planner/named_layouts.h"

namespace wsync::bench {
namespace {

constexpr char kGlooTransport[] = "gloo tcp (lo)";

// Keeps the largest peak RSS seen per process over the runs of one result.
void KeepPeaks(const std::vector<int64_t>& peaks, int32_t trainers, Measured* m) {
  for (int32_t p = 0; p < static_cast<int32_t>(peaks.size()); ++p) {
    int64_t& kept = m->peak_rss_bytes[ProcessName(p, trainers)];
    kept = std::max(kept, peaks[p]);
  }
}

// The binaries and scripts a run needs, found once.
struct Tools {
  std::string self, perftest, python, scripts;
};

// ---------------------------------------------------------------------------------------------
// memcpy of the bytes one rollout process must receive, in a child process (`wsync-bench memcpy`):
// the launcher's own peak RSS is handed down to every child it spawns (posix_spawn shares its
// memory until exec), so the launcher itself never touches buffers of that size.

absl::StatusOr<double> RunMemcpyChild(const Tools& tools, int64_t bytes, int32_t round,
                                      absl::Duration timeout) {
  harness::ProcessesSpec spec;
  spec.processes = 1;
  spec.command = [&](int) {
    return std::vector<std::string>{tools.self, "memcpy",
                                    absl::StrCat("--compare_memcpy_bytes=", bytes),
                                    absl::StrCat("--compare_memcpy_pattern=", 0x5a ^ round)};
  };
  spec.timeout = timeout;
  WSYNC_ASSIGN_OR_RETURN(std::vector<harness::ProcessResult> r, harness::RunProcesses(spec));
  double seconds = 0;
  if (r[0].exit_code != 0 ||
      sscanf(r[0].stdout_text.c_str(), "MEMCPY seconds=%lf", &seconds) != 1) {
    return absl::InternalError(
        absl::StrCat("wsync-bench memcpy failed: ", r[0].stdout_text, TailOf(r[0].stderr_text)));
  }
  return seconds;
}

// ---------------------------------------------------------------------------------------------

Measured Result(std::string id, std::string description, std::string transport,
                std::string link_limit, std::string verification) {
  Measured m;
  m.id = std::move(id);
  m.description = std::move(description);
  m.transport = std::move(transport);
  m.link_limit = std::move(link_limit);
  m.verification = std::move(verification);
  return m;
}

Measured Limit(std::string id, std::string description, std::string transport,
               std::string verification) {
  Measured m = Result(std::move(id), std::move(description), std::move(transport), "",
                      std::move(verification));
  m.limit = true;
  return m;
}

// The goals, evaluated on this scenario's summaries; empty for every scenario but the one
// they are stated for (qwen2.5-0.5b megatron(tp=2) -> vllm(tp=2)).
std::vector<std::string> GoalLines(const Scenario& scenario) {
  if (scenario.model != "qwen2.5-0.5b" || scenario.from != "megatron(tp=2)" ||
      scenario.to != "vllm(tp=2)") {
    return {};
  }
  auto speedup = [&](const std::string& of, const std::string& over) -> std::optional<double> {
    std::optional<Summary> s = Summarize(scenario, of);
    if (!s.has_value() || !s->speedup.count(over)) return std::nullopt;
    return s->speedup.at(over);
  };
  auto line = [](const std::string& what, std::optional<double> value, double goal) {
    if (!value.has_value()) return absl::StrCat("  ", what, ": not measured");
    return absl::StrFormat("  %s: %.2f (goal >= %.2f: %s)", what, *value, goal,
                           *value >= goal ? "met" : "missed");
  };
  std::vector<std::string> lines = {
      "goals of the issue (stated for qwen2.5-0.5b megatron(tp=2) -> vllm(tp=2)):"};
  lines.push_back(
      line("wsync-tcp speed-up over per-param (both TCP)", speedup("wsync-tcp", "per-param"), 8));
  lines.push_back(
      line("wsync-tcp speed-up over bucketed (both TCP)", speedup("wsync-tcp", "bucketed"), 4));
  lines.push_back(line("wsync-shm speed-up over per-param", speedup("wsync-shm", "per-param"), 8));
  lines.push_back(line("wsync-shm speed-up over bucketed", speedup("wsync-shm", "bucketed"), 4));
  for (const char* id : {"wsync-shm", "wsync-tcp"}) {
    std::optional<Summary> s = Summarize(scenario, id);
    lines.push_back(line(absl::StrCat(id, " fraction of its ucx_perftest limit"),
                         s.has_value() ? s->fraction_of_link : std::nullopt, 0.85));
  }
  return lines;
}

// What the runs of one scenario share.
struct ScenarioRun {
  const CompareBenchOptions& options;  // options.job's binaries resolved.
  const Tools& tools;
  std::string model_name, from, to, work_dir;
  std::string spec_path;  // The layouts as JSON, for the broadcast contestants.
  ScheduleFacts facts;
  Transports shm, tcp;
  int64_t message = 0;  // ucx_perftest's message: the schedule's largest.
  int32_t iters = 0;    // ucx_perftest's iterations.
  int32_t syncs = 0, warmup = 0;
};

// The contestants and limits of a scenario, in table order, without measurements.
std::vector<Measured> Contestants(const ScenarioRun& run) {
  const std::string rollout_check = "every element of every rollout piece, every sync";
  const std::string wsync_check =
      absl::StrCat("a verified job of 2 versions first (",
                   VerificationText(VerificationCheck(run.options.job.verify_elements)),
                   "); timed jobs: bytes and rounds each rollout received equal the schedule");
  const std::string perftest =
      absl::StrFormat("ucx_perftest tag_bw, one pair, %d x %d B", run.iters, run.message);
  const std::string tcp_name = absl::StrCat("UCX tcp (", run.tcp.devices, ")");
  return {
      Result("wsync-shm", absl::StrCat("wsync over UCX shared memory (UCX_TLS=", run.shm.tls, ")"),
             "UCX shm", "perftest-shm", wsync_check),
      Result("wsync-tcp",
             absl::StrCat("wsync over UCX TCP (UCX_TLS=", run.tcp.tls, ", devices ",
                          run.tcp.devices, ")"),
             tcp_name, "perftest-tcp", wsync_check),
      Result("per-param",
             "per-parameter broadcast: trainer 0 gathers each parameter and broadcasts it "
             "(torch.distributed gloo)",
             kGlooTransport, "perftest-tcp", rollout_check),
      Result("bucketed",
             absl::StrFormat("bucketed broadcast: whole parameters in %.0f MiB buckets "
                             "(torch.distributed gloo)",
                             run.options.bucket_bytes / 1048576.0),
             kGlooTransport, "perftest-tcp", rollout_check),
      Limit("perftest-shm", perftest, "UCX shm", "not applicable: moves no weights"),
      Limit("perftest-tcp", perftest, tcp_name, "not applicable: moves no weights"),
      Limit("memcpy", "memcpy of the bytes one rollout process must receive, one thread", "memory",
            "memcmp of the copy against its source"),
  };
}

// One run of contestant `m` in `round`: its s/sync samples. Keeps its processes' peak RSS in
// `m`; a broadcast's bucket line goes to `buckets_line`. `verified` becomes true for the
// contestants whose every run checks what it moved (broadcasts, memcpy).
absl::StatusOr<std::vector<double>> MeasureOnce(const ScenarioRun& run, int32_t round, Measured& m,
                                                bool& verified, std::string& buckets_line) {
  std::vector<double> samples;
  const ScheduleFacts& facts = run.facts;
  if (m.id == "wsync-shm" || m.id == "wsync-tcp") {
    std::vector<int64_t> peaks;
    WSYNC_ASSIGN_OR_RETURN(
        std::vector<SyncSample> s,
        RunWsync(facts, run.model_name, run.from, run.to, m.id == "wsync-shm" ? run.shm : run.tcp,
                 run.warmup, run.syncs, JobCheck::kNone, run.options.job, &peaks));
    for (const SyncSample& sample : s) samples.push_back(sample.seconds);
    KeepPeaks(peaks, facts.trainers, &m);
  } else if (m.id == "per-param" || m.id == "bucketed") {
    const BroadcastOptions options{run.tools.python, run.tools.scripts,
                                   m.id == "per-param" ? "param" : "bucket",
                                   run.options.bucket_bytes, absl::Seconds(run.options.timeout_s)};
    WSYNC_ASSIGN_OR_RETURN(BroadcastRun broadcast,
                           RunBroadcast(options, run.spec_path, facts.trainers, facts.rollouts,
                                        run.warmup, run.syncs));
    samples = broadcast.seconds;
    KeepPeaks(broadcast.peak_rss_bytes, facts.trainers, &m);
    if (m.id == "bucketed") buckets_line = broadcast.buckets_line;
    verified = true;
  } else if (m.id == "memcpy") {
    WSYNC_ASSIGN_OR_RETURN(const double seconds,
                           RunMemcpyChild(run.tools, facts.bytes_per_rollout, round,
                                          absl::Seconds(run.options.timeout_s)));
    samples.push_back(seconds);
    verified = true;
  } else {
    const Transports& transports = m.id == "perftest-shm" ? run.shm : run.tcp;
    WSYNC_ASSIGN_OR_RETURN(
        PerftestResult r,
        RunPerftest(run.tools.perftest, run.work_dir, transports.tls, transports.devices,
                    run.message, run.iters, 1, absl::Seconds(run.options.timeout_s)));
    if (r.bytes_per_second.empty() || r.bytes_per_second[0] <= 0) {
      return absl::InternalError(absl::StrCat(m.id, " reported no bandwidth"));
    }
    samples.push_back(facts.bytes_per_rollout / r.bytes_per_second[0]);
  }
  return samples;
}

// The notes under a scenario's table: what each column means, the buckets, the goals.
void AddNotes(const ScenarioRun& run, int32_t repeats, const std::string& buckets_line,
              Scenario& scenario) {
  scenario.notes.push_back(
      "broadcast contestants (per-param, bucketed): torch.distributed over gloo, i.e. TCP over "
      "loopback (GLOO_SOCKET_IFNAME=lo); compare them with wsync-tcp (TCP too) and with "
      "wsync-shm.");
  int64_t bucket_count = 0, largest_bucket = 0;
  if (sscanf(buckets_line.c_str(), "BUCKETS count=%ld largest_bytes=%ld", &bucket_count,
             &largest_bucket) == 2) {
    scenario.notes.push_back(absl::StrFormat(
        "bucketed: %d bucket(s) of at most %.0f MiB; the largest holds %.2f MiB%s.", bucket_count,
        run.options.bucket_bytes / 1048576.0, largest_bucket / 1048576.0,
        bucket_count == 1 ? " (the whole model fits in one bucket)" : ""));
  }
  scenario.notes.push_back(absl::StrFormat(
      "s/sync: wsync: transfer of the slowest process after the plan-digest agreement (commit "
      "decision excluded); broadcasts: from a barrier until the slowest process is done; limits: "
      "the busiest rollout's bytes at the measured rate. %d round(s), %d timed sync(s) per run "
      "after %d warm-up.",
      repeats, run.syncs, run.warmup));
  scenario.notes.push_back(absl::StrFormat(
      "GB/s/roll: the busiest rollout's %d B / median s/sync, for every row (a broadcast moves "
      "more than that: every rollout receives whole parameters). x ID: that contestant's median "
      "s/sync / this one's. of link: GB/s/roll / that of ucx_perftest on its transport (gloo: "
      "tcp); of mcpy: / memcpy's.",
      run.facts.bytes_per_rollout));
  rusage self = {};
  getrusage(RUSAGE_SELF, &self);
  scenario.notes.push_back(absl::StrFormat(
      "peak RSS: wait4's ru_maxrss of each process, which includes the launcher's own peak (%.0f "
      "MiB here) since posix_spawn shares its memory until exec.",
      self.ru_maxrss / 1024.0));
  for (const std::string& line : GoalLines(scenario)) scenario.notes.push_back(line);
}

absl::StatusOr<Scenario> RunScenario(const CompareBenchOptions& options, const Tools& tools,
                                     const std::string& model_name, const std::string& from,
                                     const std::string& to, const std::string& work_dir,
                                     int32_t index, std::FILE* out) {
  const int32_t repeats = std::max(1, options.repeats);
  WSYNC_ASSIGN_OR_RETURN(const ModelSpec model, LoadModel(model_name));
  WSYNC_ASSIGN_OR_RETURN(const ScheduleFacts facts,
                         ScheduleFactsFor(model, from, to, options.job.budget, options.job.policy));
  WSYNC_ASSIGN_OR_RETURN(const Layout trainers, BuildNamedLayout(model, from));
  WSYNC_ASSIGN_OR_RETURN(const Layout rollouts, BuildNamedLayout(model, to));
  WSYNC_ASSIGN_OR_RETURN(const std::string spec_json,
                         LayoutSpecJson(model_name, trainers, rollouts));
  const ScenarioRun run{.options = options,
                        .tools = tools,
                        .model_name = model_name,
                        .from = from,
                        .to = to,
                        .work_dir = work_dir,
                        .spec_path = absl::StrCat(work_dir, "/layout", index, ".json"),
                        .facts = facts,
                        .shm = {"shm", options.shm_tls, ""},
                        .tcp = {"tcp", options.tcp_tls, options.tcp_devices},
                        .message = facts.largest_message,
                        .iters = PerftestIterations(facts, facts.largest_message),
                        .syncs = std::max(1, options.syncs),
                        .warmup = std::max(0, options.warmup)};
  {
    std::ofstream file(run.spec_path);
    file << spec_json;
    if (!file.good()) return absl::InternalError(absl::StrCat("cannot write ", run.spec_path));
  }

  Scenario scenario;
  scenario.model = model_name;
  scenario.from = from;
  scenario.to = to;
  scenario.trainers = facts.trainers;
  scenario.rollouts = facts.rollouts;
  scenario.rollout_bytes = facts.bytes_per_rollout;
  scenario.results = Contestants(run);

  absl::FPrintF(out,
                "\n[%d] %s, %s -> %s: %d trainers, %d rollouts; busiest rollout receives %.2f MiB "
                "per sync; largest message %d B\n",
                index, model_name, from, to, facts.trainers, facts.rollouts,
                facts.bytes_per_rollout / 1048576.0, run.message);
  std::fflush(out);

  // Each transport gets one verification job of 2 versions first: every chunk's hash compared
  // between sender and receiver over distinct bytes, or with --verify_elements every rollout
  // element against its logical value (the test reference's xxh3 per element: about a minute per
  // GB per version here); the timed jobs then check the bytes and rounds every rollout received
  // against the schedule. The broadcast rollouts check every element after every sync
  // (vectorized torch).
  const JobCheck check = VerificationCheck(options.job.verify_elements);
  std::map<std::string, bool> ok;
  for (Measured& m : scenario.results) {
    if (m.id != "wsync-shm" && m.id != "wsync-tcp") continue;
    const absl::Time start = absl::Now();
    WSYNC_RETURN_IF_ERROR(RunWsync(facts, model_name, from, to,
                                   m.id == "wsync-shm" ? run.shm : run.tcp,
                                   /*warmup=*/0, /*syncs=*/2, check, options.job)
                              .status());
    ok[m.id] = true;
    absl::FPrintF(out, "  verified %s: 2 versions, %s (%.1f s)\n", m.id, VerificationText(check),
                  absl::ToDoubleSeconds(absl::Now() - start));
    std::fflush(out);
  }

  std::string buckets_line;
  const int n = static_cast<int>(scenario.results.size());
  for (int32_t round = 0; round < repeats; ++round) {
    for (int k = 0; k < n; ++k) {
      // The starting contestant rotates, so that slow phases of the machine hit each in turn.
      Measured& m = scenario.results[(k + round) % n];
      const absl::Time start = absl::Now();
      WSYNC_ASSIGN_OR_RETURN(const std::vector<double> samples,
                             MeasureOnce(run, round, m, ok[m.id], buckets_line));
      m.seconds.insert(m.seconds.end(), samples.begin(), samples.end());
      std::vector<std::string> cells;
      for (double s : samples) cells.push_back(absl::StrFormat("%.4f", s));
      absl::FPrintF(out, "  round %d/%d %-12s %s s (%.1f s wall)\n", round + 1, repeats, m.id,
                    absl::StrJoin(cells, " "), absl::ToDoubleSeconds(absl::Now() - start));
      std::fflush(out);
    }
  }
  for (Measured& m : scenario.results) m.verified = ok[m.id];
  AddNotes(run, repeats, buckets_line, scenario);
  absl::FPrintF(out, "\n%s", FormatTable(scenario));
  std::fflush(out);
  return scenario;
}

// Writes compare.json (and compare.png with --compare_plot) for the scenarios so far.
absl::Status WriteResults(const CompareBenchOptions& options, const Tools& tools,
                          const std::vector<Scenario>& scenarios, const std::string& out_dir,
                          const std::string& date, const std::string& machine,
                          const std::string& command, std::FILE* out) {
  const std::string json_path = out_dir + "/compare.json";
  {
    std::ofstream file(json_path);
    file << ToJson(scenarios, date, machine, command);
    if (!file.good()) return absl::InternalError(absl::StrCat("cannot write ", json_path));
  }
  absl::FPrintF(out, "\nwrote %s\n", json_path);
  if (options.plot) {
    const std::string png_path = out_dir + "/compare.png";
    harness::ProcessesSpec plot;
    plot.processes = 1;
    plot.command = [&](int) {
      return std::vector<std::string>{tools.python, tools.scripts + "/plot_compare.py", json_path,
                                      png_path};
    };
    plot.timeout = absl::Seconds(120);
    WSYNC_ASSIGN_OR_RETURN(std::vector<harness::ProcessResult> r, harness::RunProcesses(plot));
    if (r[0].exit_code != 0) {
      return absl::InternalError(absl::StrCat(
          "plot_compare.py failed (python3-matplotlib installed?): ", TailOf(r[0].stderr_text)));
    }
    absl::FPrintF(out, "wrote %s\n", png_path);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunMemcpyProbe(int64_t bytes, int32_t pattern_value, std::FILE* out) {
  if (bytes <= 0) return absl::InvalidArgumentError("--compare_memcpy_bytes must be positive");
  const auto pattern = static_cast<unsigned char>(pattern_value);
  std::vector<unsigned char> from(bytes, pattern), to(bytes, static_cast<unsigned char>(~pattern));
  const absl::Time start = absl::Now();
  std::memcpy(to.data(), from.data(), bytes);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (std::memcmp(to.data(), from.data(), bytes) != 0) {
    return absl::DataLossError("memcpy produced different bytes");
  }
  absl::FPrintF(out, "MEMCPY seconds=%.9f bytes=%d\n", seconds, bytes);
  return absl::OkStatus();
}

std::string CompareBenchUsage() {
  return "wsync-bench compare [--model M,M] [--compare_long] [--from L;L] [--to L;L]\n"
         "                    [--repeats R] [--out DIR] [--compare_syncs K] [--compare_warmup W]\n"
         "                    [--compare_bucket_bytes B] [--compare_python PATH]\n"
         "                    [--compare_scripts DIR] [--compare_plot] [--compare_timeout_s S]\n"
         "                    [--verify_elements] [--sync_timeout_s S] [--staging_budget_bytes B]\n"
         "                    [--replica_policy P]\n"
         "  Every scenario of the models (default qwen2.5-0.5b), trainer layouts (';'-separated,\n"
         "  default megatron(tp=2)) and rollout layouts (default vllm(tp=2); --compare_long:\n"
         "  models qwen2.5-0.5b,llama-3.2-1b to vllm(tp=2);vllm(tp=1,dp=2)): wsync over UCX shm\n"
         "  and TCP, the per-parameter and the bucketed broadcast over gloo, ucx_perftest and\n"
         "  memcpy, in turn R times (default 2), K timed syncs per run (default 3). wsync's\n"
         "  transports each get a verification job first (every chunk's xxh3 compared between\n"
         "  sender and receiver; --verify_elements: every rollout element); the broadcast\n"
         "  rollouts check every element after every sync. Prints a table per scenario and\n"
         "  writes compare.json and\n"
         "  compare.png to DIR (default bench-results/compare). `wsync-bench memcpy\n"
         "  --compare_memcpy_bytes N` is its memcpy limit, run as a child process.\n";
}

absl::Status RunCompareBench(const CompareBenchOptions& given, std::FILE* out) {
  const absl::Time bench_start = absl::Now();
  CompareBenchOptions options = given;
  const std::string& out_dir = options.out_dir;
  Tools tools;
  WSYNC_ASSIGN_OR_RETURN(tools.self, SelfPath());
  WSYNC_RETURN_IF_ERROR(ResolveBinaries(tools.self, &options.job));
  WSYNC_ASSIGN_OR_RETURN(tools.perftest, FindInPath(options.perftest, "sync_perftest"));
  WSYNC_ASSIGN_OR_RETURN(tools.python, FindInPath(options.python, "compare_python"));
  tools.scripts = options.scripts;
  if (access((tools.scripts + "/broadcast_sync.py").c_str(), R_OK) != 0) {
    return absl::NotFoundError(
        absl::StrCat(tools.scripts, "/broadcast_sync.py not found; pass --compare_scripts"));
  }
  std::error_code error;
  std::filesystem::create_directories(out_dir, error);
  if (error)
    return absl::InternalError(absl::StrCat("cannot create ", out_dir, ": ", error.message()));
  char dir_template[] = "/tmp/wsync-bench-compare-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) return absl::InternalError("mkdtemp failed");
  const std::string work_dir = dir_template;

  const std::string machine = MachineDescription();
  const std::string date = absl::FormatTime("%Y-%m-%d %H:%M UTC", bench_start, absl::UTCTimeZone());
  absl::FPrintF(out, "wsync-bench compare, %s\n  machine: %s\n  command: %s\n", date, machine,
                options.command);
  std::vector<Scenario> scenarios;
  absl::Status status;
  int32_t index = 0;
  for (absl::string_view model : absl::StrSplit(options.models, ',', absl::SkipWhitespace())) {
    for (absl::string_view from : absl::StrSplit(options.froms, ';', absl::SkipWhitespace())) {
      for (absl::string_view to : absl::StrSplit(options.tos, ';', absl::SkipWhitespace())) {
        if (!status.ok()) break;
        absl::StatusOr<Scenario> scenario =
            RunScenario(options, tools, std::string(absl::StripAsciiWhitespace(model)),
                        std::string(absl::StripAsciiWhitespace(from)),
                        std::string(absl::StripAsciiWhitespace(to)), work_dir, ++index, out);
        if (scenario.ok()) {
          scenarios.push_back(*std::move(scenario));
          // After every scenario, so that a later failure keeps the finished ones.
          status =
              WriteResults(options, tools, scenarios, out_dir, date, machine, options.command, out);
        } else {
          status = absl::Status(
              scenario.status().code(),
              absl::StrCat(model, " ", from, " -> ", to, ": ", scenario.status().message()));
        }
      }
    }
  }
  std::filesystem::remove_all(work_dir, error);
  WSYNC_RETURN_IF_ERROR(status);

  absl::FPrintF(out, "total %.1f s\n", absl::ToDoubleSeconds(absl::Now() - bench_start));
  return absl::OkStatus();
}

}  // namespace wsync::bench
