#include "planner/builders.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "planner/geometry.h"
#include "planner/layout.h"

namespace wsync {
namespace {

Box MakeBox(Dims origin, Dims extent) { return Box{std::move(origin), std::move(extent)}; }

TEST(SplitRangeTest, EvenSplit) {
  for (int32_t i = 0; i < 4; ++i) {
    const Range range = SplitRange(12, 4, i);
    EXPECT_EQ(range.begin, 3 * i);
    EXPECT_EQ(range.size, 3);
  }
}

TEST(SplitRangeTest, UnevenSplitGivesTheFirstPartsOneMore) {
  const std::vector<std::pair<int64_t, int64_t>> expected = {{0, 3}, {3, 3}, {6, 2}, {8, 2}};
  for (int32_t i = 0; i < 4; ++i) {
    const Range range = SplitRange(10, 4, i);
    EXPECT_EQ(range.begin, expected[i].first) << i;
    EXPECT_EQ(range.size, expected[i].second) << i;
  }
}

TEST(SplitRangeTest, MorePartsThanElements) {
  const std::vector<std::pair<int64_t, int64_t>> expected = {
      {0, 1}, {1, 1}, {2, 1}, {3, 0}, {3, 0}};
  for (int32_t i = 0; i < 5; ++i) {
    const Range range = SplitRange(3, 5, i);
    EXPECT_EQ(range.begin, expected[i].first) << i;
    EXPECT_EQ(range.size, expected[i].second) << i;
  }
}

TEST(SplitRangeTest, PartsTileTheExtent) {
  for (int64_t extent : {0, 1, 7, 64, 1001}) {
    for (int32_t parts : {1, 2, 3, 8, 13}) {
      int64_t next = 0;
      for (int32_t i = 0; i < parts; ++i) {
        const Range range = SplitRange(extent, parts, i);
        EXPECT_EQ(range.begin, next);
        EXPECT_GE(range.size, extent / parts);
        EXPECT_LE(range.size, extent / parts + 1);
        next += range.size;
      }
      EXPECT_EQ(next, extent);
    }
  }
}

TEST(SplitBoxTest, CutsOneAxis) {
  EXPECT_EQ(SplitBox({10, 6, 4}, 1, 4, 3), MakeBox({0, 5, 0}, {10, 1, 4}));
  EXPECT_EQ(SplitBox({10, 6}, 0, 3, 0), MakeBox({0, 0}, {4, 6}));
}

TEST(FlatRangeBoxesTest, TwoDimensionalPartialFullPartial) {
  // Shape [4, 5]; elements [3, 17): row 0 columns 3..4, rows 1..2, row 3 columns 0..1.
  const std::vector<FlatBox> boxes = FlatRangeBoxes({4, 5}, 3, 17);
  ASSERT_EQ(boxes.size(), 3u);
  EXPECT_EQ(boxes[0].box, MakeBox({0, 3}, {1, 2}));
  EXPECT_EQ(boxes[0].flat_offset, 0);
  EXPECT_EQ(boxes[1].box, MakeBox({1, 0}, {2, 5}));
  EXPECT_EQ(boxes[1].flat_offset, 2);
  EXPECT_EQ(boxes[2].box, MakeBox({3, 0}, {1, 2}));
  EXPECT_EQ(boxes[2].flat_offset, 12);
}

TEST(FlatRangeBoxesTest, WholeTensorIsOneBox) {
  const std::vector<FlatBox> boxes = FlatRangeBoxes({3, 4, 5}, 0, 60);
  ASSERT_EQ(boxes.size(), 1u);
  EXPECT_EQ(boxes[0].box, MakeBox({0, 0, 0}, {3, 4, 5}));
  EXPECT_EQ(boxes[0].flat_offset, 0);
}

TEST(FlatRangeBoxesTest, EmptyRangeAndScalar) {
  EXPECT_TRUE(FlatRangeBoxes({4, 5}, 7, 7).empty());
  EXPECT_TRUE(FlatRangeBoxes({0, 5}, 0, 0).empty());
  const std::vector<FlatBox> scalar = FlatRangeBoxes({}, 0, 1);
  ASSERT_EQ(scalar.size(), 1u);
  EXPECT_EQ(scalar[0].box.rank(), 0);
  EXPECT_EQ(scalar[0].flat_offset, 0);
}

// Checks FlatRangeBoxes(shape, begin, end) by enumerating every element of every box.
void CheckAgainstEnumeration(const Dims& shape, int64_t begin, int64_t end) {
  SCOPED_TRACE(::testing::Message()
               << "shape " << DimsToString(shape) << " range [" << begin << ", " << end << ")");
  const int rank = static_cast<int>(shape.size());
  const Dims strides = RowMajorStrides(shape);
  const std::vector<FlatBox> boxes = FlatRangeBoxes(shape, begin, end);
  EXPECT_LE(static_cast<int>(boxes.size()), std::max(2 * rank - 1, 1));
  std::vector<int> hits(end - begin, 0);
  int64_t next = 0;  // Boxes come in flat order, each starting where the previous one ended.
  for (const FlatBox& flat : boxes) {
    EXPECT_EQ(flat.flat_offset, next);
    next += Volume(flat.box);
    ASSERT_EQ(flat.box.rank(), rank);
    ASSERT_GT(Volume(flat.box), 0);
    for (int a = 0; a < rank; ++a) {
      ASSERT_GE(flat.box.origin[a], 0);
      ASSERT_LE(flat.box.origin[a] + flat.box.extent[a], shape[a]);
    }
    // Walk the box's elements in row-major order.
    Dims index = flat.box.origin;
    for (int64_t n = 0; n < Volume(flat.box); ++n) {
      int64_t linear = 0;
      int64_t local = 0;
      for (int a = 0; a < rank; ++a) {
        linear += index[a] * strides[a];
        local += (index[a] - flat.box.origin[a]) * strides[a];
      }
      ASSERT_GE(linear, begin);
      ASSERT_LT(linear, end);
      // The piece's affine map (offset flat_offset, strides of the shape) lands on the element's
      // position in the flat range.
      EXPECT_EQ(flat.flat_offset + local, linear - begin);
      ++hits[linear - begin];
      for (int a = rank - 1; a >= 0; --a) {
        if (++index[a] < flat.box.origin[a] + flat.box.extent[a]) break;
        index[a] = flat.box.origin[a];
      }
    }
  }
  for (int64_t i = 0; i < end - begin; ++i) {
    ASSERT_EQ(hits[i], 1) << "element " << begin + i;
  }
}

TEST(FlatRangeBoxesTest, MatchesEnumerationOnRandomShapes) {
  std::mt19937_64 rng(20240611);
  for (int trial = 0; trial < 3000; ++trial) {
    const int rank = 1 + static_cast<int>(rng() % 5);
    Dims shape;
    for (int a = 0; a < rank; ++a) shape.push_back(1 + static_cast<int64_t>(rng() % 5));
    const int64_t numel = Volume(shape);
    int64_t begin = static_cast<int64_t>(rng() % (numel + 1));
    int64_t end = static_cast<int64_t>(rng() % (numel + 1));
    if (begin > end) std::swap(begin, end);
    CheckAgainstEnumeration(shape, begin, end);
  }
}

TEST(FlatRangeBoxesTest, MatchesEnumerationOnAllRangesOfSmallShapes) {
  for (const Dims& shape : {Dims{7}, Dims{3, 4}, Dims{2, 3, 4}, Dims{2, 1, 3, 2}, Dims{1, 1, 5}}) {
    const int64_t numel = Volume(shape);
    for (int64_t begin = 0; begin <= numel; ++begin) {
      for (int64_t end = begin; end <= numel; ++end) CheckAgainstEnumeration(shape, begin, end);
    }
  }
}

TEST(FlatRangeBoxesTest, ReachesTheBoundOfTwoRankMinusOne) {
  // [1, 62) of [4, 4, 4]: partial row, partial plane, one full plane... down to one element.
  EXPECT_EQ(FlatRangeBoxes({4, 4, 4}, 1, 62).size(), 5u);
}

TEST(LayoutBuilderTest, NumbersProcessesAndBuffersPerProcess) {
  LayoutBuilder builder(Role::kRollout);
  EXPECT_EQ(builder.AddProcess("a"), 0);
  EXPECT_EQ(builder.AddProcess("b"), 1);
  EXPECT_EQ(builder.AddBuffer(0, 10), 0u);
  EXPECT_EQ(builder.AddBuffer(1, 20, MemoryKind::kCuda), 0u);
  EXPECT_EQ(builder.AddBuffer(0, 30), 1u);
  const Layout layout = std::move(builder).Build();
  EXPECT_EQ(layout.role, Role::kRollout);
  ASSERT_EQ(layout.processes.size(), 2u);
  EXPECT_EQ(layout.processes[1].rank, 1);
  EXPECT_EQ(layout.processes[1].node_id, "b");
  ASSERT_EQ(layout.buffers.size(), 3u);
  EXPECT_EQ(layout.buffers[1].process, 1);
  EXPECT_EQ(layout.buffers[1].kind, MemoryKind::kCuda);
  EXPECT_EQ(layout.buffers[2].id, 1u);
  EXPECT_EQ(layout.buffers[2].bytes, 30);
}

TEST(LayoutBuilderTest, AddParamFindsExistingNames) {
  LayoutBuilder builder(Role::kTrainer);
  EXPECT_EQ(builder.AddParam("w", DType::kBFloat16, {4, 4}), 0);
  EXPECT_EQ(builder.AddParam("b", DType::kFloat32, {4}), 1);
  EXPECT_EQ(builder.AddParam("w", DType::kBFloat16, {4, 4}), 0);
  builder.mutable_layout().params.push_back(ParamInfo{"direct", DType::kInt8, {2}, ParamQuant{}, 0});
  EXPECT_EQ(builder.AddParam("direct", DType::kInt8, {2}), 2);
  EXPECT_EQ(builder.AddParam("c", DType::kInt8, {2}), 3);
  EXPECT_EQ(builder.layout().params.size(), 4u);
  EXPECT_EQ(builder.layout().params[1].dtype, DType::kFloat32);
}

TEST(LayoutBuilderTest, PackedPieceUsesRowMajorStridesOfTheBox) {
  LayoutBuilder builder(Role::kTrainer);
  builder.AddProcess("n");
  const int32_t w = builder.AddParam("w", DType::kBFloat16, {8, 6});
  const uint64_t buffer = builder.AddBuffer(0, 1000);
  EXPECT_EQ(builder.AddPackedPiece(w, 0, buffer, MakeBox({2, 1}, {3, 4}), 17), 12);
  const Piece& piece = builder.layout().pieces.at(0);
  EXPECT_EQ(piece.offset, 17);
  EXPECT_EQ(piece.strides, (Dims{4, 1}));
  EXPECT_EQ(piece.box, MakeBox({2, 1}, {3, 4}));
}

TEST(LayoutBuilderTest, FusedQkvPiecesStackAlongAxisZero) {
  // q rows [0, 8), k rows [2, 4), v rows [2, 4) of [*, 4] tensors fused into a [12, 4] tensor.
  LayoutBuilder builder(Role::kRollout);
  builder.AddProcess("n");
  const int32_t q = builder.AddParam("q", DType::kBFloat16, {8, 4});
  const int32_t k = builder.AddParam("k", DType::kBFloat16, {4, 4});
  const int32_t v = builder.AddParam("v", DType::kBFloat16, {4, 4});
  const uint64_t buffer = builder.AddBuffer(0, 2 * (100 + 48));
  const int64_t elements = builder.AddFusedPieces(
      {{q, MakeBox({0, 0}, {8, 4})}, {k, MakeBox({2, 0}, {2, 4})}, {v, MakeBox({2, 0}, {2, 4})}}, 0,
      0, buffer, 100);
  EXPECT_EQ(elements, 48);
  const std::vector<Piece>& pieces = builder.layout().pieces;
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].param, q);
  EXPECT_EQ(pieces[0].offset, 100);
  EXPECT_EQ(pieces[1].param, k);
  EXPECT_EQ(pieces[1].box, MakeBox({2, 0}, {2, 4}));
  EXPECT_EQ(pieces[1].offset, 100 + 8 * 4);
  EXPECT_EQ(pieces[2].param, v);
  EXPECT_EQ(pieces[2].offset, 100 + 10 * 4);
  for (const Piece& piece : pieces) EXPECT_EQ(piece.strides, (Dims{4, 1}));
}

TEST(LayoutBuilderTest, FusedW13PiecesInterleaveAlongAxisOne) {
  // gate and up experts [2, 3, 5] fused into w13 [2, 6, 5]: per expert, 3 gate rows then 3 up rows.
  LayoutBuilder builder(Role::kRollout);
  builder.AddProcess("n");
  const int32_t gate = builder.AddParam("gate", DType::kBFloat16, {4, 3, 5});
  const int32_t up = builder.AddParam("up", DType::kBFloat16, {4, 3, 5});
  const uint64_t buffer = builder.AddBuffer(0, 2 * 60);
  const Box experts = MakeBox({2, 0, 0}, {2, 3, 5});
  EXPECT_EQ(builder.AddFusedPieces({{gate, experts}, {up, experts}}, 1, 0, buffer, 0), 60);
  const std::vector<Piece>& pieces = builder.layout().pieces;
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0].offset, 0);
  EXPECT_EQ(pieces[1].offset, 15);
  EXPECT_EQ(pieces[0].strides, (Dims{30, 5, 1}));
  EXPECT_EQ(pieces[1].strides, (Dims{30, 5, 1}));
  // Up's element (expert 3, row 1, column 2) sits after expert 2's 30 elements and 3 gate rows.
  EXPECT_EQ(AddressOf(pieces[1].box, pieces[1].offset, pieces[1].strides, {3, 1, 2}),
            30 + 15 + 5 + 2);
}

TEST(LayoutBuilderTest, FlatRangePiecesFollowFlatRangeBoxes) {
  // [2, 11) of a [3, 4] tensor at element 100: row 0 columns 2..3, row 1, row 2 columns 0..2.
  LayoutBuilder builder(Role::kTrainer);
  builder.AddProcess("n");
  const int32_t w = builder.AddParam("w", DType::kBFloat16, {3, 4});
  const uint64_t buffer = builder.AddBuffer(0, 2 * 109);
  builder.AddFlatRange(w, 0, buffer, 2, 11, 100);
  const std::vector<Piece>& pieces = builder.layout().pieces;
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].box, MakeBox({0, 2}, {1, 2}));
  EXPECT_EQ(pieces[0].offset, 100);
  EXPECT_EQ(pieces[1].box, MakeBox({1, 0}, {1, 4}));
  EXPECT_EQ(pieces[1].offset, 102);
  EXPECT_EQ(pieces[2].box, MakeBox({2, 0}, {1, 3}));
  EXPECT_EQ(pieces[2].offset, 106);
  for (const Piece& piece : pieces) {
    EXPECT_EQ(piece.strides, (Dims{4, 1}));
    EXPECT_EQ(piece.param, w);
    EXPECT_EQ(piece.buffer, buffer);
  }
}

}  // namespace
}  // namespace wsync
