#ifndef WSYNC_PLANNER_LAYOUT_H_
#define WSYNC_PLANNER_LAYOUT_H_

// The in-memory form of one side's layout (the protobuf Manifest is its wire form; see
// manifest_codec.h). A layout lists the processes of one role, their buffers, the logical
// parameters, and the pieces that say which buffer holds which box of which parameter.
// Plain data: no invariants are enforced here; ValidateLayout checks them.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/dtype.h"
#include "common/memory_kind.h"
#include "planner/geometry.h"

namespace wsync {

enum class Role : uint8_t { kTrainer = 1, kRollout = 2 };

absl::string_view RoleName(Role role);  // "trainer", "rollout"

struct ProcessInfo {
  int32_t rank = 0;     // Rank within the role; ranks are 0..n-1.
  std::string node_id;  // Processes with equal node ids share a node (intra_node paths).
  // The process's GPU on its node (node-wide index, as nvidia-smi numbers them, not an ordinal
  // relative to CUDA_VISIBLE_DEVICES), or kUnknownDevice. Two processes of one node with equal
  // known devices share a GPU (path class same_device); unknown never shares.
  int32_t device = -1;
};

// ProcessInfo::device when the host did not say which GPU the process uses.
inline constexpr int32_t kUnknownDevice = -1;
// The largest ProcessInfo::device accepted (validation and manifest decoding refuse more).
inline constexpr int32_t kMaxDevice = 1 << 16;

// The buffer id of a relay process's arena in segment endpoints (planner/relay.h). Layout
// validation refuses it as a buffer id, so it never names a registered buffer.
inline constexpr uint64_t kRelayArenaBuffer = ~uint64_t{0};
// The buffer id of a receiver's quantization arena in quantization steps (plan.h QuantTransform);
// refused as a buffer id too.
inline constexpr uint64_t kQuantArenaBuffer = ~uint64_t{0} - 1;
// The buffer id of a sender's quantization staging (the e4m3 bytes and scales it quantized for
// sender-side steps; executor/quant_work.h) in the executor's segments; refused as a buffer id too.
inline constexpr uint64_t kQuantStagingBuffer = ~uint64_t{0} - 2;

struct BufferInfo {
  int32_t process = 0;  // Rank of the owning process within this layout.
  uint64_t id = 0;      // Unique within its process.
  int64_t bytes = 0;
  MemoryKind kind = MemoryKind::kHost;
};

// FP8 quantization of a rollout (target) parameter (issue 22; quant/fp8.h states the rules). A
// quantized parameter has dtype fp8_e4m3 and 2 axes ([rows, cols]) or 3 ([experts, rows, cols]);
// its fp32 scales are the parameter `scale_param` of the same layout, of shape
// QuantScaleShape(shape, block_rows, block_cols). The trainer holds the parameter in bf16 or fp32
// under the same name; the plan quantizes it (planner/quant_plan.h).
struct ParamQuant {
  int64_t block_rows = 0;  // Rows of a scale block; kWholeAxis (quant/fp8.h) for the whole axis.
  int64_t block_cols = 0;  // 0 (with block_rows 0): the parameter is not quantized.
  std::string scale_param;

  bool quantized() const { return block_rows > 0; }
  friend bool operator==(const ParamQuant&, const ParamQuant&) = default;
};

// Waves of a streamed sync (wsync.h, set_parameter_wave): ParamInfo::wave is in [0, kMaxWaves).
inline constexpr int32_t kMaxWaves = 4096;

struct ParamInfo {
  std::string name;
  DType dtype = DType::kBFloat16;
  Dims shape;  // At most kMaxAxes axes.
  ParamQuant quant;
  // The wave of a streamed sync that moves this rollout (target) parameter (planner/waves.h);
  // 0 for every trainer parameter and every quantized parameter or scale.
  int32_t wave = 0;
};

// "This buffer holds this box of this parameter": element `i` of the box lives at element address
// offset + sum_a (i[a] - box.origin[a]) * strides[a] of the buffer (in units of the dtype).
struct Piece {
  int32_t param = 0;    // Index into Layout::params.
  int32_t process = 0;  // Rank of the holding process.
  uint64_t buffer = 0;  // BufferInfo::id within that process.
  Box box;
  int64_t offset = 0;
  Dims strides;
};

struct Layout {
  Role role = Role::kTrainer;
  std::vector<ProcessInfo> processes;
  std::vector<BufferInfo> buffers;
  std::vector<ParamInfo> params;
  std::vector<Piece> pieces;

  // Total bytes of all pieces (counting each replica).
  int64_t PieceBytes() const;
};

}  // namespace wsync

#endif  // WSYNC_PLANNER_LAYOUT_H_
