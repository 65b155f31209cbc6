// Real processes: a coordinator and trainer and rollout workers moving a model's weights over UCX,
// three versions in a row, every rollout element checked against the logical weights of each
// version by the rollout itself.

#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "integration/harness/launcher.h"

namespace wsync::harness {
namespace {

int64_t Field(const std::map<std::string, std::string>& stats, const std::string& key) {
  auto it = stats.find(key);
  int64_t value = 0;
  if (it == stats.end() || !absl::SimpleAtoi(it->second, &value)) return -1;
  return value;
}

// Every worker exits 0 after `spec.versions` committed syncs; the bytes trainers sent equal the
// bytes rollouts received in every version. Returns the result for further checks.
JobResult ExpectJobSucceeds(const JobSpec& spec) {
  absl::StatusOr<JobResult> result = RunJob(spec, WSYNC_TEST_WORKER, WSYNC_CLI);
  EXPECT_TRUE(result.ok()) << result.status();
  if (!result.ok()) return {};
  for (size_t p = 0; p < result->workers.size(); ++p) {
    const WorkerResult& worker = result->workers[p];
    EXPECT_EQ(worker.exit_code, 0) << "process " << p << ": " << worker.stderr_text
                                   << "\ncoordinator: " << result->coordinator_output;
    EXPECT_EQ(worker.stats.size(), static_cast<size_t>(spec.versions)) << "process " << p;
  }
  for (int v = 0; v < spec.versions; ++v) {
    int64_t sent = 0, received = 0;
    for (const WorkerResult& worker : result->workers) {
      if (v >= static_cast<int>(worker.stats.size())) continue;
      sent += Field(worker.stats[v], "sent");
      received += Field(worker.stats[v], "received");
    }
    EXPECT_GT(sent, 0) << "version " << v + 1;
    EXPECT_EQ(sent, received) << "version " << v + 1;
  }
  return *std::move(result);
}

TEST(MultiprocTest, TwoTrainersToTwoRolloutsOverSharedMemory) {
  JobSpec spec;
  spec.tls = "sm,cma,self";
  ExpectJobSucceeds(spec);
}

TEST(MultiprocTest, TwoTrainersToTwoRolloutsOverTcp) {
  JobSpec spec;
  spec.tls = "tcp";
  spec.placement.assign(4, ProcessPlacement{"", "local", "lo", {}});
  ExpectJobSucceeds(spec);
}

TEST(MultiprocTest, DpTwoTpTwoTrainersToFusedRolloutsOverSharedMemoryAndTcp) {
  for (const char* tls : {"sm,cma,self", "tcp"}) {
    SCOPED_TRACE(tls);
    JobSpec spec;
    spec.from = "megatron(tp=2,dp=2)";
    spec.to = "vllm(tp=2)";
    spec.trainers = 4;
    spec.tls = tls;
    if (std::string(tls) == "tcp")
      spec.placement.assign(6, ProcessPlacement{"", "local", "lo", {}});
    JobResult result = ExpectJobSucceeds(spec);
    // Both replicas serve: the replica policy spreads the sends over all four trainers.
    for (int p = 0; p < 4 && p < static_cast<int>(result.workers.size()); ++p) {
      ASSERT_FALSE(result.workers[p].stats.empty());
      EXPECT_GT(Field(result.workers[p].stats[0], "sent"), 0) << "trainer " << p;
    }
  }
}

TEST(MultiprocTest, AcrossTwoNetworkNamespaces) {
  std::string reason;
  std::optional<NetnsPair> net = NetnsPair::Create(&reason);
  if (!net) GTEST_SKIP() << "network namespaces unavailable: " << reason;
  JobSpec spec;
  spec.tls = "tcp";
  spec.coordinator_netns = net->ns(0);
  spec.coordinator_address = net->address(0);
  for (int p = 0; p < 4; ++p) {
    const int side = p < 2 ? 0 : 1;  // Trainers in one namespace, rollouts in the other.
    spec.placement.push_back(
        ProcessPlacement{net->ns(side), side == 0 ? "node-a" : "node-b", net->device(side), {}});
  }
  JobResult result = ExpectJobSucceeds(spec);
  for (size_t p = 0; p < result.workers.size(); ++p) {
    for (const auto& stats : result.workers[p].stats) {
      // Every byte crosses between the "nodes"; nothing is intra-node.
      EXPECT_GT(Field(stats, "path_inter_node"), 0) << "process " << p;
      EXPECT_EQ(Field(stats, "path_intra_node"), -1) << "process " << p;
    }
  }
}

TEST(MultiprocTest, PathClassesPickSharedMemoryWithinANodeAndTcpAcross) {
  std::string reason;
  std::optional<NetnsPair> net = NetnsPair::Create(&reason);
  if (!net) GTEST_SKIP() << "network namespaces unavailable: " << reason;
  JobSpec spec;
  spec.to = "vllm(tp=1,dp=2)";  // Each rollout needs both trainers' halves.
  spec.coordinator_netns = net->ns(0);
  spec.coordinator_address = net->address(0);
  // Trainer r and rollout r share a "node" (namespace); the other pair is on the other node.
  for (int p = 0; p < 4; ++p) spec.placement.push_back(TwoNodePlacement(*net, p % 2));
  JobResult result = ExpectJobSucceeds(spec);
  int64_t intra = 0, inter = 0;
  for (const WorkerResult& worker : result.workers) {
    for (const auto& stats : worker.stats) {
      intra += std::max<int64_t>(0, Field(stats, "path_intra_node"));
      inter += std::max<int64_t>(0, Field(stats, "path_inter_node"));
    }
  }
  EXPECT_GT(intra, 0);  // Trainer r to rollout r, within the node.
  EXPECT_GT(inter, 0);  // The other trainer's half crosses between the nodes.
}

// megatron(tp=2) trainers on the first node of `net`, two DP replicas of vllm(tp=2) (four rollouts)
// on the second, `versions` versions, `flags` on every worker.
JobSpec TwoReplicasAcrossNodes(const NetnsPair& net, int versions, std::vector<std::string> flags) {
  JobSpec spec;
  spec.to = "vllm(tp=2,dp=2)";
  spec.rollouts = 4;
  spec.versions = versions;
  spec.coordinator_netns = net.ns(0);
  spec.coordinator_address = net.address(0);
  spec.extra_worker_flags = std::move(flags);
  for (int p = 0; p < 6; ++p) spec.placement.push_back(TwoNodePlacement(net, p < 2 ? 0 : 1));
  return spec;
}

// Trainers (megatron(tp=2)) in one namespace, four rollouts (two DP replicas of vllm(tp=2)) in
// the other. Without relaying each replica's shard crosses the veth once per replica; relayed, it
// crosses once and a rollout forwards it over shared memory: the inter-node bytes the transports
// carried halve, and every rollout still verifies every element of every version.
TEST(MultiprocTest, RelayHalvesInterNodeBytesAcrossTwoNetworkNamespaces) {
  std::string reason;
  std::optional<NetnsPair> net = NetnsPair::Create(&reason);
  if (!net) GTEST_SKIP() << "network namespaces unavailable: " << reason;
  std::map<std::string, int64_t> inter_node;  // Wire bytes sent across nodes, per relay mode.
  for (const char* relay : {"never", "always"}) {
    SCOPED_TRACE(relay);
    JobResult result = ExpectJobSucceeds(TwoReplicasAcrossNodes(*net, 2, {"--relay", relay}));
    ASSERT_EQ(result.workers.size(), 6u);
    int64_t sent_across = 0, received_across = 0, forwarded = 0;
    for (const WorkerResult& worker : result.workers) {
      ASSERT_EQ(worker.stats.size(), 2u);
      sent_across += std::max<int64_t>(0, Field(worker.stats[1], "wire_sent_inter_node"));
      received_across += std::max<int64_t>(0, Field(worker.stats[1], "wire_received_inter_node"));
      forwarded += Field(worker.stats[1], "forwarded");
    }
    EXPECT_EQ(sent_across, received_across);
    EXPECT_EQ(forwarded > 0, std::string(relay) == "always");
    inter_node[relay] = sent_across;
  }
  // Halved; a little more for boxes all four rollouts hold (norm weights, replicated over the TP
  // ranks of both replicas), which cross once instead of four times.
  EXPECT_GT(inter_node["always"], 0);
  EXPECT_GE(inter_node["never"], 2 * inter_node["always"]);
  EXPECT_LE(inter_node["never"], 2 * inter_node["always"] + inter_node["always"] / 100);
}

// Delta sync (issue 44) over UCX `tls`: 20 versions, each after the first changing ~2% of the
// elements; every rollout checks every element of every version. Version 6 aborts (rollout 0
// votes no after its transfer), so version 7 goes dense to both rollouts; rollout 1 rebinds its
// buffers before version 12, which goes dense to it only. Every other version travels as deltas.
void ExpectDeltaSyncsExact(const std::string& tls) {
  JobSpec spec;
  spec.tls = tls;
  spec.versions = 20;
  spec.extra_worker_flags = {"--delta=on", "--changed_per_mille=20", "--verify=hash",
                             "--keep_going"};
  spec.placement.assign(
      4, tls == "tcp" ? ProcessPlacement{"", "local", "lo", {}} : ProcessPlacement{});
  spec.placement[2].extra_flags = {"--fail_version=6"};
  spec.placement[3].extra_flags = {"--rebind_version=12"};
  absl::StatusOr<JobResult> result = RunJob(spec, WSYNC_TEST_WORKER, WSYNC_CLI);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->workers.size(), 4u);
  int64_t delta_received = 0, delta_dense = 0;  // Rollouts, versions that travelled as deltas.
  for (int p = 0; p < 4; ++p) {
    const WorkerResult& worker = result->workers[p];
    // Only version 6 failed, on every process (the decision).
    EXPECT_EQ(worker.exit_code, 1) << worker.stderr_text;
    EXPECT_NE(worker.stderr_text.find("1 of 20 versions failed"), std::string::npos)
        << "process " << p << ": " << worker.stderr_text;
    ASSERT_EQ(worker.stats.size(), 19u) << "process " << p << ": " << worker.stderr_text;
    if (p < 2) continue;
    for (const auto& stats : worker.stats) {
      const int64_t version = Field(stats, "version");
      SCOPED_TRACE(testing::Message() << "rollout " << p - 2 << " version " << version);
      EXPECT_NE(version, 6);
      EXPECT_GT(Field(stats, "verified"), 0);  // Chunk hashes over the patched targets.
      const bool dense = version == 1 || version == 7 || (version == 12 && p == 3);
      if (dense) {
        EXPECT_EQ(Field(stats, "delta_messages"), 0);
        continue;
      }
      EXPECT_GT(Field(stats, "delta_messages"), 0);
      delta_received += Field(stats, "received");
      delta_dense += Field(stats, "received") + Field(stats, "delta_saved");
    }
  }
  ASSERT_GT(delta_dense, 0);
  // ~2% of the elements changed: the encodings are a small part of the dense bytes.
  EXPECT_LT(delta_received * 5, delta_dense)
      << delta_received << " of " << delta_dense << " dense bytes";
  testing::Test::RecordProperty("delta_received_bytes", std::to_string(delta_received));
  testing::Test::RecordProperty("delta_dense_bytes", std::to_string(delta_dense));
}

TEST(MultiprocTest, DeltaSyncTwentySmallUpdatesBitExactDenseAfterAnAbortAndARebind) {
  ExpectDeltaSyncsExact("sm,cma,self");
}

TEST(MultiprocTest, DeltaSyncTwentySmallUpdatesBitExactOverTcp) { ExpectDeltaSyncsExact("tcp"); }

// Delta sync with relays: a relay patches what it receives from the trainers and forwards its
// patched weights dense (forwarding lanes never announce); every rollout checks every element.
TEST(MultiprocTest, DeltaSyncThroughRelaysAcrossTwoNetworkNamespaces) {
  std::string reason;
  std::optional<NetnsPair> net = NetnsPair::Create(&reason);
  if (!net) GTEST_SKIP() << "network namespaces unavailable: " << reason;
  JobResult result = ExpectJobSucceeds(TwoReplicasAcrossNodes(
      *net, 4, {"--relay", "always", "--delta=on", "--changed_per_mille=20", "--verify=hash"}));
  ASSERT_EQ(result.workers.size(), 6u);
  int64_t forwarded = 0, delta_messages = 0;
  for (int p = 2; p < 6; ++p) {
    for (const auto& stats : result.workers[p].stats) {
      forwarded += Field(stats, "forwarded");
      if (Field(stats, "version") > 1) delta_messages += Field(stats, "delta_messages");
    }
  }
  EXPECT_GT(forwarded, 0);
  EXPECT_GT(delta_messages, 0);
}

TEST(MultiprocTest, AWrongSecretIsRefusedAndTheOthersFailNamingTheMissingProcess) {
  setenv("WSYNC_WRONG_SECRET", "0123456789abcdef-not-the-secret-0123", 1);
  JobSpec spec;
  spec.tls = "sm,cma,self";
  spec.versions = 1;
  spec.rendezvous_timeout = absl::Seconds(4);
  spec.timeout = absl::Seconds(60);
  spec.placement.assign(4, ProcessPlacement{});
  spec.placement[3].extra_flags = {"--secret_env", "WSYNC_WRONG_SECRET"};
  absl::StatusOr<JobResult> result = RunJob(spec, WSYNC_TEST_WORKER, WSYNC_CLI);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->workers.size(), 4u);
  EXPECT_EQ(result->workers[3].exit_code, 1);
  EXPECT_NE(result->workers[3].stderr_text.find("UNAUTHENTICATED"), std::string::npos)
      << result->workers[3].stderr_text;
  for (int p = 0; p < 3; ++p) {
    EXPECT_EQ(result->workers[p].exit_code, 1) << result->workers[p].stderr_text;
    EXPECT_NE(result->workers[p].stderr_text.find("rollout rank 1"), std::string::npos)
        << result->workers[p].stderr_text;
  }
  for (const WorkerResult& worker : result->workers) {
    EXPECT_EQ(worker.stderr_text.find(result->secret), std::string::npos);
    EXPECT_EQ(worker.stderr_text.find("not-the-secret"), std::string::npos);
  }
  EXPECT_EQ(result->coordinator_output.find(result->secret), std::string::npos);
}

}  // namespace
}  // namespace wsync::harness
