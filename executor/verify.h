#ifndef WSYNC_EXECUTOR_VERIFY_H_
#define WSYNC_EXECUTOR_VERIFY_H_

// End-to-end integrity of one run (ExecuteOptions::verify): a digest per chunk, computed by the
// sender over the chunk's elements in its weight buffers as it posts them, and by the receiver over
// the chunk's elements as they landed in its weight buffers; both hash the elements in row-major
// order of the chunk's box, so staging, packing and strides do not change a correct chunk's hash.
// A region in CUDA memory is hashed by copying it (stream-ordered through the run's DeviceMemory,
// so after every unpack or copy enqueued before it) in row-major pieces into one host bounce buffer
// and hashing there: the same hash as the host path, so host and CUDA sides verify each other, in
// at most `bounce_bytes` of host memory.
//
// The digest is xxh3-64 (VerifyMode::kHash: finds accidents, not attackers: anyone who can change
// a chunk on the wire can send its hash too), or with a DataKey (VerifyMode::kKeyed) the 128-bit
// keyed MAC of chunk_mac.h, bound to the sync id, the wave of a streamed sync, sender, receiver,
// lane kind and the chunk's position in the lane: without the key nobody can make a tag that a
// receiver accepts for bytes other than the sender's, nor reuse one from another sync, wave, lane
// or position. The hash message
// is then [sync id, tag of chunk 0 (2 words), ...]; the receiver acts on none of it except to
// compare it with what it computed itself, so a forged or replayed message can only fail the run.
//
// Transport: after its rounds, a sender posts one extra message to each receiving peer, tagged
// with the sync id, the reserved round kVerifyRound and the sender, carrying
// [sync id, hash of chunk 0, hash of chunk 1, ...] in the lane's canonical chunk order (the order
// both sides derive from BuildWork). Receivers post the matching receives before the first round
// and compare once every round completed. A lane that would need round kVerifyRound for data is
// refused. Between two CUDA processes (a lane of kind kCuda) the hash message travels in device
// memory like the lane's data (NCCL carries only device memory and matches a pair's messages in
// posting order): the receive is posted in Finish, after the lane's last data receive, and both
// sides copy the hashes between host and a small device area.
//
// Private to the executor (like work.h). Not thread-safe: used by the executing thread only.

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/data_key.h"
#include "executor/chunk_mac.h"
#include "executor/work.h"
#include "transport/device_memory.h"
#include "transport/transport.h"

namespace wsync::executor_internal {

// The round number of the hash message in its tag (MakeTag keeps 24 bits of the round).
inline constexpr int64_t kVerifyRound = kMaxRounds - 1;

// xxh3-64 of the elements of the region `shape` at `base` (element strides `strides`, elements of
// `element_size` bytes), fed in row-major order: equal to Xxh3 of the packed region.
uint64_t HashRegion(const void* base, const Dims& strides, const Dims& shape, int64_t element_size);

// A region in device memory, for HashDeviceRegions.
struct DeviceRegion {
  const void* base = nullptr;
  Dims strides;
  Dims shape;
  int64_t element_size = 1;
};

// The HashRegion of every region (into `hashes`, in order), for regions in memory `device` can
// copy from: each region is cut into row-major pieces of at most bounce.size() bytes, copied with
// device.CopyStridedAsync into `bounce` (packed, several pieces per fill) and fed to xxh3 after
// device.Synchronize(deadline). The copies follow whatever was enqueued on the device before.
// InvalidArgument when `bounce` cannot hold one element; the device's error otherwise.
absl::Status HashDeviceRegions(DeviceMemory& device, absl::Span<const DeviceRegion> regions,
                               absl::Span<char> bounce, absl::Time deadline,
                               absl::Span<uint64_t> hashes);

// The keyed MAC (chunk_mac.h) of the region as the chunk at `position` of `mac`'s lane: equal to
// mac.Of of the packed region. Internal when OpenSSL fails.
absl::StatusOr<MacTag> MacRegion(LaneMac& mac, uint64_t position, const void* base,
                                 const Dims& strides, const Dims& shape, int64_t element_size);

// The keyed MAC of every region (into `tags`, region r as the chunk at positions[r] of `mac`'s
// lane), through the bounce buffer as HashDeviceRegions: the same tags as MacRegion on host
// memory. Errors as HashDeviceRegions, and Internal when OpenSSL fails.
absl::Status MacDeviceRegions(DeviceMemory& device, absl::Span<const DeviceRegion> regions,
                              absl::Span<const uint64_t> positions, LaneMac& mac,
                              absl::Span<char> bounce, absl::Time deadline,
                              absl::Span<MacTag> tags);

class ChunkVerifier {
 public:
  // Where an endpoint's element `offset` lies in this process's memory (a weight buffer or the
  // relay arena); called while hashing, so the memory it names must exist by then.
  using AddressOf =
      std::function<const char*(const Endpoint& end, int64_t offset, int64_t element_size)>;

  // Device memory of at least `bytes` bytes for the hash messages of CUDA lanes, owned by the
  // caller and kept across syncs (an arena of the session's ArenaCache): a peer over CUDA IPC maps
  // it, and memory a peer mapped must not be freed under it.
  using DeviceArea = std::function<absl::StatusOr<char*>(int64_t bytes)>;

  // `work`, `segments` and `device` must outlive the verifier. `sync_id` and `wave` are
  // ExecuteOptions's. `device` (null in a host-only job) copies CUDA regions and hash messages;
  // `device_area` gives the memory of the hash messages of CUDA lanes (empty: the verifier
  // allocates it from `device` and frees it when destroyed); `bounce_bytes` bounds the host memory
  // that CUDA regions are hashed in; `deadline` bounds every wait for the device; `key` (null: xxh3
  // hashes), when given, keys the chunk MACs and must outlive the verifier.
  ChunkVerifier(const Job& job, const Work& work, absl::Span<const Segment> segments,
                AddressOf address_of, uint64_t sync_id, int32_t wave,
                DeviceMemory* device = nullptr, int64_t bounce_bytes = 0,
                absl::Time deadline = absl::InfiniteFuture(), DeviceArea device_area = nullptr,
                const DataKey* key = nullptr);
  ~ChunkVerifier();
  ChunkVerifier(const ChunkVerifier&) = delete;
  ChunkVerifier& operator=(const ChunkVerifier&) = delete;

  // Posts the receive of every sending peer's hash message over host memory (CUDA lanes: in
  // Finish). Before the first round. InvalidArgument when a lane has a message at round
  // kVerifyRound; the device's error when its area for CUDA hash messages cannot be allocated;
  // Internal when the keyed MACs cannot be set up.
  absl::Status Start(Transport& transport);
  // Hashes the chunks of message `message` of send lane `lane` from this process's source memory.
  // The device's error when a CUDA region cannot be copied.
  absl::Status HashSent(int32_t lane, int32_t message);
  // Hashes the chunks of message `message` of receive lane `lane` as they landed in the target
  // memory: call after the message's unpacks completed (a device unpack into host memory is
  // synchronised first; copies of CUDA regions follow it on the device anyway).
  absl::Status HashReceived(int32_t lane, int32_t message);
  // Sends every receiving peer the hashes of what this process sent it, waits until `deadline`
  // for the hashes of every sending peer, and compares chunk by chunk. DataLoss naming the peer
  // and the first chunk that differs (parameter, segment box, chunk index) on a mismatch ("the
  // MAC of chunk ..." when keyed); the transport's error otherwise.
  absl::Status Finish(Transport& transport, absl::Time deadline);
  // Cancels whatever Start and Finish posted and did not complete (after a failed run).
  void Cancel(Transport& transport);

  // Chunks whose hash this process compared (receiver) and found equal.
  int64_t checked_chunks() const { return checked_; }
  // Chunks this process hashed, sent and received.
  int64_t hashed_chunks() const { return hashed_; }

 private:
  // Appends the hashes of the chunks of `message` of `lane` to local_[lane].
  absl::Status HashMessage(int32_t lane, int32_t message, bool sending);
  absl::Status Compare(int32_t lane);
  // Where lane `lane`'s hash message lies in device_area_ (CUDA lanes only).
  char* DeviceSlot(size_t lane) const { return device_area_ + device_offset_[lane]; }
  // Copies `count` hashes between host and device memory and waits for the copy.
  absl::Status CopyHashes(void* dst, const void* src, size_t count);

  const Job& job_;
  const Work& work_;
  absl::Span<const Segment> segments_;
  AddressOf address_of_;
  const uint64_t sync_id_;
  const int32_t wave_;  // Binds the MACs with the sync id (ExecuteOptions::wave).
  // Per lane: [sync id, digests...] in the lane's chunk order (computed on both sides), and on
  // receive lanes the peer's message as it arrived.
  std::vector<std::vector<uint64_t>> local_;
  std::vector<std::vector<uint64_t>> remote_;
  std::vector<size_t> expected_;  // Per lane: 1 + its chunks.
  std::vector<RequestId> pending_;
  DeviceMemory* device_;
  const int64_t bounce_bytes_;
  const absl::Time deadline_;
  std::vector<char> bounce_;  // Allocated when a CUDA region is first hashed.
  DeviceArea device_area_source_;
  char* device_area_ = nullptr;    // The hash messages of CUDA lanes.
  bool owns_device_area_ = false;  // Allocated from device_ (no source): freed by the destructor.
  std::vector<int64_t> device_offset_;  // Per lane, bytes into device_area_.
  int64_t checked_ = 0;
  int64_t hashed_ = 0;
  const DataKey* key_;                          // Null: xxh3 hashes.
  const size_t words_per_chunk_;                // Of the hash message: 1 (xxh3) or 2 (MAC).
  std::vector<std::unique_ptr<LaneMac>> macs_;  // Per lane, keyed only; set by Start.
};

}  // namespace wsync::executor_internal

#endif  // WSYNC_EXECUTOR_VERIFY_H_
