// The exactness proof of quantization steps (quant_plan.h ProveQuantExact).

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "planner/piece_match.h"
#include "planner/quant_layout.h"
#include "planner/quant_plan.h"
#include "planner/region_overlap.h"

namespace wsync {
namespace {

std::string DescribeStep(const Job& job, const QuantTransform& step) {
  const bool known =
      step.param >= 0 && step.param < static_cast<int32_t>(job.target().params.size());
  return absl::StrCat(step.side == QuantSide::kSender ? "sender" : "receiver",
                      "-side quantization of parameter '",
                      known ? job.target().params[step.param].name : "?", "' blocks ",
                      BoxToString(step.blocks), " from process ", step.from.process, " to process ",
                      step.to.process, " box ", BoxToString(step.box));
}

std::string DescribeGather(const Job& job, const Segment& gather) {
  return absl::StrCat("gather of parameter '", job.target().params[gather.param].name, "' box ",
                      BoxToString(gather.box), " from process ", gather.from.process,
                      " to process ", gather.to.process, " arena offset ", gather.to.offset);
}

absl::Status Refuse(absl::string_view what, absl::string_view reason) {
  return absl::InternalError(absl::StrCat(what, " ", reason));
}

bool IsTargetProcess(const Job& job, int32_t process) {
  return process >= 0 && process < job.num_processes() && !job.IsSource(process);
}
bool IsSourceProcess(const Job& job, int32_t process) {
  return process >= 0 && process < job.num_processes() && job.IsSource(process);
}

// A receiver-side step's arena region, bytes.
struct ArenaRegion {
  int64_t begin = 0;
  int64_t end = 0;
  int32_t step = 0;
};

class QuantProof {
 public:
  QuantProof(const Job& job, const QuantPlan& plan, std::optional<int32_t> process)
      : job_(job),
        plan_(plan),
        process_(process),
        source_index_(IndexPieces(job.source())),
        target_index_(IndexPieces(job.target())),
        written_(job.target().pieces.size()),
        gathered_(plan.transforms.size()) {}

  absl::Status Run() {
    for (int32_t k = 0; k < static_cast<int32_t>(plan_.transforms.size()); ++k) {
      WSYNC_RETURN_IF_ERROR(CheckStep(k));
    }
    WSYNC_RETURN_IF_ERROR(CheckArenas());
    for (const Segment& gather : plan_.gathers) WSYNC_RETURN_IF_ERROR(CheckGather(gather));
    WSYNC_RETURN_IF_ERROR(CheckGathered());
    return CheckWritten();
  }

 private:
  int32_t RankOf(int32_t process) const { return job_.processes()[process].rank; }
  int64_t SourceElementSize(int32_t param) const {
    return DTypeSize(job_.source().params[job_.SourceParamOf(param)].dtype);
  }

  // Reads of `box` at `from` from source pieces of that process that hold it.
  bool ReadsSource(int32_t param, const Box& box, const Endpoint& from) const {
    return IsSourceProcess(job_, from.process) &&
           ForEachMatchingPiece(job_.source(), source_index_, RankOf(from.process),
                                job_.SourceParamOf(param), box, from,
                                [](int32_t, const Box&) {}) == Volume(box);
  }

  // Records the writes of `box` of target parameter `param` at `to`; false when some element
  // lands outside every target piece.
  bool Writes(int32_t param, const Box& box, const Endpoint& to) {
    return ForEachMatchingPiece(job_.target(), target_index_, RankOf(to.process), param, box, to,
                                [&](int32_t piece, const Box& part) {
                                  written_[piece].push_back(part);
                                }) == Volume(box);
  }

  absl::Status CheckStep(int32_t k);
  absl::Status CheckArenas();
  absl::Status CheckGather(const Segment& gather);
  absl::Status CheckGathered();
  absl::Status CheckWritten();

  const Job& job_;
  const QuantPlan& plan_;
  std::optional<int32_t> process_;
  const absl::flat_hash_map<PieceKey, std::vector<int32_t>> source_index_;
  const absl::flat_hash_map<PieceKey, std::vector<int32_t>> target_index_;
  std::vector<std::vector<Box>> written_;               // Per target piece.
  std::vector<std::vector<Box>> gathered_;              // Per receiver-side step.
  std::map<int32_t, std::vector<ArenaRegion>> arenas_;  // Per receiver, sorted by CheckArenas.
};

absl::Status QuantProof::CheckStep(int32_t k) {
  const QuantTransform& step = plan_.transforms[k];
  const std::string what = DescribeStep(job_, step);
  const Layout& target = job_.target();
  if (step.param < 0 || step.param >= static_cast<int32_t>(target.params.size()) ||
      job_.quant_links().scale_of[step.param] < 0 ||
      step.scale_param != job_.quant_links().scale_of[step.param]) {
    return Refuse(what, "is not a step of a quantized parameter and its scales");
  }
  const ParamInfo& param = target.params[step.param];
  const Dims blocks = QuantBlockDims(param.quant, static_cast<int>(param.shape.size()));
  if (step.blocks.rank() != static_cast<int>(param.shape.size()) || Volume(step.blocks) == 0 ||
      !Contains(WholeBox(param.shape), step.blocks) ||
      !IsWholeBlockBox(blocks, param.shape, step.blocks)) {
    return Refuse(what, "does not quantize whole blocks of its parameter");
  }
  if (step.box.rank() != step.blocks.rank() || Volume(step.box) == 0 ||
      !Contains(step.blocks, step.box) ||
      !(step.scale_box == ScaleBox(blocks, param.shape, step.blocks))) {
    return Refuse(what, "writes elements or scales of other blocks than it quantizes");
  }
  if (!IsTargetProcess(job_, step.to.process) || step.scale_to.process != step.to.process) {
    return Refuse(what, "does not write into one rollout process");
  }
  if (step.side == QuantSide::kSender) {
    if (!ReadsSource(step.param, step.blocks, step.from)) {
      return Refuse(what, "reads blocks its sender holds in no source piece there");
    }
  } else if (step.side == QuantSide::kReceiver) {
    const int64_t element_size = SourceElementSize(step.param);
    const int64_t begin = step.from.offset * element_size;
    if (step.from.process != step.to.process || step.from.buffer != kQuantArenaBuffer ||
        step.from.strides != RowMajorStrides(step.blocks.extent) || step.from.offset < 0 ||
        begin % kQuantArenaAlignment != 0) {
      return Refuse(what, "does not read an aligned row-major region of its receiver's arena");
    }
    arenas_[step.to.process].push_back(
        ArenaRegion{begin, begin + Volume(step.blocks) * element_size, k});
  } else {
    return Refuse(what, "has no side");
  }
  if (!Writes(step.param, step.box, step.to)) {
    return Refuse(what, "writes e4m3 elements outside every target piece");
  }
  if (!Writes(step.scale_param, step.scale_box, step.scale_to)) {
    return Refuse(what, "writes scales outside every scale piece");
  }
  return absl::OkStatus();
}

absl::Status QuantProof::CheckArenas() {
  for (auto& [receiver, regions] : arenas_) {
    std::sort(regions.begin(), regions.end(),
              [](const ArenaRegion& a, const ArenaRegion& b) { return a.begin < b.begin; });
    for (size_t i = 1; i < regions.size(); ++i) {
      if (regions[i].begin < regions[i - 1].end) {
        return Refuse(DescribeStep(job_, plan_.transforms[regions[i].step]),
                      "gathers into arena bytes another step of its receiver uses");
      }
    }
  }
  return absl::OkStatus();
}

absl::Status QuantProof::CheckGather(const Segment& gather) {
  const Layout& target = job_.target();
  if (gather.param < 0 || gather.param >= static_cast<int32_t>(target.params.size()) ||
      job_.quant_links().scale_of[gather.param] < 0 || Volume(gather.box) == 0 ||
      gather.box.rank() != static_cast<int>(target.params[gather.param].shape.size())) {
    return absl::InternalError("a gather is not a non-empty box of a quantized parameter");
  }
  const std::string what = DescribeGather(job_, gather);
  if (!ReadsSource(gather.param, gather.box, gather.from)) {
    return Refuse(what, "reads elements its sender holds in no source piece there");
  }
  if (!IsTargetProcess(job_, gather.to.process) || gather.to.buffer != kQuantArenaBuffer) {
    return Refuse(what, "does not write a rollout process's quantization arena");
  }
  if (process_ && *process_ != gather.to.process) return absl::OkStatus();
  auto it = arenas_.find(gather.to.process);
  const int64_t begin = gather.to.offset * SourceElementSize(gather.param);
  const ArenaRegion* region = nullptr;
  if (it != arenas_.end()) {
    auto after =
        std::upper_bound(it->second.begin(), it->second.end(), begin,
                         [](int64_t value, const ArenaRegion& r) { return value < r.begin; });
    if (after != it->second.begin() && begin < std::prev(after)->end) region = &*std::prev(after);
  }
  if (region == nullptr) return Refuse(what, "lands in no quantization step's arena region");
  const QuantTransform& step = plan_.transforms[region->step];
  const Dims strides = RowMajorStrides(step.blocks.extent);
  if (gather.param != step.param || !Contains(step.blocks, gather.box) ||
      gather.to.strides != strides ||
      gather.to.offset != SubRegionOffset(step.blocks, step.from.offset, strides, gather.box)) {
    return Refuse(what,
                  absl::StrCat("does not land where ", DescribeStep(job_, step), " reads its box"));
  }
  gathered_[region->step].push_back(gather.box);
  return absl::OkStatus();
}

// Parts of one box, each inside it: disjoint and adding up to it.
bool Tiles(const Box& whole, const std::vector<Box>& parts) {
  int64_t volume = 0;
  for (const Box& part : parts) volume += Volume(part);
  if (volume != Volume(whole)) return false;
  if (parts.size() < 2) return true;
  const OverlapResult overlap = FindBoxOverlap(parts);
  return !overlap.overlap && !overlap.too_complex;
}

absl::Status QuantProof::CheckGathered() {
  for (const auto& [receiver, regions] : arenas_) {
    if (process_ && *process_ != receiver) continue;
    for (const ArenaRegion& region : regions) {
      const QuantTransform& step = plan_.transforms[region.step];
      if (!Tiles(step.blocks, gathered_[region.step])) {
        return Refuse(DescribeStep(job_, step), "is not gathered exactly once element by element");
      }
    }
  }
  return absl::OkStatus();
}

absl::Status QuantProof::CheckWritten() {
  const Layout& target = job_.target();
  for (int32_t t = 0; t < static_cast<int32_t>(target.pieces.size()); ++t) {
    const Piece& piece = target.pieces[t];
    const QuantLinks& links = job_.quant_links();
    if (links.scale_of[piece.param] < 0 && links.quantized_of[piece.param] < 0) continue;
    if (Volume(piece.box) == 0) continue;
    if (process_ && job_.TargetId(piece.process) != *process_) continue;
    if (!Tiles(piece.box, written_[t])) {
      return absl::InternalError(absl::StrCat(
          links.scale_of[piece.param] >= 0 ? "e4m3" : "scale", " piece of parameter '",
          target.params[piece.param].name, "' on process ", job_.TargetId(piece.process), " box ",
          BoxToString(piece.box), " is not written exactly once by quantization steps"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ProveQuantExact(const Job& job, const QuantPlan& plan,
                             std::optional<int32_t> process) {
  return QuantProof(job, plan, process).Run();
}

}  // namespace wsync
