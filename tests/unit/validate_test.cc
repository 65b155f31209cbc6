#include "planner/validate.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/builders.h"
#include "planner/job.h"

namespace wsync {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

MATCHER_P(RefusedWith, substring, "") {
  if (arg.ok()) {
    *result_listener << "was OK";
    return false;
  }
  return ::testing::ExplainMatchResult(HasSubstr(substring), std::string(arg.message()),
                                       result_listener);
}

// "w" [8, 8] fp32 split by rows over `processes` processes, one packed buffer each.
Layout RowSplit(Role role, int processes, int64_t buffer_slack = 0) {
  LayoutBuilder b(role);
  const int32_t w = b.AddParam("w", DType::kFloat32, {8, 8});
  for (int p = 0; p < processes; ++p) {
    b.AddProcess("node0");
    const Box box = SplitBox({8, 8}, 0, processes, p);
    const uint64_t buffer = b.AddBuffer(p, (Volume(box) + buffer_slack) * 4);
    b.AddPackedPiece(w, p, buffer, box, 0);
  }
  return std::move(b).Build();
}

TEST(ValidateTest, AcceptsValidLayouts) {
  EXPECT_TRUE(ValidateLayout(RowSplit(Role::kTrainer, 2)).ok());
  EXPECT_TRUE(ValidatePair(RowSplit(Role::kTrainer, 2), RowSplit(Role::kRollout, 3)).ok());
}

TEST(ValidateTest, RefusesPieceOutsideParameter) {
  Layout layout = RowSplit(Role::kTrainer, 2);
  layout.pieces[1].box.origin[0] = 5;  // rows 5..9 of an 8-row parameter
  EXPECT_THAT(ValidateLayout(layout),
              RefusedWith("parameter 'w' piece on trainer process 1 buffer 0 box [5:9, 0:8): lies "
                          "outside the parameter's shape (8, 8) on axis 0"));
}

TEST(ValidateTest, RefusesPieceOutsideBuffer) {
  Layout layout = RowSplit(Role::kTrainer, 2);
  layout.pieces[0].offset = 1;
  EXPECT_THAT(ValidateLayout(layout),
              AllOf(RefusedWith("process 0"), RefusedWith("reach past the buffer's 128 bytes")));
}

TEST(ValidateTest, RefusesInt64Overflow) {
  Layout layout = RowSplit(Role::kTrainer, 2);
  layout.pieces[0].strides = {int64_t{1} << 62, 1};  // 3 * 2^62 does not fit.
  EXPECT_THAT(ValidateLayout(layout), RefusedWith("overflows int64"));
  layout = RowSplit(Role::kTrainer, 2);
  layout.pieces[0].offset = INT64_MAX - 3;
  EXPECT_THAT(ValidateLayout(layout), RefusedWith("overflows int64"));
  layout = RowSplit(Role::kTrainer, 2);
  layout.pieces[0].offset = (int64_t{1} << 62);  // In int64, but bytes = 4x overflow.
  EXPECT_THAT(ValidateLayout(layout), RefusedWith("reach past the buffer"));
}

TEST(ValidateTest, RefusesAliasingStrides) {
  Layout layout = RowSplit(Role::kTrainer, 2);
  layout.pieces[0].strides = {4, 1};  // Row r+1 starts inside row r.
  EXPECT_THAT(ValidateLayout(layout), RefusedWith("map two elements to one address"));
}

TEST(ValidateTest, RefusesOverlappingPiecesInOneBuffer) {
  LayoutBuilder b(Role::kRollout);
  const int32_t q = b.AddParam("q", DType::kBFloat16, {4, 4});
  const int32_t k = b.AddParam("k", DType::kBFloat16, {4, 4});
  b.AddProcess("n");
  const uint64_t buffer = b.AddBuffer(0, 64);
  b.AddPackedPiece(q, 0, buffer, WholeBox({4, 4}), 0);
  b.AddPackedPiece(k, 0, buffer, WholeBox({4, 4}), 15);  // Shares element 15 with q.
  EXPECT_THAT(ValidateLayout(b.layout()),
              AllOf(RefusedWith("parameter 'k'"), RefusedWith("overlaps parameter 'q'")));
}

TEST(ValidateTest, AcceptsInterleavedFusedPiecesAndRefusesShiftedOnes) {
  // gate | up along axis 1 of a [E, 2I, H] buffer: strided pieces that interleave without overlap.
  LayoutBuilder b(Role::kRollout);
  const int32_t gate = b.AddParam("gate", DType::kBFloat16, {3, 2, 4});
  const int32_t up = b.AddParam("up", DType::kBFloat16, {3, 2, 4});
  b.AddProcess("n");
  const uint64_t buffer = b.AddBuffer(0, 3 * 4 * 4 * 2);
  b.AddFusedPieces({{gate, WholeBox({3, 2, 4})}, {up, WholeBox({3, 2, 4})}}, 1, 0, buffer, 0);
  EXPECT_TRUE(ValidateLayout(b.layout()).ok());
  Layout shifted = b.layout();
  shifted.pieces[1].offset -= 1;
  EXPECT_THAT(ValidateLayout(shifted), RefusedWith("overlaps"));
}

TEST(ValidateTest, AllowsDifferentDtypesSideBySideInOneBuffer) {
  LayoutBuilder b(Role::kTrainer);
  const int32_t a = b.AddParam("a", DType::kFloat32, {4});
  const int32_t c = b.AddParam("c", DType::kBFloat16, {4});
  b.AddProcess("n");
  const uint64_t buffer = b.AddBuffer(0, 24);
  b.AddPackedPiece(a, 0, buffer, WholeBox({4}), 0);  // bytes [0, 16)
  b.AddPackedPiece(c, 0, buffer, WholeBox({4}), 8);  // bytes [16, 24)
  EXPECT_TRUE(ValidateLayout(b.layout()).ok());
  b.mutable_layout().pieces[1].offset = 7;  // bytes [14, 22): overlaps a
  EXPECT_THAT(ValidateLayout(b.layout()), RefusedWith("overlaps"));
}

TEST(ValidateTest, RefusesUncoveredParameter) {
  Layout source = RowSplit(Role::kTrainer, 2);
  source.pieces.pop_back();  // Rows 4..8 have no holder.
  EXPECT_THAT(ValidatePair(source, RowSplit(Role::kRollout, 2)),
              AllOf(RefusedWith("parameter 'w'"), RefusedWith("covers 32 of its 64 elements"),
                    RefusedWith("box [4:8, 0:8) has no holder")));
  EXPECT_EQ(ValidatePair(source, RowSplit(Role::kRollout, 2)).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ValidateTest, RefusesUnequalOverlappingHolders) {
  Layout source = RowSplit(Role::kTrainer, 2);
  source.pieces[1].box.origin[0] = 3;  // rows 3..7 overlap rows 0..4 of process 0
  source.pieces[1].box.extent[0] = 4;
  EXPECT_THAT(ValidateLayout(source), AllOf(RefusedWith("overlaps but differs from"),
                                            RefusedWith("process 1"), RefusedWith("[3:7, 0:8)")));
}

TEST(ValidateTest, RefusesDtypeAndShapeDifferences) {
  Layout target = RowSplit(Role::kRollout, 2);
  target.params[0].dtype = DType::kBFloat16;
  EXPECT_THAT(ValidatePair(RowSplit(Role::kTrainer, 2), target),
              RefusedWith("parameter 'w' is fp32(8, 8) in the trainer layout but bf16(8, 8)"));
  target = RowSplit(Role::kRollout, 2);
  target.params[0].shape = {8, 9};
  EXPECT_THAT(ValidatePair(RowSplit(Role::kTrainer, 2), target),
              RefusedWith("is fp32(8, 8) in the trainer layout but fp32(8, 9) in the rollout"));
}

TEST(ValidateTest, RefusesDuplicateAndUnknownNames) {
  Layout layout = RowSplit(Role::kTrainer, 1);
  layout.params.push_back(layout.params[0]);
  EXPECT_THAT(ValidateLayout(layout), RefusedWith("trainer parameter 'w' is declared twice"));

  Layout target = RowSplit(Role::kRollout, 1);
  target.params[0].name = "v";
  EXPECT_THAT(
      ValidatePair(RowSplit(Role::kTrainer, 1), target),
      RefusedWith("parameter 'v' is declared by the rollout layout but not by the trainer"));

  Layout source = RowSplit(Role::kTrainer, 1);
  source.params.push_back(ParamInfo{"extra", DType::kInt8, {2}, ParamQuant{}, 0});
  EXPECT_THAT(ValidatePair(source, RowSplit(Role::kRollout, 1)),
              RefusedWith("parameter 'extra' is declared by the trainer layout but not by the"));

  layout = RowSplit(Role::kTrainer, 1);
  layout.pieces[0].param = 3;
  EXPECT_THAT(ValidateLayout(layout), RefusedWith("unknown parameter index 3"));
}

TEST(ValidateTest, RefusesRanksOutOfRangeAndDuplicates) {
  Layout layout = RowSplit(Role::kTrainer, 2);
  layout.processes[1].rank = 2;
  EXPECT_THAT(ValidateLayout(layout), RefusedWith("trainer process rank 2 is out of range [0, 2)"));
  layout = RowSplit(Role::kTrainer, 2);
  layout.processes[1].rank = 0;
  EXPECT_THAT(ValidateLayout(layout), RefusedWith("trainer process rank 0 is duplicated"));
  layout = RowSplit(Role::kTrainer, 2);
  layout.pieces[1].process = 7;
  EXPECT_THAT(ValidateLayout(layout), RefusedWith("process is out of range [0, 2)"));
  layout = RowSplit(Role::kTrainer, 2);
  layout.buffers[1].process = -1;
  EXPECT_THAT(ValidateLayout(layout), RefusedWith("process is out of range"));
}

TEST(ValidateTest, RefusesUnknownAndDuplicateBuffers) {
  Layout layout = RowSplit(Role::kTrainer, 2);
  layout.pieces[0].buffer = 9;
  EXPECT_THAT(ValidateLayout(layout), RefusedWith("unknown buffer"));
  layout = RowSplit(Role::kTrainer, 2);
  layout.buffers.push_back(layout.buffers[0]);
  EXPECT_THAT(ValidateLayout(layout), RefusedWith("buffer 0 of process 0 is declared twice"));
}

TEST(ValidateTest, RefusesRankMismatchAndBadParameters) {
  Layout layout = RowSplit(Role::kTrainer, 2);
  layout.pieces[0].strides = {8};
  EXPECT_THAT(ValidateLayout(layout), RefusedWith("rank differs from the parameter's shape"));
  layout = RowSplit(Role::kTrainer, 2);
  layout.params[0].shape = Dims(9, 1);
  EXPECT_THAT(ValidateLayout(layout), RefusedWith("has 9 axes, more than 8"));
  layout = RowSplit(Role::kTrainer, 2);
  layout.params[0].shape = {int64_t{1} << 40, int64_t{1} << 40};
  EXPECT_THAT(ValidateLayout(layout), RefusedWith("over int64"));
  layout = RowSplit(Role::kTrainer, 2);
  layout.params[0].name = "";
  EXPECT_THAT(ValidateLayout(layout), RefusedWith("empty name"));
}

TEST(ValidateTest, JobCreateRefusesSidesInTheWrongRoles) {
  EXPECT_THAT(
      Job::Create(RowSplit(Role::kRollout, 2), RowSplit(Role::kTrainer, 2)).status(),
      RefusedWith("from a trainer layout to a rollout layout, not from rollout to trainer"));
  EXPECT_THAT(Job::Create(RowSplit(Role::kTrainer, 2), RowSplit(Role::kTrainer, 2)).status(),
              RefusedWith("not from trainer to trainer"));
}

TEST(ValidateTest, JobCreateRefusesWhatValidationRefuses) {
  Layout source = RowSplit(Role::kTrainer, 2);
  source.pieces.pop_back();
  EXPECT_THAT(Job::Create(source, RowSplit(Role::kRollout, 2)).status(),
              RefusedWith("has no holder"));
  Layout target = RowSplit(Role::kRollout, 2);
  target.pieces[0].offset = 100;
  EXPECT_THAT(Job::Create(RowSplit(Role::kTrainer, 2), target).status(),
              RefusedWith("rollout process 0"));
}

}  // namespace
}  // namespace wsync
