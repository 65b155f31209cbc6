#ifndef WSYNC_EXECUTOR_COPY_H_
#define WSYNC_EXECUTOR_COPY_H_

// Host-memory strided copies: the pack, unpack and local-copy kernels of the executor.
// Pure functions over caller-owned memory; thread-safe for disjoint destinations.

#include <cstdint>

#include "planner/geometry.h"

namespace wsync {

// Copies the region `shape` of elements of `element_size` bytes from `src` (element strides
// `src_strides`) to `dst` (element strides `dst_strides`). Axes of extent 1 are ignored, axes that
// are contiguous on both sides are merged, and runs contiguous on both sides go through memcpy;
// other runs are copied element by element with a loop specialised for sizes 1, 2, 4 and 8.
// The regions must not overlap. A shape with a zero extent copies nothing.
void CopyStrided(void* dst, const Dims& dst_strides, const void* src, const Dims& src_strides,
                 const Dims& shape, int64_t element_size);

// Packs the strided region at `src` into the row-major buffer `packed`.
void PackRegion(void* packed, const void* src, const Dims& src_strides, const Dims& shape,
                int64_t element_size);

// Unpacks the row-major buffer `packed` into the strided region at `dst`.
void UnpackRegion(void* dst, const Dims& dst_strides, const void* packed, const Dims& shape,
                  int64_t element_size);

}  // namespace wsync

#endif  // WSYNC_EXECUTOR_COPY_H_
