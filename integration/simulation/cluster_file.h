#ifndef WSYNC_INTEGRATION_SIMULATION_CLUSTER_FILE_H_
#define WSYNC_INTEGRATION_SIMULATION_CLUSTER_FILE_H_

// The topology a cluster file (integration/clusters/*.cluster) states, and a job placed on it:
// the SimGrid platform of `wsync plan --simulate CLUSTER --engine simgrid`.

#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "integration/simulation/simgrid/cluster_platform.h"
#include "planner/job.h"

namespace wsync::simulation {

// The topology lines of a cluster file's text ("#" comments; "key: value"):
//   gpus_per_node: 8            nics_per_node: 8
//   nvlink: 1.5us,450GB/s       pcie: 0.5us,63GB/s       nic: 4us,50GB/s
//   nodes_per_leaf: 4           oversubscription: 2      spine_latency: 0.5us
// (latency per crossing, bandwidth each way; units of SyntheticCalibration). The same_device link
// is the links: line's same_device entry, else NVLink's. nullopt when the file states none of
// these keys (a file of links only). InvalidArgument for a key the format does not have, a value
// that does not parse, a key given twice, some but not all of the keys, or a topology
// ValidateTopology refuses.
absl::StatusOr<std::optional<simgrid_backend::ClusterTopology>> ParseClusterTopology(
    absl::string_view text);

// Each process of `job` on a GPU of `topology`: node = Job::NodeIndex; GPU = the process's device
// when known (colocated processes of one device share it), else the lowest GPU of its node that
// no other process holds. InvalidArgument when a node needs more GPUs than the topology has.
absl::StatusOr<std::vector<simgrid_backend::GpuPlacement>> PlaceOnCluster(
    const simgrid_backend::ClusterTopology& topology, const Job& job);

}  // namespace wsync::simulation

#endif  // WSYNC_INTEGRATION_SIMULATION_CLUSTER_FILE_H_
