// Overlap detection in bounded work (planner/region_overlap.h), and validation of the adversarial
// manifest of issue 26: thousands of interleaved column pieces of one parameter in one buffer.
//
// The bugs these tests catch: a sweep that misses an overlap (a rectangle map that checks only one
// neighbour, a wrap-around run placed on the wrong row, axes merged that do not continue each
// other, a class skipped in the cross-stride sweep) fails the property tests against the
// byte-by-byte reference; a return to the pairwise sweep fails the timing guard (84 s measured
// before, under 1 s now).

#include "planner/region_overlap.h"

#include <chrono>
#include <random>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/builders.h"
#include "planner/job.h"
#include "planner/manifest_codec.h"
#include "planner/plan.h"
#include "planner/policy.h"
#include "planner/validate.h"

namespace wsync {
namespace {

using ::testing::HasSubstr;

// Reference: every address of every region, enumerated.
bool BruteForceRegionOverlap(const std::vector<StridedRegion>& regions) {
  std::set<int64_t> seen;
  for (const StridedRegion& r : regions) {
    if (Volume(r.extent) == 0) continue;
    std::set<int64_t> own;
    const int64_t count = Volume(r.extent);
    for (int64_t k = 0; k < count; ++k) {
      int64_t rest = k;
      int64_t address = r.offset;
      for (int a = static_cast<int>(r.extent.size()) - 1; a >= 0; --a) {
        address += (rest % r.extent[a]) * r.strides[a];
        rest /= r.extent[a];
      }
      own.insert(address);
    }
    for (int64_t address : own) {
      if (!seen.insert(address).second) return true;
    }
  }
  return false;
}

// The pairwise check the sweep replaced.
bool PairwiseRegionOverlap(const std::vector<StridedRegion>& regions) {
  for (size_t i = 0; i < regions.size(); ++i) {
    for (size_t j = i + 1; j < regions.size(); ++j) {
      if (RegionsOverlap(regions[i].extent, regions[i].offset, regions[i].strides,
                         regions[j].extent, regions[j].offset, regions[j].strides)) {
        return true;
      }
    }
  }
  return false;
}

// A random injective region: axes of extent 1..4 nested with random gaps (the nesting rule of
// IsInjective), in random axis order, at a random offset.
StridedRegion RandomRegion(std::mt19937_64& rng, int64_t max_offset) {
  const int rank = std::uniform_int_distribution<int>(1, 3)(rng);
  std::vector<int> order(rank);
  for (int a = 0; a < rank; ++a) order[a] = a;
  std::shuffle(order.begin(), order.end(), rng);
  StridedRegion r;
  r.extent.assign(rank, 1);
  r.strides.assign(rank, 1);
  int64_t reach = 0;
  for (int k = 0; k < rank; ++k) {
    const int a = order[k];
    r.extent[a] = std::uniform_int_distribution<int64_t>(1, 4)(rng);
    // The innermost axis often has stride 1 (a run); gaps of 0..3 beyond the reach below.
    const int64_t gap = std::uniform_int_distribution<int64_t>(0, 3)(rng);
    r.strides[a] = (k == 0 && gap < 2) ? 1 : reach + 1 + gap;
    reach += (r.extent[a] - 1) * r.strides[a];
  }
  r.offset = std::uniform_int_distribution<int64_t>(0, max_offset)(rng);
  return r;
}

// Pieces of a [rows, cols] row-major matrix cut into random column and row blocks (disjoint by
// construction), each as a strided region; with probability 1/2 one piece is moved a little.
std::vector<StridedRegion> TiledRegions(std::mt19937_64& rng) {
  const int64_t rows = std::uniform_int_distribution<int64_t>(1, 6)(rng);
  const int64_t cols = std::uniform_int_distribution<int64_t>(2, 9)(rng);
  const int64_t element = std::uniform_int_distribution<int64_t>(1, 2)(rng);
  std::vector<StridedRegion> regions;
  int64_t col = 0;
  while (col < cols) {
    const int64_t width = std::uniform_int_distribution<int64_t>(1, cols - col)(rng);
    int64_t row = 0;
    while (row < rows) {
      const int64_t height = std::uniform_int_distribution<int64_t>(1, rows - row)(rng);
      regions.push_back(StridedRegion{
          {height, width, element}, {cols * element, element, 1}, (row * cols + col) * element});
      row += height;
    }
    col += width;
  }
  if (rng() % 2 == 0) {
    StridedRegion& moved = regions[rng() % regions.size()];
    moved.offset =
        std::max<int64_t>(0, moved.offset + std::uniform_int_distribution<int64_t>(-3, 3)(rng));
  }
  std::shuffle(regions.begin(), regions.end(), rng);
  return regions;
}

TEST(RegionOverlapTest, MatchesBruteForceOnRandomRegions) {
  std::mt19937_64 rng(26);
  int overlapping = 0;
  int disjoint = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    std::vector<StridedRegion> regions;
    if (trial % 2 == 0) {
      const int n = std::uniform_int_distribution<int>(2, 5)(rng);
      for (int i = 0; i < n; ++i) regions.push_back(RandomRegion(rng, 60));
    } else {
      regions = TiledRegions(rng);
    }
    const bool expected = BruteForceRegionOverlap(regions);
    ASSERT_EQ(expected, PairwiseRegionOverlap(regions)) << "trial " << trial;
    const OverlapResult result = FindRegionOverlap(regions);
    ASSERT_FALSE(result.too_complex) << "trial " << trial;
    ASSERT_EQ(result.overlap, expected) << "trial " << trial;
    if (result.overlap) {
      ++overlapping;
      // The pair named really overlaps.
      const StridedRegion& a = regions[result.first];
      const StridedRegion& b = regions[result.second];
      ASSERT_LT(result.first, result.second);
      ASSERT_TRUE(RegionsOverlap(a.extent, a.offset, a.strides, b.extent, b.offset, b.strides))
          << "trial " << trial;
    } else {
      ++disjoint;
    }
  }
  // Both outcomes are exercised often.
  EXPECT_GT(overlapping, 2000);
  EXPECT_GT(disjoint, 2000);
}

bool BruteForceBoxOverlap(const std::vector<Box>& boxes) {
  for (size_t i = 0; i < boxes.size(); ++i) {
    for (size_t j = i + 1; j < boxes.size(); ++j) {
      if (Overlaps(boxes[i], boxes[j])) return true;
    }
  }
  return false;
}

TEST(RegionOverlapTest, BoxesMatchBruteForce) {
  std::mt19937_64 rng(27);
  int overlapping = 0;
  int disjoint = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    const int rank = 1 + trial % 4;
    const int n = std::uniform_int_distribution<int>(2, 7)(rng);
    std::set<Box> distinct;
    for (int i = 0; i < n; ++i) {
      Box box;
      for (int a = 0; a < rank; ++a) {
        box.origin.push_back(std::uniform_int_distribution<int64_t>(0, 5)(rng));
        box.extent.push_back(std::uniform_int_distribution<int64_t>(1, 3)(rng));
      }
      distinct.insert(box);
    }
    std::vector<Box> boxes(distinct.begin(), distinct.end());
    std::shuffle(boxes.begin(), boxes.end(), rng);
    const bool expected = BruteForceBoxOverlap(boxes);
    const OverlapResult result = FindBoxOverlap(boxes);
    ASSERT_FALSE(result.too_complex);
    ASSERT_EQ(result.overlap, expected) << "trial " << trial << " rank " << rank;
    if (result.overlap) {
      ++overlapping;
      ASSERT_TRUE(Overlaps(boxes[result.first], boxes[result.second]));
    } else {
      ++disjoint;
    }
  }
  EXPECT_GT(overlapping, 2000);
  EXPECT_GT(disjoint, 2000);
}

TEST(RegionOverlapTest, GivesUpBeyondTheBudgetInsteadOfAccepting) {
  // Two columns of different row strides that interleave over many rows: the pair check splits
  // row by row. With a tiny budget the answer is "too complex", never "disjoint".
  std::vector<StridedRegion> regions = {
      StridedRegion{{1 << 20, 1}, {1000, 1}, 0},
      StridedRegion{{1 << 20, 1}, {1001, 1}, 500},
  };
  const OverlapResult small = FindRegionOverlap(regions, /*budget=*/64);
  EXPECT_TRUE(small.too_complex);
  EXPECT_FALSE(small.overlap);
}

// The adversarial manifest of issue 26: one [rows, columns] fp32 parameter held by one trainer
// process as `columns` single-column pieces of one row-major buffer. Every pair of pieces shares an
// address span, and the pairwise check of a pair cost a step per row.
Layout InterleavedColumns(Role role, int64_t rows, int64_t columns) {
  LayoutBuilder b(role);
  const int32_t w = b.AddParam("w", DType::kFloat32, {rows, columns});
  b.AddProcess("node0");
  const uint64_t buffer = b.AddBuffer(0, rows * columns * 4);
  for (int64_t c = 0; c < columns; ++c) {
    b.AddPiece(w, 0, buffer, Box{{0, c}, {rows, 1}}, c, {columns, 1});
  }
  return std::move(b).Build();
}

double SecondsOf(const std::function<void()>& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The guard against a return to quadratic work: the issue asks for under 1 s. Sanitizer builds run
// several times slower, so the bound there is wider; the plain build's figure is the claim.
#if defined(WSYNC_SANITIZED)  // cmake/WsyncSanitizers.cmake
constexpr double kBoundSeconds = 5.0;
#else
constexpr double kBoundSeconds = 1.0;
#endif

TEST(RegionOverlapTest, InterleavedColumnManifestValidatesInUnderOneSecond) {
  const Layout layout = InterleavedColumns(Role::kTrainer, 1 << 16, 4096);
  const std::string wire = SerializeLayout(layout);
  EXPECT_LT(wire.size(), 200u * 1024) << "a manifest of a few tens of KB per thousand pieces";
  absl::Status status;
  const double seconds = SecondsOf([&] { status = ValidateLayout(layout); });
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_LT(seconds, kBoundSeconds) << wire.size() << " bytes of manifest";
  std::printf("%zu pieces, %zu bytes of manifest: validated in %.3f s\n", layout.pieces.size(),
              wire.size(), seconds);

  // The same with one column moved onto its neighbour: refused, naming both pieces.
  Layout bad = layout;
  bad.pieces[2000].offset = 2001;
  bad.pieces[2000].box.origin[1] = 2000;
  const double bad_seconds = SecondsOf([&] { status = ValidateLayout(bad); });
  EXPECT_THAT(std::string(status.message()), HasSubstr("in the same buffer"));
  EXPECT_LT(bad_seconds, kBoundSeconds);
}

TEST(RegionOverlapTest, InterleavedColumnJobPlansInUnderOneSecond) {
  // The whole connect-time pipeline: both layouts validated, the job planned and proven exact.
  Layout source = InterleavedColumns(Role::kTrainer, 1 << 12, 2048);
  LayoutBuilder b(Role::kRollout);
  const int32_t w = b.AddParam("w", DType::kFloat32, {1 << 12, 2048});
  b.AddProcess("node1");
  const uint64_t buffer = b.AddBuffer(0, (int64_t{1} << 12) * 2048 * 4);
  for (int64_t c = 0; c < 2048; c += 2) {
    b.AddPiece(w, 0, buffer, Box{{0, c}, {1 << 12, 2}}, c, {2048, 1});
  }
  Layout target = std::move(b).Build();
  absl::Status status;
  const double seconds = SecondsOf([&] {
    absl::StatusOr<Job> job = Job::Create(std::move(source), std::move(target));
    if (!job.ok()) {
      status = job.status();
      return;
    }
    absl::StatusOr<Plan> plan = MakePlan(*job, *MakeFirstHolderPolicy());
    status = plan.status();
  });
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_LT(seconds, 4 * kBoundSeconds);
  std::printf("interleaved job planned in %.3f s\n", seconds);
}

TEST(RegionOverlapTest, ManyDistinctHolderBoxesValidateQuickly) {
  // Holders of one parameter: 20000 column boxes on 20000 processes' worth of replicas would be a
  // big layout; the holder check alone on 100000 column boxes.
  std::vector<Box> boxes;
  for (int64_t c = 0; c < 100000; ++c) boxes.push_back(Box{{0, c}, {1000, 1}});
  OverlapResult result;
  const double seconds = SecondsOf([&] { result = FindBoxOverlap(boxes); });
  EXPECT_FALSE(result.overlap);
  EXPECT_FALSE(result.too_complex);
  EXPECT_LT(seconds, kBoundSeconds);
}

}  // namespace
}  // namespace wsync
