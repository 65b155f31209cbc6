#include "executor/work.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "executor/memory_kinds.h"
#include "executor/quant_work.h"
#include "executor/relay_work.h"
#include "transport/transport.h"

namespace wsync::executor_internal {
namespace {

std::string DescribeSegment(const Job& job, const Segment& s) {
  return absl::StrCat("parameter '", job.target().params[s.param].name, "' box ",
                      BoxToString(s.box), " from process ", s.from.process, " to process ",
                      s.to.process);
}

// Cuts segment `index` into chunks of whole rows along its outermost axis of extent > 1, each of
// at most `cap` bytes (one row when a row is larger). Refuses a row larger than the whole budget
// that a side would have to stage. A side whose buffer is not of the pair's memory kind stages.
absl::Status AppendChunks(const Job& job, const JobMemoryKinds& kinds, const Segment& s,
                          int32_t index, int64_t cap, int64_t budget, std::vector<Chunk>& out) {
  const int64_t element_size = SegmentElementSize(job, s);
  const int64_t bytes = Volume(s.box) * element_size;
  const MemoryKind wire = kinds.Pair(s.from.process, s.to.process);
  const MemoryKind from_kind = kinds.Buffer(s.from.process, s.from.buffer);
  const MemoryKind to_kind = kinds.Buffer(s.to.process, s.to.buffer);
  auto packed = [&](const Dims& shape, const Dims& strides, MemoryKind kind) {
    return kind == wire && IsPacked(shape, strides);
  };
  auto make_chunk = [&](const Dims& shape, int64_t from_offset, int64_t to_offset) {
    Chunk chunk;
    chunk.segment = index;
    chunk.shape = shape;
    chunk.from_offset = from_offset;
    chunk.to_offset = to_offset;
    chunk.element_size = element_size;
    chunk.bytes = Volume(shape) * element_size;
    chunk.from_packed = packed(shape, s.from.strides, from_kind);
    chunk.to_packed = packed(shape, s.to.strides, to_kind);
    chunk.from_kind = from_kind;
    chunk.to_kind = to_kind;
    return chunk;
  };
  int axis = -1;
  for (int a = 0; a < s.box.rank(); ++a) {
    if (s.box.extent[a] > 1) {
      axis = a;
      break;
    }
  }
  if (bytes <= cap || axis < 0) {
    out.push_back(make_chunk(s.box.extent, s.from.offset, s.to.offset));
    return absl::OkStatus();
  }
  const int64_t rows = s.box.extent[axis];
  const int64_t row_bytes = bytes / rows;
  Dims row_shape = s.box.extent;
  row_shape[axis] = 1;
  if (row_bytes > budget) {
    const bool from_packed = packed(row_shape, s.from.strides, from_kind);
    const bool to_packed = packed(row_shape, s.to.strides, to_kind);
    if (!from_packed || !to_packed) {
      return absl::InvalidArgumentError(absl::StrCat(
          "segment of ", DescribeSegment(job, s), " cannot be staged: one row along axis ", axis,
          " is ", row_bytes, " bytes, more than the staging budget of ", budget,
          " bytes, and it is not contiguous on the ", from_packed ? "receiving" : "sending",
          " side"));
    }
  }
  const int64_t rows_per_chunk = std::max<int64_t>(1, cap / row_bytes);
  for (int64_t begin = 0; begin < rows; begin += rows_per_chunk) {
    Dims shape = s.box.extent;
    shape[axis] = std::min(rows_per_chunk, rows - begin);
    out.push_back(make_chunk(shape, s.from.offset + begin * s.from.strides[axis],
                             s.to.offset + begin * s.to.strides[axis]));
  }
  return absl::OkStatus();
}

// Both ends of a pair order its segments the same way, whatever order they were given in.
bool CanonicalLess(const Segment& a, const Segment& b) {
  return std::tie(a.param, a.box.origin, a.box.extent, a.from.buffer, a.from.offset, a.to.buffer,
                  a.to.offset) < std::tie(b.param, b.box.origin, b.box.extent, b.from.buffer,
                                          b.from.offset, b.to.buffer, b.to.offset);
}

// Packs a pair's chunks (in order) into messages; identical on both ends.
std::vector<Message> BuildMessages(const std::vector<Chunk>& chunks,
                                   const std::vector<int32_t>& order, int64_t cap) {
  std::vector<Message> messages;
  Message current;
  auto flush = [&] {
    if (!current.chunks.empty()) messages.push_back(std::move(current));
    current = Message{};
  };
  for (int32_t index : order) {
    const Chunk& chunk = chunks[index];
    const bool alone = ((chunk.from_packed || chunk.to_packed) && chunk.bytes > kSmallChunkBytes) ||
                       chunk.bytes > cap;
    if (alone) flush();
    if (!alone && current.bytes + chunk.bytes > cap) flush();
    current.chunks.push_back(index);
    current.bytes += chunk.bytes;
    current.elements += chunk.bytes / chunk.element_size;
    if (alone) flush();
  }
  flush();
  return messages;
}

}  // namespace

std::optional<int64_t> IntegerBudgetBytes(const StagingBudget& budget) {
  const double bytes = budget.bytes;
  if (!std::isfinite(bytes) || bytes != std::floor(bytes) || bytes < 0 || bytes > 0x1p62) {
    return std::nullopt;
  }
  return static_cast<int64_t>(bytes);
}

absl::StatusOr<int64_t> ValidateBudget(const Job& job, const StagingBudget& budget) {
  int64_t largest_element = 1;
  for (const ParamInfo& param : job.target().params) {
    largest_element = std::max(largest_element, DTypeSize(param.dtype));
  }
  const double bytes = budget.bytes;
  if (!IntegerBudgetBytes(budget)) {
    return absl::InvalidArgumentError(
        absl::StrCat("staging budget ", bytes, " bytes is not an integer number of bytes"));
  }
  if (static_cast<int64_t>(bytes) < largest_element) {
    return absl::InvalidArgumentError(absl::StrCat("staging budget of ", bytes,
                                                   " bytes is less than one element (",
                                                   largest_element, " bytes)"));
  }
  return static_cast<int64_t>(bytes);
}

absl::StatusOr<Work> BuildLanes(const Job& job, absl::Span<const Segment> segments,
                                const Endpoints& endpoints, const StagingBudget& budget,
                                int32_t process) {
  WSYNC_ASSIGN_OR_RETURN(const int64_t budget_bytes, ValidateBudget(job, budget));
  auto named = [&](int32_t p) {
    return std::find(endpoints.processes.begin(), endpoints.processes.end(), p) !=
           endpoints.processes.end();
  };
  if (!named(process)) {
    return absl::InvalidArgumentError(
        absl::StrCat("process ", process, " is not one of the batch's endpoints"));
  }
  const JobMemoryKinds kinds(job);
  Work work;
  work.process = process;
  work.budget_bytes = budget_bytes;
  work.any_cuda = kinds.any_cuda();
  work.relay_arena_kind = kinds.Process(process);
  const int64_t cap = std::max<int64_t>(budget_bytes / 2, 1);

  // Segments of each ordered pair this process is in, in canonical order.
  std::map<std::pair<int32_t, int32_t>, std::vector<int32_t>> pairs;
  for (int32_t i = 0; i < static_cast<int32_t>(segments.size()); ++i) {
    const Segment& s = segments[i];
    if (s.from.process != process && s.to.process != process) continue;
    for (int32_t end : {s.from.process, s.to.process}) {
      if (!named(end)) {
        return absl::InvalidArgumentError(absl::StrCat("segment of ", DescribeSegment(job, s),
                                                       " names process ", end,
                                                       ", which is not one of the endpoints"));
      }
    }
    ++work.segments;
    if (s.from.process == s.to.process) {
      work.local_segments.push_back(i);
      continue;
    }
    pairs[{s.from.process, s.to.process}].push_back(i);
  }
  // Sends by peer, then receives by peer.
  for (Direction direction : {Direction::kSend, Direction::kReceive}) {
    for (auto& [pair, indices] : pairs) {
      const bool sending = pair.first == process;
      if (sending != (direction == Direction::kSend)) continue;
      std::sort(indices.begin(), indices.end(),
                [&](int32_t a, int32_t b) { return CanonicalLess(segments[a], segments[b]); });
      std::vector<int32_t> order;
      for (int32_t index : indices) {
        const size_t first = work.chunks.size();
        WSYNC_RETURN_IF_ERROR(
            AppendChunks(job, kinds, segments[index], index, cap, budget_bytes, work.chunks));
        for (size_t c = first; c < work.chunks.size(); ++c) order.push_back(c);
      }
      Lane lane;
      lane.peer = sending ? pair.second : pair.first;
      lane.direction = direction;
      lane.kind = kinds.Pair(pair.first, pair.second);
      lane.messages = BuildMessages(work.chunks, order, cap);
      if (static_cast<int64_t>(lane.messages.size()) > kMaxRounds) {
        return absl::InvalidArgumentError(absl::StrCat(
            "process ", process, " would need ", lane.messages.size(), " rounds with process ",
            lane.peer, ", more than ", kMaxRounds, "; raise the staging budget"));
      }
      int32_t staged = 0;
      for (Message& message : lane.messages) {
        const Chunk& only = work.chunks[message.chunks[0]];
        message.direct =
            message.chunks.size() == 1 && (sending ? only.from_packed : only.to_packed);
        if (!message.direct) {
          ++staged;
          lane.slot_bytes = std::max(lane.slot_bytes, message.bytes);
        }
      }
      if (staged > 0) lane.slots = (staged >= 2 && 2 * lane.slot_bytes <= budget_bytes) ? 2 : 1;
      int32_t ordinal = 0;
      for (Message& message : lane.messages) {
        if (!message.direct) message.slot = ordinal++ % lane.slots;
      }
      work.lanes.push_back(std::move(lane));
    }
  }
  return work;
}

absl::StatusOr<Work> BuildWork(const Job& job, absl::Span<const Segment> segments,
                               const Endpoints& endpoints, const StagingBudget& budget,
                               int32_t process) {
  WSYNC_ASSIGN_OR_RETURN(Work work, BuildLanes(job, segments, endpoints, budget, process));
  WSYNC_RETURN_IF_ERROR(AssignRelayRounds(job, segments, endpoints, budget, work));
  return work;
}

ProcessSchedule Summarize(const Job& job, const Work& work, absl::Span<const Segment> segments) {
  ProcessSchedule schedule;
  schedule.process = work.process;
  schedule.segments = work.segments;
  for (const Lane& lane : work.lanes) {
    PeerSchedule peer;
    peer.peer = lane.peer;
    peer.direction = lane.direction;
    peer.arena_slots = lane.slots;
    peer.arena_slot_bytes = lane.slot_bytes;
    peer.forwarding = lane.forwarding;
    peer.arena_kind = lane.kind;
    for (const Message& message : lane.messages) {
      peer.rounds.push_back(ScheduledRound{message.round, message.bytes, message.elements,
                                           static_cast<int32_t>(message.chunks.size()),
                                           message.direct});
      schedule.chunks += static_cast<int64_t>(message.chunks.size());
      (lane.direction == Direction::kSend ? schedule.sent_bytes : schedule.received_bytes) +=
          message.bytes;
      (message.direct ? schedule.direct_bytes : schedule.staged_bytes) += message.bytes;
    }
    if (!lane.messages.empty()) {
      schedule.rounds = std::max(schedule.rounds, lane.messages.back().round + 1);
    }
    schedule.arena_bytes += peer.arena_bytes();
    if (lane.kind == MemoryKind::kCuda) schedule.cuda_arena_bytes += peer.arena_bytes();
    schedule.peers.push_back(std::move(peer));
  }
  for (int32_t index : work.local_segments) {
    const Segment& s = segments[index];
    const int64_t elements = Volume(s.box);
    const int64_t bytes = elements * SegmentElementSize(job, s);
    schedule.local_copies.push_back(LocalCopy{index, bytes, elements});
    schedule.local_copy_bytes += bytes;
    ++schedule.chunks;
  }
  SummarizeRelays(job, work, segments, schedule);
  schedule.quant_staging_bytes = work.quant_staging_bytes;
  schedule.quant_staging_whole_bytes = work.quant_staging_whole_bytes;
  schedule.quant_arena_bytes = work.quant_arena_bytes;
  schedule.quantized_elements = work.quantized_elements;
  schedule.arena_bytes += work.quant_staging_bytes + work.quant_arena_bytes;
  if (work.relay_arena_kind == MemoryKind::kCuda) {  // The process's kind (memory_kinds.h).
    schedule.cuda_arena_bytes +=
        work.relay_arena_bytes + work.quant_staging_bytes + work.quant_arena_bytes;
  }
  return schedule;
}

}  // namespace wsync::executor_internal
