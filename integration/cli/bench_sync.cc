#include "integration/cli/bench_sync.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
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
#include "executor/schedule.h"
#include "integration/cli/bench_report.h"
#include "integration/cli/perftest.h"
#include "integration/harness/launcher.h"
#include "planner/job.h"
#include "planner/models.h"
#include "planner/named_layouts.h"
#include "planner/plan.h"
#include "planner/policy.h"

ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, from);
ABSL_DECLARE_FLAG(std::string, to);
ABSL_DECLARE_FLAG(std::string, policy);
ABSL_DECLARE_FLAG(double, budget);
ABSL_DECLARE_FLAG(std::string, memory);

ABSL_FLAG(int32_t, sync_syncs, 5, "Timed syncs per wsync job (after the warm-up syncs).");
ABSL_FLAG(int32_t, sync_warmup, 1, "Untimed syncs at the start of every wsync job.");
ABSL_FLAG(int32_t, sync_rounds, 4,
          "Times the contestants (wsync shm, perftest shm, wsync tcp, perftest tcp) run, in turn.");
ABSL_FLAG(bool, sync_verify, true,
          "First run one job per transport that checks every received byte (2 versions).");
ABSL_FLAG(
    bool, verify, false,
    "Also time wsync with verify=true (xxh3 per chunk, checked before the commit) in the same "
    "rounds, and print its cost as the ratio of seconds per sync with and without it.");
ABSL_FLAG(std::string, sync_shm_tls, "sm,cma,self", "UCX_TLS of the shared-memory contestants.");
ABSL_FLAG(std::string, sync_tcp_tls, "tcp", "UCX_TLS of the TCP contestants.");
ABSL_FLAG(std::string, sync_tcp_devices, "lo", "UCX_NET_DEVICES of the TCP contestants.");
ABSL_FLAG(std::string, sync_worker, "",
          "wsync_test_worker binary; default: found next to this binary or in its build tree.");
ABSL_FLAG(std::string, sync_perftest, "ucx_perftest", "ucx_perftest binary (searched in PATH).");
ABSL_FLAG(int32_t, sync_perftest_iters, 0,
          "Messages per ucx_perftest run; 0: as many as carry two syncs' bytes to one rollout "
          "process.");
ABSL_FLAG(int64_t, sync_perftest_size, 0,
          "ucx_perftest message bytes; 0: the largest message the schedule sends.");
ABSL_FLAG(bool, sync_perftest_concurrent, true,
          "Also run as many concurrent ucx_perftest pairs as the schedule has busy sender -> "
          "receiver pairs (each carrying at least a quarter of the busiest pair's bytes).");
ABSL_FLAG(int32_t, sync_perftest_pairs, 0,
          "Concurrent ucx_perftest pairs; 0: the schedule's busy sender -> receiver pairs.");
ABSL_FLAG(std::string, sync_single_from, "megatron(tp=1)",
          "Trainer layout of the 1->1 wsync contestant (compared with one ucx_perftest pair); "
          "empty: none.");
ABSL_FLAG(std::string, sync_single_to, "vllm(tp=1)", "Rollout layout of the 1->1 contestant.");
ABSL_FLAG(bool, sync_perftest_wsync_settings, true,
          "Run ucx_perftest with the UCX settings wsync's processes apply (UcxDefaultSettings); "
          "false: with UCX's own defaults.");
ABSL_FLAG(double, sync_timeout_s, 90, "Limit of each child job or ucx_perftest run, seconds.");
ABSL_FLAG(std::string, sync_json, "", "Also write the table as JSON to this path.");

namespace wsync::cli {
namespace {

// ---------------------------------------------------------------------------------------------
// Small helpers.

std::string MiB(double bytes) { return absl::StrFormat("%.2f MiB", bytes / (1 << 20)); }

bool Executable(const std::string& path) {
  return !path.empty() && access(path.c_str(), X_OK) == 0;
}

std::string Dirname(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

}  // namespace

absl::StatusOr<std::string> SelfPath() {
  char buffer[4096];
  const ssize_t n = readlink("/proc/self/exe", buffer, sizeof(buffer) - 1);
  if (n <= 0) return absl::InternalError("cannot read /proc/self/exe");
  return std::string(buffer, n);
}

absl::StatusOr<std::string> FindWorker(const std::string& self) {
  const std::string flag = absl::GetFlag(FLAGS_sync_worker);
  if (!flag.empty()) {
    if (Executable(flag)) return flag;
    return absl::NotFoundError(absl::StrCat("--sync_worker ", flag, " is not an executable file"));
  }
  const std::string dir = Dirname(self);
  const std::vector<std::string> candidates = {dir + "/wsync_test_worker",
                                               dir + "/../../tests/multiproc/wsync_test_worker"};
  for (const std::string& candidate : candidates) {
    if (Executable(candidate)) return candidate;
  }
  return absl::NotFoundError(
      absl::StrCat("wsync_test_worker not found (looked for ", absl::StrJoin(candidates, " and "),
                   "); build the target wsync_test_worker or pass --sync_worker"));
}

absl::StatusOr<std::string> FindInPath(const std::string& name) {
  if (absl::StrContains(name, "/")) {
    if (Executable(name)) return name;
    return absl::NotFoundError(absl::StrCat(name, " is not an executable file"));
  }
  const char* path = getenv("PATH");
  for (absl::string_view dir :
       absl::StrSplit(path != nullptr ? path : "", ':', absl::SkipEmpty())) {
    const std::string candidate = absl::StrCat(dir, "/", name);
    if (Executable(candidate)) return candidate;
  }
  return absl::NotFoundError(absl::StrCat(
      name, " not found in PATH (Debian: apt-get install ucx-utils); or pass --sync_perftest"));
}

// ---------------------------------------------------------------------------------------------
// What the schedule sends to a rollout process.

absl::StatusOr<ScheduleFacts> ScheduleFactsFor(const ModelSpec& model, const std::string& from,
                                               const std::string& to, double budget) {
  WSYNC_ASSIGN_OR_RETURN(Layout source, BuildNamedLayout(model, from));
  WSYNC_ASSIGN_OR_RETURN(Layout target, BuildNamedLayout(model, to));
  ScheduleFacts facts;
  facts.trainers = static_cast<int32_t>(source.processes.size());
  facts.rollouts = static_cast<int32_t>(target.processes.size());
  // As the jobs run them: every process on node "local" (the replica policy looks at nodes).
  for (ProcessInfo& p : source.processes) p.node_id = "local";
  for (ProcessInfo& p : target.processes) p.node_id = "local";
  WSYNC_ASSIGN_OR_RETURN(Job job, Job::Create(std::move(source), std::move(target)));
  WSYNC_ASSIGN_OR_RETURN(auto policy, MakeReplicaPolicy(absl::GetFlag(FLAGS_policy)));
  WSYNC_ASSIGN_OR_RETURN(Plan plan, MakePlan(job, *policy));
  Endpoints endpoints;
  for (int32_t p = 0; p < job.num_processes(); ++p) endpoints.processes.push_back(p);
  WSYNC_ASSIGN_OR_RETURN(std::vector<ProcessSchedule> schedules,
                         ScheduleTransfers(job, plan.segments, endpoints, StagingBudget{budget}));
  for (const ProcessSchedule& s : schedules) {
    if (job.IsSource(s.process)) continue;
    for (const PeerSchedule& peer : s.peers) {
      if (peer.direction != Direction::kReceive) continue;
      int64_t bytes = 0;
      for (const ScheduledRound& round : peer.rounds) bytes += round.bytes;
      if (bytes > 0) facts.pair_bytes.push_back(bytes);
    }
    facts.bytes_total += s.received_bytes;
    facts.rounds = std::max(facts.rounds, s.rounds);
    std::vector<int64_t> sizes;
    int64_t direct = 0;
    for (const PeerSchedule& peer : s.peers) {
      if (peer.direction != Direction::kReceive) continue;
      for (const ScheduledRound& round : peer.rounds) {
        sizes.push_back(round.bytes);
        direct += round.direct ? 1 : 0;
        if (round.bytes > facts.largest_message) {
          facts.largest_message = round.bytes;
          facts.largest_direct = round.direct;
        }
      }
    }
    if (s.received_bytes < facts.bytes_per_rollout) continue;
    facts.bytes_per_rollout = s.received_bytes;
    facts.messages = static_cast<int64_t>(sizes.size());
    facts.direct_messages = direct;
    std::sort(sizes.begin(), sizes.end());
    int64_t running = 0;
    for (int64_t size : sizes) {
      running += size;
      if (2 * running >= s.received_bytes) {
        facts.median_message = size;
        break;
      }
    }
  }
  if (facts.largest_message <= 0) {
    return absl::FailedPreconditionError("the plan sends nothing to the rollout processes");
  }
  std::sort(facts.pair_bytes.rbegin(), facts.pair_bytes.rend());
  for (int64_t bytes : facts.pair_bytes) facts.busy_pairs += 4 * bytes >= facts.pair_bytes[0];
  return facts;
}

int32_t PerftestIterations(const ScheduleFacts& facts, int64_t message_bytes) {
  return static_cast<int32_t>(
      std::max<int64_t>(10, (facts.bytes_per_rollout * 2 + message_bytes - 1) / message_bytes));
}

// ---------------------------------------------------------------------------------------------
// wsync jobs.

namespace {

double Field(const std::map<std::string, std::string>& stats, const std::string& key) {
  double value = 0;
  auto it = stats.find(key);
  if (it != stats.end()) absl::SimpleAtod(it->second, &value);
  return value;
}

}  // namespace

absl::StatusOr<std::vector<SyncSample>> RunWsync(const ScheduleFacts& facts,
                                                 const std::string& model, const std::string& from,
                                                 const std::string& to, const Transports& t,
                                                 int32_t warmup, int32_t syncs, bool verify,
                                                 bool hashes, const std::string& worker,
                                                 const std::string& cli, absl::Duration limit,
                                                 std::vector<int64_t>* peak_rss_bytes) {
  harness::JobSpec spec;
  spec.model = model;
  spec.from = from;
  spec.to = to;
  spec.trainers = facts.trainers;
  spec.rollouts = facts.rollouts;
  spec.tls = t.tls;
  spec.versions = warmup + syncs;
  spec.budget = absl::GetFlag(FLAGS_budget);
  spec.timeout = limit;
  spec.rendezvous_timeout = absl::Seconds(30);
  if (!t.devices.empty()) {
    spec.placement.assign(facts.trainers + facts.rollouts,
                          harness::ProcessPlacement{"", "local", t.devices, {}});
  }
  spec.extra_worker_flags = {"--policy", absl::GetFlag(FLAGS_policy),
                             absl::StrCat("--verify=", verify ? "true" : "false"),
                             absl::StrCat("--verify_hashes=", hashes ? "true" : "false"),
                             absl::StrCat("--deadline_s=", absl::ToDoubleSeconds(limit))};
  WSYNC_ASSIGN_OR_RETURN(harness::JobResult result, harness::RunJob(spec, worker, cli));
  const int total = facts.trainers + facts.rollouts;
  for (int p = 0; p < total; ++p) {
    const harness::WorkerResult& w = result.workers[p];
    if (w.exit_code != 0 || static_cast<int>(w.stats.size()) != spec.versions) {
      return absl::InternalError(absl::StrFormat(
          "wsync job over UCX_TLS=%s: process %d exited %d%s with %d of %d STATS lines: %s", t.tls,
          p, w.exit_code, w.exit_code == -1 ? " (killed at the limit)" : "", w.stats.size(),
          spec.versions, TailOf(w.stderr_text)));
    }
  }
  if (peak_rss_bytes != nullptr) {
    peak_rss_bytes->clear();
    for (const harness::WorkerResult& w : result.workers)
      peak_rss_bytes->push_back(w.peak_rss_bytes);
  }
  std::vector<SyncSample> samples;
  for (int v = warmup; v < spec.versions; ++v) {
    SyncSample s;
    int32_t rounds = 0;
    for (int p = 0; p < total; ++p) {
      const auto& stats = result.workers[p].stats[v];
      const double seconds = Field(stats, "seconds");
      const double call = Field(stats, "call_seconds");
      const double decide = Field(stats, "decide_seconds");
      if (p == 0 || seconds > s.seconds) s.decide_seconds = decide;
      s.seconds = std::max(s.seconds, seconds);
      s.agree_seconds = std::max(s.agree_seconds, call - seconds);
      s.step_seconds = std::max(s.step_seconds, call + decide);
      s.cpu_seconds += Field(stats, "cpu_seconds");
      s.cpu_user_seconds += Field(stats, "cpu_user_seconds");
      if (p >= facts.trainers) {
        const auto received = static_cast<int64_t>(Field(stats, "received"));
        s.rollout_bytes = std::max(s.rollout_bytes, received);
        rounds = std::max(rounds, static_cast<int32_t>(Field(stats, "rounds")));
        s.total_bytes += received;
        if (hashes && Field(stats, "verified") <= 0 && received > 0) {
          return absl::InternalError(absl::StrFormat(
              "wsync job with verify over UCX_TLS=%s: process %d checked no chunk hash in sync %d",
              t.tls, p, v + 1));
        }
      }
    }
    if (s.total_bytes != facts.bytes_total || rounds != facts.rounds) {
      return absl::InternalError(absl::StrFormat(
          "wsync job over UCX_TLS=%s: the rollouts received %d bytes in %d rounds in sync %d; "
          "the schedule computed here says %d bytes in %d rounds",
          t.tls, s.total_bytes, rounds, v + 1, facts.bytes_total, facts.rounds));
    }
    samples.push_back(s);
  }
  return samples;
}

namespace {

// ---------------------------------------------------------------------------------------------
// The table.

// A layout pair the benchmark runs, with its schedule.
struct SyncScenario {
  std::string from;
  std::string to;
  ScheduleFacts facts;
};

struct Row {
  // "wsync", "wsync+verify", "wsync 1->1", "ucx_perftest", "ucx_perftest xN" or
  // "ucx_perftest 1->1" (one pair at the 1->1 schedule's largest message, where it differs).
  std::string contestant;
  const SyncScenario* scenario = nullptr;  // wsync.
  Transports transports;
  int32_t pairs = 1;                   // ucx_perftest: concurrent sender/receiver pairs.
  std::vector<SyncSample> syncs;       // wsync.
  std::vector<double> per_pair_rates;  // ucx_perftest: mean bytes/s of a pair, one per run.
  std::vector<double> total_rates;     // ucx_perftest: summed over the pairs, one per run.
  int64_t message_bytes = 0;           // ucx_perftest.
  int32_t iters = 0;                   // ucx_perftest.

  bool wsync() const { return absl::StartsWith(contestant, "wsync"); }
  bool hashes() const { return contestant == "wsync+verify"; }
  int runs() const { return wsync() ? syncs.size() : per_pair_rates.size(); }
  std::vector<double> Seconds() const {
    std::vector<double> v;
    for (const SyncSample& s : syncs) v.push_back(s.seconds);
    return v;
  }
  // Per-receiver bytes per second: wsync's busiest rollout at the median sync; ucx_perftest's
  // median run.
  double Rate() const {
    if (!wsync()) return Median(per_pair_rates);
    const double seconds = Median(Seconds());
    return seconds > 0 ? syncs[0].rollout_bytes / seconds : 0;
  }
  double TotalRate() const {
    if (!wsync()) return Median(total_rates);
    const double seconds = Median(Seconds());
    return seconds > 0 ? syncs[0].total_bytes / seconds : 0;
  }
};

std::string Join(const std::vector<double>& values, int digits) {
  return absl::StrJoin(values, " ", [digits](std::string* out, double v) {
    absl::StrAppendFormat(out, "%.*f", digits, v);
  });
}

}  // namespace

std::string SyncBenchUsage() {
  return "wsync bench sync [--model M] [--from L] [--to L] [--budget B] [--policy P]\n"
         "                 [--sync_syncs K] [--sync_warmup W] [--sync_rounds R]\n"
         "                 [--sync_verify] [--verify] [--sync_shm_tls T] [--sync_tcp_tls T]\n"
         "                 [--sync_tcp_devices D] [--sync_worker PATH] [--sync_perftest PATH]\n"
         "                 [--sync_perftest_iters N] [--sync_perftest_size B]\n"
         "                 [--sync_perftest_concurrent] [--sync_perftest_pairs N]\n"
         "                 [--sync_single_from L] [--sync_single_to L]\n"
         "                 [--sync_perftest_wsync_settings]\n"
         "                 [--sync_timeout_s S] [--sync_json PATH]\n"
         "  Runs M (default qwen2.5-0.5b) from L (megatron(tp=2)) to L (vllm(tp=2)) as real\n"
         "  processes (coordinator, trainers, rollouts of wsync_test_worker) over UCX shared\n"
         "  memory and over UCX TCP, and a 1->1 job (megatron(tp=1) -> vllm(tp=1)): one verified\n"
         "  job per scenario and transport, then R rounds of K timed syncs each, alternating with\n"
         "  ucx_perftest tag_bw between two processes (and as many concurrent pairs as the\n"
         "  schedule has busy sender -> receiver pairs) at the largest message the schedule\n"
         "  sends. Prints seconds per sync, GB/s per rollout and in total, and per transport the\n"
         "  ratios of wsync to ucx_perftest: per receiver against one pair and against the\n"
         "  concurrent pairs, in aggregate, and 1->1 against one pair. --verify adds a\n"
         "  wsync+verify contestant (verify=true: xxh3 per chunk) to the same rounds and prints\n"
         "  its cost as a ratio.\n" +
         CudaSyncBenchUsage();
}

namespace {

void PrintSchedule(std::FILE* out, const SyncScenario& scenario, double budget) {
  const ScheduleFacts& facts = scenario.facts;
  absl::FPrintF(out,
                "schedule %s -> %s (budget %.0f B per peer direction): the busiest rollout\n"
                "  receives %s in %d messages (%d direct) over %d rounds; largest message %d B\n"
                "  (%s, %s); bytes-weighted median message %s; all rollouts %s per sync;\n"
                "  %d sender -> receiver pairs carry bytes (%s MiB), %d of them busy\n",
                scenario.from, scenario.to, budget, MiB(facts.bytes_per_rollout), facts.messages,
                facts.direct_messages, facts.rounds, facts.largest_message,
                MiB(facts.largest_message), facts.largest_direct ? "direct" : "staged",
                MiB(facts.median_message), MiB(facts.bytes_total), facts.pair_bytes.size(),
                absl::StrJoin(facts.pair_bytes, " ",
                              [](std::string* o, int64_t b) {
                                absl::StrAppendFormat(o, "%.1f", b / 1048576.0);
                              }),
                facts.busy_pairs);
}

// The ratios of wsync to ucx_perftest on one transport (0 where a contestant did not run).
struct Ratios {
  double per_receiver_vs_pair = 0;        // wsync GB/s per receiver / one pair's GB/s.
  double per_receiver_vs_concurrent = 0;  // ... / the mean pair's of the concurrent pairs.
  double aggregate_vs_concurrent = 0;     // wsync GB/s of all receivers / all concurrent pairs'.
  double aggregate_vs_pair = 0;           // wsync GB/s of all receivers / one pair's.
  double single_vs_pair = 0;              // wsync 1->1 GB/s / one pair's at its message size.
};

double Ratio(double a, double b) { return b > 0 ? a / b : 0; }

}  // namespace

absl::Status RunSyncBench(std::FILE* out) {
  const std::string memory = absl::GetFlag(FLAGS_memory);
  if (memory == "cuda") return RunCudaSyncBench(out);
  if (memory != "host") {
    return absl::InvalidArgumentError(absl::StrCat("--memory is host or cuda, not '", memory, "'"));
  }
  const absl::Time bench_start = absl::Now();
  const std::string model_name =
      absl::GetFlag(FLAGS_model).empty() ? "qwen2.5-0.5b" : absl::GetFlag(FLAGS_model);
  const std::string from =
      absl::GetFlag(FLAGS_from).empty() ? "megatron(tp=2)" : absl::GetFlag(FLAGS_from);
  const std::string to = absl::GetFlag(FLAGS_to).empty() ? "vllm(tp=2)" : absl::GetFlag(FLAGS_to);
  const int32_t syncs = std::max(1, absl::GetFlag(FLAGS_sync_syncs));
  const int32_t warmup = std::max(0, absl::GetFlag(FLAGS_sync_warmup));
  const int32_t rounds = std::max(1, absl::GetFlag(FLAGS_sync_rounds));
  const double budget = absl::GetFlag(FLAGS_budget);

  WSYNC_ASSIGN_OR_RETURN(const std::string cli, SelfPath());
  WSYNC_ASSIGN_OR_RETURN(const std::string worker, FindWorker(cli));
  WSYNC_ASSIGN_OR_RETURN(const std::string perftest,
                         FindInPath(absl::GetFlag(FLAGS_sync_perftest)));
  WSYNC_ASSIGN_OR_RETURN(ModelSpec model, GetModel(model_name));
  SyncScenario main_scenario{from, to, {}};
  WSYNC_ASSIGN_OR_RETURN(main_scenario.facts, ScheduleFactsFor(model, from, to, budget));
  const ScheduleFacts& facts = main_scenario.facts;
  std::optional<SyncScenario> single;
  if (!absl::GetFlag(FLAGS_sync_single_from).empty()) {
    single = SyncScenario{
        absl::GetFlag(FLAGS_sync_single_from), absl::GetFlag(FLAGS_sync_single_to), {}};
    WSYNC_ASSIGN_OR_RETURN(single->facts,
                           ScheduleFactsFor(model, single->from, single->to, budget));
    if (single->facts.trainers != 1 || single->facts.rollouts != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--sync_single_from/--sync_single_to must have one process each; ", single->from, " -> ",
          single->to, " has ", single->facts.trainers, " and ", single->facts.rollouts));
    }
  }
  // The message size of ucx_perftest for a schedule: --sync_perftest_size or its largest.
  auto perftest_size = [](const ScheduleFacts& f) {
    return absl::GetFlag(FLAGS_sync_perftest_size) > 0 ? absl::GetFlag(FLAGS_sync_perftest_size)
                                                       : f.largest_message;
  };
  auto perftest_iters = [](const ScheduleFacts& f, int64_t size) {
    return absl::GetFlag(FLAGS_sync_perftest_iters) > 0 ? absl::GetFlag(FLAGS_sync_perftest_iters)
                                                        : PerftestIterations(f, size);
  };
  const int64_t message_bytes = perftest_size(facts);
  const int32_t iters = perftest_iters(facts, message_bytes);
  const int32_t pairs = absl::GetFlag(FLAGS_sync_perftest_pairs) > 0
                            ? absl::GetFlag(FLAGS_sync_perftest_pairs)
                            : std::max(1, facts.busy_pairs);

  absl::FPrintF(out, "wsync bench sync: %s, %s -> %s, %d trainer + %d rollout processes\n",
                model.name, from, to, facts.trainers, facts.rollouts);
  absl::FPrintF(out, "  worker %s\n  ucx_perftest %s\n", worker, perftest);
  absl::FPrintF(out, "  UCX settings of wsync's processes%s: %s\n",
                absl::GetFlag(FLAGS_sync_perftest_wsync_settings) ? " and of ucx_perftest" : "",
                absl::StrJoin(WsyncUcxEnvironment(), " "));
  PrintSchedule(out, main_scenario, budget);
  if (single.has_value()) PrintSchedule(out, *single, budget);
  std::fflush(out);

  const std::vector<Transports> transports = {
      {"shm", absl::GetFlag(FLAGS_sync_shm_tls), ""},
      {"tcp", absl::GetFlag(FLAGS_sync_tcp_tls), absl::GetFlag(FLAGS_sync_tcp_devices)}};
  std::vector<const SyncScenario*> scenarios = {&main_scenario};
  if (single.has_value()) scenarios.push_back(&*single);

  if (absl::GetFlag(FLAGS_sync_verify)) {
    for (const Transports& t : transports) {
      for (const SyncScenario* scenario : scenarios) {
        const absl::Time start = absl::Now();
        WSYNC_RETURN_IF_ERROR(RunWsync(scenario->facts, model_name, scenario->from, scenario->to, t,
                                       /*warmup=*/0, /*syncs=*/2,
                                       /*verify=*/true, /*hashes=*/false, worker, cli,
                                       absl::Seconds(absl::GetFlag(FLAGS_sync_timeout_s)))
                                  .status());
        absl::FPrintF(out,
                      "verified %s -> %s over %s (UCX_TLS=%s): 2 versions, every rollout byte "
                      "equal to the trainers' logical values (%.1f s with fill and check)\n",
                      scenario->from, scenario->to, t.name, t.tls,
                      absl::ToDoubleSeconds(absl::Now() - start));
        std::fflush(out);
      }
    }
  }

  // Per transport: wsync, wsync 1->1, one ucx_perftest pair (and one at the 1->1 schedule's
  // largest message where that differs), and as many concurrent pairs as wsync has busy
  // sender -> receiver pairs (on the same cores).
  std::vector<Row> rows;
  const bool concurrent = absl::GetFlag(FLAGS_sync_perftest_concurrent) && pairs > 1;
  for (const Transports& t : transports) {
    Row row;
    row.contestant = "wsync";
    row.scenario = &main_scenario;
    row.transports = t;
    rows.push_back(row);
    if (absl::GetFlag(FLAGS_verify)) {
      row.contestant = "wsync+verify";
      rows.push_back(row);
    }
    if (single.has_value()) {
      row.contestant = "wsync 1->1";
      row.scenario = &*single;
      rows.push_back(row);
    }
    row.scenario = nullptr;
    row.contestant = "ucx_perftest";
    row.message_bytes = message_bytes;
    row.iters = iters;
    rows.push_back(row);
    if (single.has_value() && perftest_size(single->facts) != message_bytes) {
      row.contestant = "ucx_perftest 1->1";
      row.message_bytes = perftest_size(single->facts);
      row.iters = perftest_iters(single->facts, row.message_bytes);
      rows.push_back(row);
    }
    if (concurrent) {
      row.contestant = absl::StrCat("ucx_perftest x", pairs);
      row.message_bytes = message_bytes;
      row.iters = iters;
      row.pairs = pairs;
      rows.push_back(row);
    }
  }
  char dir_template[] = "/tmp/wsync-bench-sync-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) return absl::InternalError("mkdtemp failed");
  const std::string dir = dir_template;
  absl::Status status;
  for (int32_t round = 1; round <= rounds && status.ok(); ++round) {
    for (size_t i = 0; i < rows.size() && status.ok(); ++i) {
      Row& row = rows[i];
      const std::string label = absl::StrFormat("round %d/%d  %-17s %-3s", round, rounds,
                                                row.contestant, row.transports.name);
      if (row.wsync()) {
        const SyncScenario& sc = *row.scenario;
        absl::StatusOr<std::vector<SyncSample>> samples =
            RunWsync(sc.facts, model_name, sc.from, sc.to, row.transports, warmup, syncs,
                     /*verify=*/false, row.hashes(), worker, cli,
                     absl::Seconds(absl::GetFlag(FLAGS_sync_timeout_s)));
        if (!samples.ok()) {
          status = samples.status();
          break;
        }
        std::vector<double> seconds;
        for (const SyncSample& s : *samples) seconds.push_back(s.seconds);
        absl::FPrintF(out, "%s  %d syncs: %s s; %.2f GB/s per rollout at the median\n", label,
                      syncs, Join(seconds, 4),
                      samples->front().rollout_bytes / Median(seconds) / 1e9);
        row.syncs.insert(row.syncs.end(), samples->begin(), samples->end());
      } else {
        absl::StatusOr<PerftestResult> result = RunPerftest(
            perftest, dir, row.transports.tls, row.transports.devices, row.message_bytes, row.iters,
            row.pairs, absl::Seconds(absl::GetFlag(FLAGS_sync_timeout_s)),
            absl::GetFlag(FLAGS_sync_perftest_wsync_settings));
        if (!result.ok()) {
          status = result.status();
          break;
        }
        double sum = 0;
        for (double rate : result->bytes_per_second) sum += rate;
        std::vector<double> gb;
        for (double rate : result->bytes_per_second) gb.push_back(rate / 1e9);
        absl::FPrintF(out, "%s  %d x %d B: %s GB/s (%.2f s)\n", label, row.iters, row.message_bytes,
                      Join(gb, 2), result->seconds);
        row.per_pair_rates.push_back(sum / row.pairs);
        row.total_rates.push_back(sum);
      }
      std::fflush(out);
    }
  }
  for (const char* kind : {"server", "client"}) {
    for (int32_t i = 0; i < std::max(1, pairs); ++i) {
      unlink(absl::StrCat(dir, "/perftest-", kind, i, ".log").c_str());
    }
  }
  rmdir(dir.c_str());
  WSYNC_RETURN_IF_ERROR(status);

  // The table. Ratios: per-receiver throughput against one ucx_perftest pair (the goal) and
  // against concurrent pairs; a 1->1 row against one pair at its own message size.
  std::map<std::string, const Row*> single_pair, single_pair_1to1, multi;
  for (const Row& row : rows) {
    const std::string& name = row.transports.name;
    if (row.contestant == "ucx_perftest") {
      single_pair[name] = &row;
      if (!single_pair_1to1.contains(name)) single_pair_1to1[name] = &row;
    }
    if (row.contestant == "ucx_perftest 1->1") single_pair_1to1[name] = &row;
    if (!row.wsync() && row.pairs > 1) multi[name] = &row;
  }
  auto reference = [&](const std::map<std::string, const Row*>& refs, const Row& row) {
    auto it = refs.find(row.transports.name);
    return it == refs.end() ? 0.0 : it->second->Rate();
  };
  const std::string multi_header = absl::StrCat("vs x", pairs);
  absl::FPrintF(out, "\n%-17s %-3s %-12s %4s %8s %8s %8s %9s %8s %7s %7s\n", "contestant", "",
                "UCX_TLS", "runs", "s/sync", "min", "max", "GB/s/recv", "GB/s all", "vs perf",
                concurrent ? multi_header : "");
  std::string json = absl::StrFormat(
      "{\n  \"model\": %s, \"from\": %s, \"to\": %s, \"trainers\": %d, \"rollouts\": %d,\n"
      "  \"budget_bytes\": %.0f, \"largest_message_bytes\": %d, \"perftest_message_bytes\": "
      "%d, \"rollout_bytes\": %d, "
      "\"total_bytes\": %d,\n  \"messages_per_rollout\": %d, \"rounds\": %d, \"syncs_per_job\": "
      "%d, \"warmup_syncs\": %d, \"alternations\": %d, \"busy_pairs\": %d, "
      "\"concurrent_perftest_pairs\": %d,\n  \"rows\": [",
      JsonString(model.name), JsonString(from), JsonString(to), facts.trainers, facts.rollouts,
      budget, facts.largest_message, message_bytes, facts.bytes_per_rollout, facts.bytes_total,
      facts.messages, facts.rounds, syncs, warmup, rounds, facts.busy_pairs, pairs);
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& row = rows[i];
    const bool one_to_one = absl::EndsWith(row.contestant, "1->1");
    const double ratio =
        Ratio(row.Rate(), reference(one_to_one ? single_pair_1to1 : single_pair, row));
    const double ratio_multi = Ratio(row.Rate(), reference(multi, row));
    const std::string multi_cell = concurrent && !one_to_one ? absl::StrFormat("%.2f", ratio_multi)
                                                             : std::string(concurrent ? "-" : "");
    std::string seconds_cells = absl::StrFormat("%8s %8s %8s", "-", "-", "-");
    std::string json_extra;
    if (row.wsync()) {
      const std::vector<double> seconds = row.Seconds();
      seconds_cells =
          absl::StrFormat("%8.4f %8.4f %8.4f", Median(seconds), Min(seconds), Max(seconds));
      std::vector<double> agree, decide, cpu;
      for (const SyncSample& s : row.syncs) {
        agree.push_back(s.agree_seconds);
        decide.push_back(s.decide_seconds);
        cpu.push_back(s.cpu_seconds);
      }
      json_extra = absl::StrFormat(
          ", \"from\": %s, \"to\": %s, \"seconds_median\": %.6f, \"seconds_min\": %.6f, "
          "\"seconds_max\": %.6f, \"agreement_seconds_median\": %.6f, "
          "\"decide_seconds_median\": %.6f, \"cpu_seconds_median\": %.6f, \"seconds\": [%s]",
          JsonString(row.scenario->from), JsonString(row.scenario->to), Median(seconds),
          Min(seconds), Max(seconds), Median(agree), Median(decide), Median(cpu),
          absl::StrJoin(seconds, ", ",
                        [](std::string* o, double v) { absl::StrAppendFormat(o, "%.6f", v); }));
    } else {
      json_extra = absl::StrFormat(
          ", \"pairs\": %d, \"message_bytes\": %d, \"iterations\": %d, \"gbps_per_pair_runs\": "
          "[%s]",
          row.pairs, row.message_bytes, row.iters,
          absl::StrJoin(row.per_pair_rates, ", ", [](std::string* o, double r) {
            absl::StrAppendFormat(o, "%.4f", r / 1e9);
          }));
    }
    absl::FPrintF(out, "%-17s %-3s %-12s %4d %s %9.2f %8.2f %7.2f %7s\n", row.contestant,
                  row.transports.name, row.transports.tls, row.runs(), seconds_cells,
                  row.Rate() / 1e9, row.TotalRate() / 1e9, ratio, multi_cell);
    absl::StrAppendFormat(&json,
                          "%s\n    {\"contestant\": %s, \"transport\": %s, \"tls\": %s, "
                          "\"runs\": %d, \"gbps_per_receiver\": %.4f, \"gbps_total\": %.4f, "
                          "\"ratio_to_perftest\": %.4f, \"ratio_to_concurrent_perftest\": %.4f%s}",
                          i == 0 ? "" : ",", JsonString(row.contestant),
                          JsonString(row.transports.name), JsonString(row.transports.tls),
                          row.runs(), row.Rate() / 1e9, row.TotalRate() / 1e9, ratio, ratio_multi,
                          json_extra);
  }
  json += "\n  ],\n  \"ratios\": {";
  absl::FPrintF(out,
                "GB/s = 1e9 B/s. s/sync: transfer time of the slowest process (agreement, commit\n"
                "  decision and verification excluded), median/min/max over %d rounds x %d syncs.\n"
                "  GB/s/recv: the busiest rollout's %d B / median s/sync; ucx_perftest: tag_bw,\n"
                "  %d x %d B per run, median run, mean of its pairs. vs perf: GB/s/recv / one\n"
                "  ucx_perftest pair's (goal >= 0.85; 1->1 rows: the pair at their own size).\n",
                rounds, syncs, facts.bytes_per_rollout, iters, message_bytes);
  if (concurrent) {
    absl::FPrintF(out,
                  "  %s: GB/s/recv / the mean pair's of %d concurrent ucx_perftest pairs (as many\n"
                  "  as wsync's busy sender -> receiver pairs, on the same cores; ucx_perftest's\n"
                  "  processes busy-poll).\n",
                  multi_header, pairs);
  }
  // The ratios per transport, the like-for-like ones next to the literal goal.
  absl::FPrintF(out,
                "\nwsync / ucx_perftest (medians of the same alternating rounds; goal >= 0.85)\n"
                "%-4s %12s %14s %14s %12s %12s\n",
                "", "recv/1 pair", absl::StrCat("recv/pair of x", pairs),
                absl::StrCat("all/all of x", pairs), "all/1 pair", "1->1/1 pair");
  for (size_t t = 0; t < transports.size(); ++t) {
    Ratios r;
    for (const Row& row : rows) {
      if (row.transports.name != transports[t].name) continue;
      if (row.contestant == "wsync") {
        r.per_receiver_vs_pair = Ratio(row.Rate(), reference(single_pair, row));
        r.per_receiver_vs_concurrent = Ratio(row.Rate(), reference(multi, row));
        r.aggregate_vs_pair = Ratio(row.TotalRate(), reference(single_pair, row));
        auto it = multi.find(row.transports.name);
        if (it != multi.end()) {
          r.aggregate_vs_concurrent = Ratio(row.TotalRate(), it->second->TotalRate());
        }
      } else if (row.contestant == "wsync 1->1") {
        r.single_vs_pair = Ratio(row.Rate(), reference(single_pair_1to1, row));
      }
    }
    auto cell = [](double v) { return v > 0 ? absl::StrFormat("%.2f", v) : std::string("-"); };
    absl::FPrintF(out, "%-4s %12s %14s %14s %12s %12s\n", transports[t].name,
                  cell(r.per_receiver_vs_pair), cell(r.per_receiver_vs_concurrent),
                  cell(r.aggregate_vs_concurrent), cell(r.aggregate_vs_pair),
                  cell(r.single_vs_pair));
    absl::StrAppendFormat(
        &json,
        "%s\n    %s: {\"per_receiver_vs_pair\": %.4f, \"per_receiver_vs_concurrent_pair\": %.4f, "
        "\"aggregate_vs_concurrent\": %.4f, \"aggregate_vs_pair\": %.4f, "
        "\"one_to_one_vs_pair\": %.4f}",
        t == 0 ? "" : ",", JsonString(transports[t].name), r.per_receiver_vs_pair,
        r.per_receiver_vs_concurrent, r.aggregate_vs_concurrent, r.aggregate_vs_pair,
        r.single_vs_pair);
  }
  json += "\n  }\n}\n";
  for (const Row& row : rows) {
    if (!row.wsync()) continue;
    std::vector<double> agree, decide, step, cpu, user;
    for (const SyncSample& s : row.syncs) {
      agree.push_back(s.agree_seconds);
      decide.push_back(s.decide_seconds);
      step.push_back(s.step_seconds);
      cpu.push_back(s.cpu_seconds);
      user.push_back(s.cpu_user_seconds);
    }
    absl::FPrintF(out,
                  "%s %s outside the transfer (medians): agreement %.4f s, commit decision\n"
                  "  %.4f s (of the last process to finish); whole step (ExecuteTransfers and\n"
                  "  decision, slowest process) %.4f s = %.2f GB/s per rollout; CPU of all\n"
                  "  processes during ExecuteTransfers %.4f s per sync = %.3f s per GB received\n"
                  "  (user space %.4f s, kernel %.4f s)\n",
                  row.contestant, row.transports.name, Median(agree), Median(decide), Median(step),
                  row.syncs[0].rollout_bytes / Median(step) / 1e9, Median(cpu),
                  Median(cpu) / (row.syncs[0].total_bytes / 1e9), Median(user),
                  Median(cpu) - Median(user));
  }
  for (const Row& with : rows) {
    if (!with.hashes()) continue;
    for (const Row& without : rows) {
      if (without.contestant != "wsync" || without.transports.name != with.transports.name) {
        continue;
      }
      const double on = Median(with.Seconds());
      const double off = Median(without.Seconds());
      absl::FPrintF(out,
                    "verify cost %s: %.4f s/sync with verify=true, %.4f s without (same rounds, "
                    "alternating): ratio %.3f\n",
                    with.transports.name, on, off, off > 0 ? on / off : 0);
    }
  }
  absl::FPrintF(out, "total %.1f s\n", absl::ToDoubleSeconds(absl::Now() - bench_start));

  const std::string json_path = absl::GetFlag(FLAGS_sync_json);
  if (!json_path.empty()) {
    std::ofstream file(json_path);
    file << json;
    if (!file.good()) return absl::InternalError(absl::StrCat("cannot write ", json_path));
  }
  return absl::OkStatus();
}

}  // namespace wsync::cli
