#include "integration/cli/plan_compare.h"

#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "cost/link_model.h"
#include "integration/cli/plan_simgrid.h"
#include "planner/plan.h"
#include "planner/relay.h"
#include "plugin/prediction.h"

namespace wsync::cli {
namespace {

constexpr const char* kRelayModes[] = {"never", "always", "auto"};
constexpr const char* kPolicies[] = {"first_holder", "local_first_least_loaded", "cost_aware"};

struct Choice {
  std::string relay;
  std::string policy;
};

struct Row {
  int64_t inter_node_bytes = 0;
  double bound_seconds = 0;
  ClusterSimulation simulation;
};

absl::StatusOr<Row> PlanPriceAndSimulate(const Job& job, const Choice& choice,
                                         const PricingSource& cluster,
                                         const std::shared_ptr<const LinkFits>& fits) {
  WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<ReplicaPolicy> policy,
                         MakeSessionPolicy(choice.policy, fits.get()));
  PlanOptions options;
  WSYNC_ASSIGN_OR_RETURN(options.relay.mode, ParseRelayMode(choice.relay));
  options.relay.fits = fits;
  WSYNC_ASSIGN_OR_RETURN(const Plan plan, MakePlan(job, *policy, options));
  Row row;
  row.inter_node_bytes = plan.inter_node_bytes;
  WSYNC_ASSIGN_OR_RETURN(const Prediction bound, PredictPriced(*fits, PlanTraffic(job, plan)));
  row.bound_seconds = bound.seconds;
  WSYNC_ASSIGN_OR_RETURN(row.simulation, SimulateOnCluster(job, plan, cluster));
  WSYNC_RETURN_IF_ERROR(row.simulation.result.FirstFailure());
  return row;
}

}  // namespace

absl::Status CheckCompareList(absl::string_view compare) {
  bool relay = false, policy = false;
  for (absl::string_view entry : absl::StrSplit(compare, ',')) {
    bool& seen = entry == "relay" ? relay : policy;
    if ((entry != "relay" && entry != "policy") || seen) {
      return absl::InvalidArgumentError(
          absl::StrCat("--compare: '", entry, "' is not relay or policy, or is given twice"));
    }
    seen = true;
  }
  return absl::OkStatus();
}

absl::Status PrintComparison(std::FILE* out, const PlanRequest& request, const Job& job,
                             const PricingSource& cluster) {
  WSYNC_RETURN_IF_ERROR(CheckCompareList(request.compare));
  WSYNC_RETURN_IF_ERROR(CheckSimulationCluster(cluster));
  std::vector<std::string> relays = {request.relay}, policies = {request.policy};
  for (absl::string_view entry : absl::StrSplit(request.compare, ',')) {
    if (entry == "relay") relays.assign(std::begin(kRelayModes), std::end(kRelayModes));
    if (entry == "policy") policies.assign(std::begin(kPolicies), std::end(kPolicies));
  }
  WSYNC_ASSIGN_OR_RETURN(LinkFits fits, FitLinks(cluster.calibration));
  const auto shared_fits = std::make_shared<const LinkFits>(std::move(fits));
  absl::FPrintF(out,
                "\ncompared on SimGrid (%s; the executor of all %d processes per row):\n"
                "| relay | policy | inter-node bytes | simulated | bound | ratio | sim wall | "
                "sim peak RSS |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n",
                cluster.label, job.num_processes());
  absl::Status first_error;
  for (const std::string& relay : relays) {
    for (const std::string& policy : policies) {
      absl::StatusOr<Row> row = PlanPriceAndSimulate(job, {relay, policy}, cluster, shared_fits);
      if (!row.ok()) {
        absl::FPrintF(out, "| %s | %s | failed: %s |\n", relay, policy, row.status().message());
        if (first_error.ok()) first_error = row.status();
        continue;
      }
      const simulation::SimulationResult& result = row->simulation.result;
      absl::FPrintF(out, "| %s | %s | %s | %.4f s | %.4f s | %.3fx | %.1f s | %s |\n", relay,
                    policy, HumanBytes(row->inter_node_bytes), result.sync_seconds,
                    row->bound_seconds,
                    row->bound_seconds > 0 ? result.sync_seconds / row->bound_seconds : 0,
                    result.wall_seconds, HumanBytes(result.peak_rss_bytes));
      std::fflush(out);
    }
  }
  return first_error;
}

}  // namespace wsync::cli
