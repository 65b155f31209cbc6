#include "integration/simulation/simgrid/cluster_platform.h"

#include <cmath>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "simgrid/s4u.hpp"

namespace wsync::simgrid_backend {
namespace sg4 = simgrid::s4u;

namespace {

absl::Status CheckLink(const LinkConstants& link, const char* name) {
  if (!(link.bytes_per_second > 0) || !std::isfinite(link.bytes_per_second) ||
      !(link.latency_seconds >= 0) || !std::isfinite(link.latency_seconds)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cluster platform: ", name, " bandwidth must be positive and latency non-negative, got ",
        link.bytes_per_second, " B/s and ", link.latency_seconds, " s"));
  }
  return absl::OkStatus();
}

const char* KindName(LinkHop::Kind kind) {
  switch (kind) {
    case LinkHop::Kind::kDevice:
      return "device";
    case LinkHop::Kind::kNvLink:
      return "nvlink";
    case LinkHop::Kind::kPcie:
      return "pcie";
    case LinkHop::Kind::kNic:
      return "nic";
    case LinkHop::Kind::kLeafUplink:
      return "leaf-uplink";
  }
  return "?";
}

LinkConstants ConstantsOf(const ClusterTopology& topology, LinkHop::Kind kind) {
  switch (kind) {
    case LinkHop::Kind::kDevice:
      return topology.same_device;
    case LinkHop::Kind::kNvLink:
      return topology.nvlink;
    case LinkHop::Kind::kPcie:
      return topology.pcie;
    case LinkHop::Kind::kNic:
      return topology.nic;
    case LinkHop::Kind::kLeafUplink:
      return {topology.LeafUplinkBytesPerSecond(), topology.spine_latency_seconds};
  }
  return {};
}

// Which link of a PCIe/NIC pair SimGrid is given when one of the two can never bind (kNone: both).
// A GPU's PCIe link carries exactly its inter-node messages, each of which also crosses its NIC,
// so when PCIe is at least as fast as the NIC the NIC's share of those messages never exceeds
// PCIe's capacity: PCIe is dropped and its latency added to the NIC's (every route that crosses
// one crosses the other, so route latencies stay as stated). With one GPU per NIC the two carry
// the same messages and the slower one alone is kept, either way round. Each inter-node route
// then has two links fewer, which SimGrid's max-min solver visits per message event.
LinkHop::Kind MergedAway(const ClusterTopology& topology, bool merge) {
  if (!merge) return LinkHop::Kind::kDevice;  // kDevice: nothing is merged away.
  if (topology.pcie.bytes_per_second >= topology.nic.bytes_per_second) return LinkHop::Kind::kPcie;
  if (topology.gpus_per_node == topology.nics_per_node) return LinkHop::Kind::kNic;
  return LinkHop::Kind::kDevice;
}

// The SimGrid links of one platform, made on first use (only the GPUs, NICs and leaves a job
// uses). The device link is one shared direction; every other link is split duplex. Hops of the
// merged-away kind (MergedAway) are skipped, their latency carried by the kept link of the pair.
// Uplinks are skipped when `drop_uplinks` (ClusterPlatformSpec::drop_redundant_uplinks at 1:1),
// their latency carried by each NIC crossing.
class LinkMaker {
 public:
  LinkMaker(sg4::NetZone* zone, const ClusterTopology& topology, LinkHop::Kind merged_away,
            bool drop_uplinks)
      : zone_(zone), topology_(topology), merged_away_(merged_away), drop_uplinks_(drop_uplinks) {}

  // Appends the link of `hop` to `route`, unless its kind is merged away or dropped.
  void Append(const LinkHop& hop, std::vector<sg4::LinkInRoute>& route) {
    if (merged_away_ != LinkHop::Kind::kDevice && hop.kind == merged_away_) return;
    if (drop_uplinks_ && hop.kind == LinkHop::Kind::kLeafUplink) return;
    route.push_back(Get(hop));
  }

  sg4::LinkInRoute Get(const LinkHop& hop) {
    using Direction = sg4::LinkInRoute::Direction;
    LinkHop key = hop;
    key.up = true;
    auto [it, inserted] = links_.try_emplace(key, nullptr);
    if (inserted) {
      const std::string name = absl::StrCat(KindName(hop.kind), hop.first, ".", hop.second);
      LinkConstants constants = ConstantsOf(topology_, hop.kind);
      if (merged_away_ != LinkHop::Kind::kDevice &&
          (hop.kind == LinkHop::Kind::kPcie || hop.kind == LinkHop::Kind::kNic)) {
        constants.latency_seconds = topology_.pcie.latency_seconds + topology_.nic.latency_seconds;
      }
      // Every inter-node route crosses one link of the sender's pair up and one of the
      // receiver's down, the NIC (or what the merge kept of its pair).
      if (drop_uplinks_ &&
          (hop.kind == LinkHop::Kind::kNic ||
           (hop.kind == LinkHop::Kind::kPcie && merged_away_ == LinkHop::Kind::kNic))) {
        constants.latency_seconds += topology_.spine_latency_seconds;
      }
      it->second = hop.kind == LinkHop::Kind::kDevice
                       ? zone_->create_link(name, constants.bytes_per_second)
                       : static_cast<sg4::Link*>(
                             zone_->create_split_duplex_link(name, constants.bytes_per_second));
      it->second->set_latency(constants.latency_seconds)->seal();
    }
    if (hop.kind == LinkHop::Kind::kDevice) return sg4::LinkInRoute(it->second);
    return sg4::LinkInRoute(it->second, hop.up ? Direction::UP : Direction::DOWN);
  }

 private:
  sg4::NetZone* zone_;
  const ClusterTopology& topology_;
  const LinkHop::Kind merged_away_;
  const bool drop_uplinks_;
  std::map<LinkHop, sg4::Link*> links_;  // By hop with up = true.
};

}  // namespace

std::string LinkHop::Name() const {
  return absl::StrCat(KindName(kind), first, ".", second,
                      kind == Kind::kDevice ? "" : (up ? " up" : " down"));
}

double HopBytesPerSecond(const ClusterTopology& topology, LinkHop::Kind kind) {
  return ConstantsOf(topology, kind).bytes_per_second;
}

std::vector<LinkHop> RouteBetween(const ClusterTopology& topology, const GpuPlacement& from,
                                  const GpuPlacement& to) {
  using Kind = LinkHop::Kind;
  if (from.node == to.node && from.gpu == to.gpu) {
    return {{Kind::kDevice, from.node, from.gpu, true}};
  }
  if (from.node == to.node) {
    return {{Kind::kNvLink, from.node, from.gpu, true}, {Kind::kNvLink, to.node, to.gpu, false}};
  }
  const int32_t gpus_per_nic = topology.gpus_per_node / topology.nics_per_node;
  std::vector<LinkHop> route = {{Kind::kPcie, from.node, from.gpu, true},
                                {Kind::kNic, from.node, from.gpu / gpus_per_nic, true}};
  const int32_t from_leaf = from.node / topology.nodes_per_leaf;
  const int32_t to_leaf = to.node / topology.nodes_per_leaf;
  if (from_leaf != to_leaf) {
    route.push_back({Kind::kLeafUplink, from_leaf, 0, true});
    route.push_back({Kind::kLeafUplink, to_leaf, 0, false});
  }
  route.push_back({Kind::kNic, to.node, to.gpu / gpus_per_nic, false});
  route.push_back({Kind::kPcie, to.node, to.gpu, false});
  return route;
}

absl::Status ValidateTopology(const ClusterTopology& topology) {
  if (topology.gpus_per_node <= 0 || topology.nics_per_node <= 0 ||
      topology.gpus_per_node % topology.nics_per_node != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cluster platform: gpus_per_node (", topology.gpus_per_node,
        ") must be a positive multiple of nics_per_node (", topology.nics_per_node, ")"));
  }
  if (topology.nodes_per_leaf <= 0) {
    return absl::InvalidArgumentError("cluster platform: nodes_per_leaf must be positive");
  }
  if (!(topology.oversubscription >= 1) || !std::isfinite(topology.oversubscription)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cluster platform: oversubscription must be at least 1, got ", topology.oversubscription));
  }
  if (!(topology.spine_latency_seconds >= 0) || !std::isfinite(topology.spine_latency_seconds)) {
    return absl::InvalidArgumentError("cluster platform: spine latency must be non-negative");
  }
  WSYNC_RETURN_IF_ERROR(CheckLink(topology.nvlink, "nvlink"));
  WSYNC_RETURN_IF_ERROR(CheckLink(topology.pcie, "pcie"));
  WSYNC_RETURN_IF_ERROR(CheckLink(topology.nic, "nic"));
  return CheckLink(topology.same_device, "same_device");
}

absl::StatusOr<std::vector<sg4::Host*>> ClusterPlatform::Build(int32_t processes) const {
  const ClusterTopology& topology = spec_.topology;
  WSYNC_RETURN_IF_ERROR(ValidateTopology(topology));
  if (processes <= 0 || static_cast<size_t>(processes) != spec_.placement.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cluster platform: placement of ", spec_.placement.size(), " processes for ", processes));
  }
  for (size_t p = 0; p < spec_.placement.size(); ++p) {
    const GpuPlacement& gpu = spec_.placement[p];
    if (gpu.node < 0 || gpu.gpu < 0 || gpu.gpu >= topology.gpus_per_node) {
      return absl::InvalidArgumentError(
          absl::StrCat("cluster platform: process ", p, " is placed on node ", gpu.node, " GPU ",
                       gpu.gpu, "; nodes have GPUs 0..", topology.gpus_per_node - 1));
    }
  }
  // Every pair's route stated once: n^2 routes (150 k at 384 processes, a few MiB).
  sg4::NetZone* zone = sg4::create_full_zone("wsync-cluster");
  std::vector<sg4::Host*> hosts;
  hosts.reserve(processes);
  for (int32_t p = 0; p < processes; ++p) {
    // Actors only wait; the host's speed is never used.
    hosts.push_back(zone->create_host(absl::StrCat("p", p), 1e9)->seal());
  }
  LinkMaker links(zone, topology, MergedAway(topology, spec_.merge_dominated_links),
                  spec_.drop_redundant_uplinks && topology.oversubscription <= 1);
  std::vector<sg4::LinkInRoute> route;
  for (int32_t a = 0; a < processes; ++a) {
    for (int32_t b = 0; b < processes; ++b) {
      if (a == b) continue;
      route.clear();
      for (const LinkHop& hop : RouteBetween(topology, spec_.placement[a], spec_.placement[b])) {
        links.Append(hop, route);
      }
      zone->add_route(hosts[a]->get_netpoint(), hosts[b]->get_netpoint(), nullptr, nullptr, route,
                      false);
    }
  }
  zone->seal();
  return hosts;
}

std::string ClusterPlatform::Describe() const {
  const ClusterTopology& t = spec_.topology;
  return absl::StrFormat(
      "cluster: %d GPUs and %d NICs per node; NVLink %.4g GB/s, PCIe %.4g GB/s, NIC %.4g GB/s "
      "each way; %d nodes per leaf, spine %.4g:1 oversubscribed (%.4g GB/s per leaf)%s",
      t.gpus_per_node, t.nics_per_node, t.nvlink.bytes_per_second / 1e9,
      t.pcie.bytes_per_second / 1e9, t.nic.bytes_per_second / 1e9, t.nodes_per_leaf,
      t.oversubscription, t.LeafUplinkBytesPerSecond() / 1e9,
      spec_.drop_redundant_uplinks && t.oversubscription <= 1
          ? " (never binding: left out, their latency in the NIC crossings)"
          : "");
}

}  // namespace wsync::simgrid_backend
