#include "planner/geometry.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checked_math.h"

namespace wsync {

Box WholeBox(const Dims& shape) {
  Box box;
  box.origin.assign(shape.size(), 0);
  box.extent = shape;
  return box;
}

int64_t Volume(const Dims& extent) {
  int64_t volume = 1;
  for (int64_t e : extent) volume *= e;
  return volume;
}

std::optional<int64_t> CheckedVolume(const Dims& extent) {
  int64_t volume = 1;
  for (int64_t e : extent) {
    if (e < 0) return std::nullopt;
    std::optional<int64_t> next = CheckedMul(volume, e);
    if (!next) return std::nullopt;
    volume = *next;
  }
  return volume;
}

std::optional<Box> Intersect(const Box& a, const Box& b) {
  if (a.rank() != b.rank()) return std::nullopt;
  Box out;
  out.origin.resize(a.rank());
  out.extent.resize(a.rank());
  for (int axis = 0; axis < a.rank(); ++axis) {
    const int64_t begin = std::max(a.origin[axis], b.origin[axis]);
    const int64_t end = std::min(a.origin[axis] + a.extent[axis], b.origin[axis] + b.extent[axis]);
    if (end <= begin) return std::nullopt;
    out.origin[axis] = begin;
    out.extent[axis] = end - begin;
  }
  return out;
}

bool Contains(const Box& outer, const Box& inner) {
  if (outer.rank() != inner.rank()) return false;
  if (Volume(inner) == 0) return true;
  for (int axis = 0; axis < outer.rank(); ++axis) {
    if (inner.origin[axis] < outer.origin[axis]) return false;
    if (inner.origin[axis] + inner.extent[axis] > outer.origin[axis] + outer.extent[axis]) {
      return false;
    }
  }
  return true;
}

bool Overlaps(const Box& a, const Box& b) { return Intersect(a, b).has_value(); }

std::string BoxToString(const Box& box) {
  std::string out = "[";
  for (int axis = 0; axis < box.rank(); ++axis) {
    if (axis > 0) out += ", ";
    absl::StrAppend(&out, box.origin[axis], ":", box.origin[axis] + box.extent[axis]);
  }
  out += ")";
  return out;
}

std::string DimsToString(const Dims& dims) {
  return absl::StrCat("(", absl::StrJoin(dims, ", "), ")");
}

Dims RowMajorStrides(const Dims& extent) {
  Dims strides(extent.size(), 1);
  for (int axis = static_cast<int>(extent.size()) - 2; axis >= 0; --axis) {
    strides[axis] = strides[axis + 1] * extent[axis + 1];
  }
  return strides;
}

bool IsPacked(const Dims& extent, const Dims& strides) {
  if (extent.size() != strides.size()) return false;
  for (int64_t e : extent) {
    if (e == 0) return true;
  }
  int64_t expected = 1;
  for (int axis = static_cast<int>(extent.size()) - 1; axis >= 0; --axis) {
    if (extent[axis] == 1) continue;
    if (strides[axis] != expected) return false;
    expected *= extent[axis];
  }
  return true;
}

absl::StatusOr<std::optional<AddressSpan>> RegionSpan(const Dims& extent, int64_t offset,
                                                      const Dims& strides) {
  if (extent.size() != strides.size()) {
    return absl::InvalidArgumentError(absl::StrCat("rank mismatch: extent ", DimsToString(extent),
                                                   " strides ", DimsToString(strides)));
  }
  for (int64_t e : extent) {
    if (e < 0) return absl::InvalidArgumentError("negative extent");
    if (e == 0) return std::optional<AddressSpan>();
  }
  if (offset < 0) {
    return absl::OutOfRangeError(absl::StrCat("negative offset ", offset));
  }
  int64_t last = offset;
  for (size_t axis = 0; axis < extent.size(); ++axis) {
    if (extent[axis] == 1) continue;
    if (strides[axis] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("negative stride ", strides[axis], " on axis ", axis));
    }
    std::optional<int64_t> reach = CheckedMul(extent[axis] - 1, strides[axis]);
    if (!reach) return absl::OutOfRangeError("address arithmetic overflows int64");
    std::optional<int64_t> next = CheckedAdd(last, *reach);
    if (!next) return absl::OutOfRangeError("address arithmetic overflows int64");
    last = *next;
  }
  return std::optional<AddressSpan>(AddressSpan{offset, last});
}

bool IsInjective(const Dims& extent, const Dims& strides) {
  if (extent.size() != strides.size()) return false;
  std::vector<std::pair<int64_t, int64_t>> axes;  // (stride, extent) of axes with extent > 1
  for (size_t axis = 0; axis < extent.size(); ++axis) {
    if (extent[axis] == 0) return true;
    if (extent[axis] > 1) axes.emplace_back(strides[axis], extent[axis]);
  }
  std::sort(axes.begin(), axes.end());
  __int128 reach = 0;  // Largest offset the smaller axes reach.
  for (const auto& [stride, e] : axes) {
    if (stride <= reach) return false;
    reach += static_cast<__int128>(e - 1) * stride;
  }
  return true;
}

namespace {

struct Region {
  Dims extent;
  int64_t offset;
  const Dims* strides;
  int64_t first;
  int64_t last;
  bool dense;  // Its addresses are exactly [first, last].
};

Region MakeRegion(Dims extent, int64_t offset, const Dims& strides) {
  Region r{std::move(extent), offset, &strides, offset, offset, false};
  for (size_t axis = 0; axis < r.extent.size(); ++axis) {
    r.last += (r.extent[axis] - 1) * strides[axis];
  }
  r.dense = Volume(r.extent) == r.last - r.first + 1;
  return r;
}

// Splits `r` in two along its axis of extent > 1 with the largest stride.
std::pair<Region, Region> Halve(const Region& r) {
  int best = -1;
  for (size_t axis = 0; axis < r.extent.size(); ++axis) {
    if (r.extent[axis] > 1 && (best < 0 || (*r.strides)[axis] > (*r.strides)[best])) {
      best = static_cast<int>(axis);
    }
  }
  Dims low = r.extent;
  Dims high = r.extent;
  low[best] = r.extent[best] / 2;
  high[best] = r.extent[best] - low[best];
  return {MakeRegion(low, r.offset, *r.strides),
          MakeRegion(high, r.offset + low[best] * (*r.strides)[best], *r.strides)};
}

// Whether a and b share an address; nullopt when `*steps` (counted down once per call, when not
// null) runs out first.
std::optional<bool> Overlap(const Region& a, const Region& b, int64_t* steps) {
  if (steps != nullptr && --*steps < 0) return std::nullopt;
  if (a.last < b.first || b.last < a.first) return false;
  if (a.dense && b.dense) return true;
  // Split the sparse region with the wider span; a sparse region always has an axis of extent > 1.
  const bool split_a = !a.dense && (b.dense || a.last - a.first >= b.last - b.first);
  if (split_a) {
    auto [low, high] = Halve(a);
    std::optional<bool> first = Overlap(low, b, steps);
    if (!first || *first) return first;
    return Overlap(high, b, steps);
  }
  auto [low, high] = Halve(b);
  std::optional<bool> first = Overlap(a, low, steps);
  if (!first || *first) return first;
  return Overlap(a, high, steps);
}

}  // namespace

bool RegionsOverlap(const Dims& extent_a, int64_t offset_a, const Dims& strides_a,
                    const Dims& extent_b, int64_t offset_b, const Dims& strides_b) {
  if (Volume(extent_a) == 0 || Volume(extent_b) == 0) return false;
  return *Overlap(MakeRegion(extent_a, offset_a, strides_a),
                  MakeRegion(extent_b, offset_b, strides_b), nullptr);
}

std::optional<bool> RegionsOverlapWithin(const Dims& extent_a, int64_t offset_a,
                                         const Dims& strides_a, const Dims& extent_b,
                                         int64_t offset_b, const Dims& strides_b, int64_t& steps) {
  if (Volume(extent_a) == 0 || Volume(extent_b) == 0) return false;
  return Overlap(MakeRegion(extent_a, offset_a, strides_a),
                 MakeRegion(extent_b, offset_b, strides_b), &steps);
}

int64_t AddressOf(const Box& box, int64_t offset, const Dims& strides, const Dims& index) {
  int64_t address = offset;
  for (int axis = 0; axis < box.rank(); ++axis) {
    address += (index[axis] - box.origin[axis]) * strides[axis];
  }
  return address;
}

int64_t SubRegionOffset(const Box& box, int64_t offset, const Dims& strides, const Box& sub) {
  return AddressOf(box, offset, strides, sub.origin);
}

}  // namespace wsync
