// PlanNcclCommunicators: random jobs of processes on shared GPUs, checked against what NCCL
// needs (no communicator with two ranks of one GPU; each pair in one holding both of its
// processes), the single communicator when no GPU is shared, determinism and the refusals.

#include "plugin/nccl_communicators.h"

#include <algorithm>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wsync {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Every property of a plan for `pairs` on `gpu_of`.
void ExpectValid(const NcclCommunicators& plan, const std::vector<NcclPair>& pairs,
                 const std::vector<std::string>& gpu_of) {
  ASSERT_EQ(plan.of_pair.size(), pairs.size());
  for (const std::vector<int32_t>& members : plan.members) {
    EXPECT_TRUE(std::is_sorted(members.begin(), members.end()));
    std::set<std::string> gpus;
    for (int32_t p : members) EXPECT_TRUE(gpus.insert(gpu_of[p]).second) << "GPU " << gpu_of[p];
    EXPECT_GE(members.size(), 2u);
  }
  for (size_t i = 0; i < pairs.size(); ++i) {
    ASSERT_GE(plan.of_pair[i], 0);
    ASSERT_LT(plan.of_pair[i], static_cast<int32_t>(plan.members.size()));
    const std::vector<int32_t>& members = plan.members[plan.of_pair[i]];
    EXPECT_TRUE(std::binary_search(members.begin(), members.end(), pairs[i].first));
    EXPECT_TRUE(std::binary_search(members.begin(), members.end(), pairs[i].second));
  }
}

TEST(NcclCommunicatorsTest, RandomJobsGetValidDeterministicCommunicators) {
  int shared_jobs = 0, several = 0;
  for (uint32_t seed = 0; seed < 400; ++seed) {
    std::mt19937 rng(seed);
    const int32_t processes = 2 + static_cast<int32_t>(rng() % 15);
    const int32_t gpus = 1 + static_cast<int32_t>(rng() % processes);
    std::vector<std::string> gpu_of(processes);
    for (int32_t p = 0; p < processes; ++p) {
      gpu_of[p] = absl::StrCat("node ", rng() % 2, ", GPU ", rng() % gpus);
    }
    std::vector<NcclPair> pairs;
    for (int32_t a = 0; a < processes; ++a) {
      for (int32_t b = a + 1; b < processes; ++b) {
        if (gpu_of[a] != gpu_of[b] && rng() % 3 == 0) pairs.emplace_back(a, b);
      }
    }
    std::shuffle(pairs.begin(), pairs.end(), rng);
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    absl::StatusOr<NcclCommunicators> plan = PlanNcclCommunicators(pairs, gpu_of);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ExpectValid(*plan, pairs, gpu_of);
    std::set<int32_t> in_pairs;
    std::set<std::string> their_gpus;
    for (const auto& [a, b] : pairs) {
      for (int32_t p : {a, b}) {
        in_pairs.insert(p);
        their_gpus.insert(gpu_of[p]);
      }
    }
    if (their_gpus.size() == in_pairs.size()) {
      // No GPU shared: one communicator over exactly the processes of the pairs (or none).
      if (pairs.empty()) {
        EXPECT_TRUE(plan->members.empty());
      } else {
        ASSERT_EQ(plan->members.size(), 1u);
        EXPECT_EQ(std::set<int32_t>(plan->members[0].begin(), plan->members[0].end()), in_pairs);
      }
    } else {
      ++shared_jobs;
      several += plan->members.size() > 1 ? 1 : 0;
    }
    // The same answer for the same pairs in another order (processes list them differently only
    // by construction; the plan must not depend on it).
    std::vector<NcclPair> sorted = pairs;
    std::sort(sorted.begin(), sorted.end());
    absl::StatusOr<NcclCommunicators> again = PlanNcclCommunicators(sorted, gpu_of);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->members, plan->members);
  }
  EXPECT_GT(shared_jobs, 100);  // The greedy path was exercised, and split jobs.
  EXPECT_GT(several, 50);
}

TEST(NcclCommunicatorsTest, ColocatedTwoNodesNeedOneCommunicatorPerPair) {
  // Trainer 0 and rollout 1 share node a's GPU, trainer 1 and rollout 0 node b's.
  const std::vector<std::string> gpu_of = {"a0", "b0", "b0", "a0"};
  const std::vector<NcclPair> pairs = {{0, 1}, {0, 2}, {1, 3}, {2, 3}};
  absl::StatusOr<NcclCommunicators> plan = PlanNcclCommunicators(pairs, gpu_of);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->members, ElementsAre(ElementsAre(0, 1), ElementsAre(0, 2), ElementsAre(1, 3),
                                         ElementsAre(2, 3)));
  EXPECT_THAT(plan->of_pair, ElementsAre(0, 1, 2, 3));
}

TEST(NcclCommunicatorsTest, PairsOnDistinctGpusShareACommunicatorWhereTheyFit) {
  // Processes 0 and 1 share a GPU; 2 and 3 each have their own: {0, 2, 3} and {1, 2}.
  const std::vector<std::string> gpu_of = {"g0", "g0", "g2", "g3"};
  const std::vector<NcclPair> pairs = {{0, 2}, {0, 3}, {1, 2}, {2, 3}};
  absl::StatusOr<NcclCommunicators> plan = PlanNcclCommunicators(pairs, gpu_of);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->members, ElementsAre(ElementsAre(0, 2, 3), ElementsAre(1, 2)));
  EXPECT_THAT(plan->of_pair, ElementsAre(0, 0, 1, 0));
}

TEST(NcclCommunicatorsTest, APairOnOneGpuIsRefusedNamingIt) {
  const std::vector<std::string> gpu_of = {"node a, GPU 00ff", "node b, GPU 0101",
                                           "node a, GPU 00ff"};
  absl::StatusOr<NcclCommunicators> plan = PlanNcclCommunicators({{0, 1}, {0, 2}}, gpu_of);
  EXPECT_TRUE(absl::IsUnimplemented(plan.status())) << plan.status();
  EXPECT_THAT(std::string(plan.status().message()),
              HasSubstr("processes 0 and 2 exchange CUDA memory over NCCL but share one GPU "
                        "(node a, GPU 00ff)"));
}

TEST(NcclCommunicatorsTest, MalformedPairsAreRefused) {
  const std::vector<std::string> gpu_of = {"a", "b", "c"};
  for (const NcclPair& bad : {NcclPair{1, 0}, NcclPair{1, 1}, NcclPair{-1, 2}, NcclPair{0, 3}}) {
    EXPECT_TRUE(absl::IsInvalidArgument(PlanNcclCommunicators({bad}, gpu_of).status()))
        << bad.first << ", " << bad.second;
  }
  absl::StatusOr<NcclCommunicators> none = PlanNcclCommunicators({}, gpu_of);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->members.empty());
}

}  // namespace
}  // namespace wsync
