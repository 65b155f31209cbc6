#ifndef WSYNC_PLANNER_PIECE_MATCH_H_
#define WSYNC_PLANNER_PIECE_MATCH_H_

// Which pieces a segment end reads or writes: the exactness proofs' (exactness.cc,
// quant_exactness.cc) matching of an endpoint's affine map against the pieces of its buffer.
// Internal to the planner.

#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "planner/geometry.h"
#include "planner/layout.h"
#include "planner/plan.h"

namespace wsync {

using PieceKey = std::tuple<int32_t, uint64_t, int32_t>;  // (rank, buffer, param)

inline absl::flat_hash_map<PieceKey, std::vector<int32_t>> IndexPieces(const Layout& layout) {
  absl::flat_hash_map<PieceKey, std::vector<int32_t>> index;
  for (int32_t i = 0; i < static_cast<int32_t>(layout.pieces.size()); ++i) {
    const Piece& piece = layout.pieces[i];
    if (Volume(piece.box) > 0) index[{piece.process, piece.buffer, piece.param}].push_back(i);
  }
  return index;
}

// Calls fn(piece index, part) for every piece of `layout` in the endpoint's buffer whose affine map
// places `part` (its common box with `box`) where the endpoint's map does. Returns the number of
// elements so accounted for; a segment that coalesced several pieces continuing each other in one
// buffer is accounted for piece by piece.
template <typename Fn>
int64_t ForEachMatchingPiece(const Layout& layout,
                             const absl::flat_hash_map<PieceKey, std::vector<int32_t>>& index,
                             int32_t rank, int32_t param, const Box& box, const Endpoint& endpoint,
                             Fn&& fn) {
  auto it = index.find(PieceKey{rank, endpoint.buffer, param});
  if (it == index.end()) return 0;
  int64_t matched = 0;
  for (int32_t i : it->second) {
    const Piece& piece = layout.pieces[i];
    if (piece.strides != endpoint.strides) continue;
    std::optional<Box> part = Intersect(piece.box, box);
    if (!part) continue;
    if (SubRegionOffset(piece.box, piece.offset, piece.strides, *part) !=
        SubRegionOffset(box, endpoint.offset, endpoint.strides, *part)) {
      continue;
    }
    matched += Volume(*part);
    fn(i, *part);
  }
  return matched;
}

}  // namespace wsync

#endif  // WSYNC_PLANNER_PIECE_MATCH_H_
