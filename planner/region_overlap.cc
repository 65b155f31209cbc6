#include "planner/region_overlap.h"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"

namespace wsync {
namespace {

// `rows` runs of `run` consecutive addresses, the first at `offset`, each `stride` after the one
// before (stride > run when rows > 1). Every injective region is a set of such units.
struct Unit {
  int region = 0;
  int64_t offset = 0;
  int64_t rows = 1;
  int64_t stride = 0;  // 0 when rows == 1: the unit is contiguous.
  int64_t run = 1;

  int64_t first() const { return offset; }
  int64_t last() const { return offset + (rows - 1) * stride + run - 1; }
};

struct Axis {
  int64_t extent;
  int64_t stride;
};

// The work budget, shared by every stage of one search.
class Budget {
 public:
  explicit Budget(int64_t steps) : steps_(steps) {}
  // False when the budget is spent.
  bool Take(int64_t steps) {
    steps_ -= steps;
    return steps_ >= 0;
  }
  int64_t& steps() { return steps_; }

 private:
  int64_t steps_;
};

OverlapResult Found(int a, int b) {
  OverlapResult result;
  result.overlap = true;
  result.first = std::min(a, b);
  result.second = std::max(a, b);
  return result;
}

OverlapResult TooComplex() {
  OverlapResult result;
  result.too_complex = true;
  return result;
}

// Rewrites region `index` as units: axes of extent > 1 sorted by stride, axes that continue each
// other merged (stride == extent * stride of the next smaller), the stride-1 axis (if any) as the
// run, every outer axis but the innermost enumerated. False when the units would exceed the budget.
bool AppendUnits(const StridedRegion& region, int index, Budget& budget, std::vector<Unit>& units) {
  std::vector<Axis> axes;
  for (size_t a = 0; a < region.extent.size(); ++a) {
    if (region.extent[a] == 0) return true;  // No addresses.
    if (region.extent[a] > 1) axes.push_back(Axis{region.extent[a], region.strides[a]});
  }
  std::sort(axes.begin(), axes.end(),
            [](const Axis& x, const Axis& y) { return x.stride < y.stride; });
  std::vector<Axis> merged;
  for (const Axis& axis : axes) {
    if (!merged.empty() && axis.stride == merged.back().extent * merged.back().stride) {
      merged.back().extent *= axis.extent;  // Within the region's span: no overflow.
    } else {
      merged.push_back(axis);
    }
  }
  Unit unit;
  unit.region = index;
  unit.offset = region.offset;
  size_t next = 0;
  if (!merged.empty() && merged[0].stride == 1) {
    unit.run = merged[0].extent;
    next = 1;
  }
  if (next == merged.size()) {
    if (!budget.Take(1)) return false;
    units.push_back(unit);
    return true;
  }
  unit.rows = merged[next].extent;
  unit.stride = merged[next].stride;
  // Outer axes (larger strides): one unit per combination of their indices.
  std::vector<Axis> outer(merged.begin() + next + 1, merged.end());
  int64_t count = 1;
  for (const Axis& axis : outer) {
    if (count > budget.steps() / axis.extent + 1) return false;
    count *= axis.extent;
  }
  if (!budget.Take(count)) return false;
  std::vector<int64_t> index_of(outer.size(), 0);
  for (int64_t k = 0; k < count; ++k) {
    Unit u = unit;
    for (size_t a = 0; a < outer.size(); ++a) u.offset += index_of[a] * outer[a].stride;
    units.push_back(u);
    for (size_t a = 0; a < outer.size(); ++a) {
      if (++index_of[a] < outer[a].extent) break;
      index_of[a] = 0;
    }
  }
  return true;
}

// Contiguous units: sorted by first address, each must start after every earlier one ends.
OverlapResult CheckContiguous(std::vector<const Unit*>& units) {
  std::sort(units.begin(), units.end(),
            [](const Unit* a, const Unit* b) { return a->first() < b->first(); });
  const Unit* reach = nullptr;  // The unit reaching furthest so far.
  for (const Unit* unit : units) {
    if (reach != nullptr && unit->first() <= reach->last() && unit->region != reach->region) {
      return Found(reach->region, unit->region);
    }
    if (reach == nullptr || unit->last() > reach->last()) reach = unit;
  }
  return {};
}

// A rectangle of the grid where address = row * stride + column, 0 <= column < stride.
struct Rect {
  int64_t row_begin;
  int64_t row_end;
  int64_t col_begin;
  int64_t col_end;
  int region;
};

// Pairwise disjointness of rectangles: a sweep over rows keeping the column ranges of the
// rectangles that cover the current row in an ordered map. The ranges in the map are pairwise
// disjoint (an overlap ends the search), so a new range overlaps some range exactly when it
// overlaps its neighbour on one side or the other.
OverlapResult CheckRects(const std::vector<Rect>& rects) {
  // (row, 0 = leaves before 1 = enters at the same row, rect index)
  std::vector<std::tuple<int64_t, int, int>> events;
  events.reserve(2 * rects.size());
  for (int i = 0; i < static_cast<int>(rects.size()); ++i) {
    events.emplace_back(rects[i].row_begin, 1, i);
    events.emplace_back(rects[i].row_end, 0, i);
  }
  std::sort(events.begin(), events.end());
  std::map<int64_t, int> active;  // col_begin -> rect index
  for (const auto& [row, kind, i] : events) {
    const Rect& rect = rects[i];
    if (kind == 0) {
      auto it = active.find(rect.col_begin);
      if (it != active.end() && it->second == i) active.erase(it);
      continue;
    }
    auto after = active.lower_bound(rect.col_begin);
    if (after != active.end() && rects[after->second].col_begin < rect.col_end &&
        rects[after->second].region != rect.region) {
      return Found(rects[after->second].region, rect.region);
    }
    if (after != active.begin()) {
      auto before = std::prev(after);
      if (rects[before->second].col_end > rect.col_begin &&
          rects[before->second].region != rect.region) {
        return Found(rects[before->second].region, rect.region);
      }
    }
    // Parts of one region never overlap (it is injective); keep the map's ranges disjoint.
    if (after != active.end() && after->first == rect.col_begin) continue;
    active.emplace(rect.col_begin, i);
  }
  return {};
}

// Units of one row stride: as rectangles of that stride's grid (a unit whose run crosses a row's
// end is two rectangles, the second one row lower).
OverlapResult CheckStrided(const std::vector<const Unit*>& units) {
  std::vector<Rect> rects;
  rects.reserve(units.size() + units.size() / 2);
  for (const Unit* unit : units) {
    const int64_t s = unit->stride;
    const int64_t row = unit->offset / s;
    const int64_t col = unit->offset % s;
    if (col + unit->run <= s) {
      rects.push_back(Rect{row, row + unit->rows, col, col + unit->run, unit->region});
    } else {
      rects.push_back(Rect{row, row + unit->rows, col, s, unit->region});
      rects.push_back(Rect{row + 1, row + unit->rows + 1, 0, col + unit->run - s, unit->region});
    }
  }
  return CheckRects(rects);
}

bool UnitsOverlap(const Unit& a, const Unit& b, Budget& budget, bool& gave_up) {
  auto as_dims = [](const Unit& u, Dims& extent, Dims& strides) {
    if (u.rows > 1) {
      extent = {u.rows, u.run};
      strides = {u.stride, 1};
    } else {
      extent = {u.run};
      strides = {1};
    }
  };
  Dims extent_a, strides_a, extent_b, strides_b;
  as_dims(a, extent_a, strides_a);
  as_dims(b, extent_b, strides_b);
  std::optional<bool> overlap = RegionsOverlapWithin(extent_a, a.offset, strides_a, extent_b,
                                                     b.offset, strides_b, budget.steps());
  if (!overlap) {
    gave_up = true;
    return false;
  }
  return *overlap;
}

// Pairs of units of different row strides (contiguous units are the stride-0 class) whose spans
// meet: a sweep over first addresses, the active units of each class in a heap by last address.
// Every unit of another class still active when a unit starts is a pair to check.
OverlapResult CheckAcrossClasses(std::vector<Unit>& units, Budget& budget) {
  std::sort(units.begin(), units.end(),
            [](const Unit& a, const Unit& b) { return a.first() < b.first(); });
  using Entry = std::pair<int64_t, int>;  // (last address, unit index)
  // A min-heap by last address (std::push_heap with greater<>), kept as a vector to walk it.
  using Heap = std::vector<Entry>;
  std::map<int64_t, Heap> active;  // by row stride (node-based: `nonempty` points into it)
  std::map<int64_t, Heap*> nonempty;
  for (int i = 0; i < static_cast<int>(units.size()); ++i) {
    const Unit& unit = units[i];
    if (!budget.Take(1)) return TooComplex();
    for (auto it = nonempty.begin(); it != nonempty.end();) {
      Heap& heap = *it->second;
      while (!heap.empty() && heap.front().first < unit.first()) {
        std::pop_heap(heap.begin(), heap.end(), std::greater<Entry>());
        heap.pop_back();
      }
      if (heap.empty()) {
        it = nonempty.erase(it);
        continue;
      }
      if (it->first != unit.stride) {
        // Every entry left ends at or after this unit's start: each pair's spans meet.
        for (const Entry& entry : heap) {
          const Unit& other = units[entry.second];
          if (other.region == unit.region) continue;
          bool gave_up = false;
          if (UnitsOverlap(other, unit, budget, gave_up)) return Found(other.region, unit.region);
          if (gave_up) return TooComplex();
        }
      }
      ++it;
    }
    Heap& own = active[unit.stride];
    own.emplace_back(unit.last(), i);
    std::push_heap(own.begin(), own.end(), std::greater<Entry>());
    nonempty.emplace(unit.stride, &own);
  }
  return {};
}

}  // namespace

static OverlapResult FindRegionOverlapIn(const std::vector<StridedRegion>& regions,
                                         Budget& budget) {
  std::vector<Unit> units;
  for (int i = 0; i < static_cast<int>(regions.size()); ++i) {
    if (!AppendUnits(regions[i], i, budget, units)) return TooComplex();
  }
  // Within each class: exact and O(n log n).
  std::map<int64_t, std::vector<const Unit*>> by_stride;
  for (const Unit& unit : units) by_stride[unit.rows > 1 ? unit.stride : 0].push_back(&unit);
  for (auto& [stride, list] : by_stride) {
    if (!budget.Take(static_cast<int64_t>(list.size()))) return TooComplex();
    OverlapResult result = stride == 0 ? CheckContiguous(list) : CheckStrided(list);
    if (result.overlap) return result;
  }
  if (by_stride.size() <= 1) return {};
  for (Unit& unit : units) {
    if (unit.rows == 1) unit.stride = 0;
  }
  return CheckAcrossClasses(units, budget);
}

namespace {

// Rank-2 boxes: a sweep along axis `sweep` with the other axis's ranges of the active boxes in an
// ordered map; as for rectangles of a grid, active ranges are pairwise disjoint.
OverlapResult BoxesRank2(const std::vector<Box>& boxes, int sweep) {
  const int other = 1 - sweep;
  std::vector<Rect> rects;
  rects.reserve(boxes.size());
  for (int i = 0; i < static_cast<int>(boxes.size()); ++i) {
    const Box& b = boxes[i];
    rects.push_back(Rect{b.origin[sweep], b.origin[sweep] + b.extent[sweep], b.origin[other],
                         b.origin[other] + b.extent[other], i});
  }
  return CheckRects(rects);
}

}  // namespace

static OverlapResult FindBoxOverlapIn(const std::vector<Box>& boxes, Budget& budget) {
  if (boxes.size() < 2) return {};
  const int rank = boxes[0].rank();
  if (rank == 0) return Found(0, 1);  // Every rank-0 box is the whole scalar.
  if (!budget.Take(static_cast<int64_t>(boxes.size()))) return TooComplex();
  if (rank == 1) {
    std::vector<int> order(boxes.size());
    for (int i = 0; i < static_cast<int>(order.size()); ++i) order[i] = i;
    std::sort(order.begin(), order.end(),
              [&](int a, int b) { return boxes[a].origin[0] < boxes[b].origin[0]; });
    int reach = order[0];
    for (size_t k = 1; k < order.size(); ++k) {
      const Box& box = boxes[order[k]];
      const Box& far = boxes[reach];
      if (box.origin[0] < far.origin[0] + far.extent[0]) return Found(reach, order[k]);
      if (box.origin[0] + box.extent[0] > far.origin[0] + far.extent[0]) reach = order[k];
    }
    return {};
  }
  if (rank == 2) return BoxesRank2(boxes, 0);
  // Higher ranks: sweep along the axis with the most distinct origins; every active box is a pair
  // to check.
  int sweep = 0;
  size_t most = 0;
  for (int axis = 0; axis < rank; ++axis) {
    absl::flat_hash_set<int64_t> origins;
    for (const Box& box : boxes) origins.insert(box.origin[axis]);
    if (origins.size() > most) {
      most = origins.size();
      sweep = axis;
    }
  }
  std::vector<int> order(boxes.size());
  for (int i = 0; i < static_cast<int>(order.size()); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return boxes[a].origin[sweep] < boxes[b].origin[sweep]; });
  std::vector<int> active;
  for (int index : order) {
    const Box& box = boxes[index];
    std::erase_if(active, [&](int other) {
      return boxes[other].origin[sweep] + boxes[other].extent[sweep] <= box.origin[sweep];
    });
    if (!budget.Take(static_cast<int64_t>(active.size()) + 1)) return TooComplex();
    for (int other : active) {
      if (Overlaps(boxes[other], box)) return Found(other, index);
    }
    active.push_back(index);
  }
  return {};
}

OverlapResult FindRegionOverlap(const std::vector<StridedRegion>& regions, int64_t budget_steps) {
  Budget budget(budget_steps);
  OverlapResult result = FindRegionOverlapIn(regions, budget);
  result.steps = budget_steps - std::max<int64_t>(budget.steps(), 0);
  return result;
}

OverlapResult FindBoxOverlap(const std::vector<Box>& boxes, int64_t budget_steps) {
  Budget budget(budget_steps);
  OverlapResult result = FindBoxOverlapIn(boxes, budget);
  result.steps = budget_steps - std::max<int64_t>(budget.steps(), 0);
  return result;
}

}  // namespace wsync
