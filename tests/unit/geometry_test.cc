#include "planner/geometry.h"

#include <random>
#include <set>

#include "gtest/gtest.h"

namespace wsync {
namespace {

Box B(Dims origin, Dims extent) { return Box{std::move(origin), std::move(extent)}; }

TEST(BoxTest, IntersectContainsVolume) {
  const Box a = B({0, 0}, {4, 8});
  const Box b = B({2, 6}, {4, 4});
  std::optional<Box> common = Intersect(a, b);
  ASSERT_TRUE(common.has_value());
  EXPECT_EQ(*common, B({2, 6}, {2, 2}));
  EXPECT_EQ(Volume(a), 32);
  EXPECT_TRUE(Contains(a, *common));
  EXPECT_FALSE(Contains(*common, a));
  EXPECT_FALSE(Intersect(a, B({4, 0}, {1, 8})).has_value());  // Touching is not overlapping.
  EXPECT_FALSE(Overlaps(a, B({0, 8}, {4, 1})));
  EXPECT_FALSE(Intersect(a, B({0}, {4})).has_value());  // Rank mismatch.
  EXPECT_EQ(Volume(B({}, {})), 1);                      // Scalar.
  EXPECT_EQ(BoxToString(a), "[0:4, 0:8)");
}

TEST(BoxTest, CheckedVolumeRefusesOverflowAndNegative) {
  EXPECT_EQ(CheckedVolume({3, 5}), 15);
  EXPECT_FALSE(CheckedVolume({int64_t{1} << 40, int64_t{1} << 40}).has_value());
  EXPECT_FALSE(CheckedVolume({-1, 2}).has_value());
}

TEST(RegionTest, SpanAndOverflow) {
  auto span = RegionSpan({4, 8}, 10, {16, 1});
  ASSERT_TRUE(span.ok());
  ASSERT_TRUE(span->has_value());
  EXPECT_EQ((*span)->first, 10);
  EXPECT_EQ((*span)->last, 10 + 3 * 16 + 7);
  EXPECT_FALSE(RegionSpan({4, 0}, 0, {1, 1})->has_value());
  EXPECT_EQ(RegionSpan({2, 2}, -1, {2, 1}).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(RegionSpan({3}, INT64_MAX - 1, {1}).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(RegionSpan({3}, 0, {int64_t{1} << 62}).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(RegionSpan({3}, 5, {-1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(RegionSpan({1}, 5, {-1}).ok());  // Strides of extent-1 axes do not matter.
}

// Reference: enumerate addresses.
std::vector<int64_t> Addresses(const Dims& extent, int64_t offset, const Dims& strides) {
  std::vector<int64_t> out;
  if (Volume(extent) == 0) return out;
  Dims index(extent.size(), 0);
  while (true) {
    int64_t address = offset;
    for (size_t a = 0; a < extent.size(); ++a) address += index[a] * strides[a];
    out.push_back(address);
    int a = static_cast<int>(extent.size()) - 1;
    for (; a >= 0; --a) {
      if (++index[a] < extent[a]) break;
      index[a] = 0;
    }
    if (a < 0) break;
  }
  return out;
}

TEST(RegionTest, PackedInjectiveAndOverlapMatchEnumeration) {
  std::mt19937_64 rng(12345);
  int packed_count = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const int rank = 1 + rng() % 4;
    Dims extent(rank), strides(rank);
    for (int a = 0; a < rank; ++a) extent[a] = rng() % 4;  // 0..3, includes 0 and 1
    // Half the time row-major strides (maybe with a padded leading stride), else random.
    if (rng() % 2) {
      strides = RowMajorStrides(extent);
      if (rng() % 3 == 0 && rank > 1) strides[0] += rng() % 3;
    } else {
      for (int a = 0; a < rank; ++a) strides[a] = rng() % 13;
    }
    const std::vector<int64_t> addresses = Addresses(extent, 0, strides);
    const std::set<int64_t> unique(addresses.begin(), addresses.end());
    // Packed: the addresses are exactly 0..volume-1 in row-major order.
    bool reference_packed = true;
    for (size_t i = 0; i < addresses.size(); ++i) {
      if (addresses[i] != static_cast<int64_t>(i)) reference_packed = false;
    }
    EXPECT_EQ(IsPacked(extent, strides), reference_packed)
        << DimsToString(extent) << " " << DimsToString(strides);
    packed_count += reference_packed;
    // The nesting rule never accepts aliasing strides.
    if (IsInjective(extent, strides)) {
      EXPECT_EQ(unique.size(), addresses.size())
          << DimsToString(extent) << " " << DimsToString(strides);
    }
    if (reference_packed) {
      EXPECT_TRUE(IsInjective(extent, strides));
    }

    // Overlap against a second region of the same buffer.
    if (!IsInjective(extent, strides)) continue;
    Dims extent_b(rank), strides_b = strides;
    for (int a = 0; a < rank; ++a) extent_b[a] = rng() % 4;
    if (!IsInjective(extent_b, strides_b)) continue;
    const int64_t offset_b = rng() % 40;
    const std::vector<int64_t> b = Addresses(extent_b, offset_b, strides_b);
    bool reference_overlap = false;
    for (int64_t address : b) reference_overlap |= unique.count(address) > 0;
    EXPECT_EQ(RegionsOverlap(extent, 0, strides, extent_b, offset_b, strides_b), reference_overlap)
        << DimsToString(extent) << DimsToString(strides) << " vs " << DimsToString(extent_b)
        << " at " << offset_b;
  }
  EXPECT_GT(packed_count, 200);  // The generator exercised both answers.
}

TEST(RegionTest, InterleavedFusedHalvesDoNotOverlap) {
  // w13 of 48 experts: gate rows [0, I) and up rows [I, 2I) of every expert.
  const int64_t experts = 48, inter = 256, hidden = 64;
  const Dims extent = {experts, inter, hidden};
  const Dims strides = {2 * inter * hidden, hidden, 1};
  EXPECT_FALSE(RegionsOverlap(extent, 0, strides, extent, inter * hidden, strides));
  EXPECT_TRUE(RegionsOverlap(extent, 0, strides, extent, inter * hidden - 1, strides));
}

TEST(RegionTest, AddressArithmetic) {
  const Box box = B({2, 4}, {3, 5});
  EXPECT_EQ(AddressOf(box, 100, {10, 1}, {3, 6}), 100 + 10 + 2);
  EXPECT_EQ(SubRegionOffset(box, 100, {10, 1}, B({4, 5}, {1, 2})), 100 + 20 + 1);
  EXPECT_EQ(RowMajorStrides({2, 3, 4}), (Dims{12, 4, 1}));
}

}  // namespace
}  // namespace wsync
