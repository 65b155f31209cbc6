#ifndef WSYNC_EXECUTOR_DELTA_RUN_H_
#define WSYNC_EXECUTOR_DELTA_RUN_H_

// Private to the executor: the delta sync part of one run (ExecuteOptions::delta, issue 44).
//
// Which lanes: with delta on (every process agreed), a lane of host memory that is not
// forwarding (its sender is a trainer) runs delta; with delta=auto only where its path class pays
// at the agreed changed fraction (DeltaOptions). Such a lane announces when its receiver holds a
// version (the agreement tells every sender each receiver's held version). Both ends decide this
// alike from the work, the rule (its digest agreed) and the agreement, so both know whether a lane
// announces.
//
// FP8 targets (quant_work.h): a sender-side step's two segments, its e4m3 bytes (element size 1)
// and its scales (4), are chunks from the sender's quantization staging into the rollout's
// weight and scale buffers, encoded and recorded like any other, element by element against the
// quantized bytes last sent: a block whose e4m3 bytes and scale did not change sends nothing, and
// one that changed sends only the bytes that did. The staging is laid out over the rounds, so the
// run quantizes every step at once into the whole virtual staging before Exchange reads them
// (QuantSteps::QuantizeWhole; the `address_of` of a kQuantStagingBuffer endpoint points there).
// Receiver-side steps (gathers into the receiver's quantization arena) travel as planned.
//
// Wire: before its rounds, the sender of such a lane encodes each chunk of it (delta_codec.h)
// against its base of exactly the receiver's held version (DeltaBaseStore::Base; the dense
// encoding without one), and sends one announcement, tag round kDeltaRound, of a size both ends
// know: [sync id, then per chunk of the lane in message order its encoded bytes, or -1 for every
// chunk of a message that travels as planned]. A message travels encoded when each of its chunks
// is host memory on both sides into a weight buffer and its encodings together are smaller than
// the message: then it carries them back to back, in its own round and tag, and its size is
// their sum on both ends. Any other message travels as planned, byte for byte as without delta.
// The receiver takes every count from the announcement only after checking it against its own
// work (each encoded chunk between a header and a header plus its dense bytes, a message smaller
// than planned, host memory on its side), lands an encoded message in host memory of its own and
// patches each chunk's target in place (ApplyDelta checks the encoding against the chunk before
// writing), before the chunk digests of `verify` hash the patched target. A delta is a subset of
// what the plan writes: the plan, its digest and its exact-once proof are unchanged.
//
// Bases: the sender records every chunk it sends from host memory (a weight buffer or its
// quantization staging) into a host weight buffer (on every lane that runs delta, announcing or
// not; a base of the receiver's version is advanced in place while the chunk is encoded against
// it) as the pending base of its key (wave,
// chunk index), which the caller commits or aborts with the sync's decision. Memory: the
// encodings of a lane's encoded messages on both ends (less than those messages' planned bytes)
// besides the staging budget, the store's bytes within its own budget, and on a sender of FP8
// steps the whole virtual staging while Exchange runs.
//
// Not thread-safe: the run's thread only.

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "executor/agreement.h"
#include "executor/execute.h"
#include "executor/work.h"
#include "planner/job.h"
#include "transport/transport.h"

namespace wsync::executor_internal {

// The round number of the announcement in its tag (below verify.h's kVerifyRound).
inline constexpr int64_t kDeltaRound = kMaxRounds - 2;

// What the agreement settled for delta sync (AgreeOnBatch): every process's held version, and the
// changed fraction the senders saw (nullopt: none saw any yet).
struct DeltaAgreed {
  std::vector<std::optional<uint64_t>> held_versions;
  std::optional<double> changed_fraction;
};

// A digest of delta=auto's rule (DeltaOptions::automatic and pays_below; 0 without auto): equal
// on two processes exactly when they decide every lane alike at every changed fraction.
uint64_t DeltaRuleDigest(const DeltaOptions& options);
// This process's claim in the agreement.
DeltaClaim DeltaClaimOf(const DeltaOptions& options);

// The DeltaBaseStore key of chunk `chunk` of wave `wave`.
inline uint64_t DeltaChunkKey(int32_t wave, int32_t chunk) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(wave)) << 32) | static_cast<uint32_t>(chunk);
}

class DeltaLanes {
 public:
  // Where an endpoint's element `offset` is in this process's memory.
  using AddressOf = std::function<char*(const Endpoint&, int64_t offset, int64_t element_size)>;

  // `agreed`: from the agreement (no held versions: none holds one).
  DeltaLanes(const Job& job, absl::Span<const Segment> segments, Work& work,
             const DeltaOptions& options, DeltaAgreed agreed, uint64_t sync_id, int32_t wave,
             AddressOf address_of);

  // Before the rounds and before the run's progress totals: encodes, records and announces this
  // process's sends, then receives and checks the announcements of its receives and resizes its
  // encoded messages (Work::lanes' message bytes on both ends). DataLoss naming the peer for an
  // announcement that does not fit this process's work; the transport's errors.
  absl::Status Exchange(Transport& transport, absl::Time deadline);

  // Where message `index` of `lane` is sent from or received into when it travels encoded;
  // nullptr when it travels as planned.
  char* Payload(int32_t lane, int32_t index) const;

  // Patches the targets of the encoded messages among `received` (lane, message index).
  // DataLoss naming the peer, message and chunk for an encoding that does not fit its chunk; the
  // chunk's target is then untouched.
  absl::Status Apply(absl::Span<const std::pair<int32_t, int32_t>> received);

  // At the end of a run: after a failure, tells each receiver of an announcement not sent yet
  // that it will not come (a message of another size, as the run's notices do); then waits until
  // `until` for the announcements still posted (the rest is cancelled).
  void Release(Transport& transport, absl::Time until, bool failed);

  int64_t messages() const { return messages_; }
  // Dense bytes of the encoded messages less their encodings, over every lane.
  int64_t saved_bytes() const;
  // Sets the TransferStats::delta_* figures of this run so far.
  void WriteStats(TransferStats& stats) const;
  // What this process's sends compared against bases, and the agreed fraction lanes were decided
  // with.
  const DeltaObservation& observed() const { return observed_; }
  std::optional<double> changed_fraction() const { return changed_fraction_; }

 private:
  struct LaneDelta {
    bool runs = false;
    bool announces = false;
    std::vector<int64_t> announcement;  // [sync id, per chunk: bytes or -1].
    std::vector<int64_t> offsets;       // Per message: its place in `payload`, or -1.
    std::vector<int64_t> first_words;   // Per message: its first chunk's announcement word.
    // The encoded messages, back to back; receives land in it through Payload.
    mutable std::vector<uint8_t> payload;
    int64_t saved_bytes = 0;  // Dense bytes of its encoded messages less their encodings.
    int64_t announced_bytes = 0;  // Sender: dense bytes of the messages it announced.
  };

  // Whether the lane runs delta (records and may announce); Announces adds the held version.
  bool Runs(const Lane& lane) const;
  bool Announces(const Lane& lane) const;
  // A chunk whose bytes may be recorded and encoded: host memory on both sides, from a weight
  // buffer or the quantization staging into a weight buffer.
  bool Encodable(const Chunk& chunk) const;
  absl::Status EncodeLane(int32_t lane);
  // Whether the store holds a base of the receiver's held version for a chunk of `message` (of a
  // lane that announces).
  bool HasBase(const Lane& lane, const Message& message) const;
  // A chunk's current bytes: its source, or `packed` holding them when the source is strided.
  absl::Span<const uint8_t> Current(const Chunk& chunk, std::vector<uint8_t>* packed) const;
  // Inserts the dense encodings of `deferred` (chunks before the first that saved, in order) at
  // `mark`, the start of their message in `payload`.
  void AppendDeferred(absl::Span<const int32_t> deferred, size_t mark,
                      std::vector<uint8_t>* payload) const;
  absl::Status CheckAnnouncement(int32_t lane);
  absl::Status ApplyReceived(absl::Span<const std::pair<int32_t, int32_t>> received);

  const Job& job_;
  absl::Span<const Segment> segments_;
  Work& work_;
  const DeltaOptions& options_;
  const std::vector<std::optional<uint64_t>> held_;
  const std::optional<double> changed_fraction_;
  const uint64_t sync_id_;
  const int32_t wave_;
  const AddressOf address_of_;
  std::vector<LaneDelta> lanes_;
  std::vector<RequestId> sends_;
  bool announced_ = false;  // Exchange posted this process's announcements.
  int64_t messages_ = 0;
  double encode_cpu_seconds_ = 0;
  double apply_cpu_seconds_ = 0;
  DeltaObservation observed_;  // Elements compared against bases, and how many changed.
};

}  // namespace wsync::executor_internal

#endif  // WSYNC_EXECUTOR_DELTA_RUN_H_
