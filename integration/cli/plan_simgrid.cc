#include "integration/cli/plan_simgrid.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "cost/link_model.h"
#include "integration/simulation/cluster_file.h"
#include "integration/simulation/simgrid/cluster_platform.h"
#include "plugin/prediction.h"

namespace wsync::cli {
namespace {

using simgrid_backend::ClusterTopology;
using simgrid_backend::GpuPlacement;
using simgrid_backend::LinkHop;

std::string ProcessLabel(const Job& job, int32_t id) {
  const JobProcess& process = job.processes()[id];
  return absl::StrFormat("p%d (%s %d)", id, RoleName(process.role), process.rank);
}

// The bytes each link direction carried: every delivered message along its route.
std::vector<LinkLoad> BusiestLinks(const ClusterTopology& topology,
                                   const std::vector<GpuPlacement>& placement,
                                   const simulation::SimulationResult& result) {
  absl::flat_hash_map<std::pair<int32_t, int32_t>, int64_t> pair_bytes;
  for (const simgrid_backend::DeliveredMessage& message : result.messages) {
    pair_bytes[{message.from, message.to}] += message.bytes;
  }
  std::map<LinkHop, int64_t> hop_bytes;
  for (const auto& [pair, bytes] : pair_bytes) {
    for (const LinkHop& hop :
         simgrid_backend::RouteBetween(topology, placement[pair.first], placement[pair.second])) {
      hop_bytes[hop] += bytes;
    }
  }
  std::vector<LinkLoad> loads;
  for (const auto& [hop, bytes] : hop_bytes) {
    loads.push_back({hop.Name(), bytes, simgrid_backend::HopBytesPerSecond(topology, hop.kind)});
  }
  std::stable_sort(loads.begin(), loads.end(), [](const LinkLoad& a, const LinkLoad& b) {
    return a.bytes / a.bytes_per_second > b.bytes / b.bytes_per_second;
  });
  if (loads.size() > 5) loads.resize(5);
  return loads;
}

void PrintSlowest(std::FILE* out, const Job& job, const simulation::SimulationResult& result) {
  std::vector<int32_t> order(result.processes.size());
  for (size_t p = 0; p < order.size(); ++p) order[p] = static_cast<int32_t>(p);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return result.processes[a].finish_seconds > result.processes[b].finish_seconds;
  });
  const size_t shown = std::min<size_t>(10, order.size());
  absl::FPrintF(out, "  the %d slowest processes (simulated finish):\n", shown);
  for (size_t i = 0; i < shown; ++i) {
    const simulation::ProcessOutcome& process = result.processes[order[i]];
    absl::FPrintF(out, "    %-22s %.4f s  %d rounds, sent %s, received %s\n",
                  ProcessLabel(job, order[i]), process.finish_seconds, process.stats.rounds,
                  HumanBytes(process.stats.sent_bytes), HumanBytes(process.stats.received_bytes));
  }
}

}  // namespace

absl::Status CheckSimulationCluster(const PricingSource& cluster) {
  if (!cluster.topology.has_value()) {
    return absl::FailedPreconditionError(
        "--engine simgrid needs the cluster file's topology (gpus_per_node, nics_per_node, "
        "nvlink, pcie, nic, nodes_per_leaf, oversubscription, spine_latency; "
        "integration/clusters/README.md)");
  }
  WSYNC_ASSIGN_OR_RETURN(const LinkFits fits, FitLinks(cluster.calibration));
  if (!fits.by_path.contains(std::string(kPathLocal))) {
    return absl::FailedPreconditionError("--engine simgrid needs the cluster's local link");
  }
  return absl::OkStatus();
}

absl::StatusOr<ClusterSimulation> SimulateOnCluster(const Job& job, const Plan& plan,
                                                    const PricingSource& cluster, bool lockstep) {
  WSYNC_RETURN_IF_ERROR(CheckSimulationCluster(cluster));
  WSYNC_ASSIGN_OR_RETURN(const LinkFits fits, FitLinks(cluster.calibration));
  const auto local = fits.by_path.find(std::string(kPathLocal));
  // GPU processes: every buffer in device memory, so that no weight byte is needed.
  WSYNC_ASSIGN_OR_RETURN(const Job device_job,
                         Job::Create(simulation::InDeviceMemory(job.source()),
                                     simulation::InDeviceMemory(job.target())));
  simgrid_backend::ClusterPlatformSpec spec;
  spec.topology = *cluster.topology;
  WSYNC_ASSIGN_OR_RETURN(spec.placement, simulation::PlaceOnCluster(spec.topology, device_job));
  const simgrid_backend::ClusterPlatform platform(spec);
  simulation::SimulationOptions options;
  options.platform = &platform;
  options.copy_bytes_per_second = local->second.bytes_per_second;
  options.needs_round_order = lockstep;
  options.plan_digest = plan.digest;
  if (job.HasQuantizedParams()) {  // At the rate the cost model prices the quantize step with.
    options.quant = &plan.quant;
    options.quantize_bytes_per_second =
        QuantizeRateOf(fits, cluster.quantize_bytes_per_second).bytes_per_second;
  }
  options.record_messages = true;  // For the link loads.
  // Measuring the engine's own settings (docs/simulation.md): space-separated
  // SimGrid --cfg settings, e.g. WSYNC_SIMGRID_CFG="network/optim:Full".
  if (const char* settings = std::getenv("WSYNC_SIMGRID_CFG"); settings != nullptr) {
    options.simgrid_config = absl::StrSplit(settings, ' ', absl::SkipEmpty());
  }
  ClusterSimulation simulated;
  WSYNC_ASSIGN_OR_RETURN(simulated.result,
                         simulation::SimulateSync(device_job, plan.segments, options));
  simulated.platform = platform.Describe();
  simulated.copy_bytes_per_second = options.copy_bytes_per_second;
  simulated.busiest_links = BusiestLinks(spec.topology, spec.placement, simulated.result);
  simulated.result.messages.clear();
  simulated.result.messages.shrink_to_fit();
  return simulated;
}

absl::Status PrintSimGridSimulation(std::FILE* out, const Job& job, const Plan& plan,
                                    const PricingSource& cluster, double bound_seconds,
                                    bool lockstep) {
  WSYNC_ASSIGN_OR_RETURN(const ClusterSimulation simulated,
                         SimulateOnCluster(job, plan, cluster, lockstep));
  const simulation::SimulationResult& result = simulated.result;
  absl::FPrintF(out,
                "\nsimulated (SimGrid; the executor of all %d processes, %s):\n  platform %s; "
                "device copies at %.4g GB/s\n",
                job.num_processes(),
                lockstep ? "lockstep rounds as over NCCL" : "independent lanes as over UCX",
                simulated.platform, simulated.copy_bytes_per_second / 1e9);
  absl::FPrintF(out, "  sync time %.4f s = %.3fx the cost model's bound %.4f s\n",
                result.sync_seconds, bound_seconds > 0 ? result.sync_seconds / bound_seconds : 0,
                bound_seconds);
  PrintSlowest(out, job, result);
  absl::FPrintF(out, "  the %d busiest links (bytes; busy = bytes / bandwidth / sync time):\n",
                simulated.busiest_links.size());
  for (const LinkLoad& link : simulated.busiest_links) {
    const double busy =
        result.sync_seconds > 0 ? link.bytes / link.bytes_per_second / result.sync_seconds : 0;
    absl::FPrintF(out, "    %-22s %12s  %5.1f%% busy\n", link.name, HumanBytes(link.bytes),
                  100 * busy);
  }
  absl::FPrintF(out, "  simulation: %d messages, %.1f s wall, peak RSS %s\n", result.message_count,
                result.wall_seconds, HumanBytes(result.peak_rss_bytes));
  return result.FirstFailure();
}

}  // namespace wsync::cli
