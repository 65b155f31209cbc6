// The cluster platform (integration/simulation/simgrid/cluster_platform.h) and the cluster file's
// topology (integration/simulation/cluster_file.h): routes follow the node, NIC and leaf structure;
// a cross-node 1 -> 1 sync is bound by the NIC and an oversubscribed many-to-many by the spine,
// each simulated within 5 % of its analytic bound; bad cluster files and placements are refused.

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/simulation/cluster_file.h"
#include "integration/simulation/simgrid/cluster_platform.h"
#include "integration/simulation/simulate_sync.h"
#include "planner/models.h"
#include "planner/named_layouts.h"
#include "planner/plan.h"
#include "planner/policy.h"
#include "tests/testing/random_layouts.h"

namespace wsync {
namespace {

using simgrid_backend::ClusterPlatform;
using simgrid_backend::ClusterTopology;
using simgrid_backend::GpuPlacement;
using simgrid_backend::LinkHop;
using simulation::InDeviceMemory;
using simulation::ParseClusterTopology;
using simulation::PlaceOnCluster;
using simulation::SimulateSync;
using simulation::SimulationOptions;
using simulation::SimulationResult;
using ::testing::HasSubstr;

constexpr char kTopologyText[] = R"(# a comment
name: test
processes_per_node: 2
links: local=1us,1500GB/s;same_device=2us,700GB/s;inter_node=10us,10GB/s
gpus_per_node: 2
nics_per_node: 2
nvlink: 0.25us,100GB/s
pcie: 0.25us,20GB/s
nic: 0.25us,10GB/s
nodes_per_leaf: 1
oversubscription: 4
spine_latency: 0.25us
)";

ClusterTopology ParsedTopology() {
  absl::StatusOr<std::optional<ClusterTopology>> topology = ParseClusterTopology(kTopologyText);
  EXPECT_TRUE(topology.ok()) << topology.status();
  EXPECT_TRUE(topology.ok() && topology->has_value());
  return topology.ok() && topology->has_value() ? **topology : ClusterTopology{};
}

TEST(ClusterFileTest, ParsesEveryTopologyKey) {
  const ClusterTopology topology = ParsedTopology();
  EXPECT_EQ(topology.gpus_per_node, 2);
  EXPECT_EQ(topology.nics_per_node, 2);
  EXPECT_DOUBLE_EQ(topology.nvlink.bytes_per_second, 100e9);
  EXPECT_DOUBLE_EQ(topology.nvlink.latency_seconds, 0.25e-6);
  EXPECT_DOUBLE_EQ(topology.pcie.bytes_per_second, 20e9);
  EXPECT_DOUBLE_EQ(topology.nic.bytes_per_second, 10e9);
  EXPECT_DOUBLE_EQ(topology.same_device.bytes_per_second, 700e9);  // From the links: line.
  EXPECT_DOUBLE_EQ(topology.same_device.latency_seconds, 2e-6);
  EXPECT_EQ(topology.nodes_per_leaf, 1);
  EXPECT_DOUBLE_EQ(topology.oversubscription, 4);
  EXPECT_DOUBLE_EQ(topology.spine_latency_seconds, 0.25e-6);
  EXPECT_DOUBLE_EQ(topology.LeafUplinkBytesPerSecond(), 1 * 2 * 10e9 / 4);
}

TEST(ClusterFileTest, LinksOnlyFileHasNoTopology) {
  absl::StatusOr<std::optional<ClusterTopology>> topology =
      ParseClusterTopology("name: x\nlinks: inter_node=10us,50GB/s\n");
  ASSERT_TRUE(topology.ok()) << topology.status();
  EXPECT_FALSE(topology->has_value());
}

TEST(ClusterFileTest, RefusesBadTopologies) {
  const std::string text = kTopologyText;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {absl::StrCat(text, "gpu_per_node: 8\n"), "unknown key 'gpu_per_node'"},
      {absl::StrCat(text, "nic: 1us,10GB/s\n"), "nic given twice"},
      {absl::StrReplaceAll(text, {{"spine_latency: 0.25us\n", ""}}), "needs spine_latency"},
      {absl::StrReplaceAll(text, {{"nic: 0.25us,10GB/s", "nic: 0.25us,10Gb/s"}}), "nic: "},
      {absl::StrReplaceAll(text, {{"nic: 0.25us,10GB/s", "nic: 10GB/s"}}), "<latency>,<band"},
      {absl::StrReplaceAll(text, {{"nics_per_node: 2", "nics_per_node: 3"}}), "multiple"},
      {absl::StrReplaceAll(text, {{"nodes_per_leaf: 1", "nodes_per_leaf: 0"}}), "positive"},
      {absl::StrReplaceAll(text, {{"oversubscription: 4", "oversubscription: 0.5"}}), "at least"},
      {absl::StrReplaceAll(text, {{"oversubscription: 4", "oversubscription: x"}}), "number"},
      {absl::StrReplaceAll(text, {{"pcie: 0.25us,20GB/s", "pcie: 0.25us,0GB/s"}}), "pcie"},
  };
  for (const auto& [bad, message] : cases) {
    SCOPED_TRACE(bad);
    absl::StatusOr<std::optional<ClusterTopology>> topology = ParseClusterTopology(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(topology.status())) << topology.status();
    EXPECT_THAT(std::string(topology.status().message()), HasSubstr(message));
  }
}

TEST(ClusterFileTest, PlacesKnownDevicesAndFillsFreeGpus) {
  const Job job = test::OneTrainerToWholeCopies({64, 64}, {"a", "b", "b"});  // p0 on "a".
  const ClusterTopology topology = ParsedTopology();
  absl::StatusOr<std::vector<GpuPlacement>> placement = PlaceOnCluster(topology, job);
  ASSERT_TRUE(placement.ok()) << placement.status();
  ASSERT_EQ(placement->size(), 4u);
  EXPECT_EQ((*placement)[0].node, (*placement)[1].node);  // Both on node "a".
  EXPECT_NE((*placement)[0].gpu, (*placement)[1].gpu);    // Unknown devices never share.
  EXPECT_EQ((*placement)[2].node, (*placement)[3].node);
  EXPECT_NE((*placement)[2].gpu, (*placement)[3].gpu);
  EXPECT_NE((*placement)[0].node, (*placement)[2].node);
  // A third process on node "b" needs a third GPU; the nodes have two.
  const Job crowded = test::OneTrainerToWholeCopies({64, 64}, {"b", "b", "b"});
  absl::StatusOr<std::vector<GpuPlacement>> refused = PlaceOnCluster(topology, crowded);
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("more processes than the 2"));
}

TEST(ClusterPlatformTest, RoutesFollowNodesNicsAndLeaves) {
  ClusterTopology topology = ParsedTopology();
  topology.gpus_per_node = 4;  // Two GPUs per NIC.
  topology.nodes_per_leaf = 2;
  const auto names = [&](GpuPlacement from, GpuPlacement to) {
    std::vector<std::string> hops;
    for (const LinkHop& hop : RouteBetween(topology, from, to)) hops.push_back(hop.Name());
    return hops;
  };
  EXPECT_THAT(names({0, 1}, {0, 1}), ::testing::ElementsAre("device0.1"));
  EXPECT_THAT(names({0, 1}, {0, 3}), ::testing::ElementsAre("nvlink0.1 up", "nvlink0.3 down"));
  EXPECT_THAT(names({0, 3}, {1, 0}),
              ::testing::ElementsAre("pcie0.3 up", "nic0.1 up", "nic1.0 down", "pcie1.0 down"));
  EXPECT_THAT(names({1, 0}, {2, 2}),
              ::testing::ElementsAre("pcie1.0 up", "nic1.0 up", "leaf-uplink0.0 up",
                                     "leaf-uplink1.0 down", "nic2.1 down", "pcie2.2 down"));
}

// `job` planned (never relayed) and simulated on the test topology.
SimulationResult SimulateOnTopology(const Job& host_job, const ClusterTopology& topology,
                                    bool round_order, bool merge_dominated_links = true,
                                    bool drop_redundant_uplinks = true) {
  absl::StatusOr<Job> job =
      Job::Create(InDeviceMemory(host_job.source()), InDeviceMemory(host_job.target()));
  EXPECT_TRUE(job.ok()) << job.status();
  PlanOptions plan_options;
  plan_options.relay.mode = RelayMode::kNever;
  absl::StatusOr<Plan> plan = MakePlan(*job, *MakeFirstHolderPolicy(), plan_options);
  EXPECT_TRUE(plan.ok()) << plan.status();
  simgrid_backend::ClusterPlatformSpec spec;
  spec.topology = topology;
  absl::StatusOr<std::vector<GpuPlacement>> placement = PlaceOnCluster(topology, *job);
  EXPECT_TRUE(placement.ok()) << placement.status();
  spec.placement = *placement;
  spec.merge_dominated_links = merge_dominated_links;
  spec.drop_redundant_uplinks = drop_redundant_uplinks;
  const ClusterPlatform platform(spec);
  SimulationOptions options;
  options.platform = &platform;
  options.needs_round_order = round_order;
  absl::StatusOr<SimulationResult> result = SimulateSync(*job, plan->segments, options);
  EXPECT_TRUE(result.ok()) << result.status();
  if (!result.ok()) return {};
  EXPECT_TRUE(result->FirstFailure().ok()) << result->FirstFailure();
  return *std::move(result);
}

// 256 MiB from a GPU of node "a" to one of node "b" crosses PCIe (20 GB/s), the NICs (10 GB/s)
// and both leaves' spine links (5 GB/s at 4:1, shared by nothing else): bound by the spine. With
// 1:1 the spine carries 20 GB/s and the NIC binds; within one node NVLink (100 GB/s) does.
TEST(ClusterPlatformTest, OneToOneIsBoundByItsSlowestLink) {
  const double bytes = 16384.0 * 4096 * 4;
  const Job cross_node = test::OneTrainerToWholeCopies({16384, 4096}, {"b"});
  const Job same_node = test::OneTrainerToWholeCopies({16384, 4096}, {"a"});
  ClusterTopology full_fat_tree = ParsedTopology();
  full_fat_tree.oversubscription = 1;
  struct Case {
    const char* what;
    const Job* job;
    ClusterTopology topology;
    double bound;
  };
  const Case cases[] = {
      {"NIC", &cross_node, full_fat_tree, bytes / 10e9 + 6 * 0.25e-6},
      {"spine", &cross_node, ParsedTopology(), bytes / 5e9 + 6 * 0.25e-6},
      {"NVLink", &same_node, ParsedTopology(), bytes / 100e9 + 2 * 0.25e-6},
  };
  for (const Case& c : cases) {
    for (const bool round_order : {true, false}) {
      SCOPED_TRACE(absl::StrCat(c.what, round_order ? ", lockstep" : ", independent lanes"));
      const SimulationResult result = SimulateOnTopology(*c.job, c.topology, round_order);
      EXPECT_EQ(result.received_bytes.at(1), static_cast<int64_t>(bytes));
      EXPECT_GE(result.sync_seconds, c.bound * 0.999);
      EXPECT_NEAR(result.sync_seconds, c.bound, 0.05 * c.bound);
    }
  }
}

// `model` from megatron(tp=2) on one node of two GPUs to vllm(tp=1,dp=2) on another.
absl::StatusOr<Job> TrainerNodeToRolloutNode(const ModelSpec& model) {
  NamedLayoutOptions placement;
  placement.procs_per_node = 2;
  absl::StatusOr<NamedJobLayouts> layouts =
      BuildNamedJobLayouts(model, "megatron(tp=2)", "vllm(tp=1,dp=2)", placement);
  if (!layouts.ok()) return layouts.status();
  return Job::Create(layouts->source, layouts->target);
}

// qwen2.5-0.5b from megatron(tp=2) on one node (leaf 0) to vllm(dp=2) on another (leaf 1): each
// of the two rollout GPUs takes the whole model from the two trainer GPUs, four flows through one
// pair of leaf uplinks. At 4:1 an uplink carries 5 GB/s and binds: both copies of the model over
// 5 GB/s, four times the NICs' bound; any single flow fills the uplink, so even lockstep rounds
// reach it. At 1:1 (20 GB/s) the busiest NIC binds instead: its bytes over 10 GB/s.
TEST(ClusterPlatformTest, OversubscribedManyToManyIsBoundByTheSpine) {
  absl::StatusOr<ModelSpec> model = GetModel("qwen2.5-0.5b");
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<Job> job = TrainerNodeToRolloutNode(*model);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->num_processes(), 4);
  const double model_bytes = static_cast<double>(model->TotalBytes());
  ClusterTopology full_fat_tree = ParsedTopology();
  full_fat_tree.oversubscription = 1;
  for (const bool round_order : {true, false}) {
    SCOPED_TRACE(round_order ? "lockstep" : "independent lanes");
    const SimulationResult spine = SimulateOnTopology(*job, ParsedTopology(), round_order);
    EXPECT_EQ(spine.received_bytes.at(2) + spine.received_bytes.at(3),
              static_cast<int64_t>(2 * model_bytes));
    const double spine_bound = 2 * model_bytes / 5e9;
    EXPECT_GE(spine.sync_seconds, spine_bound * 0.999);
    EXPECT_NEAR(spine.sync_seconds, spine_bound, 0.05 * spine_bound);
    // 1:1: the uplink (20 GB/s) carries both rollouts' 10 GB/s; each rollout NIC binds.
    const SimulationResult nic = SimulateOnTopology(*job, full_fat_tree, round_order);
    int64_t busiest_nic = 0;  // Either direction of any process's NIC.
    for (int32_t p = 0; p < 4; ++p) {
      busiest_nic = std::max({busiest_nic, nic.sent_bytes.at(p), nic.received_bytes.at(p)});
    }
    const double nic_bound = static_cast<double>(busiest_nic) / 10e9;
    EXPECT_LT(nic_bound, spine_bound / 3);
    EXPECT_GE(nic.sync_seconds, nic_bound * 0.999);
    // Lockstep rounds pair unequal messages across the four flows, and a NIC that finished its
    // round waits for the others (1.38x when written); independent lanes keep every NIC busy.
    if (!round_order) {
      EXPECT_NEAR(nic.sync_seconds, nic_bound, 0.05 * nic_bound);
    }
  }
}

// The platform SimGrid is given merges a PCIe/NIC pair into its slower link when the faster can
// never bind, with the pair's latency; every message, byte and the sync time (within 1 %) stay
// those of the platform with every link of RouteBetween. The cases: PCIe faster than the NIC
// (PCIe merged away; 2 GPUs per NIC as well), PCIe slower with one GPU per NIC (the NIC merged
// away), and PCIe slower with 2 GPUs per NIC, where both bind and nothing may be merged. PCIe's
// latency is large (200 us a crossing, against 0.1 s of transfer) so that a route that lost it
// would be seen.
TEST(ClusterPlatformTest, MergedLinksSimulateAsEveryLink) {
  absl::StatusOr<ModelSpec> model = GetModel("qwen2.5-0.5b");
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<Job> job = TrainerNodeToRolloutNode(*model);
  ASSERT_TRUE(job.ok()) << job.status();
  struct Case {
    const char* what;
    double pcie_bytes_per_second;
    int32_t nics_per_node;
  };
  const Case cases[] = {{"PCIe faster, a NIC per GPU", 20e9, 2},
                        {"PCIe faster, a NIC per 2 GPUs", 20e9, 1},
                        {"PCIe slower, a NIC per GPU", 5e9, 2},
                        {"PCIe slower, a NIC per 2 GPUs", 5e9, 1}};
  for (const Case& c : cases) {
    ClusterTopology topology = ParsedTopology();
    topology.oversubscription = 1;
    topology.pcie = {c.pcie_bytes_per_second, 200e-6};
    topology.nics_per_node = c.nics_per_node;
    for (const bool round_order : {true, false}) {
      SCOPED_TRACE(absl::StrCat(c.what, round_order ? ", lockstep" : ", independent lanes"));
      const SimulationResult every_link =
          SimulateOnTopology(*job, topology, round_order, /*merge_dominated_links=*/false);
      const SimulationResult merged = SimulateOnTopology(*job, topology, round_order);
      EXPECT_EQ(merged.message_count, every_link.message_count);
      EXPECT_EQ(merged.sent_bytes, every_link.sent_bytes);
      EXPECT_EQ(merged.received_bytes, every_link.received_bytes);
      EXPECT_GT(every_link.sync_seconds, 0);
      EXPECT_NEAR(merged.sync_seconds, every_link.sync_seconds, 0.01 * every_link.sync_seconds);
    }
  }
}

// At 1:1 the platform SimGrid is given has no leaf uplinks (they can never bind) and carries
// their latency in the NIC crossings: every message, byte and the sync time (within 1 %) stay
// those of the platform with every link, for both PCIe/NIC merges and none. Each node is a leaf
// of its own (every inter-node route crosses the spine) and the spine's latency is large (200 us
// a crossing, against 0.1 s of transfer) so that a route that lost it would be seen.
TEST(ClusterPlatformTest, DroppedUplinksSimulateAsEveryLink) {
  absl::StatusOr<ModelSpec> model = GetModel("qwen2.5-0.5b");
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<Job> job = TrainerNodeToRolloutNode(*model);
  ASSERT_TRUE(job.ok()) << job.status();
  for (const double pcie_bytes_per_second : {20e9, 5e9}) {
    ClusterTopology topology = ParsedTopology();
    topology.oversubscription = 1;
    topology.nodes_per_leaf = 1;
    topology.spine_latency_seconds = 200e-6;
    topology.pcie = {pcie_bytes_per_second, 0.25e-6};
    for (const bool round_order : {true, false}) {
      SCOPED_TRACE(absl::StrCat("PCIe ", pcie_bytes_per_second / 1e9, " GB/s",
                                round_order ? ", lockstep" : ", independent lanes"));
      const SimulationResult every_link =
          SimulateOnTopology(*job, topology, round_order, /*merge_dominated_links=*/false,
                             /*drop_redundant_uplinks=*/false);
      for (const bool merge : {false, true}) {
        const SimulationResult dropped = SimulateOnTopology(*job, topology, round_order, merge);
        EXPECT_EQ(dropped.message_count, every_link.message_count);
        EXPECT_EQ(dropped.sent_bytes, every_link.sent_bytes);
        EXPECT_EQ(dropped.received_bytes, every_link.received_bytes);
        EXPECT_GT(every_link.sync_seconds, 0);
        EXPECT_NEAR(dropped.sync_seconds, every_link.sync_seconds, 0.01 * every_link.sync_seconds);
      }
    }
  }
}

TEST(ClusterPlatformTest, PlacementOfAnotherSizeIsRefused) {
  const Job job = test::OneTrainerToWholeCopies({64, 64}, {"b"});
  simgrid_backend::ClusterPlatformSpec spec;
  spec.topology = ParsedTopology();
  spec.placement = {{0, 0}};  // One process of two.
  const ClusterPlatform platform(spec);
  SimulationOptions options;
  options.platform = &platform;
  absl::StatusOr<SimulationResult> result = SimulateSync(
      *Job::Create(InDeviceMemory(job.source()), InDeviceMemory(job.target())), {}, options);
  EXPECT_FALSE(result.ok());
}

}  // namespace
}  // namespace wsync
