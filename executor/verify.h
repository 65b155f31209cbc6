#ifndef WSYNC_EXECUTOR_VERIFY_H_
#define WSYNC_EXECUTOR_VERIFY_H_

// End-to-end integrity of one run (ExecuteOptions::verify): an xxh3-64 per chunk, computed by the
// sender over the chunk's elements in its weight buffers as it posts them, and by the receiver over
// the chunk's elements as they landed in its weight buffers; both hash the elements in row-major
// order of the chunk's box, so staging, packing and strides do not change a correct chunk's hash.
//
// Transport: after its rounds, a sender posts one extra message to each receiving peer, tagged
// with the sync id, the reserved round kVerifyRound and the sender, carrying
// [sync id, hash of chunk 0, hash of chunk 1, ...] in the lane's canonical chunk order (the order
// both sides derive from BuildWork). Receivers post the matching receives before the first round
// and compare once every round completed. A lane that would need round kVerifyRound for data is
// refused.
//
// Private to the executor (like work.h). Not thread-safe: used by the executing thread only.

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "executor/work.h"
#include "transport/transport.h"

namespace wsync::executor_internal {

// The round number of the hash message in its tag (MakeTag keeps 24 bits of the round).
inline constexpr int64_t kVerifyRound = kMaxRounds - 1;

// xxh3-64 of the elements of the region `shape` at `base` (element strides `strides`, elements of
// `element_size` bytes), fed in row-major order: equal to Xxh3 of the packed region.
uint64_t HashRegion(const void* base, const Dims& strides, const Dims& shape, int64_t element_size);

class ChunkVerifier {
 public:
  // Where an endpoint's element `offset` lies in this process's memory (a weight buffer or the
  // relay arena); called while hashing, so the memory it names must exist by then.
  using AddressOf =
      std::function<const char*(const Endpoint& end, int64_t offset, int64_t element_size)>;

  // `work` and `segments` must outlive the verifier.
  ChunkVerifier(const Job& job, const Work& work, absl::Span<const Segment> segments,
                AddressOf address_of, uint64_t sync_id);
  ~ChunkVerifier();
  ChunkVerifier(const ChunkVerifier&) = delete;
  ChunkVerifier& operator=(const ChunkVerifier&) = delete;

  // Posts the receive of every sending peer's hash message. Before the first round.
  // InvalidArgument when a lane has a message at round kVerifyRound.
  absl::Status Start(Transport& transport);
  // Hashes the chunks of message `message` of send lane `lane` from this process's source memory.
  void HashSent(int32_t lane, int32_t message);
  // Hashes the chunks of message `message` of receive lane `lane` as they landed in the target
  // memory (after any unpack).
  void HashReceived(int32_t lane, int32_t message);
  // Sends every receiving peer the hashes of what this process sent it, waits until `deadline`
  // for the hashes of every sending peer, and compares chunk by chunk. DataLoss naming the peer
  // and the first chunk that differs (parameter, segment box, chunk index) on a mismatch; the
  // transport's error otherwise.
  absl::Status Finish(Transport& transport, absl::Time deadline);
  // Cancels whatever Start and Finish posted and did not complete (after a failed run).
  void Cancel(Transport& transport);

  // Chunks whose hash this process compared (receiver) and found equal.
  int64_t checked_chunks() const { return checked_; }
  // Chunks this process hashed, sent and received.
  int64_t hashed_chunks() const { return hashed_; }

 private:
  uint64_t HashChunk(const Chunk& chunk, bool sending) const;
  absl::Status Compare(int32_t lane);

  const Job& job_;
  const Work& work_;
  absl::Span<const Segment> segments_;
  AddressOf address_of_;
  const uint64_t sync_id_;
  // Per lane: [sync id, hashes...] in the lane's chunk order (computed on both sides), and on
  // receive lanes the peer's message as it arrived.
  std::vector<std::vector<uint64_t>> local_;
  std::vector<std::vector<uint64_t>> remote_;
  std::vector<size_t> expected_;  // Per lane: 1 + its chunks.
  std::vector<RequestId> pending_;
  int64_t checked_ = 0;
  int64_t hashed_ = 0;
};

}  // namespace wsync::executor_internal

#endif  // WSYNC_EXECUTOR_VERIFY_H_
