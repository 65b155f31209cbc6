// The chunk hash of verify=true (executor/verify.h): hashing a strided region element by element
// in row-major order equals hashing its packed copy, for random shapes, strides (padded, permuted
// axes) and element sizes; and any single flipped byte of the region changes the hash.

#include "executor/verify.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "common/hash.h"
#include "executor/copy.h"
#include "gtest/gtest.h"

namespace wsync::executor_internal {
namespace {

struct Region {
  Dims shape;
  Dims strides;
  int64_t element_size = 1;
  int64_t span_elements = 0;  // Elements the strided region reaches.
};

// A random region: 1..4 axes of extent 1..6, laid out in a random axis order with random padding.
Region RandomRegion(std::mt19937_64& rng) {
  Region r;
  const int64_t sizes[] = {1, 2, 4, 8, 3};
  r.element_size = sizes[rng() % 5];
  const int axes = 1 + static_cast<int>(rng() % 4);
  for (int a = 0; a < axes; ++a) r.shape.push_back(1 + static_cast<int64_t>(rng() % 6));
  std::vector<int> order(axes);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  r.strides.assign(axes, 0);
  int64_t stride = 1;
  for (int i = axes - 1; i >= 0; --i) {  // order[axes-1] is the innermost in memory.
    r.strides[order[i]] = stride;
    stride *= r.shape[order[i]] + static_cast<int64_t>(rng() % 2);  // Padding or dense.
  }
  r.span_elements = stride;
  return r;
}

TEST(VerifyTest, HashOfAStridedRegionEqualsHashOfItsPackedCopy) {
  std::mt19937_64 rng(20261129);
  for (int trial = 0; trial < 2000; ++trial) {
    const Region r = RandomRegion(rng);
    std::vector<unsigned char> memory(r.span_elements * r.element_size);
    for (unsigned char& byte : memory) byte = static_cast<unsigned char>(rng());
    const int64_t bytes = Volume(Box{Dims(r.shape.size(), 0), r.shape}) * r.element_size;
    std::vector<unsigned char> packed(bytes);
    PackRegion(packed.data(), memory.data(), r.strides, r.shape, r.element_size);
    const uint64_t expected = Xxh3(packed.data(), packed.size());
    ASSERT_EQ(HashRegion(memory.data(), r.strides, r.shape, r.element_size), expected)
        << "trial " << trial;
    // Flip one byte of one element of the region: the hash changes.
    const size_t flip = rng() % packed.size();
    packed[flip] ^= 0x01;
    UnpackRegion(memory.data(), r.strides, packed.data(), r.shape, r.element_size);
    EXPECT_NE(HashRegion(memory.data(), r.strides, r.shape, r.element_size), expected)
        << "trial " << trial;
  }
}

TEST(VerifyTest, AnEmptyRegionHashesLikeNoBytes) {
  EXPECT_EQ(HashRegion(nullptr, {4, 1}, {0, 4}, 2), Xxh3(nullptr, 0));
}

}  // namespace
}  // namespace wsync::executor_internal
