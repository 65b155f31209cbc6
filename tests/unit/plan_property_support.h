#ifndef WSYNC_TESTS_UNIT_PLAN_PROPERTY_SUPPORT_H_
#define WSYNC_TESTS_UNIT_PLAN_PROPERTY_SUPPORT_H_

// What the plan property tests share (plan_property_test.cc, plan_property_relay_test.cc): the
// seeds to run (WSYNC_PROPERTY_SEED, WSYNC_PROPERTY_PAIRS, WSYNC_PROPERTY_PERCENT), the replica
// policies checked on every pair, and helpers to annotate and compare results.

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "planner/cost_aware_policy.h"
#include "planner/geometry.h"
#include "planner/job.h"
#include "planner/plan.h"
#include "planner/policy.h"
#include "tests/testing/property_scale.h"
#include "tests/testing/random_layouts.h"

namespace wsync::test::property {

inline constexpr uint64_t kDefaultFirstSeed = 1000;
inline constexpr int64_t kDefaultPairs = 1000;
inline constexpr uint64_t kVersion = 7;
inline constexpr int kMaxReportedFailures = 5;

using test::EnvInt;

inline uint64_t FirstSeed() { return EnvInt("WSYNC_PROPERTY_SEED", kDefaultFirstSeed); }
inline int64_t NumPairs(int64_t fallback = kDefaultPairs) {
  return EnvInt("WSYNC_PROPERTY_PAIRS", ScaledCases(fallback));
}

inline test::LayoutPair PairForSeed(uint64_t seed) {
  std::mt19937_64 rng(seed);
  return test::RandomLayoutPair(rng);
}

inline std::vector<std::unique_ptr<ReplicaPolicy>> Policies(uint64_t seed, const Job& job) {
  std::vector<std::unique_ptr<ReplicaPolicy>> policies;
  for (const char* name : {"first_holder", "local_first_least_loaded"}) {
    absl::StatusOr<std::unique_ptr<ReplicaPolicy>> policy = MakeReplicaPolicy(name);
    EXPECT_TRUE(policy.ok()) << name << ": " << policy.status();
    if (policy.ok()) policies.push_back(*std::move(policy));
  }
  policies.push_back(std::make_unique<test::RandomAnswersPolicy>(seed));
  // Cost-aware with links that differ by path class and a small split size, so that its splits
  // along axis 0 are exercised too.
  // A second one also prices the job's node links (each ordered pair of nodes shares a
  // capacity below one pair's), so that its choices balance bytes across node boundaries.
  CostAwareOptions cost_options;
  cost_options.min_split_bytes = 8;
  const LinkFits fits =
      *FitLinks(*SyntheticCalibration("intra_node=5us,20GB/s;inter_node=20us,5GB/s"));
  policies.push_back(MakeCostAwarePolicy(fits, cost_options));
  LinkFits with_node_links = fits;
  for (int32_t p = 0; p < job.num_processes(); ++p) {
    with_node_links.nodes.push_back(absl::StrCat("n", job.NodeIndex(p)));
  }
  for (const std::string& from : with_node_links.nodes) {
    for (const std::string& to : with_node_links.nodes) {
      if (from != to) with_node_links.node_link[{from, to}] = LinkFit{20e-6, 2e9, 0, 2};
    }
  }
  policies.push_back(MakeCostAwarePolicy(std::move(with_node_links), cost_options));
  return policies;
}

inline absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

template <typename T>
absl::StatusOr<T> Annotate(absl::StatusOr<T> value, absl::string_view context) {
  if (value.ok()) return value;
  return Annotate(value.status(), context);
}

inline std::string SegmentToString(const Segment& s) {
  return absl::StrCat("{param ", s.param, " box ", BoxToString(s.box), " from p", s.from.process,
                      "/b", s.from.buffer, "@", s.from.offset, DimsToString(s.from.strides),
                      " to p", s.to.process, "/b", s.to.buffer, "@", s.to.offset,
                      DimsToString(s.to.strides), "}");
}

// OK when the two segment lists are equal; otherwise names the first difference.
inline absl::Status CompareSegments(const std::vector<Segment>& expected,
                                    const std::vector<Segment>& actual) {
  for (size_t i = 0; i < std::max(expected.size(), actual.size()); ++i) {
    if (i >= expected.size() || i >= actual.size() || !(expected[i] == actual[i])) {
      return absl::InternalError(
          absl::StrCat("segment ", i, " differs (", expected.size(), " vs ", actual.size(),
                       " segments): ", i < expected.size() ? SegmentToString(expected[i]) : "none",
                       " vs ", i < actual.size() ? SegmentToString(actual[i]) : "none"));
    }
  }
  return absl::OkStatus();
}

inline std::string DescribeGenericPair(uint64_t seed) {
  const test::LayoutPair pair = PairForSeed(seed);
  return test::LayoutToString(pair.source) + test::LayoutToString(pair.target);
}

// Runs `check` for NumPairs() consecutive seeds, reporting the first failures with their seeds
// (and `describe` of the first one: by default the generic pair's layouts) and failing the test if
// any seed failed.
template <typename Check>
void ForEachSeed(int64_t default_pairs, Check check,
                 std::string (*describe)(uint64_t) = DescribeGenericPair) {
  const uint64_t first = FirstSeed();
  const int64_t pairs = NumPairs(default_pairs);
  int64_t failures = 0;
  for (int64_t i = 0; i < pairs; ++i) {
    const uint64_t seed = first + static_cast<uint64_t>(i);
    const absl::Status status = check(seed);
    if (status.ok()) continue;
    if (++failures <= kMaxReportedFailures) {
      ADD_FAILURE() << "seed " << seed << " (rerun with WSYNC_PROPERTY_SEED=" << seed
                    << " WSYNC_PROPERTY_PAIRS=1): " << status;
      if (failures == 1) std::cout << describe(seed);
    }
  }
  EXPECT_EQ(failures, 0) << "of " << pairs << " seeds starting at " << first;
}

}  // namespace wsync::test::property

#endif  // WSYNC_TESTS_UNIT_PLAN_PROPERTY_SUPPORT_H_
