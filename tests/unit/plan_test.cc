#include "planner/plan.h"

#include <map>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/builders.h"
#include "planner/policy.h"

namespace wsync {
namespace {

using ::testing::HasSubstr;

// "w" [rows, cols] fp32 split along `axis` over `processes`, repeated `replicas` times (DP);
// process p sits on node "<node_prefix><p / per_node>".
Layout Split(Role role, int axis, int processes, int replicas = 1, int64_t rows = 8,
             int64_t cols = 8, const std::string& node_prefix = "n", int per_node = 1000) {
  LayoutBuilder b(role);
  const int32_t w = b.AddParam("w", DType::kFloat32, {rows, cols});
  for (int r = 0; r < replicas; ++r) {
    for (int i = 0; i < processes; ++i) {
      const int p = b.AddProcess(node_prefix + std::to_string((r * processes + i) / per_node));
      const Box box = SplitBox({rows, cols}, axis, processes, i);
      b.AddPackedPiece(w, p, b.AddBuffer(p, Volume(box) * 4), box, 0);
    }
  }
  return std::move(b).Build();
}

Plan MustPlan(const Job& job, const ReplicaPolicy& policy, PlanOptions options = {}) {
  absl::StatusOr<Plan> plan = MakePlan(job, policy, options);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *std::move(plan) : Plan{};
}

TEST(PlanTest, RowsIntoColumnsGivesEightSegmentsOfFourByTwo) {
  absl::StatusOr<Job> job = Job::Create(Split(Role::kTrainer, 0, 2), Split(Role::kRollout, 1, 4));
  ASSERT_TRUE(job.ok()) << job.status();
  const Plan plan = MustPlan(*job, *MakeFirstHolderPolicy());
  ASSERT_EQ(plan.segments.size(), 8u);
  EXPECT_TRUE(plan.requests.empty());
  for (const Segment& s : plan.segments) {
    EXPECT_EQ(s.box.extent, (Dims{4, 2}));
    const int64_t r = s.from.process;    // trainer rank r holds rows [4r, 4r+4)
    const int64_t c = s.to.process - 2;  // rollout rank c holds columns [2c, 2c+2)
    EXPECT_EQ(s.box.origin, (Dims{4 * r, 2 * c}));
    EXPECT_EQ(s.from.offset, 2 * c);  // (0, 2c) of a packed 4x8 block
    EXPECT_EQ(s.from.strides, (Dims{8, 1}));
    EXPECT_EQ(s.to.offset, 8 * r);  // (4r, 0) of a packed 8x2 block
    EXPECT_EQ(s.to.strides, (Dims{2, 1}));
  }
  EXPECT_EQ(plan.segments.front().from.process, 0);
  EXPECT_EQ(plan.segments.front().to.process, 2);
}

TEST(PlanTest, FirstHolderSendsEverythingFromTheFirstReplica) {
  absl::StatusOr<Job> job =
      Job::Create(Split(Role::kTrainer, 0, 2, /*replicas=*/2), Split(Role::kRollout, 0, 1));
  ASSERT_TRUE(job.ok()) << job.status();
  const Plan plan = MustPlan(*job, *MakeFirstHolderPolicy());
  EXPECT_EQ(plan.requests.size(), 2u);
  for (const Segment& s : plan.segments) EXPECT_LT(s.from.process, 2);
}

TEST(PlanTest, LeastLoadedSpreadsReplicasEvenly) {
  // 4 replicas of a row split over 2 ranks; 4 rollout ranks each needing all 8 rows.
  absl::StatusOr<Job> job =
      Job::Create(Split(Role::kTrainer, 0, 2, 4), Split(Role::kRollout, 1, 4));
  ASSERT_TRUE(job.ok()) << job.status();
  const Plan plan = MustPlan(*job, *MakeLocalFirstLeastLoadedPolicy());
  std::map<int32_t, int64_t> sent;
  for (const Segment& s : plan.segments) sent[s.from.process] += Volume(s.box) * 4;
  ASSERT_EQ(sent.size(), 8u);  // Every trainer process sends.
  for (const auto& [process, bytes] : sent) EXPECT_EQ(bytes, 4 * 2 * 4) << process;
}

TEST(PlanTest, LocalFirstPrefersTheReceiversNode) {
  // Replica 0 on node "n0", replica 1 on node "n1"; the rollout process is on "n1".
  absl::StatusOr<Job> job = Job::Create(Split(Role::kTrainer, 0, 1, 2, 8, 8, "n", 1),
                                        Split(Role::kRollout, 0, 1, 1, 8, 8, "n1-", 1000));
  ASSERT_TRUE(job.ok());
  // The rollout node id is "n1-0", not "n1": nothing is local, so the least-loaded tie goes to
  // the lowest process.
  Plan plan = MustPlan(*job, *MakeLocalFirstLeastLoadedPolicy());
  ASSERT_EQ(plan.segments.size(), 1u);
  EXPECT_EQ(plan.segments[0].from.process, 0);
  EXPECT_EQ(job->PathClass(0, 2), kPathInterNode);

  Layout target = Split(Role::kRollout, 0, 1);
  target.processes[0].node_id = "n1";
  job = Job::Create(Split(Role::kTrainer, 0, 1, 2, 8, 8, "n", 1), target);
  ASSERT_TRUE(job.ok());
  plan = MustPlan(*job, *MakeLocalFirstLeastLoadedPolicy());
  ASSERT_EQ(plan.segments.size(), 1u);
  EXPECT_EQ(plan.segments[0].from.process, 1);
  EXPECT_EQ(job->PathClass(1, 2), kPathIntraNode);
}

// A policy that returns a fixed (wrong) answer for every request.
class FixedPolicy final : public ReplicaPolicy {
 public:
  explicit FixedPolicy(std::vector<ReplicaAnswer> answers) : answers_(std::move(answers)) {}
  std::string name() const override { return "fixed"; }
  absl::StatusOr<std::vector<ReplicaAnswer>> Choose(
      const Job&, absl::Span<const ReplicaRequest> requests,
      absl::Span<const FixedPairTraffic>) const override {
    std::vector<ReplicaAnswer> out;
    for (size_t i = 0; i < requests.size() && i < answers_.size(); ++i) out.push_back(answers_[i]);
    return out;
  }

 private:
  std::vector<ReplicaAnswer> answers_;
};

TEST(PlanTest, RefusesMalformedPolicyAnswers) {
  absl::StatusOr<Job> job =
      Job::Create(Split(Role::kTrainer, 0, 1, 2), Split(Role::kRollout, 0, 1));
  ASSERT_TRUE(job.ok());
  const struct {
    std::vector<ReplicaAnswer> answers;
    const char* message;
  } kCases[] = {
      {{}, "answered 0 of 1 requests"},
      {{ReplicaAnswer{{{0, 0, 4}}}}, "the parts end at 4, not at 8"},
      {{ReplicaAnswer{{{0, 0, 4}, {1, 5, 8}}}}, "part 1 covers [5, 8)"},
      {{ReplicaAnswer{{{2, 0, 8}}}}, "names holder 2 of 2"},
      {{ReplicaAnswer{{{0, 0, 0}, {0, 0, 8}}}}, "part 0 covers [0, 0)"},
      {{ReplicaAnswer{}}, "no parts"},
  };
  for (const auto& c : kCases) {
    absl::StatusOr<Plan> plan = MakePlan(*job, FixedPolicy(c.answers));
    ASSERT_FALSE(plan.ok()) << c.message;
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(plan.status().message()), HasSubstr(c.message));
    if (!c.answers.empty()) {
      EXPECT_THAT(std::string(plan.status().message()),
                  HasSubstr("request for parameter 'w' box [0:8, 0:8) to process 2"));
    }
  }
  // A valid split answer: rows [0, 3) from holder 1, [3, 8) from holder 0.
  const Plan plan = MustPlan(*job, FixedPolicy({ReplicaAnswer{{{1, 0, 3}, {0, 3, 8}}}}));
  ASSERT_EQ(plan.segments.size(), 2u);
  EXPECT_EQ(plan.segments[0].from.process, 0);
  EXPECT_EQ(plan.segments[0].box, (Box{{3, 0}, {5, 8}}));
  EXPECT_EQ(plan.segments[0].to.offset, 24);
  EXPECT_EQ(plan.segments[1].from.process, 1);
  EXPECT_EQ(plan.segments[1].box, (Box{{0, 0}, {3, 8}}));
}

TEST(PlanTest, CoalescesSegmentsThatContinueEachOther) {
  // The trainer holds rows [0, 4) and [4, 8) as two pieces back to back in one buffer.
  LayoutBuilder b(Role::kTrainer);
  const int32_t w = b.AddParam("w", DType::kFloat32, {8, 8});
  b.AddProcess("n");
  const uint64_t buffer = b.AddBuffer(0, 256);
  b.AddPackedPiece(w, 0, buffer, SplitBox({8, 8}, 0, 2, 0), 0);
  b.AddPackedPiece(w, 0, buffer, SplitBox({8, 8}, 0, 2, 1), 32);
  absl::StatusOr<Job> job = Job::Create(std::move(b).Build(), Split(Role::kRollout, 0, 1));
  ASSERT_TRUE(job.ok()) << job.status();
  const Plan merged = MustPlan(*job, *MakeFirstHolderPolicy());
  ASSERT_EQ(merged.segments.size(), 1u);
  EXPECT_EQ(merged.segments[0].box, WholeBox({8, 8}));
  const Plan separate =
      MustPlan(*job, *MakeFirstHolderPolicy(),
               PlanOptions{.process = std::nullopt, .coalesce = false, .relay = {}});
  EXPECT_EQ(separate.segments.size(), 2u);
  EXPECT_EQ(merged.digest, separate.digest);  // Same inputs and answers.
  EXPECT_NE(merged.segments_digest, separate.segments_digest);
}

TEST(PlanTest, OneProcessPlanIsTheFullPlanFilteredWithTheSameDigest) {
  absl::StatusOr<Job> job =
      Job::Create(Split(Role::kTrainer, 0, 3, 2), Split(Role::kRollout, 1, 2, 2));
  ASSERT_TRUE(job.ok());
  const auto policy = MakeLocalFirstLeastLoadedPolicy();
  const Plan full = MustPlan(*job, *policy);
  for (int32_t p = 0; p < job->num_processes(); ++p) {
    const Plan mine =
        MustPlan(*job, *policy, PlanOptions{.process = p, .coalesce = true, .relay = {}});
    std::vector<Segment> expected;
    for (const Segment& s : full.segments) {
      if (s.from.process == p || s.to.process == p) expected.push_back(s);
    }
    EXPECT_EQ(mine.segments, expected) << "process " << p;
    EXPECT_EQ(mine.digest, full.digest);
    EXPECT_EQ(mine.answers, full.answers);
  }
  EXPECT_THAT(
      std::string(MakePlan(*job, *policy, PlanOptions{.process = 99, .coalesce = true, .relay = {}})
                      .status()
                      .message()),
      HasSubstr("process 99 is not in the job"));
}

TEST(PlanTest, DigestIgnoresListingOrderAndSeesChanges) {
  Layout source = Split(Role::kTrainer, 0, 2, 2);
  Layout target = Split(Role::kRollout, 1, 4);
  const auto policy = MakeFirstHolderPolicy();
  const Plan base = MustPlan(*Job::Create(source, target), *policy);

  Layout reversed = source;
  std::reverse(reversed.pieces.begin(), reversed.pieces.end());
  std::reverse(reversed.buffers.begin(), reversed.buffers.end());
  const Plan same = MustPlan(*Job::Create(reversed, target), *policy);
  EXPECT_EQ(same.segments, base.segments);
  EXPECT_EQ(same.digest, base.digest);

  Layout moved = target;
  moved.buffers[0].bytes += 4;
  EXPECT_NE(MustPlan(*Job::Create(source, moved), *policy).digest, base.digest);
  EXPECT_NE(MustPlan(*Job::Create(source, target), *MakeLocalFirstLeastLoadedPolicy()).digest,
            base.digest);
}

TEST(PlanTest, ProveExactCatchesMissingDuplicatedAndMisplacedSegments) {
  absl::StatusOr<Job> job = Job::Create(Split(Role::kTrainer, 0, 2), Split(Role::kRollout, 1, 4));
  ASSERT_TRUE(job.ok());
  const Plan plan = MustPlan(*job, *MakeFirstHolderPolicy());
  ASSERT_TRUE(ProveExact(*job, plan.segments).ok());

  std::vector<Segment> missing(plan.segments.begin() + 1, plan.segments.end());
  EXPECT_THAT(std::string(ProveExact(*job, missing).message()), HasSubstr("receives 8"));

  std::vector<Segment> duplicated = plan.segments;
  duplicated.push_back(plan.segments[3]);
  EXPECT_FALSE(ProveExact(*job, duplicated).ok());

  std::vector<Segment> misplaced = plan.segments;
  misplaced[0].to.offset += 1;
  EXPECT_THAT(std::string(ProveExact(*job, misplaced).message()),
              HasSubstr("elements outside every target piece"));

  std::vector<Segment> wrong_source = plan.segments;
  wrong_source[0].from.process = 1;  // Process 1 does not hold rows [0, 4).
  EXPECT_THAT(std::string(ProveExact(*job, wrong_source).message()),
              HasSubstr("elements from no source piece holding them"));
}

}  // namespace
}  // namespace wsync
