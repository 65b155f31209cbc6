#ifndef WSYNC_INTEGRATION_SIMULATION_SIMGRID_CLUSTER_PLATFORM_H_
#define WSYNC_INTEGRATION_SIMULATION_SIMGRID_CLUSTER_PLATFORM_H_

// A GPU cluster as a SimGrid platform: nodes of GPUs joined by NVLink through a node switch, NICs
// shared by a node's GPUs, and a two-tier fat tree (leaf switches, an oversubscribed spine)
// between nodes. One host per process, placed on a GPU of a node; routes:
//   same GPU (colocated processes):  the GPU's device link (CUDA IPC within HBM), once.
//   same node:                       NVLink of the sender's GPU up, of the receiver's GPU down.
//   other node, same leaf:           sender's PCIe up, its NIC up, receiver's NIC down, PCIe down.
//   other leaf:                      as above with the sender's leaf uplink up and the
//                                    receiver's leaf uplink down in between.
// Every link is full duplex (its own bandwidth each way) and shared max-min fairly by the
// messages crossing it. A leaf's uplink is the aggregate of its spine links: the leaf's NIC
// capacity (nodes_per_leaf x nics_per_node x NIC bandwidth) over the oversubscription, assuming
// traffic spreads evenly over the spines (no ECMP hash collisions).

#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "integration/simulation/simgrid/platform.h"

namespace wsync::simgrid_backend {

// One direction of a link class: bandwidth each way and latency per crossing.
struct LinkConstants {
  double bytes_per_second = 0;
  double latency_seconds = 0;
};

// What a cluster file states of its machines (integration/clusters/README.md).
struct ClusterTopology {
  int32_t gpus_per_node = 0;
  int32_t nics_per_node = 0;  // Divides gpus_per_node: GPU g uses NIC g / (gpus / nics).
  LinkConstants nvlink;       // Each GPU to its node's NVLink switch.
  LinkConstants pcie;         // Each GPU to its NIC.
  LinkConstants nic;          // Each NIC to its leaf switch.
  LinkConstants same_device;  // Two processes of one GPU.
  int32_t nodes_per_leaf = 0;
  double oversubscription = 1;       // A leaf's NIC capacity over its spine capacity, >= 1.
  double spine_latency_seconds = 0;  // Each leaf-spine crossing.

  // Bandwidth each way of one leaf's spine links together.
  double LeafUplinkBytesPerSecond() const {
    return nodes_per_leaf * nics_per_node * nic.bytes_per_second / oversubscription;
  }
};

// Where a process runs: its node (0-based, nodes_per_leaf consecutive nodes to a leaf) and its
// GPU on that node (0..gpus_per_node-1).
struct GpuPlacement {
  int32_t node = 0;
  int32_t gpu = 0;
};

// One link of a route, and the direction it is crossed in. Names: the device link of GPU g of node
// n is "device<n>.<g>"; NVLink and PCIe likewise; NIC k of node n "nic<n>.<k>"; leaf l's uplink
// "leaf-uplink<l>.0".
struct LinkHop {
  enum class Kind { kDevice, kNvLink, kPcie, kNic, kLeafUplink };
  Kind kind = Kind::kDevice;
  int32_t first = 0;   // Node (leaf for kLeafUplink).
  int32_t second = 0;  // GPU or NIC of that node (0 for kLeafUplink).
  bool up = true;      // Away from the sender's GPU (kDevice: always up, it is one direction).

  std::string Name() const;  // "nic3.1 up"
  friend bool operator<(const LinkHop& a, const LinkHop& b) {
    return std::tie(a.kind, a.first, a.second, a.up) < std::tie(b.kind, b.first, b.second, b.up);
  }
};

// The links a message from GPU `from` to GPU `to` crosses, in order (see the top of this file).
std::vector<LinkHop> RouteBetween(const ClusterTopology& topology, const GpuPlacement& from,
                                  const GpuPlacement& to);
// The bandwidth of one direction of a link of `kind`.
double HopBytesPerSecond(const ClusterTopology& topology, LinkHop::Kind kind);

struct ClusterPlatformSpec {
  ClusterTopology topology;
  std::vector<GpuPlacement> placement;  // By global process id.
  // Give SimGrid one link of a PCIe/NIC pair when the other can never bind (PCIe at least as
  // fast as the NIC, or one GPU per NIC), with the pair's summed latency: the same bandwidth
  // shares and route latencies with two links fewer per inter-node route, which is what the
  // solver's cost grows with. SimGrid's sharing penalty of a flow also adds S / bandwidth per
  // link crossed (its weight-S, 20537 in 3.32's CM02), which the dropped link no longer adds:
  // every inter-node flow's penalty drops by the same amount, which changes shares only on a
  // link that carries flows of different penalties at once (same-leaf and cross-leaf inter-node
  // messages together). false: every link of RouteBetween (tests compare the two).
  bool merge_dominated_links = true;
  // At oversubscription 1 give SimGrid no leaf uplinks: an uplink's capacity is then the sum of
  // its leaf's NICs, and every flow crossing it also crosses one of those NICs in the same
  // direction, so it can never bind and the max-min shares are those with it. Its latency moves
  // into each NIC crossing (spine_latency more per NIC link, twice per inter-node route), so a
  // cross-leaf route keeps its latency and a same-leaf route gains 2 x spine_latency (with the
  // h100 file: 10 us for both, the links: line's inter_node alpha, instead of 9 us within a
  // leaf). The uplinks' weight-S term (S / uplink bandwidth, 1.3e-8 s at 1.6 TB/s) leaves every
  // cross-leaf flow's sharing penalty. The uplinks are the constraints with the most flows (every
  // flow of 32 GPUs), which the max-min solver visits at each message event. false: keep them.
  bool drop_redundant_uplinks = true;
};

class ClusterPlatform final : public Platform {
 public:
  explicit ClusterPlatform(ClusterPlatformSpec spec) : spec_(std::move(spec)) {}
  // InvalidArgument for a topology with a non-positive count or bandwidth, a negative or
  // non-finite latency, GPUs not a multiple of NICs, oversubscription below 1, or a placement
  // whose size is not `processes` or that names a GPU outside its node.
  absl::StatusOr<std::vector<simgrid::s4u::Host*>> Build(int32_t processes) const override;
  std::string Describe() const override;
  const ClusterPlatformSpec& spec() const { return spec_; }

 private:
  ClusterPlatformSpec spec_;
};

// OK when `topology` can be built (the checks of ClusterPlatform::Build that do not need a
// placement).
absl::Status ValidateTopology(const ClusterTopology& topology);

}  // namespace wsync::simgrid_backend

#endif  // WSYNC_INTEGRATION_SIMULATION_SIMGRID_CLUSTER_PLATFORM_H_
