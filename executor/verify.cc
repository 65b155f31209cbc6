#include "executor/verify.h"

#include <xxhash.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
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

// Enqueues the copies of device regions into a host bounce buffer, piece by piece in each
// region's row-major order, and feeds every filled bounce buffer to the regions' hash states.
class BounceHasher {
 public:
  BounceHasher(DeviceMemory& device, absl::Span<char> bounce, absl::Time deadline, size_t regions)
      : device_(device), bounce_(bounce), deadline_(deadline) {
    states_.reserve(regions);
    for (size_t r = 0; r < regions; ++r) states_.push_back(NewHashState());
  }

  // Enqueues region `index` (its pieces of at most bounce_.size() bytes).
  absl::Status Add(size_t index, const DeviceRegion& region) {
    const Dims& shape = region.shape;
    const int64_t axes = static_cast<int64_t>(shape.size());
    const int64_t capacity = static_cast<int64_t>(bounce_.size());
    for (int64_t extent : shape) {
      if (extent == 0) return absl::OkStatus();  // No bytes: the hash of nothing.
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

  // Hashes what is still in the bounce buffer and returns every region's hash.
  absl::Status Finish(absl::Span<uint64_t> hashes) {
    WSYNC_RETURN_IF_ERROR(Flush());
    for (size_t r = 0; r < states_.size(); ++r) hashes[r] = XXH3_64bits_digest(states_[r].get());
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

  absl::Status Flush() {
    if (pieces_.empty()) return absl::OkStatus();
    WSYNC_RETURN_IF_ERROR(device_.Synchronize(deadline_));
    for (const Piece& piece : pieces_) {
      XXH3_64bits_update(states_[piece.region].get(), bounce_.data() + piece.at,
                         static_cast<size_t>(piece.bytes));
    }
    pieces_.clear();
    used_ = 0;
    return absl::OkStatus();
  }

  DeviceMemory& device_;
  absl::Span<char> bounce_;
  const absl::Time deadline_;
  std::vector<HashState> states_;
  std::vector<Piece> pieces_;  // Copied into the bounce buffer since the last flush.
  int64_t used_ = 0;
};

}  // namespace

uint64_t HashRegion(const void* base, const Dims& strides, const Dims& shape,
                    int64_t element_size) {
  // Axes of extent > 1, outermost first; the innermost ones that are dense in row-major order form
  // one contiguous run of `run` bytes.
  absl::InlinedVector<std::pair<int64_t, int64_t>, kMaxAxes> axes;  // (extent, byte stride)
  for (size_t a = 0; a < shape.size(); ++a) {
    if (shape[a] == 0) return XXH3_64bits(nullptr, 0);
    if (shape[a] > 1) axes.push_back({shape[a], strides[a] * element_size});
  }
  int64_t run = element_size;
  while (!axes.empty() && axes.back().second == run) {
    run *= axes.back().first;
    axes.pop_back();
  }
  const char* data = static_cast<const char*>(base);
  if (axes.empty()) return XXH3_64bits(data, static_cast<size_t>(run));
  const HashState state = NewHashState();
  // An odometer over the outer axes; each position feeds one run.
  absl::InlinedVector<int64_t, kMaxAxes> index(axes.size(), 0);
  int64_t offset = 0;
  for (;;) {
    XXH3_64bits_update(state.get(), data + offset, static_cast<size_t>(run));
    int a = static_cast<int>(axes.size()) - 1;
    for (; a >= 0; --a) {
      offset += axes[a].second;
      if (++index[a] < axes[a].first) break;
      offset -= axes[a].second * axes[a].first;
      index[a] = 0;
    }
    if (a < 0) break;
  }
  return XXH3_64bits_digest(state.get());
}

absl::Status HashDeviceRegions(DeviceMemory& device, absl::Span<const DeviceRegion> regions,
                               absl::Span<char> bounce, absl::Time deadline,
                               absl::Span<uint64_t> hashes) {
  BounceHasher hasher(device, bounce, deadline, regions.size());
  for (size_t r = 0; r < regions.size(); ++r) WSYNC_RETURN_IF_ERROR(hasher.Add(r, regions[r]));
  return hasher.Finish(hashes);
}

ChunkVerifier::ChunkVerifier(const Job& job, const Work& work, absl::Span<const Segment> segments,
                             AddressOf address_of, uint64_t sync_id, DeviceMemory* device,
                             int64_t bounce_bytes, absl::Time deadline, DeviceArea device_area)
    : job_(job),
      work_(work),
      segments_(segments),
      address_of_(std::move(address_of)),
      sync_id_(sync_id),
      local_(work.lanes.size()),
      remote_(work.lanes.size()),
      device_(device),
      bounce_bytes_(bounce_bytes),
      deadline_(deadline),
      device_area_source_(std::move(device_area)),
      device_offset_(work.lanes.size(), -1) {
  for (size_t lane = 0; lane < work.lanes.size(); ++lane) {
    size_t chunks = 0;
    for (const Message& message : work.lanes[lane].messages) chunks += message.chunks.size();
    expected_.push_back(chunks + 1);
    local_[lane].reserve(chunks + 1);
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
  std::vector<uint64_t>& hashes = local_[lane];
  const size_t first = hashes.size();
  hashes.resize(first + chunks.size());
  std::vector<DeviceRegion> on_device;
  std::vector<size_t> device_positions;  // Where each device region's hash goes in `hashes`.
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& chunk = work_.chunks[chunks[i]];
    const Segment& s = segments_[chunk.segment];
    const Endpoint& end = sending ? s.from : s.to;
    const int64_t offset = sending ? chunk.from_offset : chunk.to_offset;
    const char* base = address_of_(end, offset, chunk.element_size);
    const bool packed = sending ? chunk.from_packed : chunk.to_packed;
    if ((sending ? chunk.from_kind : chunk.to_kind) == MemoryKind::kCuda) {
      on_device.push_back(DeviceRegion{base, packed ? RowMajorStrides(chunk.shape) : end.strides,
                                       chunk.shape, chunk.element_size});
      device_positions.push_back(first + i);
    } else if (packed) {
      hashes[first + i] = XXH3_64bits(base, static_cast<size_t>(chunk.bytes));
    } else {
      hashes[first + i] = HashRegion(base, end.strides, chunk.shape, chunk.element_size);
    }
    ++hashed_;
  }
  if (on_device.empty()) return absl::OkStatus();
  if (device_ == nullptr) {
    return absl::FailedPreconditionError("verify: CUDA regions need device memory");
  }
  if (bounce_.empty()) {
    bounce_.resize(static_cast<size_t>(std::max<int64_t>(bounce_bytes_, kMinBounceBytes)));
  }
  std::vector<uint64_t> device_hashes(on_device.size());
  WSYNC_RETURN_IF_ERROR(HashDeviceRegions(*device_, on_device, absl::MakeSpan(bounce_), deadline_,
                                          absl::MakeSpan(device_hashes)));
  for (size_t i = 0; i < on_device.size(); ++i) hashes[device_positions[i]] = device_hashes[i];
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
  if (theirs[0] != sync_id_) {
    return absl::DataLossError(absl::StrCat("verify: the chunk hashes from process ", l.peer,
                                            " are of sync ", theirs[0], ", not of sync ",
                                            sync_id_));
  }
  int32_t position = 0;  // Chunk index in the lane's canonical order.
  for (const Message& message : l.messages) {
    for (int32_t index : message.chunks) {
      ++position;
      if (mine[position] == theirs[position]) continue;
      const Chunk& chunk = work_.chunks[index];
      const Segment& s = segments_[chunk.segment];
      return absl::DataLossError(absl::StrFormat(
          "verify: chunk %d of %d from process %d differs (parameter '%s' box %s, %d bytes at "
          "element %d of buffer %d): the sender hashed %016x, this process received %016x",
          position - 1, static_cast<int64_t>(mine.size()) - 1, l.peer,
          job_.target().params[s.param].name, BoxToString(s.box), chunk.bytes, chunk.to_offset,
          s.to.buffer, theirs[position], mine[position]));
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
