#include "planner/builders.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "planner/geometry.h"

namespace wsync {

Range SplitRange(int64_t extent, int32_t parts, int32_t index) {
  const int64_t base = extent / parts;
  const int64_t extra = extent % parts;
  Range range;
  range.begin = index * base + std::min<int64_t>(index, extra);
  range.size = base + (index < extra ? 1 : 0);
  return range;
}

Box SplitBox(const Dims& shape, int axis, int32_t parts, int32_t index) {
  Box box;
  box.origin.assign(shape.size(), 0);
  box.extent = shape;
  const Range range = SplitRange(shape[axis], parts, index);
  box.origin[axis] = range.begin;
  box.extent[axis] = range.size;
  return box;
}

namespace {

// The box of elements [flat, flat + count * stride[axis]) where `flat` is a multiple of
// stride[axis] and the range stays inside one block of stride[axis - 1]: axes before `axis` fixed
// at the coordinates of `flat`, `count` indices along `axis`, later axes whole.
Box LevelBox(const Dims& shape, const Dims& strides, int axis, int64_t flat, int64_t count) {
  const int rank = static_cast<int>(shape.size());
  Box box;
  box.origin.resize(rank);
  box.extent.resize(rank);
  for (int a = 0; a < rank; ++a) {
    if (a < axis) {
      box.origin[a] = (flat / strides[a]) % shape[a];
      box.extent[a] = 1;
    } else if (a == axis) {
      box.origin[a] = (flat / strides[a]) % shape[a];
      box.extent[a] = count;
    } else {
      box.origin[a] = 0;
      box.extent[a] = shape[a];
    }
  }
  return box;
}

}  // namespace

std::vector<FlatBox> FlatRangeBoxes(const Dims& shape, int64_t begin, int64_t end) {
  std::vector<FlatBox> boxes;
  if (begin >= end) return boxes;
  const int rank = static_cast<int>(shape.size());
  if (rank == 0) {
    // A scalar has the single element 0.
    boxes.push_back(FlatBox{Box{}, 0});
    return boxes;
  }
  const Dims strides = RowMajorStrides(shape);
  const int64_t numel = strides[0] * shape[0];
  // Block size one level above `axis`: stride[axis - 1], or the whole tensor above axis 0.
  auto outer_block = [&](int axis) { return axis == 0 ? numel : strides[axis - 1]; };
  auto emit = [&](int axis, int64_t flat, int64_t count) {
    boxes.push_back(FlatBox{LevelBox(shape, strides, axis, flat, count), flat - begin});
  };

  // Rising edge: from the innermost axis outwards, fill up to the next boundary of the enclosing
  // block while that boundary lies inside the range. Invariant: `flat` is a multiple of
  // strides[axis] when level `axis` starts.
  int64_t flat = begin;
  int axis = rank - 1;
  for (; axis >= 0; --axis) {
    const int64_t block = outer_block(axis);
    const int64_t boundary = (flat + block - 1) / block * block;
    if (boundary > end) break;
    if (boundary > flat) emit(axis, flat, (boundary - flat) / strides[axis]);
    flat = boundary;
  }
  // Falling edge: [flat, end) now lies within one block of outer_block(axis) (or `flat` is aligned
  // to the whole tensor); take whole sub-blocks from the outermost level inwards.
  for (axis = std::max(axis, 0); axis < rank && flat < end; ++axis) {
    const int64_t count = (end - flat) / strides[axis];
    if (count > 0) emit(axis, flat, count);
    flat += count * strides[axis];
  }
  return boxes;
}

LayoutBuilder::LayoutBuilder(Role role) { layout_.role = role; }

int32_t LayoutBuilder::AddProcess(std::string node_id, int32_t device) {
  const int32_t rank = static_cast<int32_t>(layout_.processes.size());
  layout_.processes.push_back(ProcessInfo{rank, std::move(node_id), device});
  return rank;
}

uint64_t LayoutBuilder::AddBuffer(int32_t process, int64_t bytes, MemoryKind kind) {
  if (static_cast<size_t>(process) >= next_buffer_id_.size()) {
    next_buffer_id_.resize(process + 1, 0);
  }
  const uint64_t id = next_buffer_id_[process]++;
  layout_.buffers.push_back(BufferInfo{process, id, bytes, kind});
  return id;
}

int32_t LayoutBuilder::AddParam(const std::string& name, DType dtype, const Dims& shape) {
  // Index parameters that were appended through mutable_layout() since the last call.
  for (; indexed_params_ < layout_.params.size(); ++indexed_params_) {
    param_index_.try_emplace(layout_.params[indexed_params_].name,
                             static_cast<int32_t>(indexed_params_));
  }
  const auto [it, inserted] =
      param_index_.try_emplace(name, static_cast<int32_t>(layout_.params.size()));
  if (inserted) {
    layout_.params.push_back(ParamInfo{name, dtype, shape, ParamQuant{}, 0});
    ++indexed_params_;
  }
  return it->second;
}

void LayoutBuilder::AddPiece(int32_t param, int32_t process, uint64_t buffer, Box box,
                             int64_t offset, Dims strides) {
  layout_.pieces.push_back(
      Piece{param, process, buffer, std::move(box), offset, std::move(strides)});
}

int64_t LayoutBuilder::AddPackedPiece(int32_t param, int32_t process, uint64_t buffer,
                                      const Box& box, int64_t offset) {
  AddPiece(param, process, buffer, box, offset, RowMajorStrides(box.extent));
  return Volume(box);
}

int64_t LayoutBuilder::AddFusedPieces(const std::vector<std::pair<int32_t, Box>>& parts, int axis,
                                      int32_t process, uint64_t buffer, int64_t offset) {
  if (parts.empty()) return 0;
  Dims fused = parts.front().second.extent;
  fused[axis] = 0;
  for (const auto& [param, box] : parts) fused[axis] += box.extent[axis];
  const Dims strides = RowMajorStrides(fused);
  int64_t position = 0;  // Index along `axis` where the next part starts.
  for (const auto& [param, box] : parts) {
    AddPiece(param, process, buffer, box, offset + position * strides[axis], strides);
    position += box.extent[axis];
  }
  return Volume(fused);
}

void LayoutBuilder::AddFlatRange(int32_t param, int32_t process, uint64_t buffer, int64_t begin,
                                 int64_t end, int64_t offset) {
  const Dims& shape = layout_.params[param].shape;
  const Dims strides = RowMajorStrides(shape);
  for (FlatBox& flat : FlatRangeBoxes(shape, begin, end)) {
    AddPiece(param, process, buffer, std::move(flat.box), offset + flat.flat_offset, strides);
  }
}

}  // namespace wsync
