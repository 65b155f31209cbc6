#include "executor/copy.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "planner/geometry.h"

namespace wsync {
namespace {

using Bytes = std::vector<uint8_t>;

// Bytes left around every buffer the copies write; they must come out unchanged.
constexpr int64_t kGuard = 64;

// Row-major strides computed independently of the code under test.
Dims NaiveRowMajor(const Dims& shape) {
  Dims strides(shape.size(), 1);
  int64_t stride = 1;
  for (int a = static_cast<int>(shape.size()) - 1; a >= 0; --a) {
    strides[a] = stride;
    stride *= shape[a];
  }
  return strides;
}

// The reference: element by element, each multi-index decoded from a linear index by division.
void ReferenceCopy(uint8_t* dst, const Dims& dst_strides, const uint8_t* src,
                   const Dims& src_strides, const Dims& shape, int64_t element_size) {
  int64_t volume = 1;
  for (int64_t e : shape) volume *= e;
  for (int64_t linear = 0; linear < volume; ++linear) {
    int64_t rest = linear;
    int64_t dst_offset = 0;
    int64_t src_offset = 0;
    for (int a = static_cast<int>(shape.size()) - 1; a >= 0; --a) {
      const int64_t index = rest % shape[a];
      rest /= shape[a];
      dst_offset += index * dst_strides[a];
      src_offset += index * src_strides[a];
    }
    std::memcpy(dst + dst_offset * element_size, src + src_offset * element_size, element_size);
  }
}

// Index of the first byte where a and b differ, or -1 when they are equal.
int64_t FirstDifference(const Bytes& a, const Bytes& b) {
  if (a.size() != b.size()) return 0;
  auto [ia, ib] = std::mismatch(a.begin(), a.end(), b.begin());
  return ia == a.end() ? -1 : static_cast<int64_t>(ia - a.begin());
}

Bytes RandomBytes(int64_t size, std::mt19937_64& rng) {
  Bytes bytes(size);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  return bytes;
}

// Where a region lives inside a buffer: element strides, the element offset of its origin, and
// the buffer's size in elements.
struct Layout {
  std::string kind;
  Dims strides;
  int64_t offset = 0;
  int64_t elements = 0;
};

enum class Kind { kRowMajor, kPadded, kPermuted, kFused };

// A region of `shape` placed in a larger row-major buffer. kRowMajor: the buffer is the region.
// kPadded: every axis of the buffer is up to 3 longer and the region sits at a random origin.
// kPermuted: the buffer stores the axes in a random order (a transpose), sometimes padded.
// kFused: one axis of the buffer is twice as long and the region is its first or second half, like
// the gate or up half w13 [E, I, H] of a fused [E, 2I, H] expert tensor.
Layout MakeLayout(Kind kind, const Dims& shape, std::mt19937_64& rng) {
  const int rank = static_cast<int>(shape.size());
  Dims buffer = shape;
  Dims origin(rank, 0);
  std::vector<int> order(rank);
  std::iota(order.begin(), order.end(), 0);
  Layout layout;
  auto pad = [&] {
    for (int a = 0; a < rank; ++a) {
      buffer[a] += std::uniform_int_distribution<int64_t>(0, 3)(rng);
      origin[a] = std::uniform_int_distribution<int64_t>(0, buffer[a] - shape[a])(rng);
    }
  };
  switch (kind) {
    case Kind::kRowMajor:
      layout.kind = "row-major";
      break;
    case Kind::kPadded:
      layout.kind = "padded";
      pad();
      break;
    case Kind::kPermuted:
      layout.kind = "permuted";
      std::shuffle(order.begin(), order.end(), rng);
      if (rng() % 2 == 0) pad();
      break;
    case Kind::kFused:
      layout.kind = "fused";
      if (rank > 0) {
        const int axis = static_cast<int>(rng() % rank);
        buffer[axis] = 2 * shape[axis];
        origin[axis] = rng() % 2 == 0 ? 0 : shape[axis];
      }
      break;
  }
  layout.strides.assign(rank, 1);
  int64_t stride = 1;
  for (int k = rank - 1; k >= 0; --k) {
    layout.strides[order[k]] = stride;
    stride *= buffer[order[k]];
  }
  layout.elements = stride;
  for (int a = 0; a < rank; ++a) layout.offset += origin[a] * layout.strides[a];
  return layout;
}

std::string Describe(const Dims& shape, int64_t element_size, const Layout& src,
                     const Layout& dst) {
  auto side = [](absl::string_view name, const Layout& layout) {
    return absl::StrCat(name, " ", layout.kind, " strides ", DimsToString(layout.strides),
                        " offset ", layout.offset);
  };
  return absl::StrCat("shape ", DimsToString(shape), " element_size ", element_size, "; ",
                      side("src", src), "; ", side("dst", dst));
}

// Checks CopyStrided, PackRegion and UnpackRegion for one case against the reference: the region
// of dst equals the reference copy, every other byte of dst (guards included) keeps its pattern,
// the packed buffer is the row-major image of the region, and unpacking it reproduces the copy.
void CheckCase(const Dims& shape, int64_t element_size, const Layout& src, const Layout& dst,
               std::mt19937_64& rng) {
  SCOPED_TRACE(Describe(shape, element_size, src, dst));
  int64_t volume = 1;
  for (int64_t e : shape) volume *= e;

  const Bytes source = RandomBytes(src.elements * element_size + 2 * kGuard, rng);
  const Bytes pattern = RandomBytes(dst.elements * element_size + 2 * kGuard, rng);
  const int64_t src_at = kGuard + src.offset * element_size;
  const uint8_t* src_region = source.data() + src_at;
  const int64_t dst_region = kGuard + dst.offset * element_size;

  Bytes expected = pattern;
  ReferenceCopy(expected.data() + dst_region, dst.strides, src_region, src.strides, shape,
                element_size);

  Bytes actual = pattern;
  Bytes source_copy = source;
  CopyStrided(actual.data() + dst_region, dst.strides, source_copy.data() + src_at, src.strides,
              shape, element_size);
  ASSERT_EQ(FirstDifference(actual, expected), -1) << "CopyStrided";
  ASSERT_EQ(FirstDifference(source_copy, source), -1) << "CopyStrided wrote to its source";

  const Bytes packed_pattern = RandomBytes(volume * element_size + 2 * kGuard, rng);
  Bytes expected_packed = packed_pattern;
  ReferenceCopy(expected_packed.data() + kGuard, NaiveRowMajor(shape), src_region, src.strides,
                shape, element_size);
  Bytes packed = packed_pattern;
  PackRegion(packed.data() + kGuard, src_region, src.strides, shape, element_size);
  ASSERT_EQ(FirstDifference(packed, expected_packed), -1) << "PackRegion";

  Bytes unpacked = pattern;
  UnpackRegion(unpacked.data() + dst_region, dst.strides, packed.data() + kGuard, shape,
               element_size);
  ASSERT_EQ(FirstDifference(unpacked, expected), -1) << "UnpackRegion after PackRegion";
}

// Up to 5 axes; extents 0 (rarely), 1 (often) and small; longer axes when the rank is low.
Dims RandomShape(std::mt19937_64& rng) {
  const int rank = static_cast<int>(rng() % 6);
  const int64_t longest = rank <= 2 ? 40 : rank == 3 ? 12 : 6;
  Dims shape(rank);
  for (auto& e : shape) {
    const int roll = static_cast<int>(rng() % 100);
    if (roll < 3) {
      e = 0;
    } else if (roll < 28) {
      e = 1;
    } else {
      e = std::uniform_int_distribution<int64_t>(2, longest)(rng);
    }
  }
  return shape;
}

class CopyRandomTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(CopyRandomTest, MatchesReference) {
  const int64_t element_size = GetParam();
  std::mt19937_64 rng(0x5eed0000 + element_size);
  constexpr int kCases = 2000;
  constexpr Kind kKinds[] = {Kind::kRowMajor, Kind::kPadded, Kind::kPermuted, Kind::kFused};
  for (int i = 0; i < kCases; ++i) {
    const Dims shape = RandomShape(rng);
    const Layout src = MakeLayout(kKinds[rng() % 4], shape, rng);
    const Layout dst = MakeLayout(kKinds[rng() % 4], shape, rng);
    CheckCase(shape, element_size, src, dst, rng);
    if (HasFatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(ElementSizes, CopyRandomTest, ::testing::Values(1, 2, 3, 4, 8, 16),
                         [](const ::testing::TestParamInfo<int64_t>& info) {
                           return absl::StrCat("Bytes", info.param);
                         });

TEST(CopyTest, ScalarCopiesOneElement) {
  for (int64_t element_size : {1, 2, 3, 4, 8, 16}) {
    SCOPED_TRACE(element_size);
    std::mt19937_64 rng(element_size);
    const Bytes source = RandomBytes(element_size, rng);
    const Bytes pattern = RandomBytes(element_size + 2 * kGuard, rng);
    Bytes expected = pattern;
    std::memcpy(expected.data() + kGuard, source.data(), element_size);
    Bytes actual = pattern;
    CopyStrided(actual.data() + kGuard, {}, source.data(), {}, {}, element_size);
    EXPECT_EQ(FirstDifference(actual, expected), -1);
    actual = pattern;
    PackRegion(actual.data() + kGuard, source.data(), {}, {}, element_size);
    EXPECT_EQ(FirstDifference(actual, expected), -1);
    actual = pattern;
    UnpackRegion(actual.data() + kGuard, {}, source.data(), {}, element_size);
    EXPECT_EQ(FirstDifference(actual, expected), -1);
  }
}

TEST(CopyTest, ZeroExtentCopiesNothing) {
  std::mt19937_64 rng(7);
  const Bytes source = RandomBytes(4096, rng);
  const Bytes pattern = RandomBytes(4096, rng);
  for (const Dims& shape : {Dims{0}, Dims{3, 0, 2}, Dims{4, 5, 0}, Dims{0, 1}}) {
    SCOPED_TRACE(DimsToString(shape));
    Bytes actual = pattern;
    CopyStrided(actual.data(), NaiveRowMajor(shape), source.data(), NaiveRowMajor(shape), shape, 4);
    PackRegion(actual.data(), source.data(), Dims(shape.size(), 3), shape, 4);
    UnpackRegion(actual.data(), Dims(shape.size(), 7), source.data(), shape, 4);
    EXPECT_EQ(FirstDifference(actual, pattern), -1);
  }
}

// Strides of extent-1 axes are never used, so they may be anything, even negative or huge.
TEST(CopyTest, IgnoresStridesOfExtentOneAxes) {
  const Dims shape = {1, 3, 1, 4, 1};
  std::vector<uint16_t> src(3 * 4);
  std::iota(src.begin(), src.end(), 100);
  std::vector<uint16_t> dst(3 * 8, 0);
  CopyStrided(dst.data(), {-5, 8, int64_t{1} << 60, 1, 0}, src.data(), {999, 4, -1, 1, 12345},
              shape, 2);
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 8; ++c) {
      EXPECT_EQ(dst[r * 8 + c], c < 4 ? 100 + r * 4 + c : 0) << r << "," << c;
    }
  }
}

// The gate and up halves of a fused expert tensor [E, 2I, H] packed separately and unpacked into
// a second fused tensor with the halves swapped.
TEST(CopyTest, FusedW13HalvesRoundTrip) {
  constexpr int64_t E = 3, I = 5, H = 7;
  std::vector<uint16_t> fused(E * 2 * I * H);
  std::iota(fused.begin(), fused.end(), 1);
  const Dims shape = {E, I, H};
  const Dims fused_strides = {2 * I * H, H, 1};
  std::vector<uint16_t> gate(E * I * H), up(E * I * H);
  PackRegion(gate.data(), fused.data(), fused_strides, shape, 2);
  PackRegion(up.data(), fused.data() + I * H, fused_strides, shape, 2);
  std::vector<uint16_t> swapped(fused.size(), 0);
  UnpackRegion(swapped.data() + I * H, fused_strides, gate.data(), shape, 2);
  UnpackRegion(swapped.data(), fused_strides, up.data(), shape, 2);
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t i = 0; i < I; ++i) {
      for (int64_t h = 0; h < H; ++h) {
        const int64_t gate_at = e * 2 * I * H + i * H + h;
        const int64_t up_at = gate_at + I * H;
        ASSERT_EQ(gate[(e * I + i) * H + h], fused[gate_at]);
        ASSERT_EQ(up[(e * I + i) * H + h], fused[up_at]);
        ASSERT_EQ(swapped[gate_at], fused[up_at]);
        ASSERT_EQ(swapped[up_at], fused[gate_at]);
      }
    }
  }
}

// A transpose: the source is read with strides (1, rows), the packed buffer is row-major.
TEST(CopyTest, TransposeByElementLoop) {
  constexpr int64_t kRows = 37, kCols = 29;
  for (int64_t element_size : {1, 2, 3, 4, 8, 16}) {
    SCOPED_TRACE(element_size);
    std::mt19937_64 rng(element_size);
    const Bytes source = RandomBytes(kRows * kCols * element_size, rng);
    Bytes packed(kRows * kCols * element_size);
    // packed[c][r] = source[r][c]
    PackRegion(packed.data(), source.data(), {1, kCols}, {kCols, kRows}, element_size);
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t c = 0; c < kCols; ++c) {
        ASSERT_EQ(std::memcmp(packed.data() + (c * kRows + r) * element_size,
                              source.data() + (r * kCols + c) * element_size, element_size),
                  0)
            << r << "," << c;
      }
    }
  }
}

// A column block of a row-major matrix (each row a contiguous run) and a fully packed region.
TEST(CopyTest, ColumnBlockAndPackedRegion) {
  constexpr int64_t kRows = 64, kCols = 96, kBlock = 40, kFirst = 24;
  std::vector<uint32_t> matrix(kRows * kCols);
  std::iota(matrix.begin(), matrix.end(), 0);
  std::vector<uint32_t> block(kRows * kBlock);
  PackRegion(block.data(), matrix.data() + kFirst, {kCols, 1}, {kRows, kBlock}, 4);
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t c = 0; c < kBlock; ++c) {
      ASSERT_EQ(block[r * kBlock + c], matrix[r * kCols + kFirst + c]);
    }
  }
  std::vector<uint32_t> copy(matrix.size(), 0);
  CopyStrided(copy.data(), {kCols, 1}, matrix.data(), {kCols, 1}, {kRows, kCols}, 4);
  EXPECT_EQ(copy, matrix);
}

// A buffer of a batch test: `bytes` of random content between guards, its region starting
// `misalign` bytes past an aligned offset so that row starts are not 16-byte aligned.
struct BatchBuffer {
  Bytes bytes;
  int64_t base = 0;  // Where element 0 of the buffer lies in `bytes`.
};

BatchBuffer MakeBatchBuffer(int64_t payload_bytes, std::mt19937_64& rng) {
  BatchBuffer buffer;
  buffer.base = kGuard + static_cast<int64_t>(rng() % 16);
  buffer.bytes = RandomBytes(buffer.base + payload_bytes + kGuard, rng);
  return buffer;
}

// One copy of a batch test, by buffer index and element offset.
struct BatchCase {
  int dst = 0;
  int64_t dst_offset = 0;
  Dims dst_strides;
  int src = 0;
  int64_t src_offset = 0;
  Dims src_strides;
  Dims shape;
};

// A matrix of `outer` x `columns` elements (`outer` may have several axes) with padded rows, cut
// into column blocks of random widths (some empty). When `pack`, each block is packed from the
// matrix into a buffer of its own (sibling blocks share the source's rows); otherwise each block
// is unpacked from a buffer of its own into the matrix (they share the destination's rows).
void AddColumnBlocks(const Dims& outer, int64_t columns, int blocks, bool pack,
                     int64_t element_size, std::vector<BatchBuffer>& buffers,
                     std::vector<BatchCase>& cases, std::mt19937_64& rng) {
  Dims matrix_shape = outer;
  matrix_shape.push_back(columns + static_cast<int64_t>(rng() % 4));  // Padded rows.
  const Dims matrix_strides = NaiveRowMajor(matrix_shape);
  const int matrix = static_cast<int>(buffers.size());
  buffers.push_back(MakeBatchBuffer(Volume(matrix_shape) * element_size, rng));
  // Random cuts of [0, columns) into `blocks` ranges, empty ones included.
  std::vector<int64_t> cuts = {0, columns};
  for (int b = 1; b < blocks; ++b) cuts.push_back(static_cast<int64_t>(rng() % (columns + 1)));
  std::sort(cuts.begin(), cuts.end());
  for (int b = 0; b < blocks; ++b) {
    Dims shape = outer;
    shape.push_back(cuts[b + 1] - cuts[b]);
    const int block = static_cast<int>(buffers.size());
    buffers.push_back(MakeBatchBuffer(Volume(shape) * element_size, rng));
    BatchCase c;
    c.shape = shape;
    if (pack) {
      c = {block, 0, NaiveRowMajor(shape), matrix, cuts[b], matrix_strides, shape};
    } else {
      c = {matrix, cuts[b], matrix_strides, block, 0, NaiveRowMajor(shape), shape};
    }
    cases.push_back(c);
  }
}

// Runs `cases` through CopyStridedBatch and checks every buffer against the reference copier
// applied to each case in turn: the regions copied, every other byte (guards included) unchanged.
void CheckBatch(const std::vector<BatchCase>& cases, const std::vector<BatchBuffer>& buffers,
                int64_t element_size) {
  std::vector<BatchBuffer> expected = buffers;
  std::vector<BatchBuffer> actual = buffers;
  std::vector<StridedCopy> copies;
  for (const BatchCase& c : cases) {
    ReferenceCopy(expected[c.dst].bytes.data() + expected[c.dst].base + c.dst_offset * element_size,
                  c.dst_strides,
                  buffers[c.src].bytes.data() + buffers[c.src].base + c.src_offset * element_size,
                  c.src_strides, c.shape, element_size);
    copies.push_back({actual[c.dst].bytes.data() + actual[c.dst].base + c.dst_offset * element_size,
                      c.dst_strides,
                      actual[c.src].bytes.data() + actual[c.src].base + c.src_offset * element_size,
                      c.src_strides, c.shape, element_size});
  }
  CopyStridedBatch(copies);
  for (size_t b = 0; b < buffers.size(); ++b) {
    ASSERT_EQ(FirstDifference(actual[b].bytes, expected[b].bytes), -1) << "buffer " << b;
  }
}

// Random batches against the reference: sibling column blocks packed from one matrix and
// unpacked into another (2-D and 3-D, rows from 0 to a few hundred bytes, some blocks empty, row
// starts unaligned), mixed with unrelated random copies (the layouts of CopyRandomTest).
class CopyBatchRandomTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(CopyBatchRandomTest, MatchesReference) {
  const int64_t element_size = GetParam();
  std::mt19937_64 rng(0xba7c0000 + element_size);
  constexpr Kind kKinds[] = {Kind::kRowMajor, Kind::kPadded, Kind::kPermuted, Kind::kFused};
  int shared_passes = 0;
  for (int i = 0; i < 300; ++i) {
    SCOPED_TRACE(testing::Message() << "case " << i);
    std::vector<BatchBuffer> buffers;
    std::vector<BatchCase> cases;
    for (int group = 0; group < 3; ++group) {
      Dims outer;
      const int outer_rank = 1 + static_cast<int>(rng() % 2);
      for (int a = 0; a < outer_rank; ++a) outer.push_back(1 + static_cast<int64_t>(rng() % 9));
      const int64_t columns = static_cast<int64_t>(rng() % (400 / element_size + 1));
      const size_t first = cases.size();
      AddColumnBlocks(outer, columns, 1 + static_cast<int>(rng() % 4), rng() % 2 == 0, element_size,
                      buffers, cases, rng);
      for (size_t a = first; a + 1 < cases.size(); ++a) {
        const BatchCase& x = cases[a];
        const BatchCase& y = cases[a + 1];
        auto at = [&](int buffer, int64_t offset) {
          return buffers[buffer].bytes.data() + buffers[buffer].base + offset * element_size;
        };
        shared_passes +=
            ShareAPass({at(x.dst, x.dst_offset), x.dst_strides, at(x.src, x.src_offset),
                        x.src_strides, x.shape, element_size},
                       {at(y.dst, y.dst_offset), y.dst_strides, at(y.src, y.src_offset),
                        y.src_strides, y.shape, element_size});
      }
    }
    for (int unrelated = static_cast<int>(rng() % 3); unrelated > 0; --unrelated) {
      const Dims shape = RandomShape(rng);
      const Layout src = MakeLayout(kKinds[rng() % 4], shape, rng);
      const Layout dst = MakeLayout(kKinds[rng() % 4], shape, rng);
      const int from = static_cast<int>(buffers.size());
      buffers.push_back(MakeBatchBuffer(src.elements * element_size, rng));
      buffers.push_back(MakeBatchBuffer(dst.elements * element_size, rng));
      cases.push_back({from + 1, dst.offset, dst.strides, from, src.offset, src.strides, shape});
    }
    std::shuffle(cases.begin(), cases.end(), rng);
    CheckBatch(cases, buffers, element_size);
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(shared_passes, 100);  // The one-pass path was taken, not only copies one by one.
}

INSTANTIATE_TEST_SUITE_P(ElementSizes, CopyBatchRandomTest, ::testing::Values(1, 2, 3, 4, 8, 16),
                         [](const ::testing::TestParamInfo<int64_t>& info) {
                           return absl::StrCat("Bytes", info.param);
                         });

// Groups of at least 4 MiB are written with streaming stores: sibling blocks of a bf16 row shard
// with unaligned row starts, rows of 3 to 2000 bytes (below and above the 256-byte streaming
// run), one block empty; packed, then unpacked into a second matrix.
TEST(CopyBatchTest, LargeSiblingBlocksStreamExactly) {
  std::mt19937_64 rng(11);
  for (bool pack : {true, false}) {
    SCOPED_TRACE(pack ? "pack" : "unpack");
    std::vector<BatchBuffer> buffers;
    std::vector<BatchCase> cases;
    const Dims outer = {1024};
    const int64_t columns = 2 + 3 + 100 + 1000 + 1 + 1001;  // Odd widths and an empty block.
    AddColumnBlocks(outer, columns, 6, pack, 2, buffers, cases, rng);
    int64_t bytes = 0;
    for (const BatchCase& c : cases) bytes += Volume(c.shape) * 2;
    ASSERT_GE(bytes, int64_t{4} << 20);
    CheckBatch(cases, buffers, 2);
  }
}

TEST(CopyBatchTest, ShareAPassOnlyWhenRowsLineUp) {
  // A row-major [64, 256] row shard of 4-byte elements, its column halves, and a second matrix.
  std::vector<uint32_t> shard_memory(64 * 256), other_memory(64 * 256), a(64 * 128), b(64 * 128);
  uint32_t* shard = shard_memory.data();
  const Dims rows = {256, 1};
  const Dims half = {64, 128};
  const Dims packed = NaiveRowMajor(half);
  auto pack = [&](void* to, const uint32_t* from, const Dims& shape = {64, 128},
                  const Dims& from_strides = {256, 1}) {
    return StridedCopy{to, NaiveRowMajor(shape), from, from_strides, shape, 4};
  };
  // Column halves of one row shard packed to two peers: the same source rows.
  EXPECT_TRUE(ShareAPass(pack(a.data(), shard), pack(b.data(), shard + 128)));
  // Unpacked into one row shard from two peers: the same destination rows.
  EXPECT_TRUE(ShareAPass({shard, rows, a.data(), packed, half, 4},
                         {shard + 128, rows, b.data(), packed, half, 4}));
  // Blocks of other rows of the shard, of another matrix, with another row count, another row
  // stride, or rows below 64 bytes: no shared pass, though their packed sides look alike.
  EXPECT_FALSE(ShareAPass(pack(a.data(), shard), pack(b.data(), shard + 256)));
  EXPECT_FALSE(ShareAPass(pack(a.data(), shard), pack(b.data(), other_memory.data())));
  EXPECT_FALSE(ShareAPass(pack(a.data(), shard), pack(b.data(), shard + 128, {32, 128})));
  EXPECT_FALSE(ShareAPass(pack(a.data(), shard), pack(b.data(), shard + 128, half, {512, 1})));
  EXPECT_FALSE(ShareAPass(pack(a.data(), shard, {64, 8}), pack(b.data(), shard + 8, {64, 8})));
  // A transpose has no contiguous rows; a fully contiguous copy has no rows to share; an empty
  // region copies nothing.
  EXPECT_FALSE(
      ShareAPass(pack(a.data(), shard, half, {1, 64}), pack(b.data(), shard + 1, half, {1, 64})));
  EXPECT_FALSE(ShareAPass(pack(a.data(), shard, {32, 256}), pack(b.data(), shard, {32, 256})));
  EXPECT_FALSE(ShareAPass(pack(a.data(), shard, {64, 0}), pack(b.data(), shard + 128, {64, 0})));
}

}  // namespace
}  // namespace wsync
