#include "planner/validate.h"

#include <algorithm>
#include <map>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/checked_math.h"
#include "common/status.h"
#include "planner/quant_layout.h"
#include "planner/region_overlap.h"

namespace wsync {
namespace {

std::string Describe(const Layout& layout, const Piece& piece) {
  const bool known_param = piece.param >= 0 && piece.param < static_cast<int>(layout.params.size());
  return absl::StrCat("parameter '", known_param ? layout.params[piece.param].name : "?",
                      "' piece on ", RoleName(layout.role), " process ", piece.process, " buffer ",
                      piece.buffer, " box ", BoxToString(piece.box));
}

absl::Status Refuse(const Layout& layout, const Piece& piece, absl::string_view reason) {
  return absl::InvalidArgumentError(absl::StrCat(Describe(layout, piece), ": ", reason));
}

absl::Status ValidateProcesses(const Layout& layout) {
  const int n = static_cast<int>(layout.processes.size());
  std::vector<bool> seen(n, false);
  for (const ProcessInfo& process : layout.processes) {
    if (process.rank < 0 || process.rank >= n) {
      return absl::InvalidArgumentError(absl::StrCat(
          RoleName(layout.role), " process rank ", process.rank, " is out of range [0, ", n, ")"));
    }
    if (seen[process.rank]) {
      return absl::InvalidArgumentError(
          absl::StrCat(RoleName(layout.role), " process rank ", process.rank, " is duplicated"));
    }
    seen[process.rank] = true;
    if (process.device < kUnknownDevice || process.device > kMaxDevice) {
      return absl::InvalidArgumentError(absl::StrCat(RoleName(layout.role), " process rank ",
                                                     process.rank, " has device ", process.device,
                                                     ", outside [-1, ", kMaxDevice, "]"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateParams(const Layout& layout) {
  absl::flat_hash_map<absl::string_view, int> names;
  for (const ParamInfo& param : layout.params) {
    const std::string where = absl::StrCat(RoleName(layout.role), " parameter '", param.name, "'");
    if (param.name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(RoleName(layout.role), " layout has a parameter with an empty name"));
    }
    if (!names.emplace(param.name, static_cast<int>(&param - layout.params.data())).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, " is declared twice"));
    }
    if (!IsValidDType(static_cast<int>(param.dtype))) {
      return absl::InvalidArgumentError(absl::StrCat(where, " has an invalid dtype"));
    }
    if (param.shape.size() > kMaxAxes) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " has ", param.shape.size(), " axes, more than ", kMaxAxes));
    }
    if (param.wave < 0 || param.wave >= kMaxWaves) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " is in wave ", param.wave, ", outside [0, ", kMaxWaves, ")"));
    }
    if (param.wave != 0 && layout.role == Role::kTrainer) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " is in wave ", param.wave, ": waves are the rollouts' alone"));
    }
    if (param.wave != 0 && param.quant.quantized()) {
      return absl::InvalidArgumentError(absl::StrCat(where, " is quantized and in wave ",
                                                     param.wave,
                                                     ": quantized parameters stay in wave 0"));
    }
    std::optional<int64_t> numel = CheckedVolume(param.shape);
    if (!numel || !CheckedMul(*numel, DTypeSize(param.dtype))) {
      return absl::InvalidArgumentError(absl::StrCat(where, " has shape ",
                                                     DimsToString(param.shape),
                                                     " with a negative extent or over int64"));
    }
  }
  for (const ParamInfo& param : layout.params) {
    if (!param.quant.quantized()) continue;
    auto scale = names.find(param.quant.scale_param);
    if (scale != names.end() && layout.params[scale->second].wave != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          RoleName(layout.role), " parameter '", param.quant.scale_param, "', the scales of '",
          param.name, "', is in wave ", layout.params[scale->second].wave,
          ": quantized parameters and scales stay in wave 0"));
    }
  }
  return absl::OkStatus();
}

// A piece as a byte region of its buffer: one extra innermost axis for the element's bytes.
struct ByteRegion {
  int piece;
  StridedRegion region;
};

// Pieces of one buffer must not share a byte. Bounded work however the pieces interleave
// (planner/region_overlap.h); a buffer whose pieces would take longer is refused.
absl::Status ValidateBufferDisjoint(const Layout& layout, const BufferInfo& buffer,
                                    const std::vector<ByteRegion>& regions, int64_t& budget) {
  if (regions.size() < 2) return absl::OkStatus();
  std::vector<StridedRegion> list;
  list.reserve(regions.size());
  for (const ByteRegion& region : regions) list.push_back(region.region);
  const OverlapResult result = FindRegionOverlap(list, budget);
  budget -= result.steps;
  if (result.too_complex) {
    return absl::InvalidArgumentError(absl::StrCat(
        RoleName(layout.role), " buffer ", buffer.id, " of process ", buffer.process, ": its ",
        regions.size(), " pieces interleave too finely to check for overlap within ",
        kOverlapWorkBudget, " steps"));
  }
  if (result.overlap) {
    return Refuse(
        layout, layout.pieces[regions[result.second].piece],
        absl::StrCat("overlaps ", Describe(layout, layout.pieces[regions[result.first].piece]),
                     " in the same buffer"));
  }
  return absl::OkStatus();
}

// Holders of one parameter hold either equal or disjoint boxes: the distinct boxes are pairwise
// disjoint. Bounded work (planner/region_overlap.h).
// Scale parameters are exempt: receivers whose boxes share a block of a quantized parameter each
// hold that block's scale (ValidateQuantParams checks them).
absl::Status ValidateHolders(const Layout& layout, int64_t& budget) {
  const QuantLinks links = LinkQuantParams(layout);
  std::vector<std::vector<int>> by_param(layout.params.size());
  for (int i = 0; i < static_cast<int>(layout.pieces.size()); ++i) {
    const int param = layout.pieces[i].param;
    if (Volume(layout.pieces[i].box) > 0 && links.quantized_of[param] < 0) {
      by_param[param].push_back(i);
    }
  }
  for (std::vector<int>& indices : by_param) {
    std::sort(indices.begin(), indices.end(),
              [&](int a, int b) { return layout.pieces[a].box < layout.pieces[b].box; });
    std::vector<int> distinct;
    for (int index : indices) {
      if (distinct.empty() || !(layout.pieces[distinct.back()].box == layout.pieces[index].box)) {
        distinct.push_back(index);
      }
    }
    if (distinct.size() < 2 || layout.pieces[distinct[0]].box.rank() == 0) continue;
    std::vector<Box> boxes;
    boxes.reserve(distinct.size());
    for (int index : distinct) boxes.push_back(layout.pieces[index].box);
    const OverlapResult result = FindBoxOverlap(boxes, budget);
    budget -= result.steps;
    if (result.too_complex) {
      const Piece& piece = layout.pieces[distinct[0]];
      return absl::InvalidArgumentError(absl::StrCat(
          RoleName(layout.role), " parameter '", layout.params[piece.param].name, "': its ",
          boxes.size(), " distinct boxes are too many to check for overlap within ",
          kOverlapWorkBudget, " steps"));
    }
    if (result.overlap) {
      return Refuse(layout, layout.pieces[distinct[result.second]],
                    absl::StrCat("overlaps but differs from ",
                                 Describe(layout, layout.pieces[distinct[result.first]]),
                                 "; holders of overlapping boxes must hold equal boxes"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateLayout(const Layout& layout) {
  WSYNC_RETURN_IF_ERROR(ValidateProcesses(layout));
  WSYNC_RETURN_IF_ERROR(ValidateParams(layout));
  const int num_processes = static_cast<int>(layout.processes.size());

  absl::flat_hash_map<std::pair<int32_t, uint64_t>, int> buffer_index;
  for (int i = 0; i < static_cast<int>(layout.buffers.size()); ++i) {
    const BufferInfo& buffer = layout.buffers[i];
    const std::string where =
        absl::StrCat(RoleName(layout.role), " buffer ", buffer.id, " of process ", buffer.process);
    if (buffer.process < 0 || buffer.process >= num_processes) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": process is out of range [0, ", num_processes, ")"));
    }
    if (buffer.bytes < 0) return absl::InvalidArgumentError(absl::StrCat(where, ": negative size"));
    if (buffer.id == kRelayArenaBuffer || buffer.id == kQuantArenaBuffer ||
        buffer.id == kQuantStagingBuffer) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": the id is reserved for relay arenas and quantization arenas and staging"));
    }
    if (buffer.kind != MemoryKind::kHost && buffer.kind != MemoryKind::kCuda) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": invalid memory kind"));
    }
    if (!buffer_index.emplace(std::make_pair(buffer.process, buffer.id), i).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, " is declared twice"));
    }
  }

  // By buffer, then by wave: pieces of different waves may share memory (wsync.h).
  std::vector<std::map<int32_t, std::vector<ByteRegion>>> regions_by_buffer(layout.buffers.size());
  for (int i = 0; i < static_cast<int>(layout.pieces.size()); ++i) {
    const Piece& piece = layout.pieces[i];
    if (piece.param < 0 || piece.param >= static_cast<int>(layout.params.size())) {
      return Refuse(layout, piece, absl::StrCat("unknown parameter index ", piece.param));
    }
    if (piece.process < 0 || piece.process >= num_processes) {
      return Refuse(layout, piece,
                    absl::StrCat("process is out of range [0, ", num_processes, ")"));
    }
    auto buffer_it = buffer_index.find(std::make_pair(piece.process, piece.buffer));
    if (buffer_it == buffer_index.end()) return Refuse(layout, piece, "unknown buffer");
    const ParamInfo& param = layout.params[piece.param];
    const int rank = static_cast<int>(param.shape.size());
    if (piece.box.origin.size() != param.shape.size() ||
        piece.box.extent.size() != param.shape.size() ||
        piece.strides.size() != param.shape.size()) {
      return Refuse(
          layout, piece,
          absl::StrCat("rank differs from the parameter's shape ", DimsToString(param.shape)));
    }
    for (int axis = 0; axis < rank; ++axis) {
      const int64_t origin = piece.box.origin[axis];
      const int64_t extent = piece.box.extent[axis];
      std::optional<int64_t> end = CheckedAdd(origin, extent);
      if (origin < 0 || extent < 0 || !end || *end > param.shape[axis]) {
        return Refuse(layout, piece,
                      absl::StrCat("lies outside the parameter's shape ", DimsToString(param.shape),
                                   " on axis ", axis));
      }
    }
    absl::StatusOr<std::optional<AddressSpan>> span =
        RegionSpan(piece.box.extent, piece.offset, piece.strides);
    if (!span.ok()) {
      return Refuse(layout, piece,
                    absl::StrCat("offset ", piece.offset, " strides ", DimsToString(piece.strides),
                                 ": ", span.status().message()));
    }
    if (!span->has_value()) continue;  // Empty piece: holds nothing.
    if (!IsInjective(piece.box.extent, piece.strides)) {
      return Refuse(layout, piece,
                    absl::StrCat("strides ", DimsToString(piece.strides),
                                 " map two elements to one address"));
    }
    const int64_t element_size = DTypeSize(param.dtype);
    const BufferInfo& buffer = layout.buffers[buffer_it->second];
    std::optional<int64_t> end_byte = CheckedMul((*span)->last + 1, element_size);
    if (!end_byte || *end_byte > buffer.bytes) {
      return Refuse(layout, piece,
                    absl::StrCat("offset ", piece.offset, " strides ", DimsToString(piece.strides),
                                 " reach past the buffer's ", buffer.bytes, " bytes"));
    }
    ByteRegion region{i,
                      StridedRegion{piece.box.extent, piece.strides, piece.offset * element_size}};
    for (int64_t& stride : region.region.strides) stride *= element_size;
    region.region.extent.push_back(element_size);
    region.region.strides.push_back(1);
    regions_by_buffer[buffer_it->second][param.wave].push_back(std::move(region));
  }
  // One budget for the whole layout: many buffers or parameters cannot multiply it.
  int64_t budget = kOverlapWorkBudget;
  for (size_t b = 0; b < regions_by_buffer.size(); ++b) {
    for (const auto& [wave, regions] : regions_by_buffer[b]) {
      WSYNC_RETURN_IF_ERROR(ValidateBufferDisjoint(layout, layout.buffers[b], regions, budget));
    }
  }
  WSYNC_RETURN_IF_ERROR(ValidateQuantParams(layout));
  return ValidateHolders(layout, budget);
}

namespace {

// Boxes of `whole` that `covered` (pairwise equal or disjoint boxes) leaves out; gives up (nullopt)
// after 100000 boxes left or kOverlapWorkBudget steps, so an input cannot make the error costly.
// Used only to name an uncovered region in an error.
std::optional<Box> FirstUncovered(const Box& whole, const std::vector<Box>& covered) {
  std::vector<Box> remaining = {whole};
  int64_t steps = kOverlapWorkBudget;
  for (const Box& box : covered) {
    std::vector<Box> next;
    steps -= static_cast<int64_t>(remaining.size()) + 1;
    if (steps < 0) return std::nullopt;
    for (const Box& r : remaining) {
      std::optional<Box> common = Intersect(r, box);
      if (!common) {
        next.push_back(r);
        continue;
      }
      // r minus common: peel slabs axis by axis.
      Box rest = r;
      for (int axis = 0; axis < r.rank(); ++axis) {
        const int64_t begin = rest.origin[axis];
        const int64_t end = rest.origin[axis] + rest.extent[axis];
        const int64_t cb = common->origin[axis];
        const int64_t ce = cb + common->extent[axis];
        if (cb > begin) {
          Box slab = rest;
          slab.extent[axis] = cb - begin;
          next.push_back(slab);
        }
        if (ce < end) {
          Box slab = rest;
          slab.origin[axis] = ce;
          slab.extent[axis] = end - ce;
          next.push_back(slab);
        }
        rest.origin[axis] = cb;
        rest.extent[axis] = ce - cb;
      }
      if (next.size() > 100000) return std::nullopt;
    }
    remaining = std::move(next);
  }
  if (remaining.empty()) return std::nullopt;
  return remaining.front();
}

}  // namespace

absl::Status ValidatePair(const Layout& source, const Layout& target) {
  absl::flat_hash_map<absl::string_view, int> source_params;
  for (int i = 0; i < static_cast<int>(source.params.size()); ++i) {
    source_params.emplace(source.params[i].name, i);
  }
  absl::flat_hash_map<absl::string_view, int> target_params;
  const QuantLinks links = LinkQuantParams(target);
  for (int i = 0; i < static_cast<int>(target.params.size()); ++i) {
    const ParamInfo& param = target.params[i];
    target_params.emplace(param.name, i);
    auto it = source_params.find(param.name);
    if (links.quantized_of[i] >= 0) {  // Computed by the plan, never sent by a trainer.
      if (it == source_params.end()) continue;
      return absl::InvalidArgumentError(
          absl::StrCat("parameter '", param.name, "' is a scale of the ", RoleName(target.role),
                       " layout's quantized '", target.params[links.quantized_of[i]].name,
                       "' but the ", RoleName(source.role), " layout declares it too"));
    }
    if (it == source_params.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter '", param.name, "' is declared by the ", RoleName(target.role),
                       " layout but not by the ", RoleName(source.role), " layout"));
    }
    WSYNC_RETURN_IF_ERROR(CheckPairedParams(source.params[it->second], param));
  }
  for (const ParamInfo& param : source.params) {
    if (!target_params.contains(param.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter '", param.name, "' is declared by the ", RoleName(source.role),
                       " layout but not by the ", RoleName(target.role), " layout"));
    }
  }
  // Coverage: holders hold equal or disjoint boxes, so distinct boxes' volumes add up to the
  // parameter's size exactly when they cover it.
  std::vector<std::vector<Box>> boxes(source.params.size());
  for (const Piece& piece : source.pieces) {
    if (Volume(piece.box) > 0) boxes[piece.param].push_back(piece.box);
  }
  for (int i = 0; i < static_cast<int>(source.params.size()); ++i) {
    std::vector<Box>& list = boxes[i];
    std::sort(list.begin(), list.end());
    list.erase(std::unique(list.begin(), list.end()), list.end());
    int64_t covered = 0;
    for (const Box& box : list) covered += Volume(box);
    const ParamInfo& param = source.params[i];
    const int64_t numel = Volume(param.shape);
    if (covered != numel) {
      std::optional<Box> hole = FirstUncovered(WholeBox(param.shape), list);
      return absl::FailedPreconditionError(
          absl::StrCat("parameter '", param.name, "': the ", RoleName(source.role),
                       " layout covers ", covered, " of its ", numel, " elements",
                       hole ? absl::StrCat("; box ", BoxToString(*hole), " has no holder") : ""));
    }
  }
  return absl::OkStatus();
}

}  // namespace wsync
