#include "executor/execute.h"

#include <algorithm>
#include <array>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/strings/str_cat.h"
#include "common/cpu_time.h"
#include "common/failpoint.h"
#include "common/status.h"
#include "executor/agreement.h"
#include "executor/copy.h"
#include "executor/lane_progress.h"
#include "executor/memory_kinds.h"
#include "executor/verify.h"
#include "executor/work.h"
#include "planner/relay.h"

namespace wsync {
namespace {

using executor_internal::Chunk;
using executor_internal::ChunkVerifier;
using executor_internal::Lane;
using executor_internal::LaneProgress;
using executor_internal::Message;
using executor_internal::Work;

// Checks that every buffer the work touches on this process was handed over, and that a process
// holding CUDA memory was given a DeviceMemory.
absl::Status CheckBuffers(const Job& job, const Work& work, absl::Span<const Segment> segments,
                          const LocalBuffers& buffers, const ExecuteOptions& options) {
  if (work.relay_arena_kind == MemoryKind::kCuda && options.device == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        "process ", work.process,
        " holds CUDA buffers but was given no device memory (CUDA buffers need a build with NCCL "
        "and a CUDA device)"));
  }
  auto check = [&](const Endpoint& end) -> absl::Status {
    if (end.process != work.process || end.buffer == kRelayArenaBuffer) return absl::OkStatus();
    if (!buffers.contains(end.buffer)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "process ", work.process, " was given no address for its buffer ", end.buffer));
    }
    return absl::OkStatus();
  };
  for (const Segment& s : segments) {
    if (s.from.process != work.process && s.to.process != work.process) continue;
    WSYNC_RETURN_IF_ERROR(check(s.from));
    WSYNC_RETURN_IF_ERROR(check(s.to));
  }
  return absl::OkStatus();
}

// The host memory a verifying run hashes CUDA regions in (verify.h): the staging budget, at most
// 1 MiB.
int64_t VerifyBounceBytes(int64_t budget_bytes) {
  return std::min<int64_t>(budget_bytes, int64_t{1} << 20);
}

class Run {
 public:
  Run(const Job& job, absl::Span<const Segment> segments, Work& work, const LocalBuffers& buffers,
      Transport& transport, const ExecuteOptions& options)
      : job_(job),
        segments_(segments),
        work_(work),
        buffers_(buffers),
        transport_(transport),
        options_(options) {
    if (options.verify != VerifyMode::kOff) {
      verifier_ = std::make_unique<ChunkVerifier>(
          job, work, segments,
          [this](const Endpoint& end, int64_t offset, int64_t element_size) -> const char* {
            return BufferAddress(end, offset, element_size);
          },
          options.sync_id, options.device, VerifyBounceBytes(work.budget_bytes), options.deadline,
          // Kept in the cache after the lanes' arenas and the relay arena.
          [this](int64_t bytes) {
            return Arenas().GetDevice(*options_.device, work_.lanes.size() + 1, bytes);
          },
          options.verify == VerifyMode::kKeyed ? options.data_key : nullptr);
    }
  }

  absl::StatusOr<TransferStats> Go() {
    const absl::Time start = absl::Now();
    posted_.assign(work_.lanes.size(), 0);
    packed_ahead_.assign(work_.lanes.size(), -1);
    // WSYNC_FAILPOINTS (common/failpoint.h): a failed allocation.
    if (absl::Status alloc = failpoint::Check("alloc"); !alloc.ok()) {
      NoticeUnsentMessages(alloc);
      DrainUnreceivedMessages(FailureGrace());
      return alloc;
    }
    absl::Status status = AllocateArenas();
    RejectStaleMessages();
    for (int32_t index : work_.local_segments) {
      if (status.ok()) status = CopyLocal(segments_[index]);
    }

    int32_t rounds = 0;
    for (const Lane& lane : work_.lanes) {
      if (!lane.messages.empty()) rounds = std::max(rounds, lane.messages.back().round + 1);
    }
    stats_.rounds = rounds;
    pending_.assign(rounds, {});
    slot_busy_.assign(work_.lanes.size(), {false, false});
    last_staged_.assign(work_.lanes.size(), -1);
    due_.assign(work_.lanes.size(), {});
    for (int32_t lane = 0; lane < std::ssize(work_.lanes); ++lane) {
      const std::vector<Message>& messages = work_.lanes[lane].messages;
      for (int32_t index = 0; index < std::ssize(messages); ++index) {
        if (!messages[index].direct) last_staged_[lane] = index;
      }
      UpdateLookAhead(lane);
    }
    lockstep_ = transport_.NeedsRoundOrder();
    if (status.ok() && verifier_) status = verifier_->Start(transport_);
    if (status.ok()) status = lockstep_ ? RunRounds(rounds) : RunLanes();
    if (status.ok() && verifier_) status = verifier_->Finish(transport_, options_.deadline);
    if (status.ok()) status = SynchronizeDevice(options_.deadline);
    if (!status.ok()) {
      NoticeUnsentMessages(status);
      const absl::Time grace = FailureGrace();
      DrainUnreceivedMessages(grace);
      if (verifier_) verifier_->Cancel(transport_);
      // What the rounds still have posted may complete until `grace` (a peer's large send to
      // this process, this process's sends); the rest is cancelled and everything released. A
      // round whose wait failed already released its requests (its list is then refused at once).
      for (std::vector<RequestId>& requests : pending_) {
        if (!requests.empty()) transport_.WaitAll(requests, grace).IgnoreError();
      }
      if (progress_) {
        const std::vector<RequestId> in_flight = progress_->Outstanding();
        if (!in_flight.empty()) transport_.WaitAll(in_flight, grace).IgnoreError();
      }
      // No device copy may write after the run returned.
      SynchronizeDevice(std::max(grace, absl::Now() + absl::Seconds(1))).IgnoreError();
      return status;
    }
    if (verifier_) stats_.verified_chunks = verifier_->checked_chunks();
    RejectStaleMessages();
    stats_.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    return stats_;
  }

 private:
  // The message of `lane` in round `r`, or nullptr; `cursor` walks the lane's messages in order.
  const Message* InRound(int32_t lane, const std::vector<int32_t>& cursor, int32_t r) const {
    const std::vector<Message>& messages = work_.lanes[lane].messages;
    const int32_t index = cursor[lane];
    return index < static_cast<int32_t>(messages.size()) && messages[index].round == r
               ? &messages[index]
               : nullptr;
  }

  absl::Status RunRounds(int32_t rounds) {
    const int32_t lanes = static_cast<int32_t>(work_.lanes.size());
    std::vector<int32_t> completed(lanes, 0);  // Next message of each lane to complete.
    std::vector<int32_t> ready;
    for (int32_t lane = 0; lane < lanes; ++lane) {
      if (InRound(lane, posted_, 0) != nullptr) ready.push_back(lane);
    }
    WSYNC_RETURN_IF_ERROR(PrepareNext(ready));
    for (int32_t r = 0; r < rounds; ++r) {
      // Round r+1 goes out now wherever its memory is free, overlapping round r. A forward goes
      // out once round r has landed, as what it forwards may arrive in round r.
      ready.clear();
      std::vector<int32_t> deferred;
      for (int32_t lane = 0; lane < lanes; ++lane) {
        const Message* next = InRound(lane, posted_, r + 1);
        if (next == nullptr) continue;
        const Lane& l = work_.lanes[lane];
        if (!(l.forwarding && l.direction == Direction::kSend) &&
            (next->direct || !slot_busy_[lane][next->slot])) {
          ready.push_back(lane);
        } else {
          deferred.push_back(lane);
        }
      }
      WSYNC_RETURN_IF_ERROR(PrepareNext(ready));
      WSYNC_RETURN_IF_ERROR(transport_.WaitAll(pending_[r], options_.deadline));
      pending_[r].clear();
      std::vector<std::pair<int32_t, int32_t>> received;  // (lane, message index)
      for (int32_t lane = 0; lane < lanes; ++lane) {
        if (InRound(lane, completed, r) == nullptr) continue;
        Completed(lane, completed[lane]++, received);
      }
      // Device unpacks of round r read arena slots that the deferred posts below may receive into.
      WSYNC_RETURN_IF_ERROR(Land(received));
      WSYNC_RETURN_IF_ERROR(PrepareNext(deferred));
    }
    return absl::OkStatus();
  }

  // Each pair advances on its own: a lane keeps up to kLaneMessagesInFlight messages posted, the
  // next going out as soon as one completes and its slot is free, so a slow pair (a shaped link)
  // does not hold back the rounds of fast ones (shared memory) as lockstep rounds do. A
  // forwarding send of round r waits until every receive lane of this process completed its
  // messages of rounds before r (what it forwards arrived by then). Messages complete, unpack and
  // verify in lane order. The bookkeeping (lane_progress.h) costs O(log lanes) per message at most.
  absl::Status RunLanes() {
    constexpr int32_t kLaneMessagesInFlight = 2;
    progress_.emplace(work_, static_cast<int32_t>(stats_.rounds), kLaneMessagesInFlight);
    LaneProgress& progress = *progress_;
    std::vector<size_t> finished;
    std::vector<std::pair<int32_t, int32_t>> received;  // (lane, message index)
    for (;;) {
      // Post until no lane may post more; PrepareNext posts one message per ready lane.
      for (;;) {
        const std::vector<int32_t>& ready = progress.Ready(posted_, slot_busy_);
        if (ready.empty()) break;
        WSYNC_RETURN_IF_ERROR(PrepareNext(ready));
      }
      if (!progress.unfinished()) return absl::OkStatus();
      if (progress.waited().empty()) {
        return absl::InternalError(
            absl::StrCat("process ", work_.process, ": lanes unfinished with nothing in flight"));
      }
      finished.clear();
      const absl::Status waited_status =
          transport_.WaitAny(progress.waited(), options_.deadline, &finished);
      progress.Finished(finished);
      if (absl::IsDeadlineExceeded(waited_status) && finished.empty()) {
        // WaitAll past the deadline cancels them all and names the peers they wait for.
        const absl::Status named = transport_.WaitAll(progress.Outstanding(), options_.deadline);
        progress.Clear();
        return named.ok() ? waited_status : named;
      }
      WSYNC_RETURN_IF_ERROR(waited_status);

      received.clear();
      progress.CompleteInOrder(
          [&](int32_t lane, int32_t index) { Completed(lane, index, received); });
      WSYNC_RETURN_IF_ERROR(Land(received));  // Later receives may land in the slots it reads.
    }
  }

  // Message `index` of `lane` completed: its slot is free once unpacked (Land), and a receive
  // is added to `received`.
  void Completed(int32_t lane, int32_t index, std::vector<std::pair<int32_t, int32_t>>& received) {
    const Message& message = work_.lanes[lane].messages[index];
    if (!message.direct) {
      slot_busy_[lane][message.slot] = false;
      UpdateLookAhead(lane);
    }
    if (work_.lanes[lane].direction != Direction::kReceive) return;
    stats_.received_bytes += message.bytes;  // Completed: every byte of it arrived.
    received.emplace_back(lane, index);
  }

  // Unpacks the completed receives (lane, message index), waits for their device copies (which
  // read arena slots later receives may land in, and write the host memory the verifier hashes)
  // and verifies them.
  absl::Status Land(absl::Span<const std::pair<int32_t, int32_t>> received) {
    WSYNC_RETURN_IF_ERROR(Unpack(received));
    WSYNC_RETURN_IF_ERROR(SynchronizeDevice(options_.deadline));
    if (verifier_) {
      for (const auto& [lane, index] : received) {
        WSYNC_RETURN_IF_ERROR(verifier_->HashReceived(lane, index));
      }
    }
    return absl::OkStatus();
  }

  // After a failure: tells every peer still waiting for a message of this process that it will
  // not come, so that the peer fails now (and votes) instead of at its deadline. The notice
  // carries the tag of the first message not posted, with a length the peer's receive cannot
  // accept: transports fail a receive of another size at once, and nothing is written.
  void NoticeUnsentMessages(const absl::Status& failure) {
    if (options_.before_notices) options_.before_notices(failure);
    static const char kNotice = 0;
    std::vector<RequestId> notices;
    for (size_t lane = 0; lane < work_.lanes.size(); ++lane) {
      const Lane& l = work_.lanes[lane];
      if (l.direction != Direction::kSend ||
          posted_[lane] >= static_cast<int32_t>(l.messages.size())) {
        continue;
      }
      const Message& unsent = l.messages[posted_[lane]];
      const int64_t expected = unsent.bytes;
      absl::StatusOr<RequestId> notice =
          transport_.PostSend(l.peer, MakeTag(options_.sync_id, unsent.round, work_.process),
                              &kNotice, expected == 0 ? 1 : 0);
      if (notice.ok()) notices.push_back(*notice);
    }
    if (!notices.empty()) {
      transport_.WaitAll(notices, absl::Now() + absl::Milliseconds(200)).IgnoreError();
    }
  }

  // After a failure: receives, for a short while, the messages peers still send this process, so
  // that a sender blocked on a large (rendezvous) send completes and votes instead of waiting for
  // its deadline. Direct messages land in the weights (the failed sync left them dirty anyway),
  // staged ones in one scratch buffer they all share. Waits until `grace` at most; what did not
  // arrive by then is cancelled.
  void DrainUnreceivedMessages(absl::Time grace) {
    // Where a drained message lands: a direct one in its weights, anything else (and a direct one
    // into a relay arena that may not exist yet) in one shared scratch buffer.
    auto direct_target = [&](const Message& message) -> void* {
      if (!message.direct) return nullptr;
      const Chunk& chunk = work_.chunks[message.chunks[0]];
      const Endpoint& to = segments_[chunk.segment].to;
      if (to.buffer == kRelayArenaBuffer && relay_arena_ == nullptr) return nullptr;
      return BufferAddress(to, chunk.to_offset, chunk.element_size);
    };
    std::vector<RequestId> requests;
    int64_t scratch_bytes = 0;
    for (size_t lane = 0; lane < work_.lanes.size(); ++lane) {
      if (work_.lanes[lane].direction != Direction::kReceive) continue;
      for (size_t index = posted_[lane]; index < work_.lanes[lane].messages.size(); ++index) {
        const Message& message = work_.lanes[lane].messages[index];
        if (direct_target(message) == nullptr)
          scratch_bytes = std::max(scratch_bytes, message.bytes);
      }
    }
    const std::unique_ptr<char[]> scratch = std::make_unique_for_overwrite<char[]>(scratch_bytes);
    for (size_t lane = 0; lane < work_.lanes.size(); ++lane) {
      const Lane& l = work_.lanes[lane];
      if (l.direction != Direction::kReceive) continue;
      for (size_t index = posted_[lane]; index < l.messages.size(); ++index) {
        const Message& message = l.messages[index];
        void* data = direct_target(message);
        if (data == nullptr) data = scratch.get();
        absl::StatusOr<RequestId> drain = transport_.PostReceive(
            l.peer, MakeTag(options_.sync_id, message.round, l.peer), data, message.bytes);
        if (!drain.ok()) break;
        requests.push_back(*drain);
      }
    }
    if (!requests.empty()) transport_.WaitAll(requests, grace).IgnoreError();
  }

  // How long a failed run keeps receiving and sending for its peers' sake: 200 ms, never past
  // the deadline (a run that failed on the deadline releases everything at once).
  absl::Time FailureGrace() const {
    return std::min(options_.deadline, absl::Now() + absl::Milliseconds(200));
  }

  void RejectStaleMessages() {
    const int64_t rejected = transport_.DiscardStaleMessages(options_.sync_id);
    stats_.rejected_messages += rejected;
    if (options_.rejected_messages != nullptr) *options_.rejected_messages += rejected;
  }

  // The caller's arena cache, or this run's own.
  ArenaCache& Arenas() { return options_.arenas != nullptr ? *options_.arenas : fresh_arenas_; }

  absl::Status AllocateArenas() {
    ArenaCache* cache = &Arenas();
    arenas_.assign(work_.lanes.size(), nullptr);
    auto get = [&](size_t lane, int64_t bytes, MemoryKind kind) -> absl::StatusOr<char*> {
      arena_bytes_ += bytes;
      stats_.peak_arena_bytes = std::max(stats_.peak_arena_bytes, arena_bytes_);
      if (kind == MemoryKind::kHost) return cache->Get(lane, bytes);
      return cache->GetDevice(*options_.device, lane, bytes);
    };
    for (size_t lane = 0; lane < work_.lanes.size(); ++lane) {
      const int64_t bytes = work_.lanes[lane].slots * work_.lanes[lane].slot_bytes;
      if (bytes == 0) continue;
      WSYNC_ASSIGN_OR_RETURN(arenas_[lane], get(lane, bytes, work_.lanes[lane].kind));
    }
    if (work_.relay_arena_bytes > 0) {  // Kept in the cache after the lanes' arenas.
      WSYNC_ASSIGN_OR_RETURN(
          relay_arena_, get(work_.lanes.size(), work_.relay_arena_bytes, work_.relay_arena_kind));
    }
    return absl::OkStatus();
  }

  // Copies a strided region between memory kinds: on the host when both sides are host memory,
  // otherwise enqueued on the device (SynchronizeDevice waits for it).
  absl::Status Copy(void* dst, MemoryKind dst_kind, const Dims& dst_strides, const void* src,
                    MemoryKind src_kind, const Dims& src_strides, const Dims& shape,
                    int64_t element_size) {
    if (dst_kind == MemoryKind::kHost && src_kind == MemoryKind::kHost) {
      CopyStrided(dst, dst_strides, src, src_strides, shape, element_size);
      return absl::OkStatus();
    }
    device_pending_ = true;
    return options_.device->CopyStridedAsync(dst, dst_strides, src, src_strides, shape,
                                             element_size);
  }

  // Appends `copy` to `host_batch` (for CopyStridedBatch) when both sides are host memory;
  // otherwise enqueues it on the device at once (SynchronizeDevice waits for it).
  absl::Status CopyOrBatch(const StridedCopy& copy, MemoryKind dst_kind, MemoryKind src_kind,
                           std::vector<StridedCopy>& host_batch) {
    if (dst_kind == MemoryKind::kHost && src_kind == MemoryKind::kHost) {
      host_batch.push_back(copy);
      return absl::OkStatus();
    }
    return Copy(copy.dst, dst_kind, copy.dst_strides, copy.src, src_kind, copy.src_strides,
                copy.shape, copy.element_size);
  }

  absl::Status SynchronizeDevice(absl::Time deadline) {
    if (!device_pending_) return absl::OkStatus();
    device_pending_ = false;
    return options_.device->Synchronize(deadline);
  }

  char* BufferAddress(const Endpoint& end, int64_t offset, int64_t element_size) const {
    char* base = end.buffer == kRelayArenaBuffer ? relay_arena_
                                                 : static_cast<char*>(buffers_.at(end.buffer));
    return base + offset * element_size;
  }

  absl::Status CopyLocal(const Segment& s) {
    const int64_t element_size = job_.ElementSize(s.param);
    WSYNC_RETURN_IF_ERROR(
        Copy(BufferAddress(s.to, s.to.offset, element_size), LocalKind(s.to.buffer), s.to.strides,
             BufferAddress(s.from, s.from.offset, element_size), LocalKind(s.from.buffer),
             s.from.strides, s.box.extent, element_size));
    stats_.local_copy_bytes += Volume(s.box) * element_size;
    ++stats_.chunks;
    return absl::OkStatus();
  }

  // The memory kind of this process's buffer `buffer`.
  MemoryKind LocalKind(uint64_t buffer) const {
    if (!work_.any_cuda) return MemoryKind::kHost;
    return kinds_.Buffer(work_.process, buffer);
  }

  char* SlotAddress(int32_t lane, const Message& message) const {
    return arenas_[lane] + message.slot * work_.lanes[lane].slot_bytes;
  }

  // Packs staged send `index` of `lane` into its arena slot: host-to-host copies are appended
  // to `packs` (run later as one batch), copies touching CUDA memory are enqueued on the device.
  absl::Status AppendPacks(int32_t lane, int32_t index, std::vector<StridedCopy>& packs) {
    const Lane& l = work_.lanes[lane];
    const Message& message = l.messages[index];
    char* cursor = SlotAddress(lane, message);
    for (int32_t chunk_index : message.chunks) {
      const Chunk& chunk = work_.chunks[chunk_index];
      const Segment& s = segments_[chunk.segment];
      WSYNC_RETURN_IF_ERROR(
          CopyOrBatch({cursor, RowMajorStrides(chunk.shape),
                       BufferAddress(s.from, chunk.from_offset, chunk.element_size), s.from.strides,
                       chunk.shape, chunk.element_size},
                      l.kind, chunk.from_kind, packs));
      cursor += chunk.bytes;
    }
    return absl::OkStatus();
  }

  // Keeps `lane` in look_ahead_lanes_ while PackableAhead may find a message of it: a sending
  // lane that is not forwarding, with a host arena, a staged message not posted yet and a free
  // arena slot. Called whenever the lane posts or completes a message.
  void UpdateLookAhead(int32_t lane) {
    const Lane& l = work_.lanes[lane];
    bool free_slot = false;
    for (int32_t slot = 0; slot < l.slots; ++slot) free_slot |= !slot_busy_[lane][slot];
    if (l.direction == Direction::kSend && !l.forwarding && l.kind == MemoryKind::kHost &&
        posted_[lane] <= last_staged_[lane] && free_slot) {
      look_ahead_lanes_.insert(lane);
    } else {
      look_ahead_lanes_.erase(lane);
    }
  }

  // The first staged send of `lane` from message `first` on (the lane's messages before `first`
  // are posted by now), when it may be packed now, ahead of its round: the lane is a sending lane
  // that is not forwarding (what it forwards may not have arrived), none of its messages from
  // `first` on is packed already, the message is one chunk from host memory into a host arena,
  // and its slot is not `busy_slot` (filled now) and holds nothing in flight. Returns -1
  // otherwise.
  int32_t PackableAhead(int32_t lane, int32_t first, int32_t busy_slot) const {
    const Lane& l = work_.lanes[lane];
    if (l.direction != Direction::kSend || l.forwarding || l.kind != MemoryKind::kHost ||
        packed_ahead_[lane] >= first) {
      return -1;
    }
    for (int32_t index = first; index < static_cast<int32_t>(l.messages.size()); ++index) {
      const Message& message = l.messages[index];
      if (message.direct) continue;
      const bool free = message.slot != busy_slot && !slot_busy_[lane][message.slot];
      const bool host_chunk = message.chunks.size() == 1 &&
                              work_.chunks[message.chunks[0]].from_kind == MemoryKind::kHost;
      return free && host_chunk ? index : -1;
    }
    return -1;
  }

  // Packs the next message of each of `lanes` that is a staged send (unless packed ahead), then
  // posts the next message of each lane in order; stops at the first post that fails. The packs
  // run as one batch (copy.h: CopyStridedBatch), joined by the next staged send of any other
  // lane whose rows line up with theirs and whose slot is free: the column blocks one row shard
  // sends to different peers are packed in one pass over its rows even when the peers' lanes
  // send them in different rounds (a peer's lane may carry a few more small messages). Only
  // messages of one chunk are matched (chunks over kSmallChunkBytes travel alone; smaller ones
  // gain little from a shared pass), and only lanes with a free slot and a staged send left are
  // looked at (look_ahead_lanes_), which keeps a call's cost in the lanes it posts and those.
  absl::Status PrepareNext(absl::Span<const int32_t> lanes) {
    std::vector<StridedCopy> packs;
    std::vector<std::pair<int32_t, int32_t>> packed;  // (lane, message index)
    ++prepare_calls_;                                 // Marks the entries of due_ this call sets.
    std::vector<StridedCopy> due_alone;               // The packs of due messages of one chunk.
    for (int32_t lane : lanes) {
      const int32_t index = posted_[lane];
      const Message& message = work_.lanes[lane].messages[index];
      DueLane& due_lane = due_[lane];
      due_lane = {prepare_calls_, index + 1, message.slot, false};
      if (message.direct || work_.lanes[lane].direction != Direction::kSend ||
          packed_ahead_[lane] == index) {
        continue;
      }
      const size_t before = packs.size();
      WSYNC_RETURN_IF_ERROR(AppendPacks(lane, index, packs));
      packed.emplace_back(lane, index);
      due_lane.packs = true;
      if (message.chunks.size() == 1 && packs.size() > before) due_alone.push_back(packs.back());
    }
    if (!due_alone.empty()) {
      for (int32_t lane : look_ahead_lanes_) {  // Ascending; the others have nothing to pack.
        const DueLane& due_lane = due_[lane];
        const bool is_due = due_lane.call == prepare_calls_;
        if (is_due && due_lane.packs) continue;
        const int32_t index = is_due ? PackableAhead(lane, due_lane.first, due_lane.busy_slot)
                                     : PackableAhead(lane, posted_[lane], -1);
        if (index < 0) continue;
        const size_t at = packs.size();
        WSYNC_RETURN_IF_ERROR(AppendPacks(lane, index, packs));  // Host to host: appended.
        if (std::none_of(due_alone.begin(), due_alone.end(),
                         [&](const StridedCopy& alone) { return ShareAPass(packs[at], alone); })) {
          packs.resize(at);
          continue;
        }
        packed.emplace_back(lane, index);
        packed_ahead_[lane] = index;
        ++stats_.packed_ahead_messages;
      }
    }
    if (!packs.empty()) {
      const double pack_start = ThreadCpuSeconds();
      CopyStridedBatch(packs);
      stats_.pack_cpu_seconds += ThreadCpuSeconds() - pack_start;
    }
    // The sends read the arenas: the device must have written them first.
    WSYNC_RETURN_IF_ERROR(SynchronizeDevice(options_.deadline));
    for (const auto& [lane, index] : packed) {
      if (work_.lanes[lane].kind != MemoryKind::kHost) continue;
      const Message& message = work_.lanes[lane].messages[index];
      failpoint::Flip("pack", SlotAddress(lane, message), message.bytes);
    }
    for (int32_t lane : lanes) WSYNC_RETURN_IF_ERROR(Post(lane, posted_[lane]));
    return absl::OkStatus();
  }

  // Posts message `index` of `lane` in its round; a staged send is already packed.
  absl::Status Post(int32_t lane_index, int32_t index) {
    const Lane& lane = work_.lanes[lane_index];
    const Message& message = lane.messages[index];
    const int32_t r = message.round;
    const bool sending = lane.direction == Direction::kSend;
    const MessageTag tag = MakeTag(options_.sync_id, r, sending ? work_.process : lane.peer);
    void* data;
    if (message.direct) {
      const Chunk& chunk = work_.chunks[message.chunks[0]];
      const Segment& s = segments_[chunk.segment];
      data = sending ? BufferAddress(s.from, chunk.from_offset, chunk.element_size)
                     : BufferAddress(s.to, chunk.to_offset, chunk.element_size);
      stats_.direct_bytes += message.bytes;
    } else {
      data = SlotAddress(lane_index, message);
      slot_busy_[lane_index][message.slot] = true;
      stats_.staged_bytes += message.bytes;
    }
    stats_.chunks += static_cast<int64_t>(message.chunks.size());
    RequestId request;
    WSYNC_RETURN_IF_ERROR(failpoint::Check(sending ? "send" : "recv"));
    if (sending) {
      if (verifier_) WSYNC_RETURN_IF_ERROR(verifier_->HashSent(lane_index, index));
      int64_t bytes = message.bytes;
      if (failpoint::Evaluate("truncate") == failpoint::Action::kFail) {
        bytes -= (work_.chunks[message.chunks.back()].bytes + 1) / 2;  // Half the last chunk.
      }
      WSYNC_ASSIGN_OR_RETURN(request, transport_.PostSend(lane.peer, tag, data, bytes));
      stats_.sent_bytes += message.bytes;
      if (lane.forwarding) stats_.forwarded_bytes += message.bytes;
    } else {
      WSYNC_ASSIGN_OR_RETURN(request, transport_.PostReceive(lane.peer, tag, data, message.bytes));
    }
    if (lockstep_) {
      pending_[r].push_back(request);
    } else {
      progress_->Posted(lane_index, index, request);
    }
    ++posted_[lane_index];
    UpdateLookAhead(lane_index);
    return absl::OkStatus();
  }

  // Unpacks the staged messages among `received` (lane, message index): host-to-host copies as
  // one batch (CopyStridedBatch: column blocks of one row shard that arrive in the same round
  // from different peers are unpacked in one pass over its rows), copies touching CUDA memory
  // enqueued on the device (SynchronizeDevice waits for them).
  absl::Status Unpack(absl::Span<const std::pair<int32_t, int32_t>> received) {
    const double start = ThreadCpuSeconds();
    std::vector<StridedCopy> unpacks;
    for (const auto& [lane, index] : received) {
      const Message& message = work_.lanes[lane].messages[index];
      if (message.direct) continue;
      const char* cursor = SlotAddress(lane, message);
      for (int32_t chunk_index : message.chunks) {
        const Chunk& chunk = work_.chunks[chunk_index];
        const Segment& s = segments_[chunk.segment];
        WSYNC_RETURN_IF_ERROR(
            CopyOrBatch({BufferAddress(s.to, chunk.to_offset, chunk.element_size), s.to.strides,
                         cursor, RowMajorStrides(chunk.shape), chunk.shape, chunk.element_size},
                        chunk.to_kind, work_.lanes[lane].kind, unpacks));
        cursor += chunk.bytes;
      }
    }
    CopyStridedBatch(unpacks);
    stats_.unpack_cpu_seconds += ThreadCpuSeconds() - start;
    return absl::OkStatus();
  }

  const Job& job_;
  absl::Span<const Segment> segments_;
  Work& work_;
  const LocalBuffers& buffers_;
  Transport& transport_;
  const ExecuteOptions& options_;
  TransferStats stats_;
  ArenaCache fresh_arenas_;      // Used when the caller keeps no cache.
  std::vector<char*> arenas_;    // Per lane; memory owned by a cache.
  char* relay_arena_ = nullptr;  // Memory owned by a cache.
  int64_t arena_bytes_ = 0;
  bool lockstep_ = false;  // The transport needs round order: RunRounds, else RunLanes.
  std::vector<std::vector<RequestId>> pending_;  // RunRounds: posted requests by round.
  std::optional<LaneProgress> progress_;         // RunLanes: what is in flight, what may post.
  std::vector<int32_t> posted_;        // Per lane: messages posted, the index of the next one.
  std::vector<int32_t> packed_ahead_;  // Per lane: the staged send last packed ahead, or -1.
  // Per lane and arena slot: a posted message uses it (until it completed, and for a receive
  // until it was unpacked).
  std::vector<std::array<bool, 2>> slot_busy_;
  std::vector<int32_t> last_staged_;  // Per lane: the index of its last staged message, or -1.
  // The lanes PackableAhead may find a message of (UpdateLookAhead), so that looking ahead does
  // not pass over every lane.
  absl::btree_set<int32_t> look_ahead_lanes_;
  // PrepareNext, per lane whose message it posts: where a look-ahead starts (after that message),
  // the slot that message fills, if any, and whether it is a staged send packed now. A lane that
  // packs a message due now looks no further: its next staged send would line up with its own
  // rows, not with another peer's. Valid in the call numbered `call` only.
  struct DueLane {
    int64_t call = -1;
    int32_t first = 0;
    int32_t busy_slot = -1;
    bool packs = false;
  };
  std::vector<DueLane> due_;
  int64_t prepare_calls_ = 0;
  std::unique_ptr<ChunkVerifier> verifier_;  // With options.verify only.
  const JobMemoryKinds kinds_{job_};
  bool device_pending_ = false;  // Device copies enqueued since the last SynchronizeDevice.
};

}  // namespace

ArenaCache::~ArenaCache() {
  for (const DeviceArena& arena : device_arenas_) {
    if (arena.memory != nullptr) arena.device->Free(arena.memory);
  }
}

char* ArenaCache::Get(size_t lane, int64_t bytes) {
  if (lane >= arenas_.size()) {
    arenas_.resize(lane + 1);
    sizes_.resize(lane + 1, 0);
  }
  if (sizes_[lane] < bytes) {
    arenas_[lane] = std::make_unique_for_overwrite<char[]>(bytes);
    sizes_[lane] = bytes;
  }
  return arenas_[lane].get();
}

absl::StatusOr<char*> ArenaCache::GetDevice(DeviceMemory& device, size_t lane, int64_t bytes) {
  if (lane >= device_arenas_.size()) device_arenas_.resize(lane + 1);
  DeviceArena& arena = device_arenas_[lane];
  if (arena.memory != nullptr && arena.device == &device && arena.bytes >= bytes) {
    return arena.memory;
  }
  if (arena.memory != nullptr) arena.device->Free(arena.memory);
  arena = DeviceArena{};
  WSYNC_ASSIGN_OR_RETURN(void* memory, device.Allocate(bytes));
  arena = DeviceArena{&device, static_cast<char*>(memory), bytes};
  return arena.memory;
}

int64_t ArenaCache::held_bytes() const {
  int64_t total = held_device_bytes();
  for (int64_t size : sizes_) total += size;
  return total;
}

int64_t ArenaCache::held_device_bytes() const {
  int64_t total = 0;
  for (const DeviceArena& arena : device_arenas_) total += arena.bytes;
  return total;
}

absl::StatusOr<TransferStats> ExecuteTransfers(const Job& job, absl::Span<const Segment> segments,
                                               const Endpoints& endpoints,
                                               const StagingBudget& budget, int32_t process,
                                               const LocalBuffers& buffers, Transport& transport,
                                               Group& group, const ExecuteOptions& options) {
  absl::StatusOr<Work> work =
      executor_internal::BuildWork(job, segments, endpoints, budget, process);
  absl::Status local = work.status();
  if (local.ok()) local = CheckBuffers(job, *work, segments, buffers, options);
  if (local.ok() && options.verify == VerifyMode::kKeyed && options.data_key == nullptr) {
    local = absl::FailedPreconditionError("verify: keyed verification without a data key");
  }
  WSYNC_RETURN_IF_ERROR(
      AgreeOnBatch(group, local, options.plan_digest, budget.bytes, options.deadline));
  Run run(job, segments, *work, buffers, transport, options);
  WSYNC_ASSIGN_OR_RETURN(TransferStats stats, run.Go());
  stats.segments = work->segments;
  return stats;
}

}  // namespace wsync
