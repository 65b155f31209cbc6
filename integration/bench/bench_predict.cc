#include "integration/bench/bench_predict.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "cost/link_model.h"
#include "integration/bench/bench_report.h"
#include "integration/bench/bench_sync.h"
#include "integration/cli/calibrate_job.h"
#include "integration/harness/launcher.h"
#include "integration/model_config/hf_config.h"
#include "planner/job.h"
#include "planner/models.h"
#include "planner/named_layouts.h"
#include "plugin/prediction.h"

namespace wsync::bench {
namespace {

constexpr char kShm[] = "ucx:sm,cma,self";

struct PredictScenario {
  std::string name;
  std::string from;
  std::string to;
  std::string transports;  // For the table.
  // Node of each global process (trainers first), given the number of trainers.
  std::function<std::string(int32_t process, int32_t trainers)> node;
  // Path transports of each process; `device` is its side's veth device in the netns scenario.
  std::function<std::string(int32_t process, int32_t trainers, const std::string& device)> paths;
  bool netns = false;             // Node "a" in one namespace, every other node in the other.
  bool compare_policies = false;  // Also measure first_holder against cost_aware.
  bool in_default_run = true;     // Run when no scenario is named.

  // The namespace of a process in the netns scenarios: 0 on node "a", else 1.
  int Side(int32_t p, int32_t trainers) const { return node(p, trainers) == "a" ? 0 : 1; }
};

std::string OneNode(int32_t, int32_t) { return "local"; }
std::string SideNode(int32_t p, int32_t trainers) { return p < trainers ? "a" : "b"; }
// DP replica 0 of the trainers (the first half of the ranks, TP innermost) on node a; replica 1
// and the rollouts on node b.
std::string ReplicaNode(int32_t p, int32_t trainers) { return p < trainers / 2 ? "a" : "b"; }

std::vector<PredictScenario> Scenarios() {
  const auto all = [](const std::string& spec) {
    return [spec](int32_t, int32_t, const std::string&) { return spec; };
  };
  const auto two_nodes = [](int32_t, int32_t, const std::string& device) {
    return absl::StrCat("local=", kShm, ";intra_node=", kShm, ";inter_node=ucx:tcp@",
                        device.empty() ? "lo" : device);
  };
  const std::string shm = absl::StrCat("*=", kShm);
  return {
      {"shm tp2->tp2", "megatron(tp=2)", "vllm(tp=2)", "shm", OneNode, all(shm)},
      {"tcp tp2->tp2", "megatron(tp=2)", "vllm(tp=2)", "tcp lo", OneNode, all("*=ucx:tcp@lo")},
      {"shm tp2->tp1", "megatron(tp=2)", "vllm(tp=1)", "shm", OneNode, all(shm)},
      {"shm tp1->tp2", "megatron(tp=1)", "vllm(tp=2)", "shm", OneNode, all(shm)},
      {"2 nodes tp2->tp2", "megatron(tp=2)", "vllm(tp=2)", "shm + tcp lo", SideNode, two_nodes},
      // Left out of the default run (10 minutes): the shaped link alone, which the replicated
      // netns scenario also crosses, and the one-node replicas, where no policy has a choice.
      {"netns tc tp2->tp2", "megatron(tp=2)", "vllm(tp=2)", "shm + tcp veth (tc)", SideNode,
       two_nodes, /*netns=*/true, /*compare_policies=*/false, /*in_default_run=*/false},
      {"replicated dp2 shm", "megatron(tp=2,dp=2)", "vllm(tp=2)", "shm", OneNode, all(shm),
       /*netns=*/false, /*compare_policies=*/true, /*in_default_run=*/false},
      // first_holder takes every shard from replica 0 across the shaped link; replica 1 is on
      // the rollouts' node.
      {"replicated dp2 netns", "megatron(tp=2,dp=2)", "vllm(tp=2)", "shm + tcp veth (tc)",
       ReplicaNode, two_nodes, /*netns=*/true, /*compare_policies=*/true},
  };
}

// When `wanted`, two namespaces with the veth link between them shaped by tc on both ends (nullopt,
// said on `out`, where namespaces cannot be made).
absl::StatusOr<std::optional<harness::NetnsPair>> ShapedPair(bool wanted, const std::string& rate,
                                                             std::FILE* out) {
  if (!wanted) return std::optional<harness::NetnsPair>();
  std::string reason;
  WSYNC_ASSIGN_OR_RETURN(std::optional<harness::NetnsPair> pair, ShapedNetnsPair(rate, &reason));
  if (!pair) absl::FPrintF(out, "  skipped: %s\n", reason);
  return pair;
}

struct SyncMeasurement {
  double seconds = 0;  // Median over the timed syncs of the slowest process's transfer.
  std::vector<double> syncs;
};

absl::StatusOr<SyncMeasurement> MeasureSync(
    const PredictScenario& s, const std::string& model, int32_t trainers, int32_t rollouts,
    const std::vector<std::string>& paths, const harness::NetnsPair* pair,
    const std::string& policy, const std::string& calibration, const PredictBenchOptions& options) {
  harness::JobSpec spec;
  spec.model = model;
  spec.from = s.from;
  spec.to = s.to;
  spec.trainers = trainers;
  spec.rollouts = rollouts;
  const int32_t warmup = options.warmup;
  spec.versions = warmup + options.syncs;
  spec.budget = options.job.budget;
  spec.timeout = absl::Seconds(options.timeout_s);
  spec.rendezvous_timeout = absl::Seconds(60);
  if (pair != nullptr) {
    spec.coordinator_netns = pair->ns(0);
    spec.coordinator_address = pair->address(0);
  }
  for (int32_t p = 0; p < trainers + rollouts; ++p) {
    harness::ProcessPlacement placement;
    placement.node_id = s.node(p, trainers);
    if (pair != nullptr) placement.netns = pair->ns(s.Side(p, trainers));
    placement.extra_flags = {absl::StrCat("--path_transports=", paths[p])};
    spec.placement.push_back(placement);
  }
  spec.extra_worker_flags = {"--replica_policy", policy, "--calibration_file", calibration,
                             "--check_values=false"};
  spec.extra_worker_flags.insert(spec.extra_worker_flags.begin(), options.job.settings.begin(),
                                 options.job.settings.end());
  WSYNC_ASSIGN_OR_RETURN(const harness::JobResult result,
                         harness::RunJob(spec, options.job.host, options.job.wsync));
  SyncMeasurement measured;
  for (int32_t v = warmup; v < spec.versions; ++v) {
    double slowest = 0;
    for (int32_t p = 0; p < trainers + rollouts; ++p) {
      const harness::WorkerResult& w = result.workers[p];
      if (w.exit_code != 0 || static_cast<int32_t>(w.stats.size()) != spec.versions) {
        return absl::InternalError(
            absl::StrFormat("%s: process %d exited %d: %s", s.name, p, w.exit_code, w.stderr_text));
      }
      double seconds = 0;
      auto it = w.stats[v].find("seconds");
      if (it != w.stats[v].end() && !absl::SimpleAtod(it->second, &seconds)) seconds = 0;
      slowest = std::max(slowest, seconds);
    }
    measured.syncs.push_back(slowest);
  }
  measured.seconds = Median(measured.syncs);
  return measured;
}

// One scenario and policy over all rounds: each round's prediction (from that round's
// calibration) and timed syncs.
struct Row {
  std::string scenario;
  std::string transports;
  int32_t processes = 0;
  std::string policy;
  std::vector<Prediction> rounds_predicted;
  std::vector<SyncMeasurement> rounds_measured;

  // The median round's prediction (the lower middle one for an even count).
  const Prediction& predicted() const {
    std::vector<const Prediction*> sorted;
    for (const Prediction& p : rounds_predicted) sorted.push_back(&p);
    std::sort(sorted.begin(), sorted.end(),
              [](const Prediction* a, const Prediction* b) { return a->seconds < b->seconds; });
    return *sorted[(sorted.size() - 1) / 2];
  }
  // Median over every round's timed syncs.
  double measured() const {
    std::vector<double> all;
    for (const SyncMeasurement& m : rounds_measured)
      all.insert(all.end(), m.syncs.begin(), m.syncs.end());
    return Median(all);
  }
  double error() const { return (predicted().seconds - measured()) / measured(); }
};

// Calibrates, predicts and measures one scenario once (round `round`), adding to its rows (one
// per policy measured, created in the first round).
absl::Status RunScenarioRound(const PredictScenario& s, const ModelSpec& model,
                              const std::string& dir, const PredictBenchOptions& options,
                              int32_t round, std::FILE* out, std::vector<Row>* rows) {
  absl::FPrintF(out, "[round %d] %s: %s -> %s over %s\n", round + 1, s.name, s.from, s.to,
                s.transports);
  std::fflush(out);
  WSYNC_ASSIGN_OR_RETURN(Layout from, BuildNamedLayout(model, s.from));
  WSYNC_ASSIGN_OR_RETURN(Layout to, BuildNamedLayout(model, s.to));
  const int32_t trainers = static_cast<int32_t>(from.processes.size());
  const int32_t rollouts = static_cast<int32_t>(to.processes.size());
  const int32_t n = trainers + rollouts;
  for (int32_t p = 0; p < n; ++p) {
    (p < trainers ? from.processes[p] : to.processes[p - trainers]).node_id = s.node(p, trainers);
  }
  WSYNC_ASSIGN_OR_RETURN(const Job job, Job::Create(std::move(from), std::move(to)));

  absl::StatusOr<std::optional<harness::NetnsPair>> shaped = ShapedPair(s.netns, options.rate, out);
  WSYNC_RETURN_IF_ERROR(shaped.status());
  const std::optional<harness::NetnsPair>& pair = *shaped;
  if (s.netns && !pair) return absl::OkStatus();
  cli::CalibrationJob calibration;
  calibration.processes = n;
  for (int32_t p = 0; p < n; ++p) {
    const int side = s.Side(p, trainers);
    calibration.nodes.push_back(s.node(p, trainers));
    calibration.path_transports.push_back(
        s.paths(p, trainers, pair ? pair->device(side) : std::string()));
    if (pair) calibration.netns.push_back(pair->ns(side));
  }
  if (pair) calibration.coordinator_address = pair->address(0);
  WSYNC_ASSIGN_OR_RETURN(calibration.sizes, cli::ParseSizes(options.probe_sizes));
  calibration.repeats = options.probe_repeats;
  std::string file_name = absl::StrCat(round, "-", s.name);
  std::replace_if(
      file_name.begin(), file_name.end(), [](char c) { return !absl::ascii_isalnum(c); }, '_');
  calibration.out = absl::StrCat(dir, "/", file_name, ".pb");
  const absl::Time start = absl::Now();
  WSYNC_ASSIGN_OR_RETURN(const proto::Calibration measured,
                         cli::RunCalibrationJob(calibration, options.job.wsync));
  WSYNC_ASSIGN_OR_RETURN(const LinkFits fits, FitLinks(measured));
  absl::FPrintF(out, "  calibrated %d processes in %.1f s (%d samples, %d fits left out)\n", n,
                absl::ToDoubleSeconds(absl::Now() - start), measured.samples_size(),
                fits.skipped.size());
  std::fflush(out);

  // Compared policies alternate which runs first, round by round.
  std::vector<std::string> policies = s.compare_policies
                                          ? std::vector<std::string>{"first_holder", "cost_aware"}
                                          : std::vector<std::string>{"cost_aware"};
  if (round % 2 == 1) std::reverse(policies.begin(), policies.end());
  for (const std::string& name : policies) {
    auto row = std::find_if(rows->begin(), rows->end(),
                            [&](const Row& r) { return r.scenario == s.name && r.policy == name; });
    if (row == rows->end()) {
      rows->push_back(Row{s.name, s.transports, n, name, {}, {}});
      row = rows->end() - 1;
    }
    WSYNC_ASSIGN_OR_RETURN(auto policy, MakeSessionPolicy(name, &fits));
    WSYNC_ASSIGN_OR_RETURN(const Prediction predicted,
                           PredictSync(job, *policy, fits, StagingBudget{options.job.budget}));
    WSYNC_ASSIGN_OR_RETURN(
        SyncMeasurement synced,
        MeasureSync(s, model.name, trainers, rollouts, calibration.path_transports,
                    pair ? &*pair : nullptr, name, calibration.out, options));
    absl::FPrintF(
        out,
        "  %-12s predicted %.4f s = transfer %.4f + latency %.4f (binding %s), measured %s s -> "
        "%.4f s\n",
        name, predicted.seconds, predicted.transfer_seconds, predicted.latency_seconds,
        predicted.binding,
        absl::StrJoin(synced.syncs, " ",
                      [](std::string* o, double v) { absl::StrAppendFormat(o, "%.4f", v); }),
        synced.seconds);
    std::fflush(out);
    row->rounds_predicted.push_back(predicted);
    row->rounds_measured.push_back(std::move(synced));
  }
  return absl::OkStatus();
}

// "0.1234..0.2345": the smallest and largest of `values`.
std::string Range(const std::vector<double>& values) {
  return absl::StrFormat("%.3f..%.3f", *std::min_element(values.begin(), values.end()),
                         *std::max_element(values.begin(), values.end()));
}

}  // namespace

std::string PredictBenchUsage() {
  return "wsync-bench predict [--predict_model M] [--predict_scenarios NAME,...]\n"
         "                    [--predict_rounds N] [--predict_syncs K] [--predict_warmup W]\n"
         "                    [--predict_rate RATE] [--predict_probe_sizes S,...]\n"
         "                    [--predict_probe_repeats R]\n"
         "  For each scenario (shm, TCP, 2 nodes, 2 network namespaces over a tc-shaped veth,\n"
         "  layouts tp2->tp2, tp2->tp1, tp1->tp2, a DP-replicated trainer; six of the eight\n"
         "  and 2 rounds by default; `--predict_scenarios all --predict_rounds 3` for all):\n"
         "  calibrate its processes, predict the sync, run it (wsync_host over UCX); N "
         "rounds, the\n"
         "  scenarios interleaved within each. Prints the median round's prediction against the\n"
         "  median of all rounds' timed syncs, the relative errors (goal: median <= 15%, none\n"
         "  > 30%) and the first_holder / cost_aware ratios (measured alternating, round by\n"
         "  round) on the replicated scenarios: shared memory, and DP replica 0 on node a with\n"
         "  replica 1 and the rollouts on node b (two namespaces, tc-shaped veth).\n";
}

absl::Status RunPredictBench(const PredictBenchOptions& given, std::FILE* out) {
  const absl::Time bench_start = absl::Now();
  PredictBenchOptions options = given;
  WSYNC_ASSIGN_OR_RETURN(const std::string self, SelfPath());
  WSYNC_RETURN_IF_ERROR(ResolveBinaries(self, &options.job));
  WSYNC_ASSIGN_OR_RETURN(const ModelSpec model, LoadModel(options.model));
  const std::string& scenario_flag = options.scenarios;
  const std::vector<std::string> wanted = absl::StrSplit(scenario_flag, ',', absl::SkipEmpty());
  std::vector<PredictScenario> scenarios;
  for (PredictScenario& s : Scenarios()) {
    const bool named = std::find(wanted.begin(), wanted.end(), s.name) != wanted.end();
    if (scenario_flag == "all" || named || (wanted.empty() && s.in_default_run)) {
      scenarios.push_back(std::move(s));
    }
  }
  for (const std::string& name : wanted) {
    const bool known =
        name == "all" || std::any_of(scenarios.begin(), scenarios.end(),
                                     [&](const PredictScenario& s) { return s.name == name; });
    if (!known) {
      std::vector<std::string> names;
      for (const PredictScenario& s : Scenarios()) names.push_back(s.name);
      return absl::InvalidArgumentError(absl::StrCat("--predict_scenarios: no scenario '", name,
                                                     "'; known: all, ",
                                                     absl::StrJoin(names, ", ")));
    }
  }
  char dir_template[] = "/tmp/wsync-bench-predict-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) return absl::InternalError("mkdtemp failed");
  const std::string dir = dir_template;
  const int32_t rounds = options.rounds;
  if (rounds < 1) return absl::InvalidArgumentError("--predict_rounds must be >= 1");
  absl::FPrintF(out,
                "wsync-bench predict: %s (%.1f MiB), %d rounds, each calibrating and running %d "
                "timed syncs after %d warm-up per scenario\n",
                model.name, model.TotalBytes() / 1048576.0, rounds, options.syncs, options.warmup);
  std::vector<Row> rows;
  absl::Status status;
  // Rounds interleave the scenarios, so that a stretch of heavy foreign load on this machine
  // falls on one round of many scenarios (which the medians drop) rather than on one scenario.
  for (int32_t round = 0; round < rounds && status.ok(); ++round) {
    for (const PredictScenario& s : scenarios) {
      status = RunScenarioRound(s, model, dir, options, round, out, &rows);
      if (!status.ok()) break;
    }
  }
  std::system(absl::StrCat("rm -rf '", dir, "'").c_str());
  WSYNC_RETURN_IF_ERROR(status);

  absl::FPrintF(out, "\n%-20s %-20s %5s %-12s %11s %11s %8s  %-12s %-12s %s\n", "scenario",
                "transports", "procs", "policy", "predicted s", "measured s", "error",
                "rounds pred.", "rounds meas.", "binding (predicted)");
  std::vector<double> errors;
  for (const Row& row : rows) {
    std::vector<double> predicted, measured;
    for (const Prediction& p : row.rounds_predicted) predicted.push_back(p.seconds);
    for (const SyncMeasurement& m : row.rounds_measured) measured.push_back(m.seconds);
    absl::FPrintF(out, "%-20s %-20s %5d %-12s %11.4f %11.4f %+7.1f%%  %-12s %-12s %s\n",
                  row.scenario, row.transports, row.processes, row.policy, row.predicted().seconds,
                  row.measured(), 100 * row.error(), Range(predicted), Range(measured),
                  row.predicted().binding);
    errors.push_back(std::abs(row.error()));
  }
  if (!errors.empty()) {
    const double median = Median(errors);
    const double worst = *std::max_element(errors.begin(), errors.end());
    absl::FPrintF(out,
                  "absolute relative error over %d rows: median %.1f%% (goal <= 15%%), max %.1f%% "
                  "(goal <= 30%%): %s\n",
                  errors.size(), 100 * median, 100 * worst,
                  median <= 0.15 && worst <= 0.30 ? "goal met" : "goal NOT met");
  }
  for (const Row& first : rows) {
    if (first.policy != "first_holder") continue;
    auto cost = std::find_if(rows.begin(), rows.end(), [&](const Row& r) {
      return r.scenario == first.scenario && r.policy == "cost_aware";
    });
    if (cost == rows.end()) continue;
    const double measured = first.measured() / cost->measured();
    const double predicted = first.predicted().seconds / cost->predicted().seconds;
    absl::FPrintF(
        out,
        "%s: first_holder / cost_aware measured %.4f / %.4f s = %.2fx (predicted "
        "%.2fx): cost_aware %s\n",
        first.scenario, first.measured(), cost->measured(), measured, predicted,
        measured > 1 && predicted > 1 ? "faster, predicted and measured" : "NOT faster in both");
  }
  absl::FPrintF(out,
                "predicted: the median round's prediction (each round calibrates anew); measured: "
                "median over every round's timed syncs of the slowest process's transfer time "
                "(agreement and commit excluded); rounds: the range of the rounds' predictions "
                "and of their median syncs.\ntotal %.1f s\n",
                absl::ToDoubleSeconds(absl::Now() - bench_start));
  return absl::OkStatus();
}

}  // namespace wsync::bench
