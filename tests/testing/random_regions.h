#ifndef WSYNC_TESTS_TESTING_RANDOM_REGIONS_H_
#define WSYNC_TESTS_TESTING_RANDOM_REGIONS_H_

// Random strided regions for the tests of functions that walk one (digests, MACs, packing): the
// same walk as the executor's chunks, over any axis order and padding.

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "absl/types/span.h"
#include "planner/geometry.h"

namespace wsync::test {

struct StridedRegion {
  Dims shape;
  Dims strides;  // In elements.
  int64_t element_size = 1;
  int64_t span_elements = 0;  // Elements the strided region reaches.
};

// 1..4 axes of extent 1..6, laid out in a random axis order, each axis padded by one element or
// dense; the element size is one of `element_sizes` (not empty).
inline StridedRegion RandomStridedRegion(std::mt19937_64& rng,
                                         absl::Span<const int64_t> element_sizes) {
  StridedRegion r;
  r.element_size = element_sizes[rng() % element_sizes.size()];
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

}  // namespace wsync::test

#endif  // WSYNC_TESTS_TESTING_RANDOM_REGIONS_H_
