// The local layout builder (local_layout.h): a process's buffers, parameters, pieces, manifest or
// named layout, waves and rebound addresses before and after connect.

#include "plugin/local_layout.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/status.h"
#include "planner/layout_parts.h"
#include "planner/manifest_codec.h"
#include "planner/models.h"
#include "planner/named_layouts.h"
#include "planner/quant_layout.h"
#include "quant/fp8.h"

namespace wsync {
namespace {

// This process's GPU from what the host configured and what its layout says (kUnknownDevice:
// not said). InvalidArgument when both say and differ.
absl::StatusOr<int32_t> JoinDevice(int32_t configured, int32_t from_layout,
                                   absl::string_view call) {
  if (from_layout == kUnknownDevice) return configured;
  if (configured != kUnknownDevice && configured != from_layout) {
    return absl::InvalidArgumentError(absl::StrCat(call, ": the layout puts this process on GPU ",
                                                   from_layout, "; device_index is ", configured));
  }
  return from_layout;
}

// "128 x 128", "1 x all columns", "the whole matrix" for a ParamQuant's blocks.
std::string BlockText(const ParamQuant& quant) {
  if (quant.block_rows == wsync::quant::kWholeAxis &&
      quant.block_cols == wsync::quant::kWholeAxis) {
    return "the whole matrix";
  }
  const auto axis = [](int64_t block, absl::string_view whole) {
    return block == wsync::quant::kWholeAxis ? std::string(whole) : absl::StrCat(block);
  };
  return absl::StrCat(axis(quant.block_rows, "all rows"), " x ",
                      axis(quant.block_cols, "all columns"));
}

}  // namespace

LocalLayoutBuilder::LocalLayoutBuilder(Role role, int32_t rank, std::string node_id, int32_t device)
    : role_(role), rank_(rank), device_(device), node_id_(std::move(node_id)) {
  part_.role = role_;
  part_.processes.push_back(ProcessInfo{rank_, node_id_, device_});
}

absl::Status LocalLayoutBuilder::RegisterBuffer(uint64_t id, void* address, int64_t bytes,
                                                MemoryKind kind, int32_t device) {
  if (address == nullptr && bytes > 0) {
    return absl::InvalidArgumentError(absl::StrCat("buffer ", id, " has no address"));
  }
  if (kind == MemoryKind::kCuda) {
    // Carried by NCCL (plugin/cuda_setup.h); a build or machine that cannot is refused at connect.
    if (device < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("CUDA buffer ", id, " needs a device ordinal, not ", device));
    }
    if (cuda_device_ >= 0 && cuda_device_ != device) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CUDA buffer ", id, " is on device ", device, " but this process's CUDA buffers are on ",
          "device ", cuda_device_, "; one process uses one device"));
    }
  } else if (kind != MemoryKind::kHost) {
    return absl::InvalidArgumentError(
        absl::StrCat("buffer ", id, " has an unknown memory kind ", static_cast<int>(kind)));
  }
  for (const BufferInfo& buffer : part_.buffers) {
    if (buffer.id == id) {
      return absl::InvalidArgumentError(absl::StrCat("buffer ", id, " is registered twice"));
    }
  }
  part_.buffers.push_back(BufferInfo{rank_, id, bytes, kind});
  buffer_addresses_.push_back(address);
  if (kind == MemoryKind::kCuda) cuda_device_ = device;
  return absl::OkStatus();
}

absl::Status LocalLayoutBuilder::DeclareParameter(const std::string& name, DType dtype,
                                                  const Dims& shape) {
  for (const ParamInfo& param : part_.params) {
    if (param.name == name) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", name, "' is declared twice"));
    }
  }
  part_.params.push_back(ParamInfo{name, dtype, shape, ParamQuant{}, 0});
  return absl::OkStatus();
}

absl::Status LocalLayoutBuilder::DeclareFp8Parameter(const std::string& name,
                                                     const ParamQuant& quant, DType scale_dtype,
                                                     const Dims& scale_shape) {
  const auto refuse = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("FP8 parameter '", name, "': ", why));
  };
  if (role_ != Role::kRollout) {
    return refuse(
        "a trainer holds its parameters unquantized (bf16 or fp32); FP8 parameters are rollout "
        "targets, which the sync quantizes");
  }
  ParamInfo* param = nullptr;
  for (ParamInfo& declared : part_.params) {
    if (declared.name == name) param = &declared;
    if (declared.name == quant.scale_param) {
      return refuse(absl::StrCat("its scale tensor '", quant.scale_param,
                                 "' is already declared as a parameter"));
    }
    if (declared.quant.scale_param == name) {
      return refuse(absl::StrCat("it is the scale tensor of '", declared.name, "'"));
    }
  }
  if (param == nullptr) return refuse("not declared (declare_parameter it as fp8_e4m3 first)");
  if (param->quant.quantized()) return refuse("declared FP8 twice");
  if (param->dtype != DType::kFloat8E4M3) {
    return refuse(absl::StrCat("declared as ", DTypeName(param->dtype), ", not fp8_e4m3"));
  }
  const int rank = static_cast<int>(param->shape.size());
  if (rank != 2 && rank != 3) {
    return refuse(absl::StrCat("has ", rank,
                               " axes; FP8 parameters have 2 ([rows, cols]) or 3 ([experts, "
                               "rows, cols])"));
  }
  if (quant.block_rows < 1 || quant.block_cols < 1) {
    return refuse(absl::StrCat("blocks of ", quant.block_rows, " x ", quant.block_cols,
                               " elements; both must be at least 1"));
  }
  if (quant.scale_param.empty() || quant.scale_param == name) {
    return refuse("its scale tensor needs a name of its own");
  }
  if (scale_dtype != DType::kFloat32) {
    return refuse(absl::StrCat("its scale tensor '", quant.scale_param, "' is ",
                               DTypeName(scale_dtype), "; scales are fp32"));
  }
  const Dims expected = QuantScaleShape(param->shape, QuantBlockDims(quant, rank));
  if (scale_shape != expected) {
    return refuse(absl::StrCat("its scale tensor '", quant.scale_param, "' has shape ",
                               DimsToString(scale_shape), "; blocks of ", BlockText(quant),
                               " over ", DimsToString(param->shape), " need ",
                               DimsToString(expected)));
  }
  param->quant = quant;
  part_.params.push_back(
      ParamInfo{quant.scale_param, DType::kFloat32, scale_shape, ParamQuant{}, 0});
  return absl::OkStatus();
}

absl::Status LocalLayoutBuilder::DeclarePiece(const std::string& parameter, uint64_t buffer,
                                              const Box& box, int64_t offset, const Dims& strides) {
  for (int32_t p = 0; p < static_cast<int32_t>(part_.params.size()); ++p) {
    if (part_.params[p].name == parameter) {
      part_.pieces.push_back(Piece{p, rank_, buffer, box, offset, strides});
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("piece of undeclared parameter '", parameter, "'"));
}

absl::Status LocalLayoutBuilder::SetManifest(absl::string_view bytes) {
  WSYNC_ASSIGN_OR_RETURN(Layout layout, ParseLayout(bytes));
  if (layout.role != role_) {
    return absl::InvalidArgumentError(absl::StrCat("the manifest is a ", RoleName(layout.role),
                                                   " layout; this process is a ", RoleName(role_)));
  }
  Layout part = LayoutPart(layout, rank_);
  // The manifest's device of this rank, when it gives one; the node is always node_id.
  WSYNC_ASSIGN_OR_RETURN(
      const int32_t device,
      JoinDevice(device_, part.processes.empty() ? kUnknownDevice : part.processes[0].device,
                 "set_manifest"));
  part.processes = {ProcessInfo{rank_, node_id_, device}};
  part.buffers = part_.buffers;  // Addresses were (or will be) registered separately.
  part_ = std::move(part);
  return absl::OkStatus();
}

absl::Status LocalLayoutBuilder::SetNamedLayout(const std::string& model,
                                                const std::string& layout) {
  WSYNC_ASSIGN_OR_RETURN(ModelSpec spec, GetModel(model));
  WSYNC_ASSIGN_OR_RETURN(const NamedPlacement placement, ParseNamedPlacement(layout));
  WSYNC_ASSIGN_OR_RETURN(Layout whole, BuildNamedLayout(spec, layout));
  if (whole.role != role_) {
    return absl::InvalidArgumentError(absl::StrCat("'", layout, "' is a ", RoleName(whole.role),
                                                   " layout; this process is a ", RoleName(role_)));
  }
  Layout part = LayoutPart(whole, rank_);
  if (part.processes.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", layout, "' has no ", RoleName(role_), " rank ", rank_));
  }
  if (placement.procs_per_node.has_value() || placement.colocated.has_value()) {
    // Placed as the spec says (node and, colocated, GPU), as `wsync plan` places this rank.
    WSYNC_ASSIGN_OR_RETURN(part.processes[0].device,
                           JoinDevice(device_, part.processes[0].device, "set_named_layout"));
    node_id_ = part.processes[0].node_id;
  } else {
    part.processes = {ProcessInfo{rank_, node_id_, device_}};
  }
  part.buffers = part_.buffers;
  part_ = std::move(part);
  return absl::OkStatus();
}

absl::Status LocalLayoutBuilder::SetParameterWave(const std::string& name, int32_t wave) {
  const auto refuse = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("parameter '", name, "': ", why));
  };
  if (role_ != Role::kRollout) {
    return refuse("waves are the rollouts' (a trainer sends what each wave needs)");
  }
  if (wave < 0 || wave >= kMaxWaves) {
    return refuse(absl::StrCat("wave ", wave, " is outside [0, ", kMaxWaves, ")"));
  }
  ParamInfo* param = nullptr;
  for (ParamInfo& declared : part_.params) {
    if (declared.name == name) param = &declared;
    if (declared.quant.scale_param == name && wave != 0) {
      return refuse(absl::StrCat("it holds the scales of FP8 parameter '", declared.name,
                                 "'; quantized parameters and scales stay in wave 0"));
    }
  }
  if (param == nullptr) return refuse("not declared");
  if (param->quant.quantized() && wave != 0) {
    return refuse("it is FP8-quantized; quantized parameters and scales stay in wave 0");
  }
  param->wave = wave;
  return absl::OkStatus();
}

absl::Status LocalLayoutBuilder::RebindAddress(uint64_t id, void* address) {
  for (size_t b = 0; b < part_.buffers.size(); ++b) {
    if (part_.buffers[b].id == id) {
      buffer_addresses_[b] = address;
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("buffer ", id, " was never registered"));
}

}  // namespace wsync
