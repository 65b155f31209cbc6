// LayOutQuantStaging (quant_work.h): where a sender's quantization staging lies and when each of
// its steps is quantized.

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "executor/quant_work.h"

namespace wsync::executor_internal {
namespace {

int64_t Aligned(int64_t bytes) {
  return (bytes + kQuantArenaAlignment - 1) / kQuantArenaAlignment * kQuantArenaAlignment;
}

int64_t ScaleBytes(const QuantTransform& step) {
  return Volume(step.scale_box) * static_cast<int64_t>(sizeof(float));
}

// Where each send's e4m3 and scale segments travel: the send lane and message indices.
struct StepUse {
  int32_t lane = -1;  // Of its e4m3 bytes; -1 when none travel (copied locally).
  int32_t first = std::numeric_limits<int32_t>::max();
  int32_t last = -1;
  std::vector<std::pair<int32_t, int32_t>> scales;  // (lane, message) carrying its scales.
};

std::vector<StepUse> FindUses(const Work& work, const QuantWork& quant) {
  std::vector<StepUse> uses(quant.sends.size());
  std::vector<std::pair<int32_t, bool>> of_segment(quant.segments.size(), {-1, false});
  for (int32_t i = 0; i < static_cast<int32_t>(quant.sends.size()); ++i) {
    of_segment[quant.sends[i].fp8_segment] = {i, true};
    of_segment[quant.sends[i].scale_segment] = {i, false};
  }
  for (int32_t lane = 0; lane < static_cast<int32_t>(work.lanes.size()); ++lane) {
    if (work.lanes[lane].direction != Direction::kSend) continue;
    const std::vector<Message>& messages = work.lanes[lane].messages;
    for (int32_t m = 0; m < static_cast<int32_t>(messages.size()); ++m) {
      for (int32_t chunk : messages[m].chunks) {
        const auto [step, fp8] = of_segment[work.chunks[chunk].segment];
        if (step < 0) continue;
        StepUse& use = uses[step];
        if (fp8) {
          use.lane = lane;
          use.first = std::min(use.first, m);
          use.last = std::max(use.last, m);
        } else if (use.scales.empty() || use.scales.back() != std::make_pair(lane, m)) {
          use.scales.emplace_back(lane, m);
        }
      }
    }
  }
  return uses;
}

// Places the e4m3 blocks of one lane's steps (ascending by first message) in a ring: a step
// lives from the preparation of its first message to that of the message after its last one.
// Returns the bytes the ring takes from `base` on.
absl::StatusOr<int64_t> PlaceRing(const QuantWork& quant, const std::vector<StepUse>& uses,
                                  const std::vector<int32_t>& steps, int64_t base,
                                  QuantStagingLayout& layout) {
  auto size = [&](int32_t i) { return Aligned(Volume(quant.sends[i].step.blocks)); };
  auto dead_before = [&](int32_t i, int32_t message) { return uses[i].last + 1 < message; };
  // The most bytes alive at once (live) and the largest step: a ring of their sum never has to
  // overlap a live step (quant_work.h). Steps leave in the order they came (lane order), and a
  // step that left out of order is kept: the live set is then larger, never wrong.
  int64_t live = 0, most_live = 0, largest = 0, all = 0;
  std::deque<int32_t> alive;
  for (int32_t i : steps) {
    while (!alive.empty() && dead_before(alive.front(), uses[i].first)) {
      live -= size(alive.front());
      alive.pop_front();
    }
    alive.push_back(i);
    live += size(i);
    most_live = std::max(most_live, live);
    largest = std::max(largest, size(i));
    all += size(i);
  }
  const int64_t capacity = std::min(most_live + largest, all);
  struct Placed {
    int32_t step;
    int64_t offset;
  };
  std::deque<Placed> placed;
  int64_t head = 0, extent = 0;
  for (int32_t i : steps) {
    while (!placed.empty() && dead_before(placed.front().step, uses[i].first)) placed.pop_front();
    const int64_t offset = head + size(i) <= capacity ? head : 0;
    for (const Placed& other : placed) {
      if (offset < other.offset + size(other.step) && other.offset < offset + size(i)) {
        return absl::InternalError(absl::StrCat("quantization staging: the ring of ", capacity,
                                                " bytes would overlap a live step"));
      }
    }
    placed.push_back({i, offset});
    layout.steps[i].fp8 = base + offset;
    head = offset + size(i);
    extent = std::max(extent, head);
  }
  return extent;
}

}  // namespace

int64_t QuantStagingLayout::Physical(int64_t offset) const {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), offset,
                             [](int64_t value, const Range& range) { return value < range.begin; });
  if (it == ranges.begin()) return offset;  // Outside every range: not a staging address.
  --it;
  return it->physical + (offset - it->begin);
}

absl::StatusOr<QuantStagingLayout> LayOutQuantStaging(const Work& work, const QuantWork& quant) {
  QuantStagingLayout layout;
  const int32_t sends = static_cast<int32_t>(quant.sends.size());
  if (sends == 0) return layout;
  layout.steps.resize(sends);
  const std::vector<StepUse> uses = FindUses(work, quant);
  int64_t bytes = 0;
  int64_t transient = 0, scratch = 0;
  std::map<int32_t, std::vector<int32_t>> rings;  // Per send lane, its steps.
  for (int32_t i = 0; i < sends; ++i) {
    const StepUse& use = uses[i];
    QuantStagingLayout::Placement& placement = layout.steps[i];
    placement.lane = use.lane;
    placement.scales = bytes;  // The scales first, each resident.
    bytes += Aligned(ScaleBytes(quant.sends[i].step));
    const int64_t fp8_bytes = Aligned(Volume(quant.sends[i].step.blocks));
    if (use.lane < 0) {  // Copied locally before the rounds, through the transient.
      transient = std::max(transient, fp8_bytes);
    } else {
      placement.birth = use.first;
      layout.births[{use.lane, use.first}].push_back(i);
      rings[use.lane].push_back(i);
    }
    bool scales_first = false;
    for (const auto& [lane, message] : use.scales) {
      if (use.lane < 0 || (lane == use.lane && message >= use.first)) continue;
      layout.scale_needs[{lane, message}].push_back(i);
      scales_first = true;
    }
    if (scales_first) {  // Its scales may be computed before its e4m3 blocks, then again.
      transient = std::max(transient, fp8_bytes);
      scratch = std::max(scratch, Aligned(ScaleBytes(quant.sends[i].step)));
    }
  }
  layout.scale_scratch = bytes;
  bytes += scratch;
  layout.transient = bytes;
  bytes += transient;
  for (auto& [lane, steps] : rings) {
    std::stable_sort(steps.begin(), steps.end(), [&](int32_t a, int32_t b) {
      return std::pair(uses[a].first, uses[a].last) < std::pair(uses[b].first, uses[b].last);
    });
    WSYNC_ASSIGN_OR_RETURN(const int64_t ring, PlaceRing(quant, uses, steps, bytes, layout));
    bytes += ring;
  }
  for (int32_t i = 0; i < sends; ++i) {
    const StagedQuantStep& staged = quant.sends[i];
    QuantStagingLayout::Placement& placement = layout.steps[i];
    if (placement.lane < 0) placement.fp8 = layout.transient;
    layout.ranges.push_back(
        {staged.fp8_offset, staged.fp8_offset + Volume(staged.step.blocks), placement.fp8});
    layout.ranges.push_back(
        {staged.scale_offset, staged.scale_offset + ScaleBytes(staged.step), placement.scales});
  }
  std::sort(layout.ranges.begin(), layout.ranges.end(),
            [](const auto& a, const auto& b) { return a.begin < b.begin; });
  layout.bytes = bytes;
  return layout;
}

}  // namespace wsync::executor_internal
