#ifndef WSYNC_PLANNER_REGION_OVERLAP_H_
#define WSYNC_PLANNER_REGION_OVERLAP_H_

// Overlap detection among many regions of one buffer, and among many boxes of one parameter, in
// bounded work. Validation runs it on manifests from the wire, so an input must not be able to make
// it quadratic: the pairwise sweep it replaces spent 84 s on a tens-of-KB manifest of interleaved
// column pieces (every pair of columns shares an address span, and each pair check costs as many
// steps as the columns have rows).
//
// Pure functions; thread-safe.

#include <cstdint>
#include <optional>
#include <vector>

#include "planner/geometry.h"

namespace wsync {

// A region of a buffer: the addresses offset + sum_a i[a] * strides[a] for 0 <= i[a] < extent[a].
// Callers pass regions that passed RegionSpan (no overflow, non-negative addresses) and
// IsInjective.
struct StridedRegion {
  Dims extent;
  Dims strides;
  int64_t offset = 0;
};

// The outcome of a search: two indices of regions (or boxes) that share an element, or
// `too_complex` when deciding would take more than the work budget (nothing is claimed about
// overlap then).
struct OverlapResult {
  bool overlap = false;
  bool too_complex = false;
  int first = -1;  // With `overlap`: the indices of two overlapping inputs, first < second.
  int second = -1;
  int64_t steps = 0;  // Work spent, so that callers can share one budget over many searches.
};

// Work (about one step per region, per sweep event and per split of a pairwise check) beyond which
// FindRegionOverlap and FindBoxOverlap give up with `too_complex`: about a quarter of a second.
// ValidateLayout spends one such budget on the whole layout (all buffers and parameters).
inline constexpr int64_t kOverlapWorkBudget = int64_t{1} << 24;

// Whether any two of `regions` share an address. Exact within the budget, for any injective
// strides: each region is rewritten as runs of consecutive addresses repeated at one stride
// ("rows"), regions of equal row stride are checked together by a sweep over rows (O(n log n),
// however finely they interleave), contiguous regions by sorting, and only pairs of different row
// strides whose spans meet are checked one by one (RegionsOverlap), each step counted against
// `budget`.
OverlapResult FindRegionOverlap(const std::vector<StridedRegion>& regions,
                                int64_t budget = kOverlapWorkBudget);

// Whether any two of `boxes` (all of one rank, non-empty, pairwise distinct) share an element.
// Exact within the budget: rank 1 by sorting, rank 2 by a sweep with an ordered set (O(n log n)),
// higher ranks by a sweep along the axis with the most distinct origins, pairs counted against
// `budget`.
OverlapResult FindBoxOverlap(const std::vector<Box>& boxes, int64_t budget = kOverlapWorkBudget);

}  // namespace wsync

#endif  // WSYNC_PLANNER_REGION_OVERLAP_H_
