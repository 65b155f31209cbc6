#ifndef WSYNC_PLANNER_PACKED_BUFFERS_H_
#define WSYNC_PLANNER_PACKED_BUFFERS_H_

// The trainers' packed buffers of the named layouts (named_layouts.h): internal to the planner.

#include <array>
#include <cstdint>

#include "common/dtype.h"
#include "planner/builders.h"
#include "planner/geometry.h"
#include "planner/layout.h"

namespace wsync {

// Per process: one buffer per dtype, created on first use, with pieces packed back to back (the
// megatron and fsdp layouts). Not thread-safe; the builder must outlive it.
class PackedBuffers {
 public:
  PackedBuffers(LayoutBuilder& builder, MemoryKind kind) : builder_(builder), kind_(kind) {}

  // Starts a process; its buffers are created as dtypes appear.
  void Begin(int32_t process) {
    Finish();
    process_ = process;
  }

  // Places `box` of `param` at the next free element of the process's `dtype` buffer, reserving
  // `reserved` elements (>= the box's volume) for it.
  void Place(int32_t param, DType dtype, const Box& box, int64_t reserved) {
    Slot& slot = SlotFor(dtype);
    if (Volume(box) > 0) builder_.AddPackedPiece(param, process_, slot.id, box, slot.elements);
    slot.elements += reserved;
  }

  // Places the row-major flat range [begin, end) of `param` at the next free element of the
  // process's `dtype` buffer, reserving `reserved` elements (>= end - begin) for it.
  void PlaceFlat(int32_t param, DType dtype, int64_t begin, int64_t end, int64_t reserved) {
    Slot& slot = SlotFor(dtype);
    builder_.AddFlatRange(param, process_, slot.id, begin, end, slot.elements);
    slot.elements += reserved;
  }

  // Sets the byte sizes of the current process's buffers and forgets them.
  void Finish() {
    for (size_t d = 0; d < slots_.size(); ++d) {
      if (slots_[d].buffer_index < 0) continue;
      builder_.mutable_layout().buffers[slots_[d].buffer_index].bytes =
          slots_[d].elements * DTypeSize(static_cast<DType>(d));
    }
    slots_.fill(Slot{});
  }

 private:
  struct Slot {
    int64_t buffer_index = -1;  // Index into Layout::buffers.
    uint64_t id = 0;
    int64_t elements = 0;
  };

  Slot& SlotFor(DType dtype) {
    Slot& slot = slots_[static_cast<size_t>(dtype)];
    if (slot.buffer_index < 0) {
      slot.buffer_index = static_cast<int64_t>(builder_.layout().buffers.size());
      slot.id = builder_.AddBuffer(process_, 0, kind_);
    }
    return slot;
  }
  LayoutBuilder& builder_;
  MemoryKind kind_;
  int32_t process_ = 0;
  std::array<Slot, 9> slots_;  // Indexed by DType's value (1..8).
};

}  // namespace wsync

#endif  // WSYNC_PLANNER_PACKED_BUFFERS_H_
