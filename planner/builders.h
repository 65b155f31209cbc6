#ifndef WSYNC_PLANNER_BUILDERS_H_
#define WSYNC_PLANNER_BUILDERS_H_

// Primitive layout builders. Each appends processes, buffers, parameters or pieces to a Layout
// being assembled; the named layouts (named_layouts.h), the random layouts of the tests and users
// who describe their own framework compose them. None validates; ValidateLayout does.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "planner/layout.h"

namespace wsync {

// Part `index` of `extent` cut into `parts` balanced ranges: the first extent % parts parts get one
// element more. Requires parts > 0 and 0 <= index < parts.
struct Range {
  int64_t begin = 0;
  int64_t size = 0;
};
Range SplitRange(int64_t extent, int32_t parts, int32_t index);

// The box of `shape` that part `index` of a balanced split along `axis` covers.
Box SplitBox(const Dims& shape, int axis, int32_t parts, int32_t index);

// Cuts the row-major flat range [begin, end) of a tensor of `shape` into non-empty boxes (at most
// 2*rank-1: a partial innermost row, ..., full blocks, ..., a partial last row; one for a scalar),
// in flat order, each with the flat offset of its first element relative to `begin`. Every box is
// packed row-major within the flat range, so its strides are RowMajorStrides(shape). Requires
// 0 <= begin, end <= the element count; an empty range gives no boxes.
struct FlatBox {
  Box box;
  int64_t flat_offset = 0;
};
std::vector<FlatBox> FlatRangeBoxes(const Dims& shape, int64_t begin, int64_t end);

// Appends to a Layout. Ids: processes get ranks 0, 1, ...; buffers get ids 0, 1, ... per process.
class LayoutBuilder {
 public:
  explicit LayoutBuilder(Role role);

  int32_t AddProcess(std::string node_id, int32_t device = kUnknownDevice);
  uint64_t AddBuffer(int32_t process, int64_t bytes, MemoryKind kind = MemoryKind::kHost);
  // Returns the index of a parameter of that name, adding it when new (an existing parameter keeps
  // its dtype and shape). Parameters added through mutable_layout() are found too.
  int32_t AddParam(const std::string& name, DType dtype, const Dims& shape);
  void AddPiece(int32_t param, int32_t process, uint64_t buffer, Box box, int64_t offset,
                Dims strides);

  // Places `box` of `param` packed row-major at element `offset` of the buffer. Returns the number
  // of elements it occupies.
  int64_t AddPackedPiece(int32_t param, int32_t process, uint64_t buffer, const Box& box,
                         int64_t offset);

  // A fused tensor: the parts' boxes concatenated along `axis` (all other extents equal), stored
  // row-major at element `offset` of one buffer, part i after part i-1 along `axis`. Each part
  // becomes one piece with the fused tensor's strides. Returns the fused tensor's element count.
  int64_t AddFusedPieces(const std::vector<std::pair<int32_t, Box>>& parts, int axis,
                         int32_t process, uint64_t buffer, int64_t offset);

  // The flat range [begin, end) of `param` (row-major), placed at element `offset` of the buffer
  // (FSDP / ZeRO-3 shards). Adds one piece per FlatRangeBoxes box.
  void AddFlatRange(int32_t param, int32_t process, uint64_t buffer, int64_t begin, int64_t end,
                    int64_t offset);

  const Layout& layout() const { return layout_; }
  Layout& mutable_layout() { return layout_; }
  Layout Build() && { return std::move(layout_); }

 private:
  Layout layout_;
  std::vector<uint64_t> next_buffer_id_;
  // Name -> index of layout_.params[0, indexed_params_).
  absl::flat_hash_map<std::string, int32_t> param_index_;
  size_t indexed_params_ = 0;
};

}  // namespace wsync

#endif  // WSYNC_PLANNER_BUILDERS_H_
