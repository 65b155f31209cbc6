#include "executor/delta_run.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/cpu_time.h"
#include "common/hash.h"
#include "common/status.h"
#include "executor/copy.h"
#include "executor/delta_codec.h"
#include "planner/layout.h"

namespace wsync::executor_internal {
namespace {

bool WeightBuffer(uint64_t buffer) {
  return buffer != kRelayArenaBuffer && buffer != kQuantArenaBuffer &&
         buffer != kQuantStagingBuffer;
}

absl::Span<uint8_t> Bytes(char* data, int64_t bytes) {
  return absl::MakeSpan(reinterpret_cast<uint8_t*>(data), static_cast<size_t>(bytes));
}

}  // namespace

uint64_t DeltaRuleDigest(const DeltaOptions& options) {
  if (!options.on || !options.automatic) return 0;
  std::string rule = "auto";
  for (const auto& [path_class, fraction] : options.pays_below) {
    absl::StrAppend(&rule, ";", path_class, "=", absl::StrFormat("%a", fraction));
  }
  return Xxh3(rule.data(), rule.size()) | 1;  // Never 0, which is without auto.
}

DeltaClaim DeltaClaimOf(const DeltaOptions& options) {
  return DeltaClaim{options.on, options.held_version, DeltaRuleDigest(options),
                    options.observed.changed_elements, options.observed.compared_elements};
}

DeltaLanes::DeltaLanes(const Job& job, absl::Span<const Segment> segments, Work& work,
                       const DeltaOptions& options, DeltaAgreed agreed, uint64_t sync_id,
                       int32_t wave, AddressOf address_of)
    : job_(job),
      segments_(segments),
      work_(work),
      options_(options),
      held_(std::move(agreed.held_versions)),
      changed_fraction_(agreed.changed_fraction),
      sync_id_(sync_id),
      wave_(wave),
      address_of_(std::move(address_of)),
      lanes_(work.lanes.size()) {
  for (size_t lane = 0; lane < work.lanes.size(); ++lane) {
    lanes_[lane].runs = Runs(work.lanes[lane]);
    lanes_[lane].announces = lanes_[lane].runs && Announces(work.lanes[lane]);
    lanes_[lane].offsets.assign(work.lanes[lane].messages.size(), -1);
    int64_t word = 1;
    for (const Message& message : work.lanes[lane].messages) {
      lanes_[lane].first_words.push_back(word);
      word += std::ssize(message.chunks);
    }
  }
}

bool DeltaLanes::Runs(const Lane& lane) const {
  if (!options_.on || lane.kind != MemoryKind::kHost || lane.forwarding) {
    return false;
  }
  if (!options_.automatic) return true;
  const bool sends = lane.direction == Direction::kSend;
  const auto it = options_.pays_below.find(std::string(
      job_.PathClass(sends ? work_.process : lane.peer, sends ? lane.peer : work_.process)));
  if (it == options_.pays_below.end() || !(it->second > 0)) return false;
  return !changed_fraction_.has_value() || *changed_fraction_ < it->second;
}

bool DeltaLanes::Announces(const Lane& lane) const {
  const int32_t receiver = lane.direction == Direction::kSend ? lane.peer : work_.process;
  return receiver < std::ssize(held_) && held_[receiver].has_value();
}

bool DeltaLanes::Encodable(const Chunk& chunk) const {
  const Segment& s = segments_[chunk.segment];
  return chunk.from_kind == MemoryKind::kHost && chunk.to_kind == MemoryKind::kHost &&
         (WeightBuffer(s.from.buffer) || s.from.buffer == kQuantStagingBuffer) &&
         WeightBuffer(s.to.buffer);
}

absl::Status DeltaLanes::EncodeLane(int32_t lane_index) {
  Lane& lane = work_.lanes[lane_index];
  LaneDelta& delta = lanes_[lane_index];
  DeltaBaseStore* const bases = options_.bases;
  if (delta.announces) delta.announcement.assign(1, static_cast<int64_t>(sync_id_));
  std::vector<uint8_t> packed;  // A chunk's current bytes when its source is strided.
  std::vector<int64_t> sizes;
  // Dense chunks of a message none of whose chunks saved so far: appended only once one saves
  // (most messages whose chunks all changed never do: no copy of their bytes).
  std::vector<int32_t> deferred;
  for (size_t index = 0; index < lane.messages.size(); ++index) {
    Message& message = lane.messages[index];
    // Encodings go straight into the lane's payload, cut back when the message travels as planned.
    // A message none of whose chunks has a base (a first sync) cannot save: nothing is encoded.
    const size_t mark = delta.payload.size();
    if (delta.announces) delta.announced_bytes += message.bytes;
    bool encodable = delta.announces && bases != nullptr && HasBase(lane, message);
    bool saves = false;
    sizes.clear();
    deferred.clear();
    for (int32_t chunk_index : message.chunks) {
      const Chunk& chunk = work_.chunks[chunk_index];
      if (!Encodable(chunk)) {
        encodable = false;
        continue;
      }
      if (bases == nullptr) continue;
      const absl::Span<const uint8_t> current = Current(chunk, &packed);
      const int element_bytes = static_cast<int>(chunk.element_size);
      const uint64_t key = DeltaChunkKey(wave_, chunk_index);
      // The base is advanced to `current` in place as it is compared (no copy), or recorded.
      const std::optional<absl::Span<uint8_t>> base =
          encodable ? bases->Advance(key, *held_[lane.peer]) : std::nullopt;
      const size_t before = delta.payload.size();
      int64_t size = 0;  // Of the chunk's encoding.
      if (base.has_value() && base->size() == current.size() &&
          !SampledMostlyChanged(*base, current, element_bytes)) {
        WSYNC_ASSIGN_OR_RETURN(
            const DeltaEncodingSummary summary,
            AppendDeltaAdvancingBase(*base, current, element_bytes, &delta.payload));
        size = static_cast<int64_t>(delta.payload.size() - before);
        if (!saves && summary.kind != DeltaKind::kDense) {
          saves = true;
          AppendDeferred(deferred, mark, &delta.payload);
        }
        observed_.changed_elements +=
            summary.mostly_changed ? summary.elements : summary.changed_elements;
        observed_.compared_elements += summary.elements;
      } else {
        if (base.has_value() && base->size() == current.size()) {  // Sampled: mostly changed.
          observed_.changed_elements += chunk.bytes / element_bytes;
          observed_.compared_elements += chunk.bytes / element_bytes;
        }
        bases->Record(key, current);
        if (encodable && saves) AppendDenseDelta(current, element_bytes, &delta.payload);
        if (encodable && !saves) deferred.push_back(chunk_index);
        size = encodable && !saves ? kDeltaHeaderBytes + chunk.bytes
                                   : static_cast<int64_t>(delta.payload.size() - before);
      }
      sizes.push_back(size);
    }
    const auto encoded_bytes = static_cast<int64_t>(delta.payload.size() - mark);
    encodable = encodable && saves && encoded_bytes < message.bytes;
    if (!encodable) delta.payload.resize(mark);
    if (!delta.announces) continue;
    for (size_t chunk = 0; chunk < message.chunks.size(); ++chunk) {
      delta.announcement.push_back(encodable ? sizes[chunk] : -1);
    }
    if (!encodable) continue;
    delta.offsets[index] = static_cast<int64_t>(mark);
    delta.saved_bytes += message.bytes - encoded_bytes;
    ++messages_;
    message.bytes = encoded_bytes;
  }
  return absl::OkStatus();
}

absl::Span<const uint8_t> DeltaLanes::Current(const Chunk& chunk,
                                              std::vector<uint8_t>* packed) const {
  const Segment& s = segments_[chunk.segment];
  char* from = address_of_(s.from, chunk.from_offset, chunk.element_size);
  if (chunk.from_packed) return Bytes(from, chunk.bytes);
  packed->resize(static_cast<size_t>(chunk.bytes));
  PackRegion(packed->data(), from, s.from.strides, chunk.shape, chunk.element_size);
  return *packed;
}

void DeltaLanes::AppendDeferred(absl::Span<const int32_t> deferred, size_t mark,
                                std::vector<uint8_t>* payload) const {
  if (deferred.empty()) return;
  std::vector<uint8_t> dense, packed;
  for (int32_t chunk_index : deferred) {
    const Chunk& chunk = work_.chunks[chunk_index];
    AppendDenseDelta(Current(chunk, &packed), static_cast<int>(chunk.element_size), &dense);
  }
  payload->insert(payload->begin() + static_cast<std::ptrdiff_t>(mark), dense.begin(), dense.end());
}

bool DeltaLanes::HasBase(const Lane& lane, const Message& message) const {
  for (int32_t chunk_index : message.chunks) {
    if (options_.bases->Base(DeltaChunkKey(wave_, chunk_index), *held_[lane.peer]).has_value()) {
      return true;
    }
  }
  return false;
}

absl::Status DeltaLanes::CheckAnnouncement(int32_t lane_index) {
  Lane& lane = work_.lanes[lane_index];
  LaneDelta& delta = lanes_[lane_index];
  auto refuse = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat("delta: the announcement from process ", lane.peer,
                                            " does not fit this process's work: ", why));
  };
  if (delta.announcement[0] != static_cast<int64_t>(sync_id_)) {
    return refuse(absl::StrCat("sync id ", delta.announcement[0], ", expected ", sync_id_));
  }
  size_t word = 1;
  int64_t total = 0;
  std::vector<int64_t> encoded_bytes(lane.messages.size(), 0);
  for (size_t index = 0; index < lane.messages.size(); ++index) {
    const Message& message = lane.messages[index];
    const size_t first = word;
    word += message.chunks.size();
    if (delta.announcement[first] == -1) {
      for (size_t w = first; w < word; ++w) {
        if (delta.announcement[w] != -1) {
          return refuse(absl::StrCat("message ", index, " is partly dense"));
        }
      }
      continue;
    }
    int64_t bytes = 0;
    for (size_t i = 0; i < message.chunks.size(); ++i) {
      const Chunk& chunk = work_.chunks[message.chunks[i]];
      const int64_t size = delta.announcement[first + i];
      if (chunk.to_kind != MemoryKind::kHost) {
        return refuse(absl::StrCat("message ", index, " is encoded into device memory"));
      }
      if (size < kDeltaHeaderBytes || size > kDeltaHeaderBytes + chunk.bytes) {
        return refuse(absl::StrCat("chunk ", i, " of message ", index, " announces ", size,
                                   " bytes, outside [", kDeltaHeaderBytes, ", ",
                                   kDeltaHeaderBytes + chunk.bytes, "]"));
      }
      bytes += size;
    }
    if (bytes >= message.bytes) {
      return refuse(absl::StrCat("message ", index, " announces ", bytes, " bytes, not fewer than ",
                                 message.bytes));
    }
    delta.offsets[index] = total;
    total += bytes;
    encoded_bytes[index] = bytes;
  }
  delta.payload.resize(static_cast<size_t>(total));
  for (size_t index = 0; index < lane.messages.size(); ++index) {
    if (delta.offsets[index] < 0) continue;
    Message& message = lane.messages[index];
    delta.saved_bytes += message.bytes - encoded_bytes[index];
    ++messages_;
    message.bytes = encoded_bytes[index];
  }
  return absl::OkStatus();
}

absl::Status DeltaLanes::Exchange(Transport& transport, absl::Time deadline) {
  if (!options_.on) return absl::OkStatus();
  for (int32_t lane = 0; lane < std::ssize(work_.lanes); ++lane) {
    const Lane& l = work_.lanes[lane];
    if (!l.messages.empty() && l.messages.back().round >= kDeltaRound) {
      return absl::InvalidArgumentError(
          absl::StrCat("delta: process ", work_.process, " has ", l.messages.back().round + 1,
                       " rounds with process ", l.peer, "; round ", kDeltaRound,
                       " is reserved for the announcements"));
    }
  }
  const double encode_start = ThreadCpuSeconds();
  for (int32_t lane = 0; lane < std::ssize(work_.lanes); ++lane) {
    const Lane& l = work_.lanes[lane];
    if (l.direction != Direction::kSend || !lanes_[lane].runs) continue;
    WSYNC_RETURN_IF_ERROR(EncodeLane(lane));
  }
  encode_cpu_seconds_ += ThreadCpuSeconds() - encode_start;
  announced_ = true;
  for (int32_t lane = 0; lane < std::ssize(work_.lanes); ++lane) {
    const Lane& l = work_.lanes[lane];
    if (l.direction != Direction::kSend || !lanes_[lane].announces) continue;
    const std::vector<int64_t>& words = lanes_[lane].announcement;
    WSYNC_ASSIGN_OR_RETURN(
        const RequestId request,
        transport.PostSend(l.peer, MakeTag(sync_id_, kDeltaRound, work_.process), words.data(),
                           static_cast<int64_t>(words.size() * sizeof(int64_t))));
    sends_.push_back(request);
  }
  std::vector<RequestId> receives;
  std::vector<int32_t> receiving;
  for (int32_t lane = 0; lane < std::ssize(work_.lanes); ++lane) {
    const Lane& l = work_.lanes[lane];
    if (l.direction != Direction::kReceive || !lanes_[lane].announces) continue;
    std::vector<int64_t>& words = lanes_[lane].announcement;
    const std::vector<int64_t>& first = lanes_[lane].first_words;
    const size_t chunks = l.messages.empty() ? 0 : l.messages.back().chunks.size();
    words.assign(l.messages.empty() ? 1 : static_cast<size_t>(first.back()) + chunks, 0);
    WSYNC_ASSIGN_OR_RETURN(
        const RequestId request,
        transport.PostReceive(l.peer, MakeTag(sync_id_, kDeltaRound, l.peer), words.data(),
                              static_cast<int64_t>(words.size() * sizeof(int64_t))));
    receives.push_back(request);
    receiving.push_back(lane);
  }
  if (receives.empty()) return absl::OkStatus();
  WSYNC_RETURN_IF_ERROR(transport.WaitAll(receives, deadline));
  for (int32_t lane : receiving) WSYNC_RETURN_IF_ERROR(CheckAnnouncement(lane));
  return absl::OkStatus();
}

char* DeltaLanes::Payload(int32_t lane, int32_t index) const {
  const int64_t offset = lanes_[lane].offsets[index];
  if (offset < 0) return nullptr;
  return reinterpret_cast<char*>(lanes_[lane].payload.data()) + offset;
}

absl::Status DeltaLanes::Apply(absl::Span<const std::pair<int32_t, int32_t>> received) {
  if (std::none_of(received.begin(), received.end(),
                   [&](const auto& at) { return Payload(at.first, at.second) != nullptr; })) {
    return absl::OkStatus();  // Nothing encoded: not timed.
  }
  const double start = ThreadCpuSeconds();
  absl::Status status = ApplyReceived(received);
  apply_cpu_seconds_ += ThreadCpuSeconds() - start;
  return status;
}

absl::Status DeltaLanes::ApplyReceived(absl::Span<const std::pair<int32_t, int32_t>> received) {
  std::vector<uint8_t> packed;
  for (const auto& [lane, index] : received) {
    const char* payload = Payload(lane, index);
    if (payload == nullptr) continue;
    const Lane& l = work_.lanes[lane];
    const Message& message = l.messages[index];
    const size_t word = lanes_[lane].first_words[index];
    int64_t at = 0;
    for (size_t i = 0; i < message.chunks.size(); ++i) {
      const Chunk& chunk = work_.chunks[message.chunks[i]];
      const Segment& s = segments_[chunk.segment];
      const int64_t size = lanes_[lane].announcement[word + i];
      const auto encoding = absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(payload) + at,
                                                static_cast<size_t>(size));
      at += size;
      char* to = address_of_(s.to, chunk.to_offset, chunk.element_size);
      absl::Span<uint8_t> target = Bytes(to, chunk.bytes);
      if (!chunk.to_packed) {
        packed.resize(static_cast<size_t>(chunk.bytes));
        PackRegion(packed.data(), to, s.to.strides, chunk.shape, chunk.element_size);
        target = absl::MakeSpan(packed);
      }
      if (absl::Status applied = ApplyDelta(encoding, static_cast<int>(chunk.element_size), target);
          !applied.ok()) {
        return absl::DataLossError(absl::StrCat("delta from process ", l.peer, ": chunk ", i,
                                                " of message ", index, ": ", applied.message()));
      }
      if (!chunk.to_packed) {
        UnpackRegion(to, s.to.strides, packed.data(), chunk.shape, chunk.element_size);
      }
    }
  }
  return absl::OkStatus();
}

int64_t DeltaLanes::saved_bytes() const {
  int64_t saved = 0;
  for (const LaneDelta& delta : lanes_) saved += delta.saved_bytes;
  return saved;
}

void DeltaLanes::WriteStats(TransferStats& stats) const {
  stats.delta_messages = messages_;
  stats.delta_saved_bytes = saved_bytes();
  for (auto& by_direction : stats.delta_saved_by_path) by_direction[0] = by_direction[1] = 0;
  for (size_t lane = 0; lane < lanes_.size(); ++lane) {
    const Lane& work_lane = work_.lanes[lane];
    const int path = PathClassIndex(job_.PathClass(work_.process, work_lane.peer));
    if (path < 0) continue;
    stats.delta_saved_by_path[path][work_lane.direction == Direction::kSend ? 0 : 1] +=
        lanes_[lane].saved_bytes;
  }
  stats.delta_announced_sent_bytes = stats.delta_announced_wire_bytes = 0;
  for (const LaneDelta& delta : lanes_) {
    stats.delta_announced_sent_bytes += delta.announced_bytes;
    if (delta.announced_bytes > 0) {
      stats.delta_announced_wire_bytes += delta.announced_bytes - delta.saved_bytes;
    }
  }
  stats.delta_compared_elements = observed_.compared_elements;
  stats.delta_changed_elements = observed_.changed_elements;
  stats.delta_changed_fraction = changed_fraction_;
  stats.delta_encode_cpu_seconds = encode_cpu_seconds_;
  stats.delta_apply_cpu_seconds = apply_cpu_seconds_;
}

void DeltaLanes::Release(Transport& transport, absl::Time until, bool failed) {
  if (failed && !announced_ && options_.on) {
    static const char kNotice = 0;
    for (int32_t lane = 0; lane < std::ssize(work_.lanes); ++lane) {
      const Lane& l = work_.lanes[lane];
      if (l.direction != Direction::kSend || !lanes_[lane].announces) continue;
      absl::StatusOr<RequestId> notice =
          transport.PostSend(l.peer, MakeTag(sync_id_, kDeltaRound, work_.process), &kNotice, 1);
      if (notice.ok()) sends_.push_back(*notice);
    }
    announced_ = true;
  }
  if (!sends_.empty()) transport.WaitAll(sends_, until).IgnoreError();
  sends_.clear();
}

}  // namespace wsync::executor_internal
