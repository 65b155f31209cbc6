#include "integration/bench/bench_relay.h"

#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status.h"
#include "cost/link_model.h"
#include "executor/schedule.h"
#include "integration/bench/bench_sync.h"
#include "integration/harness/launcher.h"
#include "integration/model_config/hf_config.h"
#include "planner/job.h"
#include "planner/models.h"
#include "planner/named_layouts.h"
#include "planner/plan.h"
#include "planner/policy.h"
#include "planner/relay.h"
#include "plugin/settings.h"

namespace wsync::bench {
namespace {

constexpr const char* kModes[] = {"never", "auto"};

int RunShell(const std::string& command) { return system(command.c_str()); }

int64_t Field(const std::map<std::string, std::string>& stats, const std::string& key) {
  int64_t value = 0;
  auto it = stats.find(key);
  if (it == stats.end() || !absl::SimpleAtoi(it->second, &value)) return 0;
  return value;
}

double Seconds(const std::map<std::string, std::string>& stats) {
  double value = 0;
  auto it = stats.find("seconds");
  // A malformed figure reads as 0, as an absent one does.
  if (it != stats.end() && !absl::SimpleAtod(it->second, &value)) value = 0;
  return value;
}

// The cost model's view of one mode: the plan the workers make (same layouts, node ids, policy,
// links) priced by Predict with each pair's bytes and messages and the busiest process's rounds.
struct Projection {
  int64_t relays = 0;
  int64_t inter_node_bytes = 0;
  Prediction prediction;
};

absl::StatusOr<Projection> Project(const ModelSpec& model, const std::string& from,
                                   const std::string& to, RelayMode mode,
                                   std::shared_ptr<const LinkFits> fits, double budget) {
  WSYNC_ASSIGN_OR_RETURN(Layout source, BuildNamedLayout(model, from));
  WSYNC_ASSIGN_OR_RETURN(Layout target, BuildNamedLayout(model, to));
  for (ProcessInfo& p : source.processes) p.node_id = "node-a";
  for (ProcessInfo& p : target.processes) p.node_id = "node-b";
  WSYNC_ASSIGN_OR_RETURN(Job job, Job::Create(std::move(source), std::move(target)));
  WSYNC_ASSIGN_OR_RETURN(auto policy, MakeReplicaPolicy(std::string(kDefaultReplicaPolicy)));
  PlanOptions options;
  options.relay.mode = mode;
  options.relay.fits = fits;
  options.relay.arena_bytes = RelayArenaLimit(StagingBudget{budget});
  WSYNC_ASSIGN_OR_RETURN(const Plan plan, MakePlan(job, *policy, options));
  Endpoints endpoints;
  for (int32_t p = 0; p < job.num_processes(); ++p) endpoints.processes.push_back(p);
  WSYNC_ASSIGN_OR_RETURN(const std::vector<ProcessSchedule> schedules,
                         ScheduleTransfers(job, plan.segments, endpoints, StagingBudget{budget}));
  Traffic traffic;
  for (const ProcessSchedule& schedule : schedules) {
    traffic.rounds = std::max<int64_t>(traffic.rounds, schedule.rounds);
    for (const PeerSchedule& peer : schedule.peers) {
      if (peer.direction != Direction::kSend) continue;
      PairTraffic pair{schedule.process, peer.peer,
                       std::string(job.PathClass(schedule.process, peer.peer)), 0,
                       static_cast<int64_t>(peer.rounds.size())};
      for (const ScheduledRound& round : peer.rounds) pair.bytes += round.bytes;
      traffic.pairs.push_back(std::move(pair));
    }
  }
  Projection projection;
  projection.relays = static_cast<int64_t>(plan.relays.size());
  projection.inter_node_bytes = plan.inter_node_bytes;
  WSYNC_ASSIGN_OR_RETURN(projection.prediction, Predict(*fits, traffic));
  return projection;
}

struct RelayTimes {
  std::vector<double> seconds;  // Per timed sync: the slowest process's transfer.
  int64_t inter_node_bytes = -1;

  // The middle value of the sorted seconds (the upper one of two).
  double Median() const {
    std::vector<double> sorted = seconds;
    std::sort(sorted.begin(), sorted.end());
    return sorted.empty() ? 0 : sorted[sorted.size() / 2];
  }
};

// One job in `mode`; appends its timed syncs. Fails when a worker fails (a byte that does not
// verify fails its rollout) or the transports' inter-node bytes change between syncs.
absl::Status RunMode(const std::string& mode, const harness::NetnsPair& net, int trainers,
                     int rollouts, const std::string& links, const RelayBenchOptions& options,
                     RelayTimes& measured) {
  const int32_t warmup = 1;
  harness::JobSpec spec;
  spec.model = options.model;
  spec.from = options.from;
  spec.to = options.to;
  spec.trainers = trainers;
  spec.rollouts = rollouts;
  spec.versions = warmup + std::max(1, options.syncs);
  spec.budget = options.job.budget;
  spec.timeout = absl::Seconds(options.timeout_s);
  spec.rendezvous_timeout = absl::Seconds(30);
  spec.coordinator_netns = net.ns(0);
  spec.coordinator_address = net.address(0);
  spec.extra_worker_flags = {"--relay", mode, "--relay_links", links};
  for (int p = 0; p < trainers + rollouts; ++p) {
    spec.placement.push_back(harness::TwoNodePlacement(net, p < trainers ? 0 : 1));
  }
  WSYNC_ASSIGN_OR_RETURN(harness::JobResult result,
                         harness::RunJob(spec, options.job.host, options.job.wsync));
  for (size_t p = 0; p < result.workers.size(); ++p) {
    const harness::WorkerResult& w = result.workers[p];
    if (w.exit_code != 0 || static_cast<int>(w.stats.size()) != spec.versions) {
      return absl::InternalError(
          absl::StrFormat("relay %s: process %d exited %d with %d STATS "
                          "lines: %s",
                          mode, p, w.exit_code, w.stats.size(), w.stderr_text.substr(0, 2000)));
    }
  }
  for (int v = warmup; v < spec.versions; ++v) {
    double seconds = 0;
    int64_t inter_node = 0;
    for (const harness::WorkerResult& w : result.workers) {
      seconds = std::max(seconds, Seconds(w.stats[v]));
      inter_node += Field(w.stats[v], "wire_sent_inter_node");
    }
    if (measured.inter_node_bytes >= 0 && measured.inter_node_bytes != inter_node) {
      return absl::InternalError(absl::StrCat("relay ", mode, ": inter-node bytes changed from ",
                                              measured.inter_node_bytes, " to ", inter_node));
    }
    measured.inter_node_bytes = inter_node;
    measured.seconds.push_back(seconds);
  }
  return absl::OkStatus();
}

}  // namespace

std::string RelayBenchUsage() {
  return "wsync-bench relay [--relay_model M] [--relay_from L] [--relay_to L]\n"
         "                  [--relay_rate_mbit R] [--relay_intra_link LINK] [--relay_syncs K]\n"
         "                  [--relay_rounds N] [--relay_timeout_s S] [--staging_budget_bytes B]\n"
         "  Trainers of L (megatron(tp=2)) in one network namespace, rollouts of L\n"
         "  (vllm(tp=2,dp=2)) in another, the veth between them shaped by tc to R Mbit/s (100);\n"
         "  M (qwen2.5-tiny) synced with relay never and auto, N jobs of K verified syncs each,\n"
         "  alternating, staging budget B per peer direction. Prints inter-node bytes, measured "
         "and\n"
         "  predicted seconds per mode and the ratio. Needs root. Refused for now: the jobs'\n"
         "  processes sync through the C ABI, which has no relay setting (relay auto only).\n";
}

absl::Status RunRelayBench(const RelayBenchOptions& given, std::FILE* out) {
  RelayBenchOptions options = given;
  const std::string& from = options.from;
  const std::string& to = options.to;
  const int32_t rate_mbit = options.rate_mbit;
  if (rate_mbit <= 0) return absl::InvalidArgumentError("--relay_rate_mbit must be positive");
  // The jobs' processes are hosts of the C ABI (wsync_host), which cannot choose the relay mode.
  return absl::UnimplementedError(
      "refused: relay compares relay never with auto, and the C ABI has no relay setting "
      "(wsync_config_t: libwsync.so always plans with relay auto), so its hosts cannot run "
      "'never'; integration/bench/README.md");
  WSYNC_ASSIGN_OR_RETURN(const std::string self, SelfPath());
  WSYNC_RETURN_IF_ERROR(ResolveBinaries(self, &options.job));
  WSYNC_ASSIGN_OR_RETURN(const ModelSpec model, LoadModel(options.model));
  WSYNC_ASSIGN_OR_RETURN(const Layout trainer_layout, BuildNamedLayout(model, from));
  WSYNC_ASSIGN_OR_RETURN(const Layout rollout_layout, BuildNamedLayout(model, to));
  const int trainers = static_cast<int>(trainer_layout.processes.size());
  const int rollouts = static_cast<int>(rollout_layout.processes.size());

  // The links both the workers' auto decision and the projection use: the shaped veth as stated
  // (its rate; TCP's latency over it), shared memory as --relay_intra_link says.
  const std::string links =
      absl::StrFormat("%s;inter_node=200us,%.3fMB/s", options.intra_link, rate_mbit / 8.0);
  WSYNC_ASSIGN_OR_RETURN(const proto::Calibration calibration, SyntheticCalibration(links));
  WSYNC_ASSIGN_OR_RETURN(LinkFits fits, FitLinks(calibration));
  const auto shared_fits = std::make_shared<const LinkFits>(std::move(fits));
  const double budget = options.job.budget;

  std::string reason;
  std::optional<harness::NetnsPair> net = harness::NetnsPair::Create(&reason);
  if (!net) return absl::FailedPreconditionError(absl::StrCat("no network namespaces: ", reason));
  for (int side = 0; side < 2; ++side) {
    const std::string shape = absl::StrFormat(
        "ip netns exec %s tc qdisc replace dev %s root tbf rate %dmbit burst 128kb latency 100ms",
        net->ns(side), net->device(side), rate_mbit);
    if (RunShell(shape) != 0) return absl::InternalError(absl::StrCat("'", shape, "' failed"));
  }
  absl::FPrintF(out,
                "wsync-bench relay: %s, %s -> %s\n"
                "  %d trainers in namespace %s (node-a), %d rollouts in %s (node-b)\n"
                "  inter-node: UCX tcp over a veth shaped by tc tbf to %d Mbit/s; intra-node: UCX "
                "sm,cma,self\n  cost model links: %s\n",
                model.name, from, to, trainers, net->ns(0), rollouts, net->ns(1), rate_mbit, links);
  std::fflush(out);

  std::map<std::string, Projection> projected;
  std::map<std::string, RelayTimes> measured;
  for (const char* mode : kModes) {
    WSYNC_ASSIGN_OR_RETURN(const RelayMode relay_mode, ParseRelayMode(mode));
    WSYNC_ASSIGN_OR_RETURN(projected[mode],
                           Project(model, from, to, relay_mode, shared_fits, budget));
  }
  for (int32_t round = 0; round < std::max(1, options.rounds); ++round) {
    for (const char* mode : kModes) {
      const absl::Time start = absl::Now();
      WSYNC_RETURN_IF_ERROR(
          RunMode(mode, *net, trainers, rollouts, links, options, measured[mode]));
      absl::FPrintF(out, "  job %d relay %-5s done in %.1f s (every byte verified)\n", round + 1,
                    mode, absl::ToDoubleSeconds(absl::Now() - start));
      std::fflush(out);
    }
  }

  absl::FPrintF(out, "\n%-6s %8s %26s %28s %12s  %s\n", "relay", "relayed",
                "inter-node bytes per sync", "measured s (median; min-max)", "predicted s",
                "binding resource (cost model)");
  for (const char* mode : kModes) {
    const Projection& p = projected[mode];
    const RelayTimes& m = measured[mode];
    const auto [low, high] = std::minmax_element(m.seconds.begin(), m.seconds.end());
    absl::FPrintF(out, "%-6s %8d %14d (plan %7d) %10.4f (%.4f-%.4f) %12.4f  %s\n", mode, p.relays,
                  m.inter_node_bytes, p.inter_node_bytes, m.Median(), *low, *high,
                  p.prediction.seconds, p.prediction.binding);
  }
  const double measured_ratio = measured["never"].Median() / measured["auto"].Median();
  const double predicted_ratio =
      projected["never"].prediction.seconds / projected["auto"].prediction.seconds;
  absl::FPrintF(out,
                "auto vs never: %.2fx faster measured (%d syncs each), %.2fx predicted; inter-node "
                "bytes %.2fx\n",
                measured_ratio, measured["auto"].seconds.size(), predicted_ratio,
                static_cast<double>(measured["auto"].inter_node_bytes) /
                    static_cast<double>(std::max<int64_t>(1, measured["never"].inter_node_bytes)));
  absl::FPrintF(out,
                "  (the cost model prices each sender's egress on its own; the trainers here share "
                "one shaped veth)\n");
  return absl::OkStatus();
}

}  // namespace wsync::bench
