#include "executor/copy.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <map>
#include <vector>

#include "absl/container/inlined_vector.h"

namespace wsync {
namespace {

// One axis of a normalised copy. Strides are in bytes, so the bytes of an element form an axis of
// their own: {element_size, 1, 1}.
struct Axis {
  int64_t extent;
  int64_t dst_stride;
  int64_t src_stride;
};

// Outermost first, in the caller's axis order. Room for every axis a parameter may have plus the
// element's byte axis; a larger rank still works, from the heap.
using Axes = absl::InlinedVector<Axis, kMaxAxes + 1>;

// Builds the normalised axes of a copy: axes of extent 1 dropped, the element's bytes appended as
// the innermost axis, and each axis merged into the one inside it when it steps exactly over it on
// both sides. The innermost axis is then always contiguous on both sides (byte stride 1). Returns
// false when the region is empty (a zero extent, or element_size <= 0).
bool Normalize(const Dims& dst_strides, const Dims& src_strides, const Dims& shape,
               int64_t element_size, Axes* axes) {
  if (element_size <= 0) return false;
  for (int64_t extent : shape) {
    if (extent <= 0) return false;
  }
  axes->clear();
  for (size_t a = 0; a < shape.size(); ++a) {
    if (shape[a] == 1) continue;
    axes->push_back({shape[a], dst_strides[a] * element_size, src_strides[a] * element_size});
  }
  axes->push_back({element_size, 1, 1});
  // Merge from the inside out: an axis folds into merged.back(), the axis just inside it, when its
  // strides step exactly over all of that axis on both sides.
  Axes merged;
  for (int a = static_cast<int>(axes->size()) - 1; a >= 0; --a) {
    const Axis& axis = (*axes)[a];
    if (!merged.empty()) {
      Axis& inner = merged.back();
      if (axis.dst_stride == inner.extent * inner.dst_stride &&
          axis.src_stride == inner.extent * inner.src_stride) {
        inner.extent *= axis.extent;
        continue;
      }
    }
    merged.push_back(axis);
  }
  // `merged` is innermost first; restore outermost-first order.
  axes->assign(merged.rbegin(), merged.rend());
  return true;
}

// Calls row(dst + d, src + s) for every combination of indices of `outer[0, count)`, where d and s
// are the byte offsets of that combination. The innermost of these axes is a plain loop; the rest
// advance as an odometer (no recursion, no division).
template <typename Row>
void ForEachRow(const Axis* outer, int count, std::byte* dst, const std::byte* src, Row row) {
  if (count == 0) {
    row(dst, src);
    return;
  }
  const Axis inner = outer[count - 1];
  const int odometer_axes = count - 1;
  absl::InlinedVector<int64_t, kMaxAxes> index(odometer_axes, 0);
  int64_t dst_offset = 0;
  int64_t src_offset = 0;
  for (;;) {
    int64_t d = dst_offset;
    int64_t s = src_offset;
    for (int64_t i = 0; i < inner.extent; ++i) {
      row(dst + d, src + s);
      d += inner.dst_stride;
      s += inner.src_stride;
    }
    int a = odometer_axes - 1;
    for (; a >= 0; --a) {
      dst_offset += outer[a].dst_stride;
      src_offset += outer[a].src_stride;
      if (++index[a] < outer[a].extent) break;
      index[a] = 0;
      dst_offset -= outer[a].extent * outer[a].dst_stride;
      src_offset -= outer[a].extent * outer[a].src_stride;
    }
    if (a < 0) return;
  }
}

// Copies `count` elements of type T (a 1, 2, 4 or 8 byte unsigned integer standing for any element
// of that size) with byte strides; loads and stores go through memcpy, so any alignment and any
// element type is fine.
template <typename T>
void CopyElements(std::byte* dst, int64_t dst_stride, const std::byte* src, int64_t src_stride,
                  int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    T value;
    std::memcpy(&value, src, sizeof(T));
    std::memcpy(dst, &value, sizeof(T));
    dst += dst_stride;
    src += src_stride;
  }
}

// Copies the rows of `axes[0, count - 1)` where each row is the strided element axis
// axes[count - 1], with elements of type T.
template <typename T>
void CopyElementRows(const Axes& axes, std::byte* dst, const std::byte* src) {
  const int count = static_cast<int>(axes.size());
  const Axis row_axis = axes[count - 1];
  ForEachRow(axes.data(), count - 1, dst, src, [&](std::byte* d, const std::byte* s) {
    CopyElements<T>(d, row_axis.dst_stride, s, row_axis.src_stride, row_axis.extent);
  });
}

// Regions at least this large are copied with streaming (non-temporal) stores where rows are long
// enough: the destination will not be read from cache before it is evicted anyway, and streaming
// stores skip the read-for-ownership of every destination line, which is a third of the memory
// traffic of a cached copy. glibc's memcpy does the same for large single copies.
constexpr int64_t kStreamingRegionBytes = int64_t{4} << 20;
constexpr int64_t kStreamingRunBytes = 256;

#if defined(__SSE2__)
// Copies n bytes with 16-byte streaming stores (unaligned head and tail through memcpy). The caller
// issues _mm_sfence() before the destination is handed to another thread.
void StreamRun(std::byte* d, const std::byte* s, int64_t n) {
  const int64_t misaligned = static_cast<int64_t>(reinterpret_cast<uintptr_t>(d) & 15);
  if (misaligned != 0) {
    const int64_t head = std::min<int64_t>(n, 16 - misaligned);
    std::memcpy(d, s, static_cast<size_t>(head));
    d += head;
    s += head;
    n -= head;
  }
  for (; n >= 64; n -= 64, d += 64, s += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
  }
  for (; n >= 16; n -= 16, d += 16, s += 16) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(d),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
  }
  if (n > 0) std::memcpy(d, s, static_cast<size_t>(n));
}
#endif

// How the rows of a copy are moved: with streaming stores when `stream` and the run is long
// enough, with memcpy otherwise.
void CopyRun(std::byte* d, const std::byte* s, int64_t run, bool stream) {
#if defined(__SSE2__)
  if (stream && run >= kStreamingRunBytes) {
    StreamRun(d, s, run);
    return;
  }
#endif
  std::memcpy(d, s, static_cast<size_t>(run));
}

// Whether a region of `bytes` in total is written with streaming stores (rows permitting).
bool StreamsRegion(int64_t bytes) {
#if defined(__SSE2__)
  return bytes >= kStreamingRegionBytes;
#else
  return false;
#endif
}

// Makes streaming stores issued so far visible to other threads.
void FenceStreamingStores() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// Copies the normalised region `axes` (Normalize: not empty) of `bytes` in total.
void CopyNormalized(std::byte* dst_bytes, const std::byte* src_bytes, Axes& axes,
                    int64_t element_size, int64_t bytes) {
  const int count = static_cast<int>(axes.size());
  const int64_t run = axes[count - 1].extent;  // Bytes contiguous on both sides.

  if (count == 1) {
    // Fully contiguous on both sides (including rank 0): one memcpy.
    std::memcpy(dst_bytes, src_bytes, static_cast<size_t>(run));
    return;
  }
  if (run > element_size) {
    // The innermost axis of the region is contiguous on both sides: runs of whole rows.
    const bool stream = run >= kStreamingRunBytes && StreamsRegion(bytes);
    ForEachRow(axes.data(), count - 1, dst_bytes, src_bytes,
               [run, stream](std::byte* d, const std::byte* s) { CopyRun(d, s, run, stream); });
    if (stream) FenceStreamingStores();
    return;
  }
  // The innermost axis is strided on at least one side: drop the element's byte axis and copy
  // element by element along the (new) innermost axis.
  axes.pop_back();
  switch (element_size) {
    case 1:
      CopyElementRows<uint8_t>(axes, dst_bytes, src_bytes);
      return;
    case 2:
      CopyElementRows<uint16_t>(axes, dst_bytes, src_bytes);
      return;
    case 4:
      CopyElementRows<uint32_t>(axes, dst_bytes, src_bytes);
      return;
    case 8:
      CopyElementRows<uint64_t>(axes, dst_bytes, src_bytes);
      return;
    default: {
      const Axis row_axis = axes.back();
      const size_t size = static_cast<size_t>(element_size);
      ForEachRow(axes.data(), static_cast<int>(axes.size()) - 1, dst_bytes, src_bytes,
                 [&](std::byte* d, const std::byte* s) {
                   for (int64_t i = 0; i < row_axis.extent; ++i) {
                     std::memcpy(d, s, size);
                     d += row_axis.dst_stride;
                     s += row_axis.src_stride;
                   }
                 });
      return;
    }
  }
}

// A copy of a batch, normalised.
struct NormalizedCopy {
  std::byte* dst = nullptr;
  const std::byte* src = nullptr;
  Axes axes;
  int64_t element_size = 0;
  int64_t bytes = 0;
};

// Copies whose rows are at least this long may share a pass (CopyStridedBatch).
constexpr int64_t kSharedPassRunBytes = 64;

// Whether the rows of `copy` may share a pass with others: whole rows contiguous on both sides,
// at least kSharedPassRunBytes long, and more than one of them.
bool RowsMayShareAPass(const NormalizedCopy& copy) {
  const int count = static_cast<int>(copy.axes.size());
  if (count < 2) return false;
  const int64_t run = copy.axes[count - 1].extent;
  return run > copy.element_size && run >= kSharedPassRunBytes;
}

// The key under which copies may share a pass: the extents of their outer (row) axes, then the
// byte strides of those axes on the side they share (source when `by_source`, else destination).
std::vector<int64_t> SharedPassKey(const NormalizedCopy& copy, bool by_source) {
  std::vector<int64_t> key;
  const size_t outer = copy.axes.size() - 1;
  key.reserve(2 * outer + 1);
  key.push_back(by_source ? 0 : 1);
  for (size_t a = 0; a < outer; ++a) key.push_back(copy.axes[a].extent);
  for (size_t a = 0; a < outer; ++a) {
    key.push_back(by_source ? copy.axes[a].src_stride : copy.axes[a].dst_stride);
  }
  return key;
}

// Where `copy` starts on the shared side, and the byte stride of its rows there.
uintptr_t SharedStart(const NormalizedCopy& copy, bool by_source) {
  return reinterpret_cast<uintptr_t>(by_source ? static_cast<const void*>(copy.src)
                                               : static_cast<const void*>(copy.dst));
}
int64_t SharedRowStride(const NormalizedCopy& copy, bool by_source) {
  const Axis& rows = copy.axes[copy.axes.size() - 2];
  return by_source ? rows.src_stride : rows.dst_stride;
}

// Whether `b`, under the same SharedPassKey as `a`, starts in the same row as `a` on the shared
// side (and so covers the same rows: column blocks of one matrix). Rows must advance (stride > 0).
bool InSameRows(const NormalizedCopy& a, const NormalizedCopy& b, bool by_source) {
  const int64_t stride = SharedRowStride(a, by_source);
  const uintptr_t from = SharedStart(a, by_source);
  const uintptr_t to = SharedStart(b, by_source);
  const uintptr_t distance = from < to ? to - from : from - to;
  return stride > 0 && distance < static_cast<uintptr_t>(stride);
}

// Copies `copies[members]`, which have the same outer extents, in one pass over their rows: row i
// of every member, then row i + 1 of every member. Sibling column blocks of one matrix (the
// blocks of a row shard that go to different peers, or that come from different peers) thus read
// or write each row of the matrix once, sequentially, instead of once per block.
void CopyInOnePass(const std::vector<NormalizedCopy>& copies, const std::vector<size_t>& members) {
  std::vector<const NormalizedCopy*> group;
  for (size_t i : members) group.push_back(&copies[i]);
  const int outer = static_cast<int>(group[0]->axes.size()) - 1;
  int64_t bytes = 0;
  for (const NormalizedCopy* copy : group) bytes += copy->bytes;
  const bool stream = StreamsRegion(bytes);
  absl::InlinedVector<int64_t, kMaxAxes> index(outer, 0);
  absl::InlinedVector<int64_t, 4> dst_offset(group.size(), 0);
  absl::InlinedVector<int64_t, 4> src_offset(group.size(), 0);
  for (;;) {
    for (size_t m = 0; m < group.size(); ++m) {
      const NormalizedCopy& copy = *group[m];
      CopyRun(copy.dst + dst_offset[m], copy.src + src_offset[m], copy.axes[outer].extent, stream);
    }
    int a = outer - 1;
    for (; a >= 0; --a) {
      const bool wraps = ++index[a] == group[0]->axes[a].extent;
      if (wraps) index[a] = 0;
      for (size_t m = 0; m < group.size(); ++m) {
        const Axis& axis = group[m]->axes[a];
        dst_offset[m] += wraps ? (1 - axis.extent) * axis.dst_stride : axis.dst_stride;
        src_offset[m] += wraps ? (1 - axis.extent) * axis.src_stride : axis.src_stride;
      }
      if (!wraps) break;
    }
    if (a < 0) break;
  }
  if (stream) FenceStreamingStores();
}

// Normalises `copy`; false when it copies nothing.
bool NormalizeCopy(const StridedCopy& copy, NormalizedCopy* out) {
  out->dst = static_cast<std::byte*>(copy.dst);
  out->src = static_cast<const std::byte*>(copy.src);
  out->element_size = copy.element_size;
  if (!Normalize(copy.dst_strides, copy.src_strides, copy.shape, copy.element_size, &out->axes)) {
    return false;
  }
  out->bytes = Volume(copy.shape) * copy.element_size;
  return true;
}

}  // namespace

void CopyStrided(void* dst, const Dims& dst_strides, const void* src, const Dims& src_strides,
                 const Dims& shape, int64_t element_size) {
  Axes axes;
  if (!Normalize(dst_strides, src_strides, shape, element_size, &axes)) return;
  CopyNormalized(static_cast<std::byte*>(dst), static_cast<const std::byte*>(src), axes,
                 element_size, Volume(shape) * element_size);
}

void CopyStridedBatch(absl::Span<const StridedCopy> copies) {
  std::vector<NormalizedCopy> normalized(copies.size());
  size_t kept = 0;
  for (const StridedCopy& copy : copies) {
    if (NormalizeCopy(copy, &normalized[kept])) ++kept;
  }
  normalized.resize(kept);
  // Groups by shared source rows first (packs), then what is left by shared destination rows
  // (unpacks): copies under one SharedPassKey, sorted by where they start on the shared side,
  // each group the copies that start within one row of its first. A copy in no group of two or
  // more is copied on its own.
  std::vector<bool> done(normalized.size(), false);
  for (bool by_source : {true, false}) {
    std::map<std::vector<int64_t>, std::vector<size_t>> candidates;
    for (size_t i = 0; i < normalized.size(); ++i) {
      if (done[i] || !RowsMayShareAPass(normalized[i])) continue;
      candidates[SharedPassKey(normalized[i], by_source)].push_back(i);
    }
    for (auto& [key, members] : candidates) {
      std::sort(members.begin(), members.end(), [&](size_t a, size_t b) {
        return SharedStart(normalized[a], by_source) < SharedStart(normalized[b], by_source);
      });
      std::vector<size_t> group;
      auto flush = [&] {
        if (group.size() >= 2) {
          CopyInOnePass(normalized, group);
          for (size_t i : group) done[i] = true;
        }
        group.clear();
      };
      for (size_t i : members) {
        if (!group.empty() && !InSameRows(normalized[group[0]], normalized[i], by_source)) flush();
        group.push_back(i);
      }
      flush();
    }
  }
  for (size_t i = 0; i < normalized.size(); ++i) {
    if (done[i]) continue;
    NormalizedCopy& copy = normalized[i];
    CopyNormalized(copy.dst, copy.src, copy.axes, copy.element_size, copy.bytes);
  }
}

bool ShareAPass(const StridedCopy& a, const StridedCopy& b) {
  NormalizedCopy na, nb;
  if (!NormalizeCopy(a, &na) || !NormalizeCopy(b, &nb)) return false;
  if (!RowsMayShareAPass(na) || !RowsMayShareAPass(nb)) return false;
  for (bool by_source : {true, false}) {
    if (SharedPassKey(na, by_source) == SharedPassKey(nb, by_source) &&
        InSameRows(na, nb, by_source)) {
      return true;
    }
  }
  return false;
}

void PackRegion(void* packed, const void* src, const Dims& src_strides, const Dims& shape,
                int64_t element_size) {
  CopyStrided(packed, RowMajorStrides(shape), src, src_strides, shape, element_size);
}

void UnpackRegion(void* dst, const Dims& dst_strides, const void* packed, const Dims& shape,
                  int64_t element_size) {
  CopyStrided(dst, dst_strides, packed, RowMajorStrides(shape), shape, element_size);
}

}  // namespace wsync
