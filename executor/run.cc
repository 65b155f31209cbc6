#include "executor/run.h"

#include <algorithm>
#include <array>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/cpu_time.h"
#include "common/failpoint.h"
#include "common/status.h"
#include "executor/copy.h"
#include "executor/delta_run.h"
#include "executor/lane_drivers.h"
#include "executor/lane_state.h"
#include "executor/memory_kinds.h"
#include "executor/packing.h"
#include "executor/quant_run.h"
#include "executor/run_progress.h"
#include "executor/verify.h"
#include "planner/relay.h"

namespace wsync::executor_internal {
namespace {

// The host memory a verifying run hashes CUDA regions in (verify.h): the staging budget, at most
// 1 MiB.
int64_t VerifyBounceBytes(int64_t budget_bytes) {
  return std::min<int64_t>(budget_bytes, int64_t{1} << 20);
}

class Run final : public RunSteps {
 public:
  Run(const Job& job, absl::Span<const Segment> segments, Work& work, const QuantWork& quant,
      const LocalBuffers& buffers, Transport& transport, const ExecuteOptions& options,
      DeltaAgreed agreed)
      : job_(job),
        segments_(segments),
        work_(work),
        buffers_(buffers),
        transport_(transport),
        options_(options),
        progress_(work, options.progress, options.sync_id),
        packer_(
            work, segments,
            [this](const Endpoint& end, int64_t offset, int64_t element_size) {
              return BufferAddress(end, offset, element_size);
            },
            options.device),
        quant_steps_(
            job, quant, buffers, options,
            work.any_cuda && kinds_.Buffer(work.process, kQuantArenaBuffer) == MemoryKind::kCuda,
            packer_.device_pending(), stats_, [this] { transport_.ProgressInFlight(); }),
        delta_(job, segments, work, options.delta, std::move(agreed), options.sync_id, options.wave,
               [this](const Endpoint& end, int64_t offset, int64_t element_size) {
                 // Before the rounds a step's bytes are in the whole staging (QuantizeWhole).
                 if (end.buffer == kQuantStagingBuffer) {
                   return delta_staging_.data() + offset * element_size;
                 }
                 return BufferAddress(end, offset, element_size);
               }) {
    if (options.verify != VerifyMode::kOff) {
      verifier_ = std::make_unique<ChunkVerifier>(
          job, work, segments,
          [this](const Endpoint& end, int64_t offset, int64_t element_size) -> const char* {
            return BufferAddress(end, offset, element_size);
          },
          options.sync_id, options.wave, options.device, VerifyBounceBytes(work.budget_bytes),
          options.deadline,
          // Kept in the cache after the lanes' arenas and the relay arena.
          [this](int64_t bytes) {
            return Arenas().GetDevice(*options_.device, work_.lanes.size() + 1, bytes);
          },
          options.verify == VerifyMode::kKeyed ? options.data_key : nullptr);
    }
  }

  absl::StatusOr<TransferStats> Go() {
    const absl::Time start = Now();
    lanes_.assign(work_.lanes.size(), LaneState{});
    // WSYNC_FAILPOINTS (common/failpoint.h): a failed allocation.
    if (absl::Status alloc = failpoint::Check("alloc"); !alloc.ok()) {
      NoticeUnsentMessages(alloc);
      delta_.Release(transport_, FailureGrace(), /*failed=*/true);
      DrainUnreceivedMessages(FailureGrace());
      return alloc;
    }
    // Delta's announcements resize messages: before the progress totals; FP8 steps quantized first.
    absl::Status status =
        options_.delta.on ? quant_steps_.QuantizeWhole(delta_staging_) : absl::OkStatus();
    if (status.ok()) status = delta_.Exchange(transport_, options_.deadline);
    delta_staging_ = {};
    progress_.Start();
    if (status.ok()) status = AllocateArenas();
    RejectStaleMessages();
    quant_steps_.SetMemory(quant_staging_, quant_arena_, &Arenas(), QuantArenaSlot() + 2);
    if (status.ok()) {
      status = quant_steps_.BeforeRounds(
          [this](int32_t segment) { return CopyLocal(segments_[segment]); });
    }
    for (int32_t index : work_.local_segments) {  // Sends copied locally went with their step.
      const Segment& s = segments_[index];
      if (status.ok() && s.from.buffer != kQuantStagingBuffer) status = CopyLocal(s);
    }

    const int32_t rounds = RoundsOf(work_);
    stats_.rounds = rounds;
    for (int32_t lane = 0; lane < std::ssize(work_.lanes); ++lane) {
      const std::vector<Message>& messages = work_.lanes[lane].messages;
      for (int32_t index = 0; index < std::ssize(messages); ++index) {
        if (!messages[index].direct) lanes_[lane].last_staged = index;
      }
      UpdateLookAhead(lane);
    }
    driver_ = transport_.NeedsRoundOrder()
                  ? MakeLockstepDriver(work_, rounds, transport_, options_.deadline)
                  : MakeIndependentLanesDriver(work_, rounds, transport_, options_.deadline);
    if (status.ok() && verifier_) status = verifier_->Start(transport_);
    if (status.ok()) status = driver_->Drive(*this);
    if (status.ok() && verifier_) progress_.Verifying();
    if (status.ok() && verifier_) status = verifier_->Finish(transport_, options_.deadline);
    if (status.ok()) status = quant_steps_.AfterRounds();
    if (status.ok()) status = SynchronizeDevice(options_.deadline);
    if (!status.ok()) {
      NoticeUnsentMessages(status);
      const absl::Time grace = FailureGrace();
      delta_.Release(transport_, grace, /*failed=*/true);
      DrainUnreceivedMessages(grace);
      if (verifier_) verifier_->Cancel(transport_);
      // What is still posted may complete until `grace`; the rest is cancelled and released.
      if (driver_) driver_->ReleaseOutstanding(transport_, grace);
      // No device copy may write after the run returned.
      SynchronizeDevice(std::max(grace, Now() + absl::Seconds(1))).IgnoreError();
      return status;
    }
    if (verifier_) stats_.verified_chunks = verifier_->checked_chunks();
    delta_.Release(transport_, options_.deadline, /*failed=*/false);
    delta_.WriteStats(stats_);
    RejectStaleMessages();
    stats_.seconds = absl::ToDoubleSeconds(Now() - start);
    return stats_;
  }

 private:
  absl::Span<const LaneState> lane_states() const override { return lanes_; }

  // Message `index` of `lane` completed: its slot is free once unpacked (Land), and a receive
  // is added to `received`.
  void Completed(int32_t lane, int32_t index, std::vector<LaneMessage>& received) override {
    const Message& message = work_.lanes[lane].messages[index];
    progress_.Completed(message);
    if (!message.direct) {
      lanes_[lane].slot_busy[message.slot] = false;
      UpdateLookAhead(lane);
    }
    if (work_.lanes[lane].direction != Direction::kReceive) return;
    stats_.received_bytes += message.bytes;  // Completed: every byte of it arrived.
    received.emplace_back(lane, index);
  }

  // Unpacks the completed receives (lane, message index), waits for their device copies (which
  // read arena slots later receives may land in, and write the host memory the verifier hashes)
  // and verifies them.
  absl::Status Land(absl::Span<const LaneMessage> received) override {
    WSYNC_RETURN_IF_ERROR(Unpack(received));
    WSYNC_RETURN_IF_ERROR(SynchronizeDevice(options_.deadline));
    WSYNC_RETURN_IF_ERROR(delta_.Apply(received));  // Host memory only; before the digests.
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
          lanes_[lane].posted >= static_cast<int32_t>(l.messages.size())) {
        continue;
      }
      const Message& unsent = l.messages[lanes_[lane].posted];
      const int64_t expected = unsent.bytes;
      absl::StatusOr<RequestId> notice =
          transport_.PostSend(l.peer, MakeTag(options_.sync_id, unsent.round, work_.process),
                              &kNotice, expected == 0 ? 1 : 0);
      if (notice.ok()) notices.push_back(*notice);
    }
    if (!notices.empty()) {
      transport_.WaitAll(notices, Now() + absl::Milliseconds(200)).IgnoreError();
    }
  }

  // After a failure: receives, for a short while, the messages peers still send this process, so
  // that a sender blocked on a large (rendezvous) send completes and votes instead of waiting for
  // its deadline. Direct messages land in the weights (the failed sync left them dirty anyway),
  // the others (and direct ones into an arena not made yet) in their peer's scratch buffer: two
  // peers may write at once (loopback copies on the sending thread), one peer's messages never.
  // Waits until `grace` at most; what did not arrive by then is cancelled.
  void DrainUnreceivedMessages(absl::Time grace) {
    auto direct_target = [&](size_t lane, size_t index) -> void* {
      const Message& message = work_.lanes[lane].messages[index];
      if (!message.direct || delta_.Payload(lane, index) != nullptr) return nullptr;
      const Chunk& chunk = work_.chunks[message.chunks[0]];
      const Endpoint& to = segments_[chunk.segment].to;
      if ((to.buffer == kRelayArenaBuffer && relay_arena_ == nullptr) ||
          (to.buffer == kQuantArenaBuffer && quant_arena_ == nullptr)) {
        return nullptr;
      }
      return BufferAddress(to, chunk.to_offset, chunk.element_size);
    };
    std::vector<RequestId> requests;
    absl::flat_hash_map<int32_t, int64_t> scratch_bytes;  // By peer.
    for (size_t lane = 0; lane < work_.lanes.size(); ++lane) {
      const Lane& l = work_.lanes[lane];
      for (size_t index = lanes_[lane].posted; index < l.messages.size(); ++index) {
        if (l.direction == Direction::kReceive && direct_target(lane, index) == nullptr)
          scratch_bytes[l.peer] = std::max(scratch_bytes[l.peer], l.messages[index].bytes);
      }
    }
    absl::flat_hash_map<int32_t, std::unique_ptr<char[]>> scratch;
    for (const auto& [peer, bytes] : scratch_bytes) scratch[peer].reset(new char[bytes]);
    for (size_t lane = 0; lane < work_.lanes.size(); ++lane) {
      const Lane& l = work_.lanes[lane];
      if (l.direction != Direction::kReceive) continue;
      for (size_t index = lanes_[lane].posted; index < l.messages.size(); ++index) {
        const Message& message = l.messages[index];
        void* data = direct_target(lane, index);
        if (data == nullptr) data = scratch[l.peer].get();
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
    return std::min(options_.deadline, Now() + absl::Milliseconds(200));
  }

  void RejectStaleMessages() {
    const int64_t rejected = transport_.DiscardStaleMessages(options_.sync_id);
    stats_.rejected_messages += rejected;
    if (options_.rejected_messages != nullptr) *options_.rejected_messages += rejected;
  }

  absl::Time Now() const { return options_.now ? options_.now() : absl::Now(); }

  // The arena cache slot of the quantization arena; the staging and the device quantization's
  // report words take the next two (after the lanes', the relay arena's and the verifier's).
  size_t QuantArenaSlot() const { return work_.lanes.size() + 2; }

  // The caller's arena cache, or this run's own.
  ArenaCache& Arenas() { return options_.arenas != nullptr ? *options_.arenas : fresh_arenas_; }

  absl::Status AllocateArenas() {
    ArenaCache* cache = &Arenas();
    auto get = [&](size_t lane, int64_t bytes, MemoryKind kind) -> absl::StatusOr<char*> {
      arena_bytes_ += bytes;
      stats_.peak_arena_bytes = std::max(stats_.peak_arena_bytes, arena_bytes_);
      if (kind == MemoryKind::kHost) return cache->Get(lane, bytes);
      return cache->GetDevice(*options_.device, lane, bytes);
    };
    for (size_t lane = 0; lane < work_.lanes.size(); ++lane) {
      const int64_t bytes = work_.lanes[lane].slots * work_.lanes[lane].slot_bytes;
      if (bytes == 0) continue;
      WSYNC_ASSIGN_OR_RETURN(lanes_[lane].arena, get(lane, bytes, work_.lanes[lane].kind));
    }
    if (work_.relay_arena_bytes > 0) {  // Kept in the cache after the lanes' arenas.
      WSYNC_ASSIGN_OR_RETURN(
          relay_arena_, get(work_.lanes.size(), work_.relay_arena_bytes, work_.relay_arena_kind));
    }
    // Of the process's kind, kept in the cache after the relay arena and the verifier's area.
    const MemoryKind quant_kind = LocalKind(kQuantArenaBuffer);
    if (work_.quant_arena_bytes > 0) {
      WSYNC_ASSIGN_OR_RETURN(quant_arena_,
                             get(QuantArenaSlot(), work_.quant_arena_bytes, quant_kind));
    }
    if (work_.quant_staging_bytes > 0) {
      WSYNC_ASSIGN_OR_RETURN(quant_staging_,
                             get(QuantArenaSlot() + 1, work_.quant_staging_bytes, quant_kind));
      stats_.quant_staging_bytes = work_.quant_staging_bytes;
    }
    return absl::OkStatus();
  }

  // Waits for the device work pending: packs, unpacks, local copies and quantization steps.
  absl::Status SynchronizeDevice(absl::Time deadline) { return packer_.Synchronize(deadline); }

  char* BufferAddress(const Endpoint& end, int64_t offset, int64_t element_size) const {
    char* base;
    switch (end.buffer) {
      case kRelayArenaBuffer:
        base = relay_arena_;
        break;
      case kQuantArenaBuffer:
        base = quant_arena_;
        break;
      case kQuantStagingBuffer:  // Laid out by QuantStagingLayout.
        return quant_steps_.StagingAddress(offset * element_size);
      default:
        base = static_cast<char*>(buffers_.at(end.buffer));
    }
    return base + offset * element_size;
  }

  absl::Status CopyLocal(const Segment& s) {
    const int64_t element_size = SegmentElementSize(job_, s);
    WSYNC_RETURN_IF_ERROR(
        packer_.Copy(BufferAddress(s.to, s.to.offset, element_size), LocalKind(s.to.buffer),
                     s.to.strides, BufferAddress(s.from, s.from.offset, element_size),
                     LocalKind(s.from.buffer), s.from.strides, s.box.extent, element_size));
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
    return lanes_[lane].arena + message.slot * work_.lanes[lane].slot_bytes;
  }

  // Packs staged send `index` of `lane` into its arena slot (MessagePacker::AppendPack).
  absl::Status AppendPacks(int32_t lane, int32_t index, std::vector<StridedCopy>& packs) {
    const Message& message = work_.lanes[lane].messages[index];
    return packer_.AppendPack(work_.lanes[lane], message, SlotAddress(lane, message), packs);
  }

  // Keeps `lane` in look_ahead_lanes_ while PackableAhead may find a message of it: a sending
  // lane that is not forwarding, with a host arena, a staged message not posted yet and a free
  // arena slot. Called whenever the lane posts or completes a message.
  void UpdateLookAhead(int32_t lane) {
    const Lane& l = work_.lanes[lane];
    bool free_slot = false;
    const LaneState& state = lanes_[lane];
    for (int32_t slot = 0; slot < l.slots; ++slot) free_slot |= !state.slot_busy[slot];
    if (l.direction == Direction::kSend && !l.forwarding && l.kind == MemoryKind::kHost &&
        state.posted <= state.last_staged && free_slot) {
      look_ahead_lanes_.insert(lane);
    } else {
      look_ahead_lanes_.erase(lane);
    }
  }

  // The first staged send of `lane` from message `first` on (the lane's messages before `first`
  // are posted by now), when it may be packed now, ahead of its round: the lane is a sending lane
  // that is not forwarding (what it forwards may not have arrived), none of its messages from
  // `first` on is packed already, the message is one chunk from host memory into a host arena,
  // and its slot is not `busy_slot` (filled now) and holds nothing in flight, and it is not read
  // from the quantization staging (whose steps are quantized when their message is due). Returns
  // -1 otherwise.
  int32_t PackableAhead(int32_t lane, int32_t first, int32_t busy_slot) const {
    const Lane& l = work_.lanes[lane];
    if (l.direction != Direction::kSend || l.forwarding || l.kind != MemoryKind::kHost ||
        lanes_[lane].packed_ahead >= first) {
      return -1;
    }
    for (int32_t index = first; index < static_cast<int32_t>(l.messages.size()); ++index) {
      const Message& message = l.messages[index];
      if (message.direct) continue;
      if (delta_.Payload(lane, index) != nullptr) return -1;  // Encoded: nothing to pack.
      const bool free = message.slot != busy_slot && !lanes_[lane].slot_busy[message.slot];
      const Chunk& chunk = work_.chunks[message.chunks[0]];
      const bool host_chunk = message.chunks.size() == 1 && chunk.from_kind == MemoryKind::kHost &&
                              segments_[chunk.segment].from.buffer != kQuantStagingBuffer;
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
  absl::Status PrepareNext(absl::Span<const int32_t> lanes) override {
    WSYNC_RETURN_IF_ERROR(quant_steps_.BeforeMessages(lanes, lanes_));
    std::vector<StridedCopy> packs;
    std::vector<std::pair<int32_t, int32_t>> packed;  // (lane, message index)
    ++prepare_calls_;                                 // Marks the due_* fields this call sets.
    std::vector<StridedCopy> due_alone;               // The packs of due messages of one chunk.
    for (int32_t lane : lanes) {
      LaneState& state = lanes_[lane];
      const int32_t index = state.posted;
      const Message& message = work_.lanes[lane].messages[index];
      state.due_call = prepare_calls_;
      state.due_first = index + 1;
      state.due_busy_slot = message.slot;
      state.due_packs = false;
      if (message.direct || work_.lanes[lane].direction != Direction::kSend ||
          state.packed_ahead == index || delta_.Payload(lane, index) != nullptr) {
        continue;
      }
      const size_t before = packs.size();
      WSYNC_RETURN_IF_ERROR(AppendPacks(lane, index, packs));
      packed.emplace_back(lane, index);
      state.due_packs = true;
      if (message.chunks.size() == 1 && packs.size() > before) due_alone.push_back(packs.back());
    }
    if (!due_alone.empty()) {
      for (int32_t lane : look_ahead_lanes_) {  // Ascending; the others have nothing to pack.
        const LaneState& state = lanes_[lane];
        const bool is_due = state.due_call == prepare_calls_;
        if (is_due && state.due_packs) continue;
        const int32_t index = is_due ? PackableAhead(lane, state.due_first, state.due_busy_slot)
                                     : PackableAhead(lane, state.posted, -1);
        if (index < 0) continue;
        const size_t at = packs.size();
        WSYNC_RETURN_IF_ERROR(AppendPacks(lane, index, packs));  // Host to host: appended.
        if (std::none_of(due_alone.begin(), due_alone.end(),
                         [&](const StridedCopy& alone) { return ShareAPass(packs[at], alone); })) {
          packs.resize(at);
          continue;
        }
        packed.emplace_back(lane, index);
        lanes_[lane].packed_ahead = index;
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
    for (int32_t lane : lanes) WSYNC_RETURN_IF_ERROR(Post(lane, lanes_[lane].posted));
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
      lanes_[lane_index].slot_busy[message.slot] = true;
      stats_.staged_bytes += message.bytes;
    }
    if (char* encoded = delta_.Payload(lane_index, index)) data = encoded;
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
    driver_->Posted(lane_index, index, r, request);
    ++lanes_[lane_index].posted;
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
      if (message.direct || delta_.Payload(lane, index) != nullptr) continue;  // Applied in Land.
      WSYNC_RETURN_IF_ERROR(
          packer_.AppendUnpack(work_.lanes[lane], message, SlotAddress(lane, message), unpacks));
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
  const JobMemoryKinds kinds_{job_};
  RunProgress progress_;  // Into options_.progress.
  // Packs and unpacks staged messages; every strided copy of the run, and the device's pending
  // work (packing.h). Before quant_steps_, which marks its device work pending there.
  MessagePacker packer_;
  TransferStats stats_;
  QuantSteps quant_steps_;           // When this process quantizes (quant_run.h).
  std::vector<char> delta_staging_;  // Every quantize step at once, for delta_'s Exchange.
  DeltaLanes delta_;                 // Encoded messages of delta sync (delta_run.h).
  ArenaCache fresh_arenas_;          // Used when the caller keeps no cache.
  char* relay_arena_ = nullptr;      // Memory owned by a cache.
  char* quant_arena_ = nullptr;      // kQuantArenaBuffer, owned by a cache.
  char* quant_staging_ = nullptr;    // kQuantStagingBuffer, owned by a cache.
  int64_t arena_bytes_ = 0;
  std::vector<LaneState> lanes_;
  std::unique_ptr<LaneDriver> driver_;  // Lockstep or independent lanes, chosen in Go.
  // The lanes PackableAhead may find a message of (UpdateLookAhead), so that looking ahead does
  // not pass over every lane.
  absl::btree_set<int32_t> look_ahead_lanes_;
  int64_t prepare_calls_ = 0;                // PrepareNext calls so far: LaneState::due_call.
  std::unique_ptr<ChunkVerifier> verifier_;  // With options.verify only.
};

}  // namespace

absl::StatusOr<TransferStats> RunWork(const Job& job, absl::Span<const Segment> segments,
                                      Work& work, const QuantWork& quant,
                                      const LocalBuffers& buffers, Transport& transport,
                                      const ExecuteOptions& options, DeltaAgreed delta) {
  Run run(job, segments, work, quant, buffers, transport, options, std::move(delta));
  return run.Go();
}

}  // namespace wsync::executor_internal
