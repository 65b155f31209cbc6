#include "executor/verify.h"

#include <xxhash.h>

#include <memory>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"

namespace wsync::executor_internal {
namespace {

struct StateDeleter {
  void operator()(XXH3_state_t* state) const { XXH3_freeState(state); }
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
  std::unique_ptr<XXH3_state_t, StateDeleter> state(XXH3_createState());
  XXH3_64bits_reset(state.get());
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

ChunkVerifier::ChunkVerifier(const Job& job, const Work& work, absl::Span<const Segment> segments,
                             AddressOf address_of, uint64_t sync_id)
    : job_(job),
      work_(work),
      segments_(segments),
      address_of_(std::move(address_of)),
      sync_id_(sync_id),
      local_(work.lanes.size()),
      remote_(work.lanes.size()) {
  for (size_t lane = 0; lane < work.lanes.size(); ++lane) {
    size_t chunks = 0;
    for (const Message& message : work.lanes[lane].messages) chunks += message.chunks.size();
    expected_.push_back(chunks + 1);
    local_[lane].reserve(chunks + 1);
    local_[lane].push_back(sync_id);
  }
}

ChunkVerifier::~ChunkVerifier() = default;

absl::Status ChunkVerifier::Start(Transport& transport) {
  for (size_t lane = 0; lane < work_.lanes.size(); ++lane) {
    const Lane& l = work_.lanes[lane];
    if (!l.messages.empty() && l.messages.back().round >= kVerifyRound) {
      return absl::InvalidArgumentError(absl::StrCat(
          "verify: process ", work_.process, " has ", l.messages.back().round + 1,
          " rounds with process ",
          l.peer, "; round ", kVerifyRound, " is reserved for the chunk hashes"));
    }
    if (l.direction != Direction::kReceive) continue;
    remote_[lane].assign(expected_[lane], 0);
    WSYNC_ASSIGN_OR_RETURN(
        RequestId request,
        transport.PostReceive(l.peer, MakeTag(sync_id_, kVerifyRound, l.peer), remote_[lane].data(),
                              static_cast<int64_t>(remote_[lane].size() * sizeof(uint64_t))));
    pending_.push_back(request);
  }
  return absl::OkStatus();
}

uint64_t ChunkVerifier::HashChunk(const Chunk& chunk, bool sending) const {
  const Segment& s = segments_[chunk.segment];
  const Endpoint& end = sending ? s.from : s.to;
  const int64_t offset = sending ? chunk.from_offset : chunk.to_offset;
  const char* base = address_of_(end, offset, chunk.element_size);
  if (sending ? chunk.from_packed : chunk.to_packed) {
    return XXH3_64bits(base, static_cast<size_t>(chunk.bytes));
  }
  return HashRegion(base, end.strides, chunk.shape, chunk.element_size);
}

void ChunkVerifier::HashSent(int32_t lane, int32_t message) {
  for (int32_t index : work_.lanes[lane].messages[message].chunks) {
    local_[lane].push_back(HashChunk(work_.chunks[index], /*sending=*/true));
    ++hashed_;
  }
}

void ChunkVerifier::HashReceived(int32_t lane, int32_t message) {
  for (int32_t index : work_.lanes[lane].messages[message].chunks) {
    local_[lane].push_back(HashChunk(work_.chunks[index], /*sending=*/false));
    ++hashed_;
  }
}

absl::Status ChunkVerifier::Finish(Transport& transport, absl::Time deadline) {
  for (size_t lane = 0; lane < work_.lanes.size(); ++lane) {
    const Lane& l = work_.lanes[lane];
    if (l.direction != Direction::kSend) continue;
    WSYNC_ASSIGN_OR_RETURN(
        RequestId request,
        transport.PostSend(l.peer, MakeTag(sync_id_, kVerifyRound, work_.process),
                           local_[lane].data(),
                           static_cast<int64_t>(local_[lane].size() * sizeof(uint64_t))));
    pending_.push_back(request);
  }
  std::vector<RequestId> requests = std::move(pending_);
  pending_.clear();
  WSYNC_RETURN_IF_ERROR(transport.WaitAll(requests, deadline));
  for (int32_t lane = 0; lane < static_cast<int32_t>(work_.lanes.size()); ++lane) {
    if (work_.lanes[lane].direction == Direction::kReceive) WSYNC_RETURN_IF_ERROR(Compare(lane));
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
