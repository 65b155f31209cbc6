// The exactness proof: every target element written exactly once, every byte read from a holder
// or forwarded from where a trainer's segment delivered it.

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "planner/piece_match.h"
#include "planner/plan.h"
#include "planner/region_overlap.h"

namespace wsync {
namespace {

std::string DescribeSegment(const Job& job, const Segment& s) {
  const bool known = s.param >= 0 && s.param < static_cast<int32_t>(job.target().params.size());
  return absl::StrCat("segment of parameter '", known ? job.target().params[s.param].name : "?",
                      "' box ", BoxToString(s.box), " from process ", s.from.process, " buffer ",
                      s.from.buffer, " offset ", s.from.offset, " to process ", s.to.process,
                      " buffer ", s.to.buffer, " offset ", s.to.offset);
}

// The parts written into one target piece (segment index, box) are pairwise disjoint. Bounded
// work (planner/region_overlap.h) however finely the parts interleave.
absl::Status CheckDisjoint(const Job& job, absl::Span<const Segment> segments,
                           std::vector<std::pair<int32_t, Box>>& parts) {
  if (parts.size() < 2) return absl::OkStatus();
  if (parts[0].second.rank() == 0) {
    return absl::InternalError(absl::StrCat(DescribeSegment(job, segments[parts[1].first]),
                                            " writes a scalar written before"));
  }
  std::sort(parts.begin(), parts.end(),
            [](const auto& a, const auto& b) { return a.second < b.second; });
  std::vector<Box> boxes;
  boxes.reserve(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0 && parts[i].second == parts[i - 1].second) {  // Equal boxes overlap.
      return absl::InternalError(absl::StrCat(DescribeSegment(job, segments[parts[i].first]),
                                              " overlaps ",
                                              DescribeSegment(job, segments[parts[i - 1].first])));
    }
    boxes.push_back(parts[i].second);
  }
  const OverlapResult result = FindBoxOverlap(boxes);
  if (result.too_complex) {
    return absl::InternalError(
        absl::StrCat(DescribeSegment(job, segments[parts[0].first]), " is one of ", parts.size(),
                     " parts of a target piece, too many to check for overlap within ",
                     kOverlapWorkBudget, " steps"));
  }
  if (result.overlap) {
    return absl::InternalError(
        absl::StrCat(DescribeSegment(job, segments[parts[result.second].first]), " overlaps ",
                     DescribeSegment(job, segments[parts[result.first].first])));
  }
  return absl::OkStatus();
}

// (param, box origin, box extent, process, buffer, offset, strides) of a segment end.
using DeliveryKeyType = std::tuple<int32_t, Dims, Dims, int32_t, uint64_t, int64_t, Dims>;
DeliveryKeyType DeliveryKey(int32_t param, const Box& box, const Endpoint& end) {
  return {param, box.origin, box.extent, end.process, end.buffer, end.offset, end.strides};
}

struct ArenaWrite {
  int64_t begin = 0;  // Bytes.
  int64_t end = 0;
};

// A stage-1 segment into a relay arena: packed row-major at an aligned, non-negative offset.
absl::Status CheckArenaWrite(const Job& job, const Segment& s,
                             std::map<int32_t, std::vector<ArenaWrite>>& writes) {
  const int64_t element_size = job.ElementSize(s.param);
  if (s.to.strides != RowMajorStrides(s.box.extent) || s.to.offset < 0 ||
      (s.to.offset * element_size) % kRelayArenaAlignment != 0) {
    return absl::InternalError(absl::StrCat(DescribeSegment(job, s),
                                            " writes its relay arena unpacked or at a bad offset"));
  }
  const int64_t begin = s.to.offset * element_size;
  writes[s.to.process].push_back(ArenaWrite{begin, begin + Volume(s.box) * element_size});
  return absl::OkStatus();
}

// Arena writes of one process are disjoint, and each is forwarded by some stage-2 segment.
// Forwarding is checked on the relay's plan (or the full plan): a sender's plan lists its stage-1
// segments without the relay's forwards.
absl::Status CheckArenas(const Job& job, absl::Span<const Segment> segments,
                         std::optional<int32_t> process,
                         std::map<int32_t, std::vector<ArenaWrite>>& writes,
                         const absl::flat_hash_set<DeliveryKeyType>& forwarded) {
  for (const Segment& s : segments) {
    if (s.to.buffer == kRelayArenaBuffer && (!process || *process == s.to.process) &&
        !forwarded.contains(DeliveryKey(s.param, s.box, s.to))) {
      return absl::InternalError(
          absl::StrCat(DescribeSegment(job, s), " fills a relay arena nothing forwards from"));
    }
  }
  for (auto& [process, list] : writes) {
    std::sort(list.begin(), list.end(),
              [](const ArenaWrite& a, const ArenaWrite& b) { return a.begin < b.begin; });
    for (size_t i = 1; i < list.size(); ++i) {
      if (list[i].begin < list[i - 1].end) {
        return absl::InternalError(absl::StrCat("relay arena writes of process ", process,
                                                " overlap at byte ", list[i].begin));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ProveExact(const Job& job, absl::Span<const Segment> segments,
                        std::optional<int32_t> process) {
  const Layout& source = job.source();
  const Layout& target = job.target();
  const auto source_index = IndexPieces(source);
  const auto target_index = IndexPieces(target);
  std::vector<std::vector<std::pair<int32_t, Box>>> writers(target.pieces.size());
  // Where stage-1 segments (from a trainer) deliver, for checking stage-2 segments against.
  absl::flat_hash_set<DeliveryKeyType> delivered;
  for (const Segment& s : segments) {
    if (s.from.process >= 0 && s.from.process < job.num_processes() &&
        job.IsSource(s.from.process)) {
      delivered.insert(DeliveryKey(s.param, s.box, s.to));
    }
  }
  absl::flat_hash_set<DeliveryKeyType> forwarded_arena;
  std::map<int32_t, std::vector<ArenaWrite>> arena_writes;

  for (int32_t k = 0; k < static_cast<int32_t>(segments.size()); ++k) {
    const Segment& s = segments[k];
    if (s.param < 0 || s.param >= static_cast<int32_t>(target.params.size()) ||
        s.box.rank() != static_cast<int>(target.params[s.param].shape.size()) ||
        Volume(s.box) == 0 || !Contains(WholeBox(target.params[s.param].shape), s.box)) {
      return absl::InternalError(
          absl::StrCat(DescribeSegment(job, s), " is not a non-empty box of its parameter"));
    }
    if (job.quant_links().scale_of[s.param] >= 0 || job.quant_links().quantized_of[s.param] >= 0) {
      return absl::InternalError(
          absl::StrCat(DescribeSegment(job, s),
                       " copies into a quantized parameter or its scales, which only "
                       "quantization steps write (quant_plan.h)"));
    }
    if (s.from.process < 0 || s.from.process >= job.num_processes() || s.to.process < 0 ||
        s.to.process >= job.num_processes() || job.IsSource(s.to.process)) {
      return absl::InternalError(absl::StrCat(DescribeSegment(job, s),
                                              " does not go from a process to a rollout process"));
    }
    const int64_t volume = Volume(s.box);
    if (job.IsSource(s.from.process)) {
      const int64_t read = ForEachMatchingPiece(
          source, source_index, job.processes()[s.from.process].rank, job.SourceParamOf(s.param),
          s.box, s.from, [](int32_t, const Box&) {});
      if (read != volume) {
        return absl::InternalError(absl::StrCat(DescribeSegment(job, s), " reads ", volume - read,
                                                " elements from no source piece holding them"));
      }
    } else {
      // Stage 2: exactly what a stage-1 segment delivers, forwarded to another process.
      if (s.from.process == s.to.process ||
          !delivered.contains(DeliveryKey(s.param, s.box, s.from))) {
        return absl::InternalError(
            absl::StrCat(DescribeSegment(job, s),
                         " forwards a region no segment from a trainer delivers there"));
      }
      if (s.from.buffer == kRelayArenaBuffer)
        forwarded_arena.insert(DeliveryKey(s.param, s.box, s.from));
    }
    if (s.to.buffer == kRelayArenaBuffer) {
      WSYNC_RETURN_IF_ERROR(CheckArenaWrite(job, s, arena_writes));
      continue;
    }
    const int64_t written = ForEachMatchingPiece(
        target, target_index, job.processes()[s.to.process].rank, s.param, s.box, s.to,
        [&](int32_t piece, const Box& part) { writers[piece].emplace_back(k, part); });
    if (written != volume) {
      return absl::InternalError(absl::StrCat(DescribeSegment(job, s), " writes ", volume - written,
                                              " elements outside every target piece"));
    }
  }

  WSYNC_RETURN_IF_ERROR(CheckArenas(job, segments, process, arena_writes, forwarded_arena));
  for (int32_t t = 0; t < static_cast<int32_t>(target.pieces.size()); ++t) {
    const Piece& piece = target.pieces[t];
    const int64_t volume = Volume(piece.box);
    if (volume == 0) continue;
    if (process && job.TargetId(piece.process) != *process) continue;
    // Quantized parameters and their scales: ProveQuantExact (quant_plan.h).
    if (job.quant_links().scale_of[piece.param] >= 0 ||
        job.quant_links().quantized_of[piece.param] >= 0) {
      continue;
    }
    int64_t written = 0;
    for (const auto& [k, part] : writers[t]) written += Volume(part);
    if (written != volume) {
      return absl::InternalError(absl::StrCat(
          "target piece of parameter '", target.params[piece.param].name, "' on process ",
          job.TargetId(piece.process), " box ", BoxToString(piece.box), " receives ", written,
          " elements for its ", volume));
    }
    if (absl::Status disjoint = CheckDisjoint(job, segments, writers[t]); !disjoint.ok()) {
      return disjoint;
    }
  }
  return absl::OkStatus();
}

}  // namespace wsync
