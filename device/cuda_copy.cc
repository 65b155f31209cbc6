#include "device/cuda_copy.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "device/cuda_copy_kernel.h"

namespace wsync {
namespace {

struct Axis {
  int64_t extent;
  int64_t dst_stride;  // Elements.
  int64_t src_stride;
};

// The copy as: `outer` axes iterated on the host, each step one 2-D copy of `height` rows of
// `width` bytes with byte pitches `dst_pitch` / `src_pitch`.
struct Plan2D {
  bool empty = false;
  std::vector<Axis> outer;
  int64_t width = 0;
  int64_t height = 1;
  int64_t dst_pitch = 0;
  int64_t src_pitch = 0;
};

absl::StatusOr<Plan2D> MakePlan(absl::Span<const int64_t> dst_strides,
                                absl::Span<const int64_t> src_strides,
                                absl::Span<const int64_t> shape, int64_t element_size) {
  if (dst_strides.size() != shape.size() || src_strides.size() != shape.size()) {
    return absl::InvalidArgumentError(absl::StrCat("strided copy of ", shape.size(), " axes with ",
                                                   dst_strides.size(), " and ", src_strides.size(),
                                                   " strides"));
  }
  if (element_size <= 0) return absl::InvalidArgumentError("element size must be positive");
  Plan2D plan;
  std::vector<Axis> axes;  // Outermost first, extent > 1, merged where contiguous on both sides.
  for (size_t a = 0; a < shape.size(); ++a) {
    if (shape[a] < 0) return absl::InvalidArgumentError("negative extent");
    if (shape[a] == 0) {
      plan.empty = true;
      return plan;
    }
    if (shape[a] == 1) continue;
    Axis axis{shape[a], dst_strides[a], src_strides[a]};
    axes.push_back(axis);
  }
  std::vector<Axis> merged;
  for (const Axis& axis : axes) {
    if (!merged.empty()) {
      Axis& prev = merged.back();
      // prev is outer to axis: merge when prev steps exactly over the whole of axis on both sides.
      if (prev.dst_stride == axis.dst_stride * axis.extent &&
          prev.src_stride == axis.src_stride * axis.extent) {
        prev = Axis{prev.extent * axis.extent, axis.dst_stride, axis.src_stride};
        continue;
      }
    }
    merged.push_back(axis);
  }
  plan.width = element_size;
  plan.dst_pitch = element_size;
  plan.src_pitch = element_size;
  if (merged.empty()) return plan;  // One element.
  Axis inner = merged.back();
  if (inner.dst_stride == 1 && inner.src_stride == 1) {
    plan.width = inner.extent * element_size;
    plan.dst_pitch = plan.width;
    plan.src_pitch = plan.width;
    merged.pop_back();
    if (merged.empty()) return plan;
    inner = merged.back();
  }
  // `inner` becomes the rows when its pitches are at least the width (what cudaMemcpy2D needs).
  if (inner.dst_stride * element_size >= plan.width &&
      inner.src_stride * element_size >= plan.width) {
    plan.height = inner.extent;
    plan.dst_pitch = inner.dst_stride * element_size;
    plan.src_pitch = inner.src_stride * element_size;
    merged.pop_back();
  }
  plan.outer = std::move(merged);
  return plan;
}

}  // namespace

int64_t CountCopies2D(absl::Span<const int64_t> dst_strides, absl::Span<const int64_t> src_strides,
                      absl::Span<const int64_t> shape, int64_t element_size) {
  absl::StatusOr<Plan2D> plan = MakePlan(dst_strides, src_strides, shape, element_size);
  if (!plan.ok() || plan->empty) return 0;
  int64_t count = 1;
  for (const Axis& axis : plan->outer) count *= axis.extent;
  return count;
}

namespace {
bool BothOnDevice(NcclApi& api, const void* dst, const void* src) {
  absl::StatusOr<MemoryKind> dst_kind = api.PointerKind(dst);
  absl::StatusOr<MemoryKind> src_kind = api.PointerKind(src);
  return dst_kind.ok() && src_kind.ok() && *dst_kind == MemoryKind::kCuda &&
         *src_kind == MemoryKind::kCuda;
}
}  // namespace

absl::Status CopyStridedAsync(NcclApi& api, CudaStream stream, void* dst,
                              absl::Span<const int64_t> dst_strides, const void* src,
                              absl::Span<const int64_t> src_strides,
                              absl::Span<const int64_t> shape, int64_t element_size) {
  WSYNC_ASSIGN_OR_RETURN(Plan2D plan, MakePlan(dst_strides, src_strides, shape, element_size));
  if (plan.empty) return absl::OkStatus();
  int64_t copies = 1;
  for (const Axis& axis : plan.outer) copies *= axis.extent;
  // The kernel only between device pointers: it cannot reach pageable host memory, which
  // cudaMemcpy2DAsync copies through the copy engines.
  if (api.HasCopyKernel() && copies > kMaxCopies2D && shape.size() <= kMaxKernelAxes &&
      (element_size == 1 || element_size == 2 || element_size == 4 || element_size == 8) &&
      BothOnDevice(api, dst, src)) {
    return api.CopyKernelAsync(dst, dst_strides, src, src_strides, shape, element_size, stream);
  }
  std::vector<int64_t> index(plan.outer.size(), 0);
  auto* dst_bytes = static_cast<char*>(dst);
  const auto* src_bytes = static_cast<const char*>(src);
  while (true) {
    int64_t dst_offset = 0;
    int64_t src_offset = 0;
    for (size_t a = 0; a < plan.outer.size(); ++a) {
      dst_offset += index[a] * plan.outer[a].dst_stride * element_size;
      src_offset += index[a] * plan.outer[a].src_stride * element_size;
    }
    WSYNC_RETURN_IF_ERROR(api.Memcpy2DAsync(
        dst_bytes + dst_offset, static_cast<size_t>(plan.dst_pitch), src_bytes + src_offset,
        static_cast<size_t>(plan.src_pitch), static_cast<size_t>(plan.width),
        static_cast<size_t>(plan.height), stream));
    // Next outer index, innermost outer axis fastest.
    int a = static_cast<int>(plan.outer.size()) - 1;
    for (; a >= 0; --a) {
      if (++index[a] < plan.outer[a].extent) break;
      index[a] = 0;
    }
    if (a < 0) return absl::OkStatus();
  }
}

namespace {
std::vector<int64_t> RowMajor(absl::Span<const int64_t> shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int a = static_cast<int>(shape.size()) - 2; a >= 0; --a) {
    strides[a] = strides[a + 1] * shape[a + 1];
  }
  return strides;
}
}  // namespace

absl::Status PackRegionAsync(NcclApi& api, CudaStream stream, void* packed, const void* src,
                             absl::Span<const int64_t> src_strides, absl::Span<const int64_t> shape,
                             int64_t element_size) {
  return CopyStridedAsync(api, stream, packed, RowMajor(shape), src, src_strides, shape,
                          element_size);
}

absl::Status UnpackRegionAsync(NcclApi& api, CudaStream stream, void* dst,
                               absl::Span<const int64_t> dst_strides, const void* packed,
                               absl::Span<const int64_t> shape, int64_t element_size) {
  return CopyStridedAsync(api, stream, dst, dst_strides, packed, RowMajor(shape), shape,
                          element_size);
}

}  // namespace wsync
