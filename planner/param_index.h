#ifndef WSYNC_PLANNER_PARAM_INDEX_H_
#define WSYNC_PLANNER_PARAM_INDEX_H_

// The source holders of each parameter, indexed for box queries (MakePlan, the quantization
// plan). Internal to the planner; immutable after BuildIndex, thread-safe for reads.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "planner/geometry.h"
#include "planner/layout.h"

namespace wsync {

// Source boxes of one parameter with their holders (source piece indices, ascending by process).
struct HolderGroup {
  Box box;
  std::vector<int32_t> pieces;
};

// Finds the holder groups of one parameter that intersect a query box. Groups are disjoint or
// equal (validated), sorted by origin on `axis`, the axis with the most distinct origins.
class ParamIndex {
 public:
  void Build(const Layout& source, std::vector<int32_t> pieces) {
    std::stable_sort(pieces.begin(), pieces.end(), [&](int32_t a, int32_t b) {
      return source.pieces[a].box < source.pieces[b].box;
    });
    for (int32_t index : pieces) {
      const Box& box = source.pieces[index].box;
      if (groups_.empty() || !(groups_.back().box == box)) groups_.push_back(HolderGroup{box, {}});
      groups_.back().pieces.push_back(index);
    }
    for (HolderGroup& group : groups_) {
      std::stable_sort(group.pieces.begin(), group.pieces.end(), [&](int32_t a, int32_t b) {
        return source.pieces[a].process < source.pieces[b].process;
      });
    }
    if (groups_.empty() || groups_[0].box.rank() == 0) return;
    size_t best_distinct = 0;
    for (int axis = 0; axis < groups_[0].box.rank(); ++axis) {
      std::vector<int64_t> origins;
      origins.reserve(groups_.size());
      for (const HolderGroup& group : groups_) origins.push_back(group.box.origin[axis]);
      std::sort(origins.begin(), origins.end());
      const size_t distinct = std::unique(origins.begin(), origins.end()) - origins.begin();
      if (distinct > best_distinct) {
        best_distinct = distinct;
        axis_ = axis;
      }
    }
    std::stable_sort(groups_.begin(), groups_.end(),
                     [&](const HolderGroup& a, const HolderGroup& b) {
                       return a.box.origin[axis_] < b.box.origin[axis_];
                     });
    prefix_max_end_.reserve(groups_.size());
    int64_t max_end = 0;
    for (const HolderGroup& group : groups_) {
      max_end = std::max(max_end, group.box.origin[axis_] + group.box.extent[axis_]);
      prefix_max_end_.push_back(max_end);
    }
  }

  // Calls fn(group, region) for every group whose box meets `query`, region being the common box.
  template <typename Fn>
  void ForEachIntersecting(const Box& query, Fn&& fn) const {
    if (groups_.empty()) return;
    if (query.rank() == 0) {
      for (const HolderGroup& group : groups_) fn(group, query);
      return;
    }
    const int64_t begin = query.origin[axis_];
    const int64_t end = begin + query.extent[axis_];
    auto upper = std::lower_bound(
        groups_.begin(), groups_.end(), end,
        [&](const HolderGroup& group, int64_t value) { return group.box.origin[axis_] < value; });
    for (int64_t i = (upper - groups_.begin()) - 1; i >= 0; --i) {
      if (prefix_max_end_[i] <= begin) break;
      if (std::optional<Box> region = Intersect(groups_[i].box, query)) fn(groups_[i], *region);
    }
  }

 private:
  int axis_ = 0;
  std::vector<HolderGroup> groups_;
  std::vector<int64_t> prefix_max_end_;
};

inline std::vector<ParamIndex> BuildIndex(const Layout& source) {
  std::vector<std::vector<int32_t>> by_param(source.params.size());
  for (int32_t i = 0; i < static_cast<int32_t>(source.pieces.size()); ++i) {
    if (Volume(source.pieces[i].box) > 0) by_param[source.pieces[i].param].push_back(i);
  }
  std::vector<ParamIndex> index(source.params.size());
  for (size_t param = 0; param < by_param.size(); ++param) {
    index[param].Build(source, std::move(by_param[param]));
  }
  return index;
}

}  // namespace wsync

#endif  // WSYNC_PLANNER_PARAM_INDEX_H_
