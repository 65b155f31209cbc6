#include "integration/cli/plan_simgrid.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "calibration/link_model/link_model.h"
#include "common/status.h"
#include "integration/simulation/simulate_sync.h"
#include "transport/simgrid/platform.h"

namespace wsync::cli {
namespace {

std::string ProcessLabel(const Job& job, int32_t id) {
  const JobProcess& process = job.processes()[id];
  return absl::StrFormat("p%d (%s %d)", id, RoleName(process.role), process.rank);
}

// One direction of one process's link on the star and what it carried.
struct LinkUse {
  int32_t process = 0;
  bool up = true;  // Sends (up) or receives (down).
  int64_t bytes = 0;
};

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

void PrintBusiestLinks(std::FILE* out, const simulation::SimulationResult& result,
                       double link_bytes_per_second) {
  std::vector<LinkUse> links;
  for (size_t p = 0; p < result.sent_bytes.size(); ++p) {
    links.push_back({static_cast<int32_t>(p), true, result.sent_bytes[p]});
    links.push_back({static_cast<int32_t>(p), false, result.received_bytes[p]});
  }
  std::stable_sort(links.begin(), links.end(),
                   [](const LinkUse& a, const LinkUse& b) { return a.bytes > b.bytes; });
  const size_t shown = std::min<size_t>(5, links.size());
  absl::FPrintF(out, "  the %d busiest links (bytes; busy = bytes / bandwidth / sync time):\n",
                shown);
  for (size_t i = 0; i < shown; ++i) {
    const LinkUse& link = links[i];
    const double busy = result.sync_seconds > 0 ? static_cast<double>(link.bytes) /
                                                      link_bytes_per_second / result.sync_seconds
                                                : 0;
    absl::FPrintF(out, "    link of p%d %-4s %12s  %5.1f%% busy\n", link.process,
                  link.up ? "up" : "down", HumanBytes(link.bytes), 100 * busy);
  }
}

}  // namespace

absl::Status PrintSimGridSimulation(std::FILE* out, const Job& job, const Plan& plan,
                                    const PricingSource& cluster, double bound_seconds) {
  WSYNC_ASSIGN_OR_RETURN(const LinkFits fits, FitLinks(cluster.calibration));
  const auto inter_node = fits.by_path.find(std::string(kPathInterNode));
  const auto local = fits.by_path.find(std::string(kPathLocal));
  if (inter_node == fits.by_path.end() || local == fits.by_path.end()) {
    return absl::FailedPreconditionError(
        "--engine simgrid needs the cluster's inter_node and local links");
  }
  const simgrid_backend::StarPlatform platform(
      {inter_node->second.bytes_per_second, inter_node->second.alpha_seconds / 2});
  // GPU processes: every buffer in device memory, so that no weight byte is needed.
  WSYNC_ASSIGN_OR_RETURN(const Job device_job,
                         Job::Create(simulation::InDeviceMemory(job.source()),
                                     simulation::InDeviceMemory(job.target())));
  simulation::SimulationOptions options;
  options.platform = &platform;
  options.copy_bytes_per_second = local->second.bytes_per_second;
  options.needs_round_order = true;
  options.plan_digest = plan.digest;
  WSYNC_ASSIGN_OR_RETURN(const simulation::SimulationResult result,
                         simulation::SimulateSync(device_job, plan.segments, options));
  absl::FPrintF(out,
                "\nsimulated (SimGrid; the executor of all %d processes, lockstep rounds as over "
                "NCCL):\n  platform %s; device copies at %.4g GB/s\n",
                job.num_processes(), platform.Describe(), options.copy_bytes_per_second / 1e9);
  absl::FPrintF(out, "  sync time %.4f s = %.3fx the cost model's bound %.4f s\n",
                result.sync_seconds, bound_seconds > 0 ? result.sync_seconds / bound_seconds : 0,
                bound_seconds);
  PrintSlowest(out, job, result);
  PrintBusiestLinks(out, result, platform.spec().link_bytes_per_second);
  absl::FPrintF(out, "  simulation: %d messages, %.1f s wall, peak RSS %s\n", result.message_count,
                result.wall_seconds, HumanBytes(result.peak_rss_bytes));
  return result.FirstFailure();
}

}  // namespace wsync::cli
