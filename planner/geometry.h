#ifndef WSYNC_PLANNER_GEOMETRY_H_
#define WSYNC_PLANNER_GEOMETRY_H_

// Boxes (axis-aligned regions of a parameter) and the affine address arithmetic of pieces.
// All coordinates and strides are in elements, int64. Pure functions; thread-safe.

#include <cstdint>
#include <optional>
#include <string>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"

namespace wsync {

// A parameter has at most this many axes.
inline constexpr int kMaxAxes = 8;

using Dims = absl::InlinedVector<int64_t, 4>;

// An axis-aligned region: origin[a] <= index[a] < origin[a] + extent[a] on every axis a.
// A box with any zero extent is empty. A rank-0 box (scalar parameter) has volume 1.
struct Box {
  Dims origin;
  Dims extent;

  int rank() const { return static_cast<int>(extent.size()); }
  friend bool operator==(const Box& a, const Box& b) {
    return a.origin == b.origin && a.extent == b.extent;
  }
  friend bool operator<(const Box& a, const Box& b) {
    if (a.origin != b.origin) return a.origin < b.origin;
    return a.extent < b.extent;
  }
  template <typename H>
  friend H AbslHashValue(H h, const Box& box) {
    return H::combine(std::move(h), box.origin, box.extent);
  }
};

// The box [0, shape) covering a whole parameter.
Box WholeBox(const Dims& shape);

// Product of the extents. Callers pass validated boxes (whose volume fits in int64);
// CheckedVolume is the variant for unvalidated input.
int64_t Volume(const Dims& extent);
inline int64_t Volume(const Box& box) { return Volume(box.extent); }
std::optional<int64_t> CheckedVolume(const Dims& extent);

// The common region of two boxes of the same rank, or nullopt when it is empty (or ranks differ).
std::optional<Box> Intersect(const Box& a, const Box& b);

// True when every element of `inner` lies in `outer` (an empty inner box is contained anywhere of
// the same rank).
bool Contains(const Box& outer, const Box& inner);

// True when the boxes share at least one element.
bool Overlaps(const Box& a, const Box& b);

// "[0:4, 2:6)"-style text: each axis as begin:end.
std::string BoxToString(const Box& box);
std::string DimsToString(const Dims& dims);

// Row-major (C-order) strides for `extent`.
Dims RowMajorStrides(const Dims& extent);

// True when (extent, strides) addresses a dense row-major range: after ignoring axes of extent 1,
// each stride equals the product of the extents after it. A region with a zero extent is packed.
bool IsPacked(const Dims& extent, const Dims& strides);

// The element addresses [first, last] that a region (extent, offset, strides) touches, computed
// with overflow checks. Fails with OutOfRange on int64 overflow or a negative address,
// InvalidArgument for rank mismatch or a negative stride on an axis of extent > 1. An empty region
// has no span: the result is nullopt.
struct AddressSpan {
  int64_t first;
  int64_t last;  // inclusive
};
absl::StatusOr<std::optional<AddressSpan>> RegionSpan(const Dims& extent, int64_t offset,
                                                      const Dims& strides);

// True when no two distinct indices of (extent, strides) map to the same address. Checked with the
// nesting rule: sorting axes of extent > 1 by stride, each stride exceeds the span of all smaller
// ones. Strides that interleave in a way this rule does not accept are reported as aliasing.
bool IsInjective(const Dims& extent, const Dims& strides);

// True when two regions of one buffer share an element address. Exact for any strides: it prunes by
// address spans and splits the wider region along its outermost axis of extent > 1, so interleaved
// regions (e.g. the gate and up halves of a fused expert tensor) cost work proportional to how
// finely they interleave, and separate ranges cost O(1).
bool RegionsOverlap(const Dims& extent_a, int64_t offset_a, const Dims& strides_a,
                    const Dims& extent_b, int64_t offset_b, const Dims& strides_b);

// RegionsOverlap that gives up: each step of its search takes one from `steps`; nullopt when
// `steps` falls below zero before the answer is known.
std::optional<bool> RegionsOverlapWithin(const Dims& extent_a, int64_t offset_a,
                                         const Dims& strides_a, const Dims& extent_b,
                                         int64_t offset_b, const Dims& strides_b, int64_t& steps);

// Address of `index` (absolute logical coordinates inside `box`) for a region that maps box.origin
// to `offset` with `strides`. Callers pass validated regions.
int64_t AddressOf(const Box& box, int64_t offset, const Dims& strides, const Dims& index);

// Offset of sub-box `sub` (inside `box`) in a region that maps box.origin to `offset`.
int64_t SubRegionOffset(const Box& box, int64_t offset, const Dims& strides, const Box& sub);

}  // namespace wsync

#endif  // WSYNC_PLANNER_GEOMETRY_H_
