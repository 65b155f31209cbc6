#include "planner/layout_parts.h"

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "quant/fp8.h"

namespace wsync {
namespace {

// "not quantized" or "fp8_e4m3 blocks 128 x 128, scales 'w_scale_inv'" (kWholeAxis: "all").
std::string QuantText(const ParamQuant& quant) {
  if (!quant.quantized()) return "not quantized";
  const auto axis = [](int64_t block) {
    return block == wsync::quant::kWholeAxis ? std::string("all") : absl::StrCat(block);
  };
  return absl::StrCat("fp8_e4m3 blocks ", axis(quant.block_rows), " x ", axis(quant.block_cols),
                      ", scales '", quant.scale_param, "'");
}

}  // namespace

Layout LayoutPart(const Layout& layout, int32_t rank) {
  Layout part;
  part.role = layout.role;
  part.params = layout.params;
  for (const ProcessInfo& process : layout.processes) {
    if (process.rank == rank) part.processes.push_back(process);
  }
  for (const BufferInfo& buffer : layout.buffers) {
    if (buffer.process == rank) part.buffers.push_back(buffer);
  }
  for (const Piece& piece : layout.pieces) {
    if (piece.process == rank) part.pieces.push_back(piece);
  }
  return part;
}

absl::StatusOr<Layout> MergeLayoutParts(absl::Span<const Layout> parts) {
  Layout merged;
  if (parts.empty()) return merged;
  merged.role = parts[0].role;
  absl::flat_hash_map<std::string, int32_t> index;
  std::vector<int32_t> owner;  // Part that first declared each merged parameter.
  for (size_t i = 0; i < parts.size(); ++i) {
    const Layout& part = parts[i];
    if (part.role != merged.role) {
      return absl::InvalidArgumentError(absl::StrCat("part ", i, " is a ", RoleName(part.role),
                                                     " layout, part 0 a ", RoleName(merged.role),
                                                     " layout"));
    }
    if (part.processes.size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat("part ", i, " lists ", part.processes.size(),
                                                     " processes instead of its own"));
    }
    std::vector<int32_t> remap(part.params.size());
    for (size_t p = 0; p < part.params.size(); ++p) {
      const ParamInfo& param = part.params[p];
      auto [it, inserted] = index.emplace(param.name, static_cast<int32_t>(merged.params.size()));
      if (inserted) {
        merged.params.push_back(param);
        owner.push_back(static_cast<int32_t>(i));
      } else {
        const ParamInfo& first = merged.params[it->second];
        if (first.dtype != param.dtype || first.shape != param.shape) {
          return absl::InvalidArgumentError(absl::StrCat(
              "parameter '", param.name, "' is ", DTypeName(first.dtype), DimsToString(first.shape),
              " in the part of ", RoleName(merged.role), " rank ",
              parts[owner[it->second]].processes[0].rank, " but ", DTypeName(param.dtype),
              DimsToString(param.shape), " in the part of rank ", part.processes[0].rank));
        }
        if (first.quant != param.quant) {
          return absl::InvalidArgumentError(absl::StrCat(
              "parameter '", param.name, "' is quantized as ", QuantText(first.quant),
              " in the part of ", RoleName(merged.role), " rank ",
              parts[owner[it->second]].processes[0].rank, " but as ", QuantText(param.quant),
              " in the part of rank ", part.processes[0].rank));
        }
        if (first.wave != param.wave) {
          return absl::InvalidArgumentError(absl::StrCat(
              "parameter '", param.name, "' is in wave ", first.wave, " in the part of ",
              RoleName(merged.role), " rank ", parts[owner[it->second]].processes[0].rank,
              " but in wave ", param.wave, " in the part of rank ", part.processes[0].rank));
        }
      }
      remap[p] = it->second;
    }
    merged.processes.push_back(part.processes[0]);
    merged.buffers.insert(merged.buffers.end(), part.buffers.begin(), part.buffers.end());
    for (Piece piece : part.pieces) {
      if (piece.param >= 0 && piece.param < static_cast<int32_t>(remap.size())) {
        piece.param = remap[piece.param];
      } else {
        piece.param = -1;  // Refused by ValidateLayout as an unknown parameter.
      }
      merged.pieces.push_back(std::move(piece));
    }
  }
  return merged;
}

}  // namespace wsync
