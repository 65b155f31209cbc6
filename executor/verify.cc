#include "executor/verify.h"

#include <xxhash.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "executor/chunk_mac.h"
#include "executor/execute.h"
#include "planner/geometry.h"

namespace wsync::executor_internal {
namespace {

// The smallest bounce buffer: one element of any dtype, several for small chunks.
constexpr int64_t kMinBounceBytes = 256;

struct StateDeleter {
  void operator()(XXH3_state_t* state) const { XXH3_freeState(state); }
};
using HashState = std::unique_ptr<XXH3_state_t, StateDeleter>;

HashState NewHashState() {
  HashState state(XXH3_createState());
  XXH3_64bits_reset(state.get());
  return state;
}

// A row-major piece of a region, copied into the bounce buffer at `at`.
struct Piece {
  size_t region = 0;
  int64_t at = 0;
  int64_t bytes = 0;
};

// Where the bytes of device regions go once they are in the bounce buffer: region, bytes.
using FeedPiece = std::function<void(size_t region, const char* data, size_t bytes)>;

// Enqueues the copies of device regions into a host bounce buffer, piece by piece in each
// region's row-major order, and feeds every filled bounce buffer to `feed`, region by region in
// the order of their pieces.
class BounceCopier {
 public:
  BounceCopier(DeviceMemory& device, absl::Span<char> bounce, absl::Time deadline, FeedPiece feed)
      : device_(device), bounce_(bounce), deadline_(deadline), feed_(std::move(feed)) {}

  // Enqueues region `index` (its pieces of at most bounce_.size() bytes).
  absl::Status Add(size_t index, const DeviceRegion& region) {
    const Dims& shape = region.shape;
    const int64_t axes = static_cast<int64_t>(shape.size());
    const int64_t capacity = static_cast<int64_t>(bounce_.size());
    for (int64_t extent : shape) {
      if (extent == 0) return absl::OkStatus();  // No bytes: the digest of nothing.
    }
    // inner[a]: bytes of one index of axis a (the axes after it, row-major).
    absl::InlinedVector<int64_t, kMaxAxes + 1> inner(axes + 1, region.element_size);
    for (int64_t a = axes - 1; a >= 0; --a) inner[a] = inner[a + 1] * shape[a];
    // Whole region at once, or cut along the outermost axis whose single index fits.
    int64_t split = -1;
    if (inner[0] > capacity) {
      split = 0;
      while (inner[split + 1] > capacity) {
        if (++split == axes) {
          return absl::InvalidArgumentError("verify: the bounce buffer cannot hold one element");
        }
      }
    }
    if (split < 0) return AddPiece(index, region.base, region.strides, shape, region.element_size);
    const int64_t rows = capacity / inner[split + 1];  // Indices of axis `split` per piece.
    absl::InlinedVector<int64_t, kMaxAxes> position(split, 0);  // Over the axes before `split`.
    Dims piece = shape;
    for (int64_t a = 0; a < split; ++a) piece[a] = 1;
    for (;;) {
      int64_t offset = 0;
      for (int64_t a = 0; a < split; ++a) offset += position[a] * region.strides[a];
      for (int64_t row = 0; row < shape[split]; row += rows) {
        piece[split] = std::min(rows, shape[split] - row);
        const char* base = static_cast<const char*>(region.base) +
                           (offset + row * region.strides[split]) * region.element_size;
        WSYNC_RETURN_IF_ERROR(AddPiece(index, base, region.strides, piece, region.element_size));
      }
      int64_t a = split - 1;
      for (; a >= 0; --a) {
        if (++position[a] < shape[a]) break;
        position[a] = 0;
      }
      if (a < 0) return absl::OkStatus();
    }
  }

  // Feeds what is still in the bounce buffer.
  absl::Status Flush() {
    if (pieces_.empty()) return absl::OkStatus();
    WSYNC_RETURN_IF_ERROR(device_.Synchronize(deadline_));
    for (const Piece& piece : pieces_) {
      feed_(piece.region, bounce_.data() + piece.at, static_cast<size_t>(piece.bytes));
    }
    pieces_.clear();
    used_ = 0;
    return absl::OkStatus();
  }

 private:
  absl::Status AddPiece(size_t index, const void* base, const Dims& strides, const Dims& shape,
                        int64_t element_size) {
    int64_t bytes = element_size;
    for (int64_t extent : shape) bytes *= extent;
    if (used_ + bytes > static_cast<int64_t>(bounce_.size())) WSYNC_RETURN_IF_ERROR(Flush());
    WSYNC_RETURN_IF_ERROR(device_.CopyStridedAsync(bounce_.data() + used_, RowMajorStrides(shape),
                                                   base, strides, shape, element_size));
    pieces_.push_back(Piece{index, used_, bytes});
    used_ += bytes;
    return absl::OkStatus();
  }

  DeviceMemory& device_;
  absl::Span<char> bounce_;
  const absl::Time deadline_;
  FeedPiece feed_;
  std::vector<Piece> pieces_;  // Copied into the bounce buffer since the last flush.
  int64_t used_ = 0;
};

absl::Status CopyDeviceRegions(DeviceMemory& device, absl::Span<const DeviceRegion> regions,
                               absl::Span<char> bounce, absl::Time deadline, FeedPiece feed) {
  BounceCopier copier(device, bounce, deadline, std::move(feed));
  for (size_t r = 0; r < regions.size(); ++r) WSYNC_RETURN_IF_ERROR(copier.Add(r, regions[r]));
  return copier.Flush();
}

// Calls feed(data, bytes) for the contiguous runs of the region `shape` at `base` in row-major
// order; nothing for an empty region.
template <typename Feed>
void ForEachRun(const void* base, const Dims& strides, const Dims& shape, int64_t element_size,
                Feed&& feed) {
  // Axes of extent > 1, outermost first; the innermost ones that are dense in row-major order form
  // one contiguous run of `run` bytes.
  absl::InlinedVector<std::pair<int64_t, int64_t>, kMaxAxes> axes;  // (extent, byte stride)
  for (size_t a = 0; a < shape.size(); ++a) {
    if (shape[a] == 0) return;
    if (shape[a] > 1) axes.push_back({shape[a], strides[a] * element_size});
  }
  int64_t run = element_size;
  while (!axes.empty() && axes.back().second == run) {
    run *= axes.back().first;
    axes.pop_back();
  }
  const char* data = static_cast<const char*>(base);
  // An odometer over the outer axes; each position feeds one run.
  absl::InlinedVector<int64_t, kMaxAxes> index(axes.size(), 0);
  int64_t offset = 0;
  for (;;) {
    feed(data + offset, static_cast<size_t>(run));
    int a = static_cast<int>(axes.size()) - 1;
    for (; a >= 0; --a) {
      offset += axes[a].second;
      if (++index[a] < axes[a].first) break;
      offset -= axes[a].second * axes[a].first;
      index[a] = 0;
    }
    if (a < 0) return;
  }
}

}  // namespace

uint64_t HashRegion(const void* base, const Dims& strides, const Dims& shape,
                    int64_t element_size) {
  const HashState state = NewHashState();
  ForEachRun(base, strides, shape, element_size,
             [&](const char* data, size_t bytes) { XXH3_64bits_update(state.get(), data, bytes); });
  return XXH3_64bits_digest(state.get());
}

absl::StatusOr<MacTag> MacRegion(LaneMac& mac, uint64_t position, const void* base,
                                 const Dims& strides, const Dims& shape, int64_t element_size) {
  MacStream& stream = mac.stream();
  stream.Start(position);
  ForEachRun(base, strides, shape, element_size,
             [&](const char* data, size_t bytes) { stream.Update(data, bytes); });
  return stream.Finish();
}

absl::Status HashDeviceRegions(DeviceMemory& device, absl::Span<const DeviceRegion> regions,
                               absl::Span<char> bounce, absl::Time deadline,
                               absl::Span<uint64_t> hashes) {
  std::vector<HashState> states;
  states.reserve(regions.size());
  for (size_t r = 0; r < regions.size(); ++r) states.push_back(NewHashState());
  WSYNC_RETURN_IF_ERROR(CopyDeviceRegions(device, regions, bounce, deadline,
                                          [&](size_t region, const char* data, size_t bytes) {
                                            XXH3_64bits_update(states[region].get(), data, bytes);
                                          }));
  for (size_t r = 0; r < states.size(); ++r) hashes[r] = XXH3_64bits_digest(states[r].get());
  return absl::OkStatus();
}

absl::Status MacDeviceRegions(DeviceMemory& device, absl::Span<const DeviceRegion> regions,
                              absl::Span<const uint64_t> positions, LaneMac& mac,
                              absl::Span<char> bounce, absl::Time deadline,
                              absl::Span<MacTag> tags) {
  std::vector<MacStream> streams;
  streams.reserve(regions.size());
  for (size_t r = 0; r < regions.size(); ++r) {
    streams.emplace_back(mac);
    streams.back().Start(positions[r]);
  }
  WSYNC_RETURN_IF_ERROR(CopyDeviceRegions(
      device, regions, bounce, deadline,
      [&](size_t region, const char* data, size_t bytes) { streams[region].Update(data, bytes); }));
  for (size_t r = 0; r < streams.size(); ++r) {
    WSYNC_ASSIGN_OR_RETURN(tags[r], streams[r].Finish());
  }
  return absl::OkStatus();
}

ChunkVerifier::ChunkVerifier(const Job& job, const Work& work, absl::Span<const Segment> segments,
                             AddressOf address_of, uint64_t sync_id, int32_t wave,
                             DeviceMemory* device, int64_t bounce_bytes, absl::Time deadline,
                             DeviceArea device_area, const DataKey* key)
    : job_(job),
      work_(work),
      segments_(segments),
      address_of_(std::move(address_of)),
      sync_id_(sync_id),
      wave_(wave),
      local_(work.lanes.size()),
      remote_(work.lanes.size()),
      device_(device),
      bounce_bytes_(bounce_bytes),
      deadline_(deadline),
      device_area_source_(std::move(device_area)),
      device_offset_(work.lanes.size(), -1),
      key_(key),
      words_per_chunk_(key != nullptr ? std::tuple_size_v<MacTag> : 1),
      macs_(work.lanes.size()) {
  for (size_t lane = 0; lane < work.lanes.size(); ++lane) {
    size_t chunks = 0;
    for (const Message& message : work.lanes[lane].messages) chunks += message.chunks.size();
    expected_.push_back(1 + chunks * words_per_chunk_);
    local_[lane].reserve(expected_.back());
    local_[lane].push_back(sync_id);
  }
}

ChunkVerifier::~ChunkVerifier() {
  if (owns_device_area_) device_->Free(device_area_);
}

absl::Status ChunkVerifier::Start(Transport& transport) {
  int64_t device_bytes = 0;
  for (size_t lane = 0; lane < work_.lanes.size(); ++lane) {
    if (work_.lanes[lane].kind != MemoryKind::kCuda) continue;
    device_offset_[lane] = device_bytes;
    device_bytes += static_cast<int64_t>(expected_[lane] * sizeof(uint64_t));
  }
  if (device_bytes > 0) {
    if (device_ == nullptr) {
      return absl::FailedPreconditionError("verify: CUDA lanes need device memory");
    }
    if (device_area_source_) {
      WSYNC_ASSIGN_OR_RETURN(device_area_, device_area_source_(device_bytes));
    } else {
      WSYNC_ASSIGN_OR_RETURN(void* area, device_->Allocate(device_bytes));
      device_area_ = static_cast<char*>(area);
      owns_device_area_ = true;
    }
  }
  for (size_t lane = 0; lane < work_.lanes.size(); ++lane) {
    const Lane& l = work_.lanes[lane];
    if (key_ != nullptr) {
      const bool sending = l.direction == Direction::kSend;
      WSYNC_ASSIGN_OR_RETURN(
          macs_[lane],
          LaneMac::Create(*key_, MacBinding{sync_id_, sending ? work_.process : l.peer,
                                            sending ? l.peer : work_.process, l.kind, wave_}));
    }
    if (!l.messages.empty() && l.messages.back().round >= kVerifyRound) {
      return absl::InvalidArgumentError(
          absl::StrCat("verify: process ", work_.process, " has ", l.messages.back().round + 1,
                       " rounds with process ", l.peer, "; round ", kVerifyRound,
                       " is reserved for the chunk hashes"));
    }
    if (l.direction != Direction::kReceive) continue;
    remote_[lane].assign(expected_[lane], 0);
    if (l.kind == MemoryKind::kCuda) continue;  // Posted in Finish, after the lane's data.
    WSYNC_ASSIGN_OR_RETURN(
        RequestId request,
        transport.PostReceive(l.peer, MakeTag(sync_id_, kVerifyRound, l.peer), remote_[lane].data(),
                              static_cast<int64_t>(remote_[lane].size() * sizeof(uint64_t))));
    pending_.push_back(request);
  }
  return absl::OkStatus();
}

absl::Status ChunkVerifier::HashMessage(int32_t lane, int32_t message, bool sending) {
  const std::vector<int32_t>& chunks = work_.lanes[lane].messages[message].chunks;
  std::vector<uint64_t>& digests = local_[lane];
  const size_t first = digests.size();
  const uint64_t first_position = (first - 1) / words_per_chunk_;  // In the lane's chunk order.
  digests.resize(first + chunks.size() * words_per_chunk_);
  LaneMac* mac = macs_[lane].get();
  if (key_ != nullptr && mac == nullptr) {
    return absl::FailedPreconditionError("verify: Start was not called");
  }
  std::vector<DeviceRegion> on_device;
  std::vector<size_t> device_chunks;  // Per device region: its index in `chunks`.
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& chunk = work_.chunks[chunks[i]];
    const Segment& s = segments_[chunk.segment];
    const Endpoint& end = sending ? s.from : s.to;
    const int64_t offset = sending ? chunk.from_offset : chunk.to_offset;
    const char* base = address_of_(end, offset, chunk.element_size);
    const bool packed = sending ? chunk.from_packed : chunk.to_packed;
    const Dims& strides = packed ? RowMajorStrides(chunk.shape) : end.strides;
    uint64_t* digest = digests.data() + first + i * words_per_chunk_;
    ++hashed_;
    if ((sending ? chunk.from_kind : chunk.to_kind) == MemoryKind::kCuda) {
      on_device.push_back(DeviceRegion{base, strides, chunk.shape, chunk.element_size});
      device_chunks.push_back(i);
    } else if (mac != nullptr) {
      WSYNC_ASSIGN_OR_RETURN(const MacTag tag, MacRegion(*mac, first_position + i, base, strides,
                                                         chunk.shape, chunk.element_size));
      std::copy(tag.begin(), tag.end(), digest);
    } else if (packed) {
      *digest = XXH3_64bits(base, static_cast<size_t>(chunk.bytes));
    } else {
      *digest = HashRegion(base, end.strides, chunk.shape, chunk.element_size);
    }
  }
  if (on_device.empty()) return absl::OkStatus();
  if (device_ == nullptr) {
    return absl::FailedPreconditionError("verify: CUDA regions need device memory");
  }
  if (bounce_.empty()) {
    bounce_.resize(static_cast<size_t>(std::max<int64_t>(bounce_bytes_, kMinBounceBytes)));
  }
  if (mac != nullptr) {
    std::vector<uint64_t> positions;
    for (size_t i : device_chunks) positions.push_back(first_position + i);
    std::vector<MacTag> tags(on_device.size());
    WSYNC_RETURN_IF_ERROR(MacDeviceRegions(*device_, on_device, positions, *mac,
                                           absl::MakeSpan(bounce_), deadline_,
                                           absl::MakeSpan(tags)));
    for (size_t r = 0; r < on_device.size(); ++r) {
      std::copy(tags[r].begin(), tags[r].end(),
                digests.data() + first + device_chunks[r] * words_per_chunk_);
    }
    return absl::OkStatus();
  }
  std::vector<uint64_t> device_hashes(on_device.size());
  WSYNC_RETURN_IF_ERROR(HashDeviceRegions(*device_, on_device, absl::MakeSpan(bounce_), deadline_,
                                          absl::MakeSpan(device_hashes)));
  for (size_t r = 0; r < on_device.size(); ++r)
    digests[first + device_chunks[r]] = device_hashes[r];
  return absl::OkStatus();
}

absl::Status ChunkVerifier::HashSent(int32_t lane, int32_t message) {
  return HashMessage(lane, message, /*sending=*/true);
}

absl::Status ChunkVerifier::HashReceived(int32_t lane, int32_t message) {
  return HashMessage(lane, message, /*sending=*/false);
}

absl::Status ChunkVerifier::CopyHashes(void* dst, const void* src, size_t count) {
  const int64_t shape[] = {static_cast<int64_t>(count)};
  const int64_t strides[] = {1};
  WSYNC_RETURN_IF_ERROR(
      device_->CopyStridedAsync(dst, strides, src, strides, shape, sizeof(uint64_t)));
  return device_->Synchronize(deadline_);
}

absl::Status ChunkVerifier::Finish(Transport& transport, absl::Time deadline) {
  for (size_t lane = 0; lane < work_.lanes.size(); ++lane) {
    const Lane& l = work_.lanes[lane];
    const int64_t bytes = static_cast<int64_t>(expected_[lane] * sizeof(uint64_t));
    if (l.kind == MemoryKind::kCuda && l.direction == Direction::kReceive) {
      WSYNC_ASSIGN_OR_RETURN(RequestId request,
                             transport.PostReceive(l.peer, MakeTag(sync_id_, kVerifyRound, l.peer),
                                                   DeviceSlot(lane), bytes));
      pending_.push_back(request);
    }
    if (l.direction != Direction::kSend) continue;
    const void* data = local_[lane].data();
    if (l.kind == MemoryKind::kCuda) {
      WSYNC_RETURN_IF_ERROR(CopyHashes(DeviceSlot(lane), data, expected_[lane]));
      data = DeviceSlot(lane);
    }
    WSYNC_ASSIGN_OR_RETURN(
        RequestId request,
        transport.PostSend(l.peer, MakeTag(sync_id_, kVerifyRound, work_.process), data, bytes));
    pending_.push_back(request);
  }
  std::vector<RequestId> requests = std::move(pending_);
  pending_.clear();
  WSYNC_RETURN_IF_ERROR(transport.WaitAll(requests, deadline));
  for (int32_t lane = 0; lane < static_cast<int32_t>(work_.lanes.size()); ++lane) {
    const Lane& l = work_.lanes[lane];
    if (l.direction != Direction::kReceive) continue;
    if (l.kind == MemoryKind::kCuda) {
      WSYNC_RETURN_IF_ERROR(CopyHashes(remote_[lane].data(), DeviceSlot(lane), expected_[lane]));
    }
    WSYNC_RETURN_IF_ERROR(Compare(lane));
  }
  return absl::OkStatus();
}

absl::Status ChunkVerifier::Compare(int32_t lane) {
  const Lane& l = work_.lanes[lane];
  const std::vector<uint64_t>& mine = local_[lane];
  const std::vector<uint64_t>& theirs = remote_[lane];
  const absl::string_view what = key_ != nullptr ? "MACs" : "hashes";
  if (theirs[0] != sync_id_) {
    return absl::DataLossError(absl::StrCat("verify: the chunk ", what, " from process ", l.peer,
                                            " are of sync ", theirs[0], ", not of sync ",
                                            sync_id_));
  }
  const int64_t total = static_cast<int64_t>((mine.size() - 1) / words_per_chunk_);
  int64_t position = 0;  // Chunk index in the lane's canonical order.
  for (const Message& message : l.messages) {
    for (int32_t index : message.chunks) {
      const size_t at = 1 + position * words_per_chunk_;
      ++position;
      if (std::equal(mine.begin() + at, mine.begin() + at + words_per_chunk_,
                     theirs.begin() + at)) {
        continue;
      }
      const Chunk& chunk = work_.chunks[index];
      const Segment& s = segments_[chunk.segment];
      const std::string where =
          absl::StrFormat("parameter '%s' box %s, %d bytes at element %d of buffer %d",
                          job_.target().params[s.param].name, BoxToString(s.box), chunk.bytes,
                          chunk.to_offset, s.to.buffer);
      if (key_ != nullptr) {
        return absl::DataLossError(absl::StrFormat(
            "verify: the MAC of chunk %d of %d from process %d does not match its bytes (%s): "
            "forged or corrupted data, a forged or replayed MAC, or another key",
            position - 1, total, l.peer, where));
      }
      return absl::DataLossError(absl::StrFormat(
          "verify: chunk %d of %d from process %d differs (%s): the sender hashed %016x, this "
          "process received %016x",
          position - 1, total, l.peer, where, theirs[at], mine[at]));
    }
  }
  checked_ += position;
  return absl::OkStatus();
}

void ChunkVerifier::Cancel(Transport& transport) {
  if (pending_.empty()) return;
  transport.WaitAll(pending_, absl::InfinitePast()).IgnoreError();
  pending_.clear();
}

}  // namespace wsync::executor_internal

namespace wsync {

absl::string_view VerifyModeName(VerifyMode mode) {
  switch (mode) {
    case VerifyMode::kOff:
      return "off";
    case VerifyMode::kHash:
      return "hash";
    case VerifyMode::kKeyed:
      return "keyed";
  }
  return "invalid";
}

absl::StatusOr<VerifyMode> ParseVerifyMode(absl::string_view name) {
  if (name == "off" || name == "false") return VerifyMode::kOff;
  if (name == "hash" || name == "true") return VerifyMode::kHash;
  if (name == "keyed") return VerifyMode::kKeyed;
  return absl::InvalidArgumentError(
      absl::StrCat("verify mode '", name, "' is none of off, hash, keyed"));
}

}  // namespace wsync
