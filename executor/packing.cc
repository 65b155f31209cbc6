#include "executor/packing.h"

#include <utility>

#include "common/status.h"

namespace wsync::executor_internal {

MessagePacker::MessagePacker(const Work& work, absl::Span<const Segment> segments,
                             EndpointAddress address, DeviceMemory* device)
    : work_(work), segments_(segments), address_(std::move(address)), device_(device) {}

absl::Status MessagePacker::AppendPack(const Lane& lane, const Message& message, char* slot,
                                       std::vector<StridedCopy>& host_batch) {
  char* cursor = slot;
  for (int32_t chunk_index : message.chunks) {
    const Chunk& chunk = work_.chunks[chunk_index];
    const Segment& s = segments_[chunk.segment];
    WSYNC_RETURN_IF_ERROR(CopyOrBatch({cursor, RowMajorStrides(chunk.shape),
                                       address_(s.from, chunk.from_offset, chunk.element_size),
                                       s.from.strides, chunk.shape, chunk.element_size},
                                      lane.kind, chunk.from_kind, host_batch));
    cursor += chunk.bytes;
  }
  return absl::OkStatus();
}

absl::Status MessagePacker::AppendUnpack(const Lane& lane, const Message& message, const char* slot,
                                         std::vector<StridedCopy>& host_batch) {
  const char* cursor = slot;
  for (int32_t chunk_index : message.chunks) {
    const Chunk& chunk = work_.chunks[chunk_index];
    const Segment& s = segments_[chunk.segment];
    WSYNC_RETURN_IF_ERROR(
        CopyOrBatch({address_(s.to, chunk.to_offset, chunk.element_size), s.to.strides, cursor,
                     RowMajorStrides(chunk.shape), chunk.shape, chunk.element_size},
                    chunk.to_kind, lane.kind, host_batch));
    cursor += chunk.bytes;
  }
  return absl::OkStatus();
}

absl::Status MessagePacker::Copy(void* dst, MemoryKind dst_kind, const Dims& dst_strides,
                                 const void* src, MemoryKind src_kind, const Dims& src_strides,
                                 const Dims& shape, int64_t element_size) {
  if (dst_kind == MemoryKind::kHost && src_kind == MemoryKind::kHost) {
    CopyStrided(dst, dst_strides, src, src_strides, shape, element_size);
    return absl::OkStatus();
  }
  device_pending_ = true;
  return device_->CopyStridedAsync(dst, dst_strides, src, src_strides, shape, element_size);
}

absl::Status MessagePacker::CopyOrBatch(const StridedCopy& copy, MemoryKind dst_kind,
                                        MemoryKind src_kind, std::vector<StridedCopy>& host_batch) {
  if (dst_kind == MemoryKind::kHost && src_kind == MemoryKind::kHost) {
    host_batch.push_back(copy);
    return absl::OkStatus();
  }
  return Copy(copy.dst, dst_kind, copy.dst_strides, copy.src, src_kind, copy.src_strides,
              copy.shape, copy.element_size);
}

absl::Status MessagePacker::Synchronize(absl::Time deadline) {
  if (!device_pending_) return absl::OkStatus();
  device_pending_ = false;
  return device_->Synchronize(deadline);
}

}  // namespace wsync::executor_internal
