#ifndef WSYNC_EXECUTOR_COPY_H_
#define WSYNC_EXECUTOR_COPY_H_

// Host-memory strided copies: the pack, unpack and local-copy kernels of the executor.
// Pure functions over caller-owned memory; thread-safe for disjoint destinations.

#include <cstdint>

#include "absl/types/span.h"
#include "planner/geometry.h"

namespace wsync {

// Copies the region `shape` of elements of `element_size` bytes from `src` (element strides
// `src_strides`) to `dst` (element strides `dst_strides`). Axes of extent 1 are ignored, axes that
// are contiguous on both sides are merged, and runs contiguous on both sides go through memcpy;
// other runs are copied element by element with a loop specialised for sizes 1, 2, 4 and 8.
// The regions must not overlap. A shape with a zero extent copies nothing.
void CopyStrided(void* dst, const Dims& dst_strides, const void* src, const Dims& src_strides,
                 const Dims& shape, int64_t element_size);

// One copy of a batch: the arguments of CopyStrided. The memory is the caller's.
struct StridedCopy {
  void* dst = nullptr;
  Dims dst_strides;
  const void* src = nullptr;
  Dims src_strides;
  Dims shape;
  int64_t element_size = 0;
};

// Performs every copy of `copies`, each with the result CopyStrided gives it. No destination may
// overlap another destination or any source. Copies whose rows line up are interleaved row by row
// in one pass: those with whole rows contiguous on both sides (at least 64 bytes each), the same
// outer extents, and on the source side the same row strides and a start in the same row (sibling
// column blocks packed from one row shard), or else the same on the destination side (sibling
// column blocks unpacked into one row shard). Streaming stores are chosen by a group's total
// bytes, as CopyStrided chooses them by a region's. Every streaming store is fenced before the
// call returns.
void CopyStridedBatch(absl::Span<const StridedCopy> copies);

// Whether the rows of `a` and `b` line up as CopyStridedBatch requires to interleave them: given
// together (and no third copy that lines up with one of them differently), they share one pass.
bool ShareAPass(const StridedCopy& a, const StridedCopy& b);

// Packs the strided region at `src` into the row-major buffer `packed`.
void PackRegion(void* packed, const void* src, const Dims& src_strides, const Dims& shape,
                int64_t element_size);

// Unpacks the row-major buffer `packed` into the strided region at `dst`.
void UnpackRegion(void* dst, const Dims& dst_strides, const void* packed, const Dims& shape,
                  int64_t element_size);

}  // namespace wsync

#endif  // WSYNC_EXECUTOR_COPY_H_
