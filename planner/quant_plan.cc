// Planning of the quantization steps (quant_plan.h).

#include "planner/quant_plan.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "planner/quant_layout.h"

namespace wsync {
namespace planner_internal {
namespace {

// The whole blocks of `range` (inside one holder's box), per axis: [ceil to a block boundary,
// floor to a block boundary or the axis end). nullopt when no whole block lies inside.
std::optional<Box> InnerWholeBlocks(const Dims& blocks, const Dims& shape, const Box& range) {
  Box inner = range;
  for (int a = 0; a < range.rank(); ++a) {
    const int64_t block = blocks[a];
    const int64_t begin = range.origin[a];
    const int64_t end = begin + range.extent[a];
    const int64_t lo = begin % block == 0 ? begin : (begin / block + 1) * block;
    const int64_t hi = end == shape[a] ? end : end / block * block;
    if (hi <= lo) return std::nullopt;
    inner.origin[a] = lo;
    inner.extent[a] = hi - lo;
  }
  return inner;
}

Endpoint EndpointOf(int32_t process, const Piece& piece, const Box& box) {
  return Endpoint{process, piece.buffer,
                  SubRegionOffset(piece.box, piece.offset, piece.strides, box), piece.strides};
}

class QuantPlanner {
 public:
  QuantPlanner(const Job& job, const std::vector<ParamIndex>& index) : job_(job), index_(index) {
    for (int32_t i = 0; i < static_cast<int32_t>(job.target().pieces.size()); ++i) {
      const Piece& piece = job.target().pieces[i];
      if (job.quant_links().quantized_of[piece.param] >= 0 && Volume(piece.box) > 0) {
        scale_pieces_[{piece.param, piece.process}].push_back(i);
      }
    }
  }

  absl::Status PlanPiece(const Piece& piece);
  QuantPlan Take() && { return std::move(plan_); }

 private:
  // The state of one target piece being planned.
  struct PieceWork {
    const Piece* piece = nullptr;
    int32_t receiver = 0;
    int32_t scale_param = 0;
    int32_t source_param = 0;
    Dims blocks;
    const Dims* shape = nullptr;
  };

  // Replicated holders in turn.
  int32_t PickHolder(const HolderGroup& group) {
    return group.pieces[next_holder_++ % static_cast<int64_t>(group.pieces.size())];
  }
  QuantTransform Start(const PieceWork& work, const Box& blocks, QuantSide side) const;
  absl::Status PlanReceiverSide(const PieceWork& work, const Box& whole,
                                const std::vector<Box>& inner);
  void AddReceiverTransform(const PieceWork& work, const Box& cell);

  const Job& job_;
  const std::vector<ParamIndex>& index_;
  std::map<std::pair<int32_t, int32_t>, std::vector<int32_t>> scale_pieces_;  // (param, rank).
  std::map<int32_t, int64_t> arena_bytes_;                                    // Per receiver.
  int64_t next_holder_ = 0;
  QuantPlan plan_;
};

QuantTransform QuantPlanner::Start(const PieceWork& work, const Box& blocks, QuantSide side) const {
  QuantTransform step;
  step.param = work.piece->param;
  step.scale_param = work.scale_param;
  step.side = side;
  step.blocks = blocks;
  step.box = *Intersect(blocks, work.piece->box);
  step.to = EndpointOf(work.receiver, *work.piece, step.box);
  step.scale_box = ScaleBox(work.blocks, *work.shape, blocks);
  // Validation put the piece's scales in one scale piece of its process.
  auto it = scale_pieces_.find({work.scale_param, work.piece->process});
  if (it == scale_pieces_.end()) return step;  // ProveQuantExact refuses the step.
  for (int32_t s : it->second) {
    const Piece& scales = job_.target().pieces[s];
    if (Contains(scales.box, step.scale_box)) {
      step.scale_to = EndpointOf(work.receiver, scales, step.scale_box);
      break;
    }
  }
  return step;
}

void QuantPlanner::AddReceiverTransform(const PieceWork& work, const Box& cell) {
  const int64_t element_size = DTypeSize(job_.source().params[work.source_param].dtype);
  int64_t& used = arena_bytes_[work.receiver];
  used = (used + kQuantArenaAlignment - 1) / kQuantArenaAlignment * kQuantArenaAlignment;
  QuantTransform step = Start(work, cell, QuantSide::kReceiver);
  const Dims strides = RowMajorStrides(cell.extent);
  step.from = Endpoint{work.receiver, kQuantArenaBuffer, used / element_size, strides};
  used += Volume(cell) * element_size;
  index_[work.source_param].ForEachIntersecting(
      cell, [&](const HolderGroup& group, const Box& part) {
        const Piece& source = job_.source().pieces[PickHolder(group)];
        Segment gather;
        gather.param = work.piece->param;
        gather.box = part;
        gather.from = EndpointOf(job_.SourceId(source.process), source, part);
        gather.to = Endpoint{work.receiver, kQuantArenaBuffer,
                             SubRegionOffset(cell, step.from.offset, strides, part), strides};
        plan_.gathers.push_back(std::move(gather));
      });
  plan_.transforms.push_back(std::move(step));
}

// The blocks of `whole` outside every `inner` box, cut along the inner boxes' boundaries (all
// block-aligned) into cells, runs of cells along the last axis merged.
absl::Status QuantPlanner::PlanReceiverSide(const PieceWork& work, const Box& whole,
                                            const std::vector<Box>& inner) {
  const int rank = whole.rank();
  std::vector<std::vector<int64_t>> cuts(rank);
  int64_t cells = 1;
  for (int a = 0; a < rank; ++a) {
    cuts[a] = {whole.origin[a], whole.origin[a] + whole.extent[a]};
    for (const Box& box : inner) {
      cuts[a].push_back(box.origin[a]);
      cuts[a].push_back(box.origin[a] + box.extent[a]);
    }
    std::sort(cuts[a].begin(), cuts[a].end());
    cuts[a].erase(std::unique(cuts[a].begin(), cuts[a].end()), cuts[a].end());
    cells *= static_cast<int64_t>(cuts[a].size()) - 1;
    if (cells * static_cast<int64_t>(inner.size() + 1) > kQuantCellBudget) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "quantized parameter '", job_.target().params[work.piece->param].name, "' box ",
          BoxToString(work.piece->box), ": its source pieces cut its scale blocks too finely (",
          kQuantCellBudget, " cells at most)"));
    }
  }
  std::vector<size_t> cell_index(rank, 0);
  while (true) {
    // One row of cells along the last axis.
    Box cell = whole;
    for (int a = 0; a + 1 < rank; ++a) {
      cell.origin[a] = cuts[a][cell_index[a]];
      cell.extent[a] = cuts[a][cell_index[a] + 1] - cell.origin[a];
    }
    const std::vector<int64_t>& last = cuts[rank - 1];
    std::optional<int64_t> run_begin;
    for (size_t c = 0; c + 1 < last.size(); ++c) {
      cell.origin[rank - 1] = last[c];
      cell.extent[rank - 1] = last[c + 1] - last[c];
      const bool sent = std::any_of(inner.begin(), inner.end(),
                                    [&](const Box& box) { return Contains(box, cell); });
      if (!sent && !run_begin) run_begin = last[c];
      if (run_begin && (sent || c + 2 == last.size())) {
        Box run = cell;
        run.origin[rank - 1] = *run_begin;
        run.extent[rank - 1] = (sent ? last[c] : last[c + 1]) - *run_begin;
        AddReceiverTransform(work, run);
        run_begin.reset();
      }
    }
    int a = rank - 2;
    for (; a >= 0; --a) {
      if (++cell_index[a] + 1 < cuts[a].size()) break;
      cell_index[a] = 0;
    }
    if (a < 0) break;
  }
  return absl::OkStatus();
}

absl::Status QuantPlanner::PlanPiece(const Piece& piece) {
  const ParamInfo& param = job_.target().params[piece.param];
  PieceWork work;
  work.piece = &piece;
  work.receiver = job_.TargetId(piece.process);
  work.scale_param = job_.quant_links().scale_of[piece.param];
  work.source_param = job_.SourceParamOf(piece.param);
  work.blocks = QuantBlockDims(param.quant, static_cast<int>(param.shape.size()));
  work.shape = &param.shape;
  const Box whole = WholeBlockBox(work.blocks, param.shape, piece.box);
  std::vector<Box> inner;
  index_[work.source_param].ForEachIntersecting(
      whole, [&](const HolderGroup& group, const Box& region) {
        std::optional<Box> blocks = InnerWholeBlocks(work.blocks, param.shape, region);
        if (!blocks) return;
        const Piece& source = job_.source().pieces[PickHolder(group)];
        QuantTransform step = Start(work, *blocks, QuantSide::kSender);
        step.from = EndpointOf(job_.SourceId(source.process), source, *blocks);
        plan_.transforms.push_back(std::move(step));
        inner.push_back(*blocks);
      });
  int64_t inner_volume = 0;
  for (const Box& box : inner) inner_volume += Volume(box);
  if (inner_volume == Volume(whole)) return absl::OkStatus();
  return PlanReceiverSide(work, whole, inner);
}

}  // namespace

absl::StatusOr<QuantPlan> PlanQuant(const Job& job, const std::vector<ParamIndex>& index) {
  QuantPlanner planner(job, index);
  for (const Piece& piece : job.target().pieces) {
    if (job.quant_links().scale_of[piece.param] < 0 || Volume(piece.box) == 0) continue;
    WSYNC_RETURN_IF_ERROR(planner.PlanPiece(piece));
  }
  return std::move(planner).Take();
}

QuantPlan QuantForProcess(const QuantPlan& plan, int32_t process) {
  QuantPlan mine;
  for (const QuantTransform& step : plan.transforms) {
    if (step.to.process == process ||
        (step.side == QuantSide::kSender && step.from.process == process)) {
      mine.transforms.push_back(step);
    }
  }
  for (const Segment& gather : plan.gathers) {
    if (gather.from.process == process || gather.to.process == process) {
      mine.gathers.push_back(gather);
    }
  }
  return mine;
}

}  // namespace planner_internal

QuantWireBytes CountQuantWireBytes(const Job& job, const QuantPlan& plan) {
  QuantWireBytes bytes;
  auto source_size = [&](int32_t param) {
    return DTypeSize(job.source().params[job.SourceParamOf(param)].dtype);
  };
  for (const QuantTransform& step : plan.transforms) {
    bytes.without_sender_quant += Volume(step.blocks) * source_size(step.param);
    if (step.side != QuantSide::kSender) continue;
    bytes.fp8 += Volume(step.box) * DTypeSize(DType::kFloat8E4M3);
    bytes.scales += Volume(step.scale_box) * DTypeSize(DType::kFloat32);
  }
  for (const Segment& gather : plan.gathers) {
    bytes.gathered += Volume(gather.box) * source_size(gather.param);
  }
  for (const Piece& piece : job.target().pieces) {
    if (job.quant_links().scale_of[piece.param] < 0) continue;
    bytes.unquantized += Volume(piece.box) * source_size(piece.param);
  }
  return bytes;
}

}  // namespace wsync
