// Property tests of relaying (planner/relay.h) and of the random replica policy, over random
// multi-node layout pairs: see plan_property_test.cc for the seeds and the environment overrides.

#include <cstdint>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "planner/geometry.h"
#include "planner/job.h"
#include "planner/plan.h"
#include "planner/policy.h"
#include "planner/relay.h"
#include "tests/testing/random_layouts.h"
#include "tests/testing/reference.h"
#include "tests/unit/plan_property_support.h"

namespace wsync {
namespace {

using test::LayoutPair;
using test::property::Annotate;
using test::property::CompareSegments;
using test::property::ForEachSeed;
using test::property::kVersion;
using test::property::PairForSeed;
using test::property::Policies;

// Relaying forced on: the plan of every policy is exact by the proof and the reference; each
// process's plan is the full plan's segments of that process plus those received by a relay that
// forwards to it from a trainer; the digest is the same for every process and covers the relays;
// the inter-node bytes saved are (k-1) copies of each relayed box; a forward re-pointed by one
// element, or left without its stage-1 segment, is refused by the proof and caught by the
// reference.
struct RelayCoverage {
  int64_t relays = 0;
  int64_t arena_relays = 0;
  int64_t pairs_with_relays = 0;
};

absl::Status CheckRelayedPlan(const Job& job, const LayoutPair& pair, const ReplicaPolicy& policy,
                              RelayCoverage* coverage) {
  PlanOptions options;
  options.relay.mode = RelayMode::kAlways;
  options.relay.arena_bytes = 256;  // Small, so that some boxes do not fit an arena.
  WSYNC_ASSIGN_OR_RETURN(const Plan plan, Annotate(MakePlan(job, policy, options), "full plan"));
  WSYNC_RETURN_IF_ERROR(Annotate(ProveExact(job, plan.segments), "ProveExact of the full plan"));
  WSYNC_RETURN_IF_ERROR(
      Annotate(test::RunReference(job, plan.segments, pair.source, pair.target, kVersion),
               "reference run of the full plan"));
  WSYNC_ASSIGN_OR_RETURN(const Plan direct, Annotate(MakePlan(job, policy), "plan without relay"));
  int64_t saved = 0;
  for (const Relay& relay : plan.relays) {
    ++coverage->relays;
    if (relay.in_arena) ++coverage->arena_relays;
    saved +=
        (static_cast<int64_t>(relay.receivers.size()) - (relay.in_arena ? 1 : 0)) * relay.bytes;
  }
  if (!plan.relays.empty()) ++coverage->pairs_with_relays;
  if (plan.inter_node_bytes_without_relay != direct.inter_node_bytes ||
      plan.inter_node_bytes != direct.inter_node_bytes - saved) {
    return absl::InternalError(absl::StrCat("inter-node bytes ", plan.inter_node_bytes,
                                            " (without relay ", plan.inter_node_bytes_without_relay,
                                            ") but the direct plan moves ", direct.inter_node_bytes,
                                            " and the relays save ", saved));
  }
  if (plan.relays.empty() != (plan.digest == direct.digest)) {
    return absl::InternalError("the digest does not follow whether anything is relayed");
  }
  for (int32_t id = 0; id < job.num_processes(); ++id) {
    PlanOptions mine_options = options;
    mine_options.process = id;
    const std::string context = absl::StrCat("relayed plan of process ", id);
    WSYNC_ASSIGN_OR_RETURN(const Plan mine, Annotate(MakePlan(job, policy, mine_options), context));
    std::set<int32_t> feeders;
    for (const Segment& segment : plan.segments) {
      if (segment.to.process == id && !job.IsSource(segment.from.process)) {
        feeders.insert(segment.from.process);
      }
    }
    std::vector<Segment> expected;
    for (const Segment& segment : plan.segments) {
      if (segment.from.process == id || segment.to.process == id ||
          (feeders.contains(segment.to.process) && job.IsSource(segment.from.process))) {
        expected.push_back(segment);
      }
    }
    WSYNC_RETURN_IF_ERROR(Annotate(CompareSegments(expected, mine.segments), context));
    if (mine.digest != plan.digest || !(mine.relays == plan.relays)) {
      return absl::InternalError(absl::StrCat(context, ": digest or relays differ"));
    }
    if (!job.IsSource(id))
      WSYNC_RETURN_IF_ERROR(Annotate(ProveExact(job, mine.segments, id), context));
  }
  // Corrupt one forward, and drop the stage-1 segment of another.
  for (size_t i = 0; i < plan.segments.size(); ++i) {
    if (job.IsSource(plan.segments[i].from.process)) continue;
    std::vector<Segment> shifted = plan.segments;
    shifted[i].from.offset += 1;
    std::vector<Segment> orphaned = plan.segments;
    std::erase_if(orphaned, [&](const Segment& s) {
      return job.IsSource(s.from.process) && s.to.process == plan.segments[i].from.process &&
             s.to.buffer == plan.segments[i].from.buffer &&
             s.to.offset == plan.segments[i].from.offset && s.box == plan.segments[i].box &&
             s.param == plan.segments[i].param;
    });
    for (const auto& [name, corrupted] :
         {std::pair<std::string, const std::vector<Segment>*>{"shifted forward", &shifted},
          {"forward without its stage 1", &orphaned}}) {
      if (ProveExact(job, *corrupted).ok()) {
        return absl::InternalError(absl::StrCat("ProveExact accepts a ", name));
      }
      if (test::RunReference(job, *corrupted, pair.source, pair.target, kVersion).ok()) {
        return absl::InternalError(absl::StrCat("the reference accepts a ", name));
      }
    }
    break;
  }
  return absl::OkStatus();
}

TEST(PlanPropertyTest, RandomMultiNodePairsRelayedExactly) {
  RelayCoverage coverage;
  int64_t pairs = 0;
  ForEachSeed(300, [&](uint64_t seed) -> absl::Status {
    std::mt19937_64 rng(seed);
    test::RandomLayoutOptions options;
    options.max_nodes = 2;  // Few nodes, so that several rollouts of a node share boxes.
    options.max_processes = 8;
    const LayoutPair pair = test::RandomLayoutPair(rng, options);
    WSYNC_ASSIGN_OR_RETURN(const Job job, Annotate(Job::Create(pair.source, pair.target), "job"));
    ++pairs;
    for (const std::unique_ptr<ReplicaPolicy>& policy : Policies(seed, job)) {
      WSYNC_RETURN_IF_ERROR(
          Annotate(CheckRelayedPlan(job, pair, *policy, &coverage), policy->name()));
    }
    return absl::OkStatus();
  });
  std::cout << "pairs " << pairs << ", plans with relays " << coverage.pairs_with_relays
            << ", relays " << coverage.relays << " (" << coverage.arena_relays
            << " through an arena)\n";
  if (pairs >= 100) {
    EXPECT_GT(coverage.pairs_with_relays, pairs / 5);
    EXPECT_GT(coverage.arena_relays, 0);
  }
}

// The random policy's answers are valid, a function of each request alone (not of its position),
// and split some regions.
absl::Status CheckRandomAnswers(uint64_t seed) {
  const LayoutPair pair = PairForSeed(seed);
  WSYNC_ASSIGN_OR_RETURN(const Job job, Job::Create(pair.source, pair.target));
  const std::unique_ptr<ReplicaPolicy> first = MakeFirstHolderPolicy();
  WSYNC_ASSIGN_OR_RETURN(const Plan plan, MakePlan(job, *first));
  const test::RandomAnswersPolicy policy(seed);
  WSYNC_ASSIGN_OR_RETURN(const std::vector<ReplicaAnswer> answers,
                         policy.Choose(job, plan.requests, plan.fixed_traffic));
  if (answers.size() != plan.requests.size()) return absl::InternalError("answer count");
  std::vector<ReplicaRequest> reversed(plan.requests.rbegin(), plan.requests.rend());
  WSYNC_ASSIGN_OR_RETURN(const std::vector<ReplicaAnswer> reversed_answers,
                         policy.Choose(job, reversed, plan.fixed_traffic));
  for (size_t r = 0; r < answers.size(); ++r) {
    WSYNC_RETURN_IF_ERROR(CheckAnswer(plan.requests[r], answers[r]));
    if (!(answers[r] == reversed_answers[answers.size() - 1 - r])) {
      return absl::InternalError(absl::StrCat("answer ", r, " depends on the request order"));
    }
  }
  return absl::OkStatus();
}

TEST(RandomAnswersPolicyTest, AnswersAreValidAndDependOnlyOnTheRequest) {
  ForEachSeed(100, CheckRandomAnswers);
}

}  // namespace
}  // namespace wsync
