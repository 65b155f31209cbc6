#include "integration/simulation/cluster_file.h"

#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/types/span.h"
#include "common/status.h"
#include "cost/link_model.h"

namespace wsync::simulation {
namespace {

using simgrid_backend::ClusterTopology;
using simgrid_backend::GpuPlacement;
using simgrid_backend::LinkConstants;

constexpr absl::string_view kTopologyKeys[] = {
    "gpus_per_node", "nics_per_node",  "nvlink",           "pcie",
    "nic",           "nodes_per_leaf", "oversubscription", "spine_latency",
};
// Keys of the links-only format (integration/cli's ReadCluster reads them).
constexpr absl::string_view kLinkKeys[] = {"name", "processes_per_node", "links", "quantize"};

bool Contains(absl::Span<const absl::string_view> keys, absl::string_view key) {
  for (absl::string_view known : keys) {
    if (known == key) return true;
  }
  return false;
}

absl::StatusOr<LinkConstants> ParseLink(absl::string_view value) {
  const std::vector<absl::string_view> parts = absl::StrSplit(value, ',');
  if (parts.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat("'", value, "' is not <latency>,<bandwidth>"));
  }
  LinkConstants link;
  WSYNC_ASSIGN_OR_RETURN(link.latency_seconds, ParseStatedSeconds(parts[0]));
  WSYNC_ASSIGN_OR_RETURN(link.bytes_per_second, ParseStatedBandwidth(parts[1]));
  return link;
}

absl::StatusOr<int32_t> ParseCount(absl::string_view value) {
  int32_t count = 0;
  if (!absl::SimpleAtoi(value, &count) || count <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("'", value, "' is not a positive integer"));
  }
  return count;
}

// The links: line's same_device entry ("same_device=5us,1500GB/s"), if it has one.
absl::StatusOr<std::optional<LinkConstants>> SameDeviceOf(absl::string_view links) {
  for (absl::string_view entry : absl::StrSplit(links, ';', absl::SkipWhitespace())) {
    entry = absl::StripAsciiWhitespace(entry);
    if (!absl::ConsumePrefix(&entry, "same_device=")) continue;
    WSYNC_ASSIGN_OR_RETURN(LinkConstants link, ParseLink(entry));
    return std::optional<LinkConstants>(link);
  }
  return std::optional<LinkConstants>();
}

// Stores `value` of topology key `key` (one of kTopologyKeys) in `topology`.
absl::Status SetKey(ClusterTopology& topology, absl::string_view key, absl::string_view value) {
  if (key == "gpus_per_node" || key == "nics_per_node" || key == "nodes_per_leaf") {
    WSYNC_ASSIGN_OR_RETURN(const int32_t count, ParseCount(value));
    (key == "gpus_per_node"   ? topology.gpus_per_node
     : key == "nics_per_node" ? topology.nics_per_node
                              : topology.nodes_per_leaf) = count;
  } else if (key == "nvlink" || key == "pcie" || key == "nic") {
    WSYNC_ASSIGN_OR_RETURN(const LinkConstants link, ParseLink(value));
    (key == "nvlink" ? topology.nvlink : key == "pcie" ? topology.pcie : topology.nic) = link;
  } else if (key == "oversubscription") {
    if (!absl::SimpleAtod(value, &topology.oversubscription)) {
      return absl::InvalidArgumentError(absl::StrCat("'", value, "' is not a number"));
    }
  } else {
    WSYNC_ASSIGN_OR_RETURN(topology.spine_latency_seconds, ParseStatedSeconds(value));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::optional<ClusterTopology>> ParseClusterTopology(absl::string_view text) {
  ClusterTopology topology;
  std::set<std::string> seen;
  std::string links;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    const std::pair<absl::string_view, absl::string_view> key_value =
        absl::StrSplit(line, absl::MaxSplits(':', 1));
    const absl::string_view key = absl::StripAsciiWhitespace(key_value.first);
    const absl::string_view value = absl::StripAsciiWhitespace(key_value.second);
    if (key == "links") links = std::string(value);
    if (Contains(kLinkKeys, key)) continue;
    if (!Contains(kTopologyKeys, key)) {
      return absl::InvalidArgumentError(absl::StrCat("cluster file: unknown key '", key, "'"));
    }
    if (!seen.insert(std::string(key)).second) {
      return absl::InvalidArgumentError(absl::StrCat("cluster file: ", key, " given twice"));
    }
    const absl::Status status = SetKey(topology, key, value);
    if (!status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cluster file: ", key, ": ", status.message()));
    }
  }
  if (seen.empty()) return std::optional<ClusterTopology>();
  std::vector<absl::string_view> missing;
  for (absl::string_view key : kTopologyKeys) {
    if (!seen.contains(std::string(key))) missing.push_back(key);
  }
  if (!missing.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster file: a topology needs ", absl::StrJoin(missing, ", "), " as well"));
  }
  WSYNC_ASSIGN_OR_RETURN(const std::optional<LinkConstants> same_device, SameDeviceOf(links));
  topology.same_device = same_device.value_or(topology.nvlink);
  WSYNC_RETURN_IF_ERROR(simgrid_backend::ValidateTopology(topology));
  return std::optional<ClusterTopology>(topology);
}

absl::StatusOr<std::vector<GpuPlacement>> PlaceOnCluster(const ClusterTopology& topology,
                                                         const Job& job) {
  const int32_t n = job.num_processes();
  std::vector<GpuPlacement> placement(n);
  std::map<int32_t, std::set<int32_t>> taken;  // GPUs held, by node index.
  for (int32_t p = 0; p < n; ++p) {
    const int32_t device = job.processes()[p].device;
    if (device == kUnknownDevice) continue;
    if (device >= topology.gpus_per_node) {
      return absl::InvalidArgumentError(absl::StrCat(
          "process ", p, " runs on GPU ", device, " of node ", job.processes()[p].node_id,
          "; the cluster's nodes have ", topology.gpus_per_node, " GPUs"));
    }
    placement[p] = {job.NodeIndex(p), device};
    taken[job.NodeIndex(p)].insert(device);
  }
  for (int32_t p = 0; p < n; ++p) {
    if (job.processes()[p].device != kUnknownDevice) continue;
    std::set<int32_t>& held = taken[job.NodeIndex(p)];
    int32_t gpu = 0;
    while (held.contains(gpu)) ++gpu;
    if (gpu >= topology.gpus_per_node) {
      return absl::InvalidArgumentError(
          absl::StrCat("node ", job.processes()[p].node_id, " has more processes than the ",
                       topology.gpus_per_node, " GPUs of a cluster node"));
    }
    held.insert(gpu);
    placement[p] = {job.NodeIndex(p), gpu};
  }
  return placement;
}

}  // namespace wsync::simulation
