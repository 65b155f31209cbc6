#include "integration/cli/plan_command.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/hash.h"
#include "common/status.h"
#include "cost/link_model.h"
#include "executor/schedule.h"
#include "integration/cli/plan_compare.h"
#include "integration/cli/plan_delta.h"
#include "integration/cli/plan_measure.h"
#include "integration/cli/plan_pricing.h"
#include "integration/cli/plan_quant.h"
#include "integration/cli/plan_simgrid.h"
#include "integration/cli/plan_traffic.h"
#include "integration/model_config/hf_config.h"
#include "planner/geometry.h"
#include "planner/job.h"
#include "planner/layout.h"
#include "planner/models.h"
#include "planner/named_layouts.h"
#include "planner/plan.h"
#include "planner/policy.h"
#include "planner/relay.h"
#include "plugin/prediction.h"

ABSL_FLAG(std::string, model, "",
          "A built-in model name or the path of a config.json; `wsync help` lists them.");
ABSL_FLAG(bool, include_mtp, false,
          "With a config.json --model: include its MTP layers (num_nextn_predict_layers).");
ABSL_FLAG(std::string, from, "", "Named layout of the source (trainer) side.");
ABSL_FLAG(std::string, to, "", "Named layout of the target (rollout) side.");
ABSL_FLAG(std::optional<int32_t>, process, std::nullopt,
          "Global process id to plan for; all processes when unset.");
ABSL_FLAG(std::string, policy, std::string(wsync::kDefaultReplicaPolicy),
          "Replica policy: first_holder, local_first_least_loaded or cost_aware (with "
          "--calibration or --simulate).");
ABSL_FLAG(int64_t, segments, 10, "Number of segments to list.");
ABSL_FLAG(std::string, simulate, "",
          "A cluster file (integration/clusters/*.cluster): prices the plan on that cluster.");
ABSL_FLAG(std::string, calibration, "",
          "A calibration file (wsync calibrate --out); prices the plan's traffic with it.");
ABSL_FLAG(std::string, relay, "auto", "Relay mode: never, always or auto.");
ABSL_FLAG(std::string, engine, "cost_model",
          "With --simulate: cost_model (the bound, fast) or simgrid (the executor of every "
          "process run on SimGrid).");
ABSL_FLAG(
    std::string, compare, "",
    "With --engine simgrid: relay, policy or relay,policy: simulate every choice, one row each.");
ABSL_FLAG(std::string, simulate_lanes, "lockstep",
          "With --engine simgrid: lockstep (rounds, as over NCCL) or independent (each peer "
          "direction on its own, as over UCX).");
ABSL_FLAG(std::optional<double>, delta_changed_fraction, std::nullopt,
          "With --calibration or --simulate: predict a delta sync (delta=on and delta=auto) at "
          "this fraction of changed elements, in [0, 1].");
ABSL_FLAG(bool, require_prediction, false,
          "Fail (exit 1) when --calibration or --simulate cannot price every path class the plan "
          "uses.");

namespace wsync::cli {
namespace {

struct PhaseCost {
  double ms = 0;
  std::optional<int64_t> rss_after;  // Resident bytes when the phase ended.
};

// Everything one `wsync plan` run produced, and what each phase cost.
struct PlanRun {
  ModelSpec model;
  std::optional<Job> job;  // Set once Job::Create succeeded.
  Plan plan;
  std::optional<int64_t> rss_start;
  PhaseCost build;     // GetModel and both BuildNamedLayout calls.
  PhaseCost validate;  // Job::Create (validation of both layouts and of the pair).
  PhaseCost planning;  // MakeReplicaPolicy and MakePlan.
};

// `result`, with `what` prefixed to its message when it is an error.
template <typename T>
absl::StatusOr<T> WithContext(absl::StatusOr<T> result, const std::string& what) {
  if (result.ok()) return result;
  return absl::Status(result.status().code(), absl::StrCat(what, ": ", result.status().message()));
}

// The fits the cost_aware policy plans with: of --calibration, else of --simulate's links.
absl::StatusOr<LinkFits> PolicyFits(const PlanRequest& request);

absl::StatusOr<PlanRun> Execute(const PlanRequest& request,
                                std::shared_ptr<const LinkFits> relay_fits) {
  PlanRun run;
  run.rss_start = ResidentBytes();
  Stopwatch watch;

  WSYNC_ASSIGN_OR_RETURN(run.model,
                         WithContext(LoadModel(request.model, request.include_mtp), "--model"));
  NamedLayoutOptions placement;
  if (request.procs_per_node > 0) placement.procs_per_node = request.procs_per_node;
  WSYNC_ASSIGN_OR_RETURN(
      NamedJobLayouts layouts,
      WithContext(BuildNamedJobLayouts(run.model, request.from, request.to, placement),
                  "--from/--to"));
  run.build = {watch.Lap(), ResidentBytes()};

  WSYNC_ASSIGN_OR_RETURN(Job job,
                         Job::Create(std::move(layouts.source), std::move(layouts.target)));
  run.job.emplace(std::move(job));
  run.validate = {watch.Lap(), ResidentBytes()};

  const int32_t num_processes = run.job->num_processes();
  if (request.process.has_value() && (*request.process < 0 || *request.process >= num_processes)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--process %d is out of range: the job has processes 0..%d (source ranks "
                        "0..%d, then target "
                        "ranks from %d)",
                        *request.process, num_processes - 1, run.job->source().processes.size() - 1,
                        run.job->TargetId(0)));
  }
  watch.Lap();  // The range check is not part of planning.
  std::optional<LinkFits> fits;
  if (request.policy == "cost_aware") {
    WSYNC_ASSIGN_OR_RETURN(fits, PolicyFits(request));
  }
  WSYNC_ASSIGN_OR_RETURN(
      std::unique_ptr<ReplicaPolicy> policy,
      WithContext(MakeSessionPolicy(request.policy, fits ? &*fits : nullptr), "--policy"));
  PlanOptions options;
  options.process = request.process;
  WSYNC_ASSIGN_OR_RETURN(options.relay.mode, WithContext(ParseRelayMode(request.relay), "--relay"));
  options.relay.fits = std::move(relay_fits);
  WSYNC_ASSIGN_OR_RETURN(run.plan, MakePlan(*run.job, *policy, options));
  run.planning = {watch.Lap(), ResidentBytes()};
  return run;
}

// ---------------------------------------------------------------------------------------------
// Printing.

// "n/a" for a figure that could not be read.
std::string MaybeBytes(const std::optional<int64_t>& bytes) {
  return bytes.has_value() ? HumanBytes(*bytes) : std::string("n/a");
}

int64_t CountNodes(const Layout& layout) {
  absl::flat_hash_set<absl::string_view> nodes;
  for (const ProcessInfo& process : layout.processes) nodes.insert(process.node_id);
  return static_cast<int64_t>(nodes.size());
}

void PrintLayout(std::FILE* out, absl::string_view label, absl::string_view spec,
                 const Layout& layout) {
  const int64_t nodes = CountNodes(layout);
  absl::FPrintF(out, "%-16s %s: %s, %d processes on %d node%s, %d buffers, %d pieces, %s held\n",
                label, spec, RoleName(layout.role), layout.processes.size(), nodes,
                nodes == 1 ? "" : "s", layout.buffers.size(), layout.pieces.size(),
                HumanBytes(layout.PieceBytes()));
}

void PrintSummary(std::FILE* out, const PlanRequest& request, const PlanRun& run,
                  const TrafficTally& traffic) {
  const Job& job = *run.job;
  const ModelSpec& model = run.model;
  absl::FPrintF(out, "%-16s %s: %d parameters, %d elements, %s (%d B)\n", "model", model.name,
                model.tensors.size(), model.TotalElements(), HumanBytes(model.TotalBytes()),
                model.TotalBytes());
  PrintLayout(out, "from", request.from, job.source());
  PrintLayout(out, "to", request.to, job.target());
  int32_t shared_nodes = 0;  // Nodes with processes of both sides.
  absl::flat_hash_set<int32_t> source_nodes;
  absl::flat_hash_set<int32_t> target_nodes;
  for (int32_t id = 0; id < job.num_processes(); ++id) {
    (job.IsSource(id) ? source_nodes : target_nodes).insert(job.NodeIndex(id));
  }
  for (int32_t node : source_nodes) shared_nodes += target_nodes.contains(node) ? 1 : 0;
  absl::FPrintF(out, "%-16s %s\n", "placement",
                shared_nodes == 0 ? std::string("separate: no node holds both sides")
                                  : absl::StrFormat("colocated: %d node%s both sides", shared_nodes,
                                                    shared_nodes == 1 ? " holds" : "s hold"));
  absl::FPrintF(out, "%-16s %d: source (%s) p0..p%d, target (%s) p%d..p%d\n", "processes",
                job.num_processes(), RoleName(job.source().role), job.TargetId(0) - 1,
                RoleName(job.target().role), job.TargetId(0), job.num_processes() - 1);
  absl::FPrintF(out, "%-16s %s\n", "policy", run.plan.policy);
  absl::FPrintF(out, "%-16s %s\n", "planned for",
                request.process.has_value() ? ProcessName(job, *request.process)
                                            : std::string("all processes"));
  absl::FPrintF(out, "%-16s %s (layouts, policy and its answers; equal for any --process)\n",
                "digest", DigestHex(run.plan.digest));
  absl::FPrintF(out, "%-16s %s (the segments of this plan)\n", "segments digest",
                DigestHex(run.plan.segments_digest));
  absl::FPrintF(out, "%-16s %d moving %s (%d B)\n", "segments", run.plan.segments.size(),
                HumanBytes(traffic.all.bytes), traffic.all.bytes);
  absl::FPrintF(out, "%-16s %d replica requests\n", "requests", run.plan.requests.size());
  int64_t fixed_bytes = 0, fixed_regions = 0;
  for (const FixedPairTraffic& pair : run.plan.fixed_traffic) {
    fixed_bytes += pair.bytes;
    fixed_regions += pair.regions;
  }
  absl::FPrintF(out, "%-16s %s in %d single-holder regions over %d pairs (whole job)\n",
                "fixed traffic", HumanBytes(fixed_bytes), fixed_regions,
                run.plan.fixed_traffic.size());
}

void PrintSegments(std::FILE* out, const Job& job, const Plan& plan, int64_t count) {
  const int64_t shown = std::min<int64_t>(count, static_cast<int64_t>(plan.segments.size()));
  if (shown == 0) return;
  absl::FPrintF(out, "\nfirst %d segments (p = global process id; offsets in elements):\n", shown);
  for (int64_t i = 0; i < shown; ++i) {
    const Segment& segment = plan.segments[i];
    absl::FPrintF(
        out, "  #%d %s %s\n       p%d buffer %d offset %d -> p%d buffer %d offset %d, %s\n", i,
        job.target().params[segment.param].name, BoxToString(segment.box), segment.from.process,
        segment.from.buffer, segment.from.offset, segment.to.process, segment.to.buffer,
        segment.to.offset, HumanBytes(SegmentBytes(job, segment)));
  }
}

void PrintCost(std::FILE* out, const PlanRun& run) {
  const double total_ms = run.build.ms + run.validate.ms + run.planning.ms;
  absl::FPrintF(out,
                "\ntime: %.1f ms = build layouts %.1f ms + validate/job %.1f ms + plan %.1f ms\n",
                total_ms, run.build.ms, run.validate.ms, run.planning.ms);
  absl::FPrintF(out, "memory: peak RSS %s (getrusage ru_maxrss)\n",
                HumanBytes(PeakResidentBytes()));
  absl::FPrintF(out, "  RSS %s at start, %s after layouts, %s after job, %s after plan\n",
                MaybeBytes(run.rss_start), MaybeBytes(run.build.rss_after),
                MaybeBytes(run.validate.rss_after), MaybeBytes(run.planning.rss_after));
  if (run.rss_start.has_value() && run.planning.rss_after.has_value()) {
    absl::FPrintF(out, "  RSS growth during planning (start to after plan): %s\n",
                  HumanBytes(*run.planning.rss_after - *run.rss_start));
  }
}

}  // namespace

namespace {

absl::StatusOr<LinkFits> PolicyFits(const PlanRequest& request) {
  if (request.calibration.empty() && request.simulate.empty()) {
    return absl::InvalidArgumentError("--policy cost_aware needs --calibration or --simulate");
  }
  WSYNC_ASSIGN_OR_RETURN(const PricingSource source,
                         request.calibration.empty() ? ReadCluster(request.simulate)
                                                     : ReadCalibrationFile(request.calibration));
  return FitLinks(source.calibration);
}

}  // namespace

// What crossed node boundaries, with and without relaying, and what was relayed.
void PrintRelay(std::FILE* out, const PlanRequest& request, const Plan& plan, bool priced) {
  int64_t arenas = 0;
  for (const Relay& relay : plan.relays) arenas += relay.in_arena ? 1 : 0;
  const absl::string_view rule = request.relay != "auto" ? ""
                                 : priced                ? " (cost model)"
                                                         : " (bytes rule)";
  absl::FPrintF(out, "\nrelay %s%s: %d regions relayed (%d through a relay arena)\n", request.relay,
                rule, plan.relays.size(), arenas);
  // Plan::inter_node_bytes: the whole job's when relaying is on (relays are chosen over every
  // process's segments) or no process is given, else the given process's.
  const std::string scope = request.process && request.relay == "never"
                                ? absl::StrCat("process ", *request.process)
                                : std::string("whole job");
  absl::FPrintF(out, "inter-node bytes (%s): %s (%d B) with relay, %s (%d B) without; saved %s\n",
                scope, HumanBytes(plan.inter_node_bytes), plan.inter_node_bytes,
                HumanBytes(plan.inter_node_bytes_without_relay),
                plan.inter_node_bytes_without_relay,
                HumanBytes(plan.inter_node_bytes_without_relay - plan.inter_node_bytes));
}

absl::Status RunPlan(const PlanRequest& request, std::FILE* out) {
  std::optional<PricingSource> calibration, cluster;
  if (!request.calibration.empty()) {
    WSYNC_ASSIGN_OR_RETURN(calibration, ReadCalibrationFile(request.calibration));
  }
  if (!request.simulate.empty()) {
    WSYNC_ASSIGN_OR_RETURN(cluster, ReadCluster(request.simulate));
  }
  std::shared_ptr<const LinkFits> relay_fits;
  if (calibration || cluster) {
    WSYNC_ASSIGN_OR_RETURN(LinkFits fits,
                           FitLinks(calibration ? calibration->calibration : cluster->calibration));
    relay_fits = std::make_shared<const LinkFits>(std::move(fits));
  }
  PlanRequest placed = request;
  if (cluster && placed.procs_per_node <= 0) placed.procs_per_node = cluster->procs_per_node;
  WSYNC_ASSIGN_OR_RETURN(const PlanRun run, Execute(placed, relay_fits));
  const Job& job = *run.job;
  const TrafficTally traffic = Tally(job, run.plan, request.process);
  PrintSummary(out, request, run, traffic);
  PrintSegments(out, job, run.plan, request.segments_to_show);
  if (request.process.has_value()) {
    PrintPairsOfProcess(out, job, traffic, *request.process);
  } else {
    PrintPairSummary(out, job, traffic);
  }
  PrintPaths(out, traffic);
  PrintRelay(out, request, run.plan, relay_fits != nullptr);
  PrintQuant(out, job, run.plan);
  std::map<std::string, int64_t> unpriced;  // Over both sources.
  double cluster_bound_seconds = 0;
  for (const std::optional<PricingSource>* source : {&calibration, &cluster}) {
    if (!source->has_value()) continue;
    WSYNC_ASSIGN_OR_RETURN(const Prediction prediction,
                           PrintPrediction(out, request, job, run.plan, **source));
    for (const auto& [path, bytes] : prediction.unpriced_bytes) unpriced[path] += bytes;
    if (source == &cluster) cluster_bound_seconds = prediction.seconds;
    if (source == &cluster && !request.process.has_value()) {
      WSYNC_RETURN_IF_ERROR(PrintIngressFloor(out, job, run.plan, *cluster));
    }
    if (request.delta_changed_fraction.has_value()) {
      WSYNC_RETURN_IF_ERROR(PrintDeltaPrediction(out, request, job, run.plan, **source,
                                                 /*cluster_file=*/source == &cluster, prediction));
    }
  }
  if (cluster && !request.compare.empty()) {
    WSYNC_RETURN_IF_ERROR(PrintComparison(out, request, job, *cluster));
  } else if (cluster && request.engine == "simgrid") {
    WSYNC_RETURN_IF_ERROR(
        PrintSimGridSimulation(out, job, run.plan, *cluster, cluster_bound_seconds,
                               /*lockstep=*/request.simulate_lanes == "lockstep"));
  }
  PrintCost(out, run);
  if (request.require_prediction && !unpriced.empty()) {
    std::vector<std::string> paths;
    for (const auto& [path, bytes] : unpriced) paths.push_back(path);
    return absl::FailedPreconditionError(
        absl::StrCat("--require_prediction: the plan moves bytes on path classes with no fit: ",
                     absl::StrJoin(paths, ", ")));
  }
  return absl::OkStatus();
}

std::string PlanUsage() {
  return absl::StrCat(
      "usage: wsync plan --model M --from LAYOUT --to LAYOUT [--process P] [--include_mtp]\n"
      "                  [--policy first_holder|local_first_least_loaded|cost_aware]\n"
      "                  [--segments N]\n"
      "                  [--calibration FILE] [--simulate CLUSTER_FILE]\n"
      "                  [--relay never|always|auto] [--require_prediction]\n"
      "                  [--delta_changed_fraction F]\n"
      "                  [--engine cost_model|simgrid] [--compare relay,policy]\n"
      "                  [--simulate_lanes lockstep|independent]\n"
      "\n"
      "  --model     ",
      ModelFlagHelp(),
      "\n"
      "  --include_mtp  with a config.json --model: include its MTP layers\n"
      "  --from      the trainer's layout: megatron(tp=1,pp=1,ep=1,dp=ep) or fsdp(n)\n"
      "  --to        the rollout's layout: vllm(tp=1,ep=1,dp=1,quant=none|fp8_block|\n"
      "              fp8_channel|fp8_tensor)\n"
      "              (keys may be omitted; the values shown are the defaults)\n"
      "              placement, in either layout: ppn=K processes (GPUs) per node (default 8,\n"
      "              or the --simulate cluster's); colocated=1 puts rank r of both sides on\n"
      "              node r / ppn and GPU r % ppn (colocated engines; the pair of one rank is\n"
      "              same_device); colocated=0 (default) puts each side on\n"
      "              nodes of its own, so every trainer -> rollout path is inter_node\n"
      "  --process   plan only what global process P sends or receives: trainer ranks are\n"
      "              0..S-1, rollout ranks S..S+T-1 (default: all processes)\n"
      "  --policy    replica policy (default: local_first_least_loaded; cost_aware plans with\n"
      "              the fits of --calibration, else of --simulate)\n"
      "  --segments  how many segments to list (default: 10)\n"
      "  --calibration  price the traffic with a calibration file (wsync calibrate) and name\n"
      "              the binding resource; traffic on a path class the file has no fit for is\n"
      "              left out, named, with the wsync calibrate command that measures it\n"
      "  --require_prediction  exit 1 when something is left out of the price\n"
      "  --delta_changed_fraction  with --calibration or --simulate: also predict a delta sync\n"
      "              (docs/delta.md) when a fraction F in [0, 1] of the elements changed: per\n"
      "              path class whether delta pays (delta=auto's rule), then the delta=on and\n"
      "              delta=auto syncs' seconds and bytes on the wire against dense, from the\n"
      "              file's link fits and delta_encode / delta_apply rates (wsync calibrate\n"
      "              measures them; without them the report names the command that does)\n"
      "  --simulate  price the whole plan on a cluster file's stated links\n"
      "              (integration/clusters/), next to published figures of other systems\n"
      "  --engine    with --simulate and without --process: cost_model (default) prices the\n"
      "              plan with the cost model (a lower bound); simgrid also runs the executor of\n"
      "              every process on SimGrid over the cluster file's topology and\n"
      "              prints the simulated sync time next to the bound\n"
      "  --compare   with --engine simgrid: relay, policy or relay,policy: plan, price and\n"
      "              simulate every relay mode and/or policy, one table row each\n"
      "  --simulate_lanes  with --engine simgrid: lockstep (default: rounds, as over NCCL) or\n"
      "              independent (each peer direction on its own, as over UCX)\n"
      "  --relay     cross a node boundary once for bytes several processes of a node need, and\n"
      "              forward them inside the node: never, always, or auto (default: the\n"
      "              calibration's or cluster's cost model decides per region; without one,\n"
      "              regions of at least 64 KiB are relayed)\n"
      "\n"
      "examples:\n"
      "  wsync plan --model kimi-k2 --from 'megatron(pp=16,ep=16)' "
      "--to 'vllm(tp=8,ep=8,dp=16)' --process 0\n"
      "  wsync calibrate --processes 4 --out cal.pb\n"
      "  wsync plan --model qwen2.5-0.5b --from 'megatron(tp=2,dp=2,colocated=1)' "
      "--to 'vllm(tp=2)' \\\n"
      "      --calibration cal.pb\n");
}

int PlanMain(int argc, char** argv) {
  const std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    absl::FPrintF(stderr, "wsync plan: unexpected argument '%s'\n\n%s", positional[1], PlanUsage());
    return 2;
  }
  PlanRequest request;
  request.model = absl::GetFlag(FLAGS_model);
  request.include_mtp = absl::GetFlag(FLAGS_include_mtp);
  request.from = absl::GetFlag(FLAGS_from);
  request.to = absl::GetFlag(FLAGS_to);
  request.process = absl::GetFlag(FLAGS_process);
  request.policy = absl::GetFlag(FLAGS_policy);
  request.segments_to_show = absl::GetFlag(FLAGS_segments);
  request.calibration = absl::GetFlag(FLAGS_calibration);
  request.simulate = absl::GetFlag(FLAGS_simulate);
  request.relay = absl::GetFlag(FLAGS_relay);
  request.require_prediction = absl::GetFlag(FLAGS_require_prediction);
  request.engine = absl::GetFlag(FLAGS_engine);
  request.compare = absl::GetFlag(FLAGS_compare);
  request.simulate_lanes = absl::GetFlag(FLAGS_simulate_lanes);
  request.delta_changed_fraction = absl::GetFlag(FLAGS_delta_changed_fraction);
  if (request.model.empty() || request.from.empty() || request.to.empty()) {
    absl::FPrintF(stderr, "wsync plan: --model, --from and --to are required\n\n%s", PlanUsage());
    return 2;
  }
  if (request.require_prediction && request.calibration.empty() && request.simulate.empty()) {
    absl::FPrintF(stderr, "wsync plan: --require_prediction needs --calibration or --simulate\n");
    return 2;
  }
  if (const std::optional<double> f = request.delta_changed_fraction;
      f.has_value() &&
      (!(*f >= 0 && *f <= 1) || (request.calibration.empty() && request.simulate.empty()))) {
    absl::FPrintF(stderr,
                  "wsync plan: --delta_changed_fraction takes a fraction in [0, 1], with "
                  "--calibration or --simulate\n");
    return 2;
  }
  if (request.engine != "cost_model" && request.engine != "simgrid") {
    absl::FPrintF(stderr, "wsync plan: --engine must be cost_model or simgrid\n");
    return 2;
  }
  if (request.engine == "simgrid" && (request.simulate.empty() || request.process.has_value())) {
    absl::FPrintF(stderr, "wsync plan: --engine simgrid needs --simulate and no --process\n");
    return 2;
  }
  if (!request.compare.empty() &&
      (request.engine != "simgrid" || !CheckCompareList(request.compare).ok())) {
    absl::FPrintF(stderr,
                  "wsync plan: --compare takes relay, policy or both, with --engine simgrid\n");
    return 2;
  }
  if (request.simulate_lanes != "lockstep" && request.simulate_lanes != "independent") {
    absl::FPrintF(stderr, "wsync plan: --simulate_lanes must be lockstep or independent\n");
    return 2;
  }
  if (request.segments_to_show < 0) {
    absl::FPrintF(stderr, "wsync plan: --segments must be >= 0\n");
    return 2;
  }
  const absl::Status status = RunPlan(request, stdout);
  if (!status.ok()) {
    absl::FPrintF(stderr, "wsync plan: %s\n", status.ToString());
    return 1;
  }
  return 0;
}

}  // namespace wsync::cli
