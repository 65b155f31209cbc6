// Property tests of the planner over random (trainer, rollout) layout pairs, generic ones and named
// layouts of small MoE models (wide-EP vLLM rollouts included): every plan, for every
// replica policy, is proven exact by ProveExact and, independently, by executing it element by
// element on host buffers (tests/testing/reference.h); per-process plans are the full plan's
// segments of that process; plans and digests do not depend on listing order; digests change with
// the layouts; corrupted plans are refused by both the proof and the reference.
//
// Environment overrides for reproducing a failure: WSYNC_PROPERTY_SEED (first seed) and
// WSYNC_PROPERTY_PAIRS (number of consecutive seeds). WSYNC_PROPERTY_PERCENT (default 100) scales
// each test's own number of seeds when WSYNC_PROPERTY_PAIRS is unset: the sanitizer builds run 8%
// (tests/unit/CMakeLists.txt), as instrumented planning is ~20x slower.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/checked_math.h"
#include "common/dtype.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "integration/fill/fill.h"
#include "planner/cost_aware_policy.h"
#include "planner/geometry.h"
#include "planner/job.h"
#include "planner/plan.h"
#include "planner/policy.h"
#include "planner/relay.h"
#include "planner/validate.h"
#include "tests/testing/random_layouts.h"
#include "tests/testing/random_named_layouts.h"
#include "tests/testing/reference.h"
#include "tests/unit/plan_property_support.h"

namespace wsync {
namespace {

using test::LayoutPair;
using test::property::Annotate;
using test::property::CompareSegments;
using test::property::DescribeGenericPair;
using test::property::ForEachSeed;
using test::property::kDefaultPairs;
using test::property::kVersion;
using test::property::NumPairs;
using test::property::PairForSeed;
using test::property::Policies;
using test::property::SegmentToString;

// Counters of what the random pairs exercised, so a generator regression that stops producing
// some kind of layout is noticed.
struct Coverage {
  int64_t pairs = 0;
  int64_t with_requests = 0;        // first_holder saw at least one replicated region.
  int64_t with_split_answers = 0;   // random_answers split some region across holders.
  int64_t with_strided_pieces = 0;  // Some piece is not row-major packed.
  int64_t with_several_nodes = 0;
  int64_t segments = 0;
};

bool HasStridedPiece(const Layout& layout) {
  for (const Piece& piece : layout.pieces) {
    if (!IsPacked(piece.box.extent, piece.strides)) return true;
  }
  return false;
}

bool HasSeveralNodes(const LayoutPair& pair) {
  std::vector<std::string> nodes;
  for (const Layout* layout : {&pair.source, &pair.target}) {
    for (const ProcessInfo& process : layout->processes) nodes.push_back(process.node_id);
  }
  std::sort(nodes.begin(), nodes.end());
  return std::unique(nodes.begin(), nodes.end()) - nodes.begin() > 1;
}

// Every property of one policy on one job. `shuffled` is the job made from shuffled copies of the
// same layouts.
absl::Status CheckPolicy(const Job& job, const Job& shuffled, const LayoutPair& pair,
                         const ReplicaPolicy& policy, Coverage* coverage) {
  WSYNC_ASSIGN_OR_RETURN(const Plan plan, Annotate(MakePlan(job, policy), "full plan"));
  coverage->segments += static_cast<int64_t>(plan.segments.size());
  if (plan.answers.size() != plan.requests.size()) {
    return absl::InternalError(
        absl::StrCat(plan.requests.size(), " requests but ", plan.answers.size(), " answers"));
  }
  for (size_t r = 0; r < plan.requests.size(); ++r) {
    WSYNC_RETURN_IF_ERROR(
        Annotate(CheckAnswer(plan.requests[r], plan.answers[r]), absl::StrCat("answer ", r)));
  }
  WSYNC_RETURN_IF_ERROR(Annotate(ProveExact(job, plan.segments), "ProveExact of the full plan"));
  WSYNC_RETURN_IF_ERROR(
      Annotate(test::RunReference(job, plan.segments, pair.source, pair.target, kVersion),
               "reference run of the full plan"));
  if (plan.digest != PlanDigest(job, plan)) {
    return absl::InternalError("plan.digest differs from PlanDigest(job, plan)");
  }

  // Listing order changes nothing.
  WSYNC_ASSIGN_OR_RETURN(const Plan again,
                         Annotate(MakePlan(shuffled, policy), "plan of shuffled layouts"));
  WSYNC_RETURN_IF_ERROR(
      Annotate(CompareSegments(plan.segments, again.segments), "plan of shuffled layouts"));
  if (again.digest != plan.digest) {
    return absl::InternalError("the digest of the shuffled layouts' plan differs");
  }

  // Per-process plans are exactly the full plan's segments of that process.
  for (int32_t id = 0; id < job.num_processes(); ++id) {
    PlanOptions options;
    options.process = id;
    const std::string context = absl::StrCat("plan of process ", id);
    WSYNC_ASSIGN_OR_RETURN(const Plan mine, Annotate(MakePlan(job, policy, options), context));
    std::vector<Segment> expected;
    for (const Segment& segment : plan.segments) {
      if (segment.from.process == id || segment.to.process == id) expected.push_back(segment);
    }
    WSYNC_RETURN_IF_ERROR(Annotate(CompareSegments(expected, mine.segments), context));
    if (!job.IsSource(id)) {
      const int32_t rank = id - static_cast<int32_t>(job.source().processes.size());
      WSYNC_RETURN_IF_ERROR(Annotate(ProveExact(job, mine.segments, id), context));
      WSYNC_RETURN_IF_ERROR(
          Annotate(test::RunReference(job, mine.segments, pair.source, pair.target, kVersion, rank),
                   absl::StrCat("reference run of the ", context)));
    }
  }

  if (!plan.requests.empty() && policy.name() == "first_holder") ++coverage->with_requests;
  if (policy.name() == "random_answers") {
    for (const ReplicaAnswer& answer : plan.answers) {
      if (answer.parts.size() > 1) {
        ++coverage->with_split_answers;
        break;
      }
    }
  }
  return absl::OkStatus();
}

// Every property of every policy on `pair`; `seed` seeds the shuffle and the random policies.
absl::Status CheckPair(const LayoutPair& pair, uint64_t seed, Coverage* coverage) {
  WSYNC_RETURN_IF_ERROR(Annotate(ValidateLayout(pair.source), "generated source"));
  WSYNC_RETURN_IF_ERROR(Annotate(ValidateLayout(pair.target), "generated target"));
  WSYNC_RETURN_IF_ERROR(Annotate(ValidatePair(pair.source, pair.target), "generated pair"));
  WSYNC_ASSIGN_OR_RETURN(const Job job, Annotate(Job::Create(pair.source, pair.target), "job"));
  std::mt19937_64 shuffle_rng(seed * 7919 + 1);
  Layout source = test::ShuffledCopy(pair.source, shuffle_rng);
  Layout target = test::ShuffledCopy(pair.target, shuffle_rng);
  WSYNC_ASSIGN_OR_RETURN(
      const Job shuffled,
      Annotate(Job::Create(std::move(source), std::move(target)), "job of shuffled layouts"));
  ++coverage->pairs;
  if (HasStridedPiece(pair.source) || HasStridedPiece(pair.target)) {
    ++coverage->with_strided_pieces;
  }
  if (HasSeveralNodes(pair)) ++coverage->with_several_nodes;
  for (const std::unique_ptr<ReplicaPolicy>& policy : Policies(seed, job)) {
    WSYNC_RETURN_IF_ERROR(
        Annotate(CheckPolicy(job, shuffled, pair, *policy, coverage), policy->name()));
  }
  return absl::OkStatus();
}

absl::Status CheckPair(uint64_t seed, Coverage* coverage) {
  return CheckPair(PairForSeed(seed), seed, coverage);
}

TEST(LogicalValueTest, DiffersBetweenNeighboursParametersAndVersions) {
  const uint64_t a = test::ParamKey("a");
  const uint64_t b = test::ParamKey("b");
  EXPECT_NE(a, b);
  int64_t same_low_byte_as_other_param = 0;
  for (int64_t i = 0; i < 4096; ++i) {
    const uint64_t value = test::LogicalValue(a, i, 1);
    // Neighbours differ even in the lowest byte (1-byte dtypes).
    EXPECT_NE(value & 0xff, test::LogicalValue(a, i + 1, 1) & 0xff) << i;
    EXPECT_NE(value, test::LogicalValue(a, i, 2)) << i;
    EXPECT_NE(value, test::LogicalValue(b, i, 1)) << i;
    if ((value & 0xff) == (test::LogicalValue(b, i, 1) & 0xff)) ++same_low_byte_as_other_param;
  }
  // About 1/128 of the low bytes agree by chance; far fewer than all.
  EXPECT_LT(same_low_byte_as_other_param, 100);
  unsigned char bytes[8];
  test::StoreValue(0x0807060504030201, 8, bytes);
  EXPECT_EQ(bytes[0], 0x01);
  EXPECT_EQ(bytes[7], 0x08);
}

// Builds a job of one parameter [2, 3] (fp32) held packed by one trainer process and stored
// transposed (column-major) by one rollout process, so that a correct plan can be written by hand.
struct HandMadeCase {
  Layout source;
  Layout target;
};

HandMadeCase MakeHandMadeCase() {
  HandMadeCase c;
  c.source.role = Role::kTrainer;
  c.source.processes = {ProcessInfo{0, "node0"}};
  c.source.buffers = {BufferInfo{0, 0, 6 * 4, MemoryKind::kHost}};
  c.source.params = {ParamInfo{"w", DType::kFloat32, Dims{2, 3}, ParamQuant{}, 0}};
  c.source.pieces = {Piece{0, 0, 0, WholeBox(Dims{2, 3}), 0, Dims{3, 1}}};
  c.target = c.source;
  c.target.role = Role::kRollout;
  c.target.buffers[0].bytes = 8 * 4;  // Two trailing elements no piece covers.
  c.target.pieces[0].strides = Dims{1, 2};
  return c;
}

TEST(ReferenceTest, AcceptsAHandWrittenPlanAndCatchesEachKindOfError) {
  const HandMadeCase c = MakeHandMadeCase();
  absl::StatusOr<Job> job = Job::Create(c.source, c.target);
  ASSERT_TRUE(job.ok()) << job.status();
  // Source id 0, target id 1. Two segments: row 0 and row 1.
  const std::vector<Segment> good = {
      Segment{0, Box{{0, 0}, {1, 3}}, Endpoint{0, 0, 0, {3, 1}}, Endpoint{1, 0, 0, {1, 2}}},
      Segment{0, Box{{1, 0}, {1, 3}}, Endpoint{0, 0, 3, {3, 1}}, Endpoint{1, 0, 1, {1, 2}}},
  };
  EXPECT_TRUE(test::RunReference(*job, good, c.source, c.target, kVersion).ok());
  EXPECT_TRUE(ProveExact(*job, good).ok());

  std::vector<Segment> missing = {good[0]};
  EXPECT_FALSE(test::RunReference(*job, missing, c.source, c.target, kVersion).ok());
  std::vector<Segment> twice = {good[0], good[0], good[1]};
  EXPECT_FALSE(test::RunReference(*job, twice, c.source, c.target, kVersion).ok());
  std::vector<Segment> wrong_source = good;
  wrong_source[1].from.offset = 2;  // Reads [0, 2..4] (and beyond) instead of row 1.
  EXPECT_FALSE(test::RunReference(*job, wrong_source, c.source, c.target, kVersion).ok());
  std::vector<Segment> into_padding = good;
  into_padding[1].to.offset = 2;  // Writes index [1, 2] to element 6: padding.
  const absl::Status status = test::RunReference(*job, into_padding, c.source, c.target, kVersion);
  EXPECT_FALSE(status.ok());
  std::vector<Segment> outside = good;
  outside[1].to.offset = 4;  // Index [1, 2] would land on element 8, past the buffer.
  EXPECT_EQ(test::RunReference(*job, outside, c.source, c.target, kVersion).code(),
            absl::StatusCode::kOutOfRange);
  // Only process 0 of the target checked: the whole plan writes it, so the check passes.
  EXPECT_TRUE(test::RunReference(*job, good, c.source, c.target, kVersion, 0).ok());
}

TEST(PlanPropertyTest, RandomPairsPlanExactlyForEveryPolicy) {
  const auto start = std::chrono::steady_clock::now();
  Coverage coverage;
  ForEachSeed(kDefaultPairs, [&](uint64_t seed) { return CheckPair(seed, &coverage); });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "pairs " << coverage.pairs << ", with replica requests " << coverage.with_requests
            << ", with split answers " << coverage.with_split_answers << ", with strided pieces "
            << coverage.with_strided_pieces << ", on several nodes " << coverage.with_several_nodes
            << ", segments " << coverage.segments << ", " << seconds << " s\n";
  if (coverage.pairs >= 100) {
    EXPECT_GT(coverage.with_requests, coverage.pairs / 5);
    EXPECT_GT(coverage.with_split_answers, coverage.pairs / 10);
    EXPECT_GT(coverage.with_strided_pieces, coverage.pairs / 5);
    EXPECT_GT(coverage.with_several_nodes, coverage.pairs / 5);
  }
}

// Named layouts of random small MoE models (tests/testing/random_named_layouts.h): the same
// properties as for generic pairs, over vLLM rollouts whose experts are TP-split, whole per
// replica, or spread over every rank of every DP replica (wide EP), and megatron / fsdp trainers.
absl::StatusOr<test::NamedLayoutPair> NamedPairForSeed(uint64_t seed) {
  std::mt19937_64 rng(seed);
  return test::RandomNamedLayoutPair(rng);
}

std::string DescribeNamedPair(uint64_t seed) {
  const absl::StatusOr<test::NamedLayoutPair> named = NamedPairForSeed(seed);
  return named.ok() ? named->Describe() + "\n" : named.status().ToString();
}

TEST(PlanPropertyTest, RandomNamedMoeLayoutsWithWideEpPlanExactly) {
  Coverage coverage;
  int64_t wide_ep = 0;
  int64_t wide_ep_over_replicas = 0;  // Wide EP with dp > 1: experts cross replica boundaries.
  int64_t per_replica_ep = 0;
  ForEachSeed(
      120,
      [&](uint64_t seed) -> absl::Status {
        WSYNC_ASSIGN_OR_RETURN(const test::NamedLayoutPair named, NamedPairForSeed(seed));
        if (named.wide_ep()) {
          ++wide_ep;
          if (named.rollout_dp > 1) ++wide_ep_over_replicas;
        } else if (named.rollout_ep > 1) {
          ++per_replica_ep;
        }
        return Annotate(CheckPair(named.pair, seed, &coverage), named.Describe());
      },
      DescribeNamedPair);
  std::cout << "pairs " << coverage.pairs << ", wide EP " << wide_ep << " ("
            << wide_ep_over_replicas << " over several DP replicas), EP per replica "
            << per_replica_ep << ", with replica requests " << coverage.with_requests
            << ", segments " << coverage.segments << "\n";
  if (coverage.pairs >= 100) {
    EXPECT_GT(wide_ep_over_replicas, coverage.pairs / 5);
    EXPECT_GT(per_replica_ep, coverage.pairs / 20);
    EXPECT_GT(coverage.with_requests, coverage.pairs / 3);
  }
}

// Moves piece `index` of `layout` past the end of its buffer (growing the buffer) with strides
// twice the row-major ones: a valid layout that differs in one piece's offset and strides.
void RelocatePiece(Layout& layout, size_t index) {
  Piece& piece = layout.pieces[index];
  const int64_t size = DTypeSize(layout.params[piece.param].dtype);
  for (BufferInfo& buffer : layout.buffers) {
    if (buffer.process != piece.process || buffer.id != piece.buffer) continue;
    piece.offset = CeilDiv(buffer.bytes, size);
    piece.strides = RowMajorStrides(piece.box.extent);
    int64_t span = 1;
    for (int a = 0; a < piece.box.rank(); ++a) {
      piece.strides[a] *= 2;
      span += (piece.box.extent[a] - 1) * piece.strides[a];
    }
    buffer.bytes = (piece.offset + span) * size;
  }
}

absl::Status CheckDigestChanges(uint64_t seed) {
  const LayoutPair pair = PairForSeed(seed);
  const std::unique_ptr<ReplicaPolicy> policy = MakeFirstHolderPolicy();
  WSYNC_ASSIGN_OR_RETURN(const Job job, Job::Create(pair.source, pair.target));
  WSYNC_ASSIGN_OR_RETURN(const Plan plan, MakePlan(job, *policy));
  std::mt19937_64 rng(seed);
  for (const bool in_source : {true, false}) {
    LayoutPair changed = pair;
    Layout& layout = in_source ? changed.source : changed.target;
    if (layout.pieces.empty()) continue;
    RelocatePiece(layout, test::UniformInt(rng, 0, layout.pieces.size() - 1));
    const std::string what = in_source ? "source" : "target";
    WSYNC_ASSIGN_OR_RETURN(const Job changed_job,
                           Annotate(Job::Create(changed.source, changed.target),
                                    absl::StrCat("job with a relocated ", what, " piece")));
    WSYNC_ASSIGN_OR_RETURN(const Plan changed_plan, MakePlan(changed_job, *policy));
    WSYNC_RETURN_IF_ERROR(Annotate(test::RunReference(changed_job, changed_plan.segments,
                                                      changed.source, changed.target, kVersion),
                                   absl::StrCat("reference with a relocated ", what, " piece")));
    if (changed_plan.digest == plan.digest) {
      return absl::InternalError(
          absl::StrCat("relocating a ", what, " piece leaves the digest unchanged"));
    }
  }
  // One more byte in a target buffer, or another node for a source process: nothing to plan
  // differently, but the layouts differ, so the digest must.
  for (const bool grow_buffer : {true, false}) {
    LayoutPair changed = pair;
    if (grow_buffer) {
      changed.target.buffers[test::UniformInt(rng, 0, changed.target.buffers.size() - 1)].bytes +=
          1;
    } else {
      changed.source.processes[0].node_id += "x";
    }
    WSYNC_ASSIGN_OR_RETURN(const Job changed_job, Job::Create(changed.source, changed.target));
    WSYNC_ASSIGN_OR_RETURN(const Plan changed_plan, MakePlan(changed_job, *policy));
    if (changed_plan.digest == plan.digest) {
      return absl::InternalError(
          absl::StrCat(grow_buffer ? "growing a target buffer" : "changing a source node id",
                       " leaves the digest unchanged"));
    }
  }
  return absl::OkStatus();
}

TEST(PlanPropertyTest, DigestChangesWhenALayoutChanges) { ForEachSeed(100, CheckDigestChanges); }

// Applies each corruption (drop, duplicate, shift, changed stride) to one segment of a valid plan
// and expects ProveExact to refuse it, and the reference too where the set of target elements
// written changes. Shifts move a segment's box and both endpoint offsets by one step of an axis
// whose target stride is non-zero, so it writes a different set of target elements.
absl::Status CheckCorruptionsAreCaught(uint64_t seed) {
  const LayoutPair pair = PairForSeed(seed);
  WSYNC_ASSIGN_OR_RETURN(const Job job, Job::Create(pair.source, pair.target));
  const test::RandomAnswersPolicy policy(seed);
  WSYNC_ASSIGN_OR_RETURN(const Plan plan, MakePlan(job, policy));
  if (plan.segments.empty()) return absl::OkStatus();
  std::mt19937_64 rng(seed);
  const size_t victim = test::UniformInt(rng, 0, plan.segments.size() - 1);
  const Segment& segment = plan.segments[victim];

  struct Corruption {
    std::string name;
    std::vector<Segment> segments;
    bool reference_must_fail;
  };
  std::vector<Corruption> corruptions;
  {
    std::vector<Segment> dropped = plan.segments;
    dropped.erase(dropped.begin() + victim);
    corruptions.push_back({"dropped segment", std::move(dropped), true});
  }
  {
    std::vector<Segment> duplicated = plan.segments;
    duplicated.insert(duplicated.begin() + victim, segment);
    corruptions.push_back({"duplicated segment", std::move(duplicated), true});
  }
  for (int a = 0; a < segment.box.rank(); ++a) {
    if (segment.to.strides[a] == 0) continue;
    std::vector<Segment> shifted = plan.segments;
    Segment& s = shifted[victim];
    s.box.origin[a] += 1;
    s.from.offset += s.from.strides[a];
    s.to.offset += s.to.strides[a];
    corruptions.push_back({absl::StrCat("segment shifted along axis ", a), shifted, true});
    // The box alone shifted: the endpoints no longer match the pieces' affine maps. The bytes
    // moved are the same, so only the proof can notice.
    shifted[victim] = segment;
    shifted[victim].box.origin[a] += 1;
    corruptions.push_back({absl::StrCat("box alone shifted along axis ", a), shifted, false});
    break;
  }
  for (int a = 0; a < segment.box.rank(); ++a) {
    if (segment.box.extent[a] < 2) continue;
    // A wrong stride on an axis of extent > 1 moves the segment's last element: the receiving
    // side writes a different set of elements; the sending side reads other elements, which the
    // value check catches only with high probability (1-byte values repeat), so only the proof
    // must refuse it.
    std::vector<Segment> wrong_to = plan.segments;
    wrong_to[victim].to.strides[a] += 1;
    corruptions.push_back({absl::StrCat("target stride changed on axis ", a), wrong_to, true});
    std::vector<Segment> wrong_from = plan.segments;
    wrong_from[victim].from.strides[a] += 1;
    corruptions.push_back({absl::StrCat("source stride changed on axis ", a), wrong_from, false});
    break;
  }
  for (const Corruption& corruption : corruptions) {
    if (ProveExact(job, corruption.segments).ok()) {
      return absl::InternalError(absl::StrCat("ProveExact accepts a plan with a ", corruption.name,
                                              ": ", SegmentToString(segment)));
    }
    if (corruption.reference_must_fail &&
        test::RunReference(job, corruption.segments, pair.source, pair.target, kVersion).ok()) {
      return absl::InternalError(absl::StrCat("the reference accepts a plan with a ",
                                              corruption.name, ": ", SegmentToString(segment)));
    }
  }
  return absl::OkStatus();
}

TEST(PlanPropertyTest, CorruptedPlansFailTheProofAndTheReference) {
  ForEachSeed(200, CheckCorruptionsAreCaught);
}

}  // namespace
}  // namespace wsync
