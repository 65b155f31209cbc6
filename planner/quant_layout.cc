#include "planner/quant_layout.h"

#include <map>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/dtype.h"
#include "common/status.h"
#include "planner/region_overlap.h"
#include "quant/fp8.h"

namespace wsync {

Dims QuantBlockDims(const ParamQuant& quant, int rank) {
  Dims blocks(rank, 1);
  if (rank >= 2) {
    blocks[rank - 2] = quant.block_rows;
    blocks[rank - 1] = quant.block_cols;
  }
  return blocks;
}

Dims QuantScaleShape(const Dims& shape, const Dims& blocks) {
  Dims scales(shape.size());
  for (size_t a = 0; a < shape.size(); ++a) scales[a] = quant::BlockCount(blocks[a], shape[a]);
  return scales;
}

namespace {

// `box` with each axis mapped by fn(blocks[a], shape[a], range of the axis).
Box MapAxes(const Dims& blocks, const Dims& shape, const Box& box,
            quant::AxisRange (*fn)(int64_t, int64_t, quant::AxisRange)) {
  Box mapped = box;
  for (int a = 0; a < box.rank(); ++a) {
    const quant::AxisRange range = fn(blocks[a], shape[a], {box.origin[a], box.extent[a]});
    mapped.origin[a] = range.origin;
    mapped.extent[a] = range.extent;
  }
  return mapped;
}

}  // namespace

Box WholeBlockBox(const Dims& blocks, const Dims& shape, const Box& box) {
  return MapAxes(blocks, shape, box, &quant::WholeBlocks);
}

bool IsWholeBlockBox(const Dims& blocks, const Dims& shape, const Box& box) {
  return WholeBlockBox(blocks, shape, box) == box;
}

Box ScaleBox(const Dims& blocks, const Dims& shape, const Box& whole) {
  return MapAxes(blocks, shape, whole, &quant::ScaleRange);
}

QuantLinks LinkQuantParams(const Layout& layout) {
  QuantLinks links;
  links.scale_of.assign(layout.params.size(), -1);
  links.quantized_of.assign(layout.params.size(), -1);
  absl::flat_hash_map<absl::string_view, int32_t> index;
  for (int32_t i = 0; i < static_cast<int32_t>(layout.params.size()); ++i) {
    index.emplace(layout.params[i].name, i);
  }
  for (int32_t q = 0; q < static_cast<int32_t>(layout.params.size()); ++q) {
    if (!layout.params[q].quant.quantized()) continue;
    auto it = index.find(layout.params[q].quant.scale_param);
    if (it == index.end()) continue;
    links.scale_of[q] = it->second;
    links.quantized_of[it->second] = q;
  }
  return links;
}

namespace {

absl::Status CheckQuantParam(const Layout& layout, int32_t q,
                             const absl::flat_hash_map<absl::string_view, int32_t>& index,
                             std::vector<int32_t>& scaled_by) {
  const ParamInfo& param = layout.params[q];
  const std::string where = absl::StrCat("quantized parameter '", param.name, "'");
  if (layout.role != Role::kRollout) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " in a ", RoleName(layout.role),
                     " layout: only rollout layouts quantize (the trainer sends its weights)"));
  }
  const int rank = static_cast<int>(param.shape.size());
  if (param.dtype != DType::kFloat8E4M3 || rank < 2 || rank > 3 || param.quant.block_cols <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " is ", DTypeName(param.dtype), DimsToString(param.shape),
                     " with blocks ", param.quant.block_rows, "x", param.quant.block_cols,
                     "; expected fp8_e4m3 of 2 or 3 axes and blocks of at least 1x1"));
  }
  auto it = index.find(param.quant.scale_param);
  if (it == index.end() || it->second == q) {
    return absl::InvalidArgumentError(absl::StrCat(where, " names scale parameter '",
                                                   param.quant.scale_param,
                                                   "', which the layout does not declare"));
  }
  const ParamInfo& scale = layout.params[it->second];
  const Dims expected = QuantScaleShape(param.shape, QuantBlockDims(param.quant, rank));
  if (scale.quant.quantized() || scale.dtype != DType::kFloat32 || scale.shape != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": its scale parameter '", scale.name, "' is ", DTypeName(scale.dtype),
                     DimsToString(scale.shape), ", expected fp32", DimsToString(expected),
                     scale.quant.quantized() ? " and unquantized" : ""));
  }
  if (scaled_by[it->second] >= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("scale parameter '", scale.name, "' scales both '",
                     layout.params[scaled_by[it->second]].name, "' and '", param.name, "'"));
  }
  scaled_by[it->second] = q;
  return absl::OkStatus();
}

// The pieces of one quantized parameter and of its scale parameter on one process.
struct ProcessQuantPieces {
  std::vector<int32_t> values;
  std::vector<int32_t> scales;
};

absl::Status CheckProcessPieces(const Layout& layout, int32_t q, int32_t process,
                                const ProcessQuantPieces& pieces, int64_t& budget) {
  const ParamInfo& param = layout.params[q];
  const Dims blocks = QuantBlockDims(param.quant, static_cast<int>(param.shape.size()));
  const std::string where = absl::StrCat("quantized parameter '", param.name, "' on ",
                                         RoleName(layout.role), " process ", process);
  std::vector<Box> wholes;
  int64_t scale_volume = 0;
  for (int32_t v : pieces.values) {
    const Box whole = WholeBlockBox(blocks, param.shape, layout.pieces[v].box);
    const Box scale = ScaleBox(blocks, param.shape, whole);
    bool held = false;
    for (int32_t s : pieces.scales) held = held || Contains(layout.pieces[s].box, scale);
    if (!held) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": piece ", BoxToString(layout.pieces[v].box), " needs the scales ",
                       BoxToString(scale), " in one scale piece of its process; none holds them"));
    }
    scale_volume += Volume(scale);
    wholes.push_back(whole);
  }
  int64_t held_volume = 0;
  for (int32_t s : pieces.scales) held_volume += Volume(layout.pieces[s].box);
  if (held_volume != scale_volume) {
    return absl::InvalidArgumentError(absl::StrCat(where, " holds ", held_volume,
                                                   " scale elements for the ", scale_volume,
                                                   " its pieces' blocks have"));
  }
  const OverlapResult overlap = FindBoxOverlap(wholes, budget);
  budget -= overlap.steps;
  if (overlap.too_complex || overlap.overlap) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, overlap.too_complex ? " has too many pieces to check within the work budget"
                                   : " has two pieces that share a scale block"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateQuantParams(const Layout& layout) {
  absl::flat_hash_map<absl::string_view, int32_t> index;
  for (int32_t i = 0; i < static_cast<int32_t>(layout.params.size()); ++i) {
    index.emplace(layout.params[i].name, i);
  }
  std::vector<int32_t> scaled_by(layout.params.size(), -1);
  bool any = false;
  for (int32_t q = 0; q < static_cast<int32_t>(layout.params.size()); ++q) {
    const ParamQuant& quant = layout.params[q].quant;
    if (!quant.quantized()) {
      if (quant.block_cols != 0 || !quant.scale_param.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("parameter '", layout.params[q].name,
                         "' has a partial quantization (block rows ", quant.block_rows,
                         ", block cols ", quant.block_cols, ", scale '", quant.scale_param, "')"));
      }
      continue;
    }
    any = true;
    WSYNC_RETURN_IF_ERROR(CheckQuantParam(layout, q, index, scaled_by));
  }
  if (!any) return absl::OkStatus();
  // (quantized parameter, process) -> its pieces and its scale pieces there.
  std::map<std::pair<int32_t, int32_t>, ProcessQuantPieces> by_process;
  for (int32_t i = 0; i < static_cast<int32_t>(layout.pieces.size()); ++i) {
    const Piece& piece = layout.pieces[i];
    if (Volume(piece.box) == 0) continue;
    if (layout.params[piece.param].quant.quantized()) {
      by_process[{piece.param, piece.process}].values.push_back(i);
    } else if (scaled_by[piece.param] >= 0) {
      by_process[{scaled_by[piece.param], piece.process}].scales.push_back(i);
    }
  }
  int64_t budget = kOverlapWorkBudget;
  for (const auto& [key, pieces] : by_process) {
    WSYNC_RETURN_IF_ERROR(CheckProcessPieces(layout, key.first, key.second, pieces, budget));
  }
  return absl::OkStatus();
}

absl::Status CheckPairedParams(const ParamInfo& source, const ParamInfo& target) {
  const bool quantized = target.quant.quantized();
  const bool dtype_ok = quantized
                            ? (source.dtype == DType::kBFloat16 || source.dtype == DType::kFloat32)
                            : source.dtype == target.dtype;
  if (dtype_ok && source.shape == target.shape) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "parameter '", target.name, "' is ", DTypeName(source.dtype), DimsToString(source.shape),
      " in the trainer layout but ", DTypeName(target.dtype), DimsToString(target.shape),
      quantized ? " (quantized, from bf16 or fp32 of the same shape)" : "",
      " in the rollout layout"));
}

}  // namespace wsync
