#ifndef WSYNC_EXECUTOR_EXECUTE_H_
#define WSYNC_EXECUTOR_EXECUTE_H_

// Runs one process's part of a batch of segments over a Transport: agrees with every other
// process on the plan digest and budget, then runs the rounds of its schedule (schedule.h) with
// double-buffered arenas, and the local copies.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/data_key.h"
#include "common/sync_progress.h"
#include "executor/delta_base.h"
#include "executor/schedule.h"
#include "transport/device_memory.h"
#include "transport/transport.h"

namespace wsync {

// Base addresses of this process's buffers by buffer id (sizes and memory kinds come from the
// layout): host pointers, or device pointers for CUDA buffers.
using LocalBuffers = absl::flat_hash_map<uint64_t, void*>;

// Staging memory kept across runs of one process, so that a sync pays neither allocation nor
// first-touch page faults for its arenas. Holds at most what the last run's schedule needed; not
// thread-safe (one per process). Device arenas are freed through the DeviceMemory that allocated
// them, which must outlive the cache.
class ArenaCache {
 public:
  ArenaCache() = default;
  ArenaCache(const ArenaCache&) = delete;
  ArenaCache& operator=(const ArenaCache&) = delete;
  ~ArenaCache();

  // Host memory for arena `lane` of at least `bytes` bytes, reused when the lane had as much.
  char* Get(size_t lane, int64_t bytes);
  // The same in `device` memory (a lane's device arena is separate from its host one).
  absl::StatusOr<char*> GetDevice(DeviceMemory& device, size_t lane, int64_t bytes);
  // Host and device bytes held, and the device part.
  int64_t held_bytes() const;
  int64_t held_device_bytes() const;

 private:
  struct DeviceArena {
    DeviceMemory* device = nullptr;
    char* memory = nullptr;
    int64_t bytes = 0;
  };
  std::vector<std::unique_ptr<char[]>> arenas_;
  std::vector<int64_t> sizes_;
  std::vector<DeviceArena> device_arenas_;
};

// End-to-end integrity of a run (ExecuteOptions::verify).
enum class VerifyMode : int32_t {
  kOff = 0,
  kHash = 1,   // xxh3-64 per chunk.
  kKeyed = 2,  // A keyed MAC per chunk (executor/chunk_mac.h).
};

// "off", "hash", "keyed"; ParseVerifyMode also takes "true" (hash) and "false" (off).
absl::string_view VerifyModeName(VerifyMode mode);
absl::StatusOr<VerifyMode> ParseVerifyMode(absl::string_view name);

// What a sender saw of its chunks in delta syncs: elements compared against a base and those that
// changed (every element of a chunk the comparison stopped in, as mostly changed).
struct DeltaObservation {
  int64_t changed_elements = 0;
  int64_t compared_elements = 0;
};

// Delta sync (issue 44; executor/delta_run.h states the wire format and the rules).
struct DeltaOptions {
  // Every process of the batch must set it alike (refused through the agreement otherwise).
  bool on = false;
  // delta=auto (plugin/prediction.h DeltaPaysBelow): with `automatic`, a lane runs delta only
  // when its path class (Job::PathClass of its sender and receiver) is in `pays_below` with a
  // fraction above the agreed changed fraction (AgreeOnBatch: every process's `observed` summed),
  // or, when no process observed any yet, above 0: a probe that measures it. Other lanes run as
  // without delta: nothing recorded or announced. Every process must bring the same rule (the
  // agreement compares DeltaRuleDigest), so both ends of a lane decide alike.
  bool automatic = false;
  std::map<std::string, double> pays_below;
  // What this process saw as a sender in the last committed sync that compared anything
  // (TransferStats::delta_observed): its part of the agreed changed fraction.
  DeltaObservation observed;
  // As a sender: the bytes this process last sent per chunk, caller-owned. The run encodes each
  // chunk to a receiver against the base of exactly the version that receiver holds and records
  // what it sends as pending; the caller commits the store with the sync's decision
  // (DeltaBaseStore::Commit / Abort). Null: every chunk goes dense and nothing is recorded.
  // The source bytes must not change during the run (what is recorded is what is sent).
  DeltaBaseStore* bases = nullptr;
  // As a receiver: the version this process committed last and still holds unchanged, or nullopt
  // when it is dirty, new, rebound or was in an aborted sync since: then every chunk to it goes
  // dense. Applies to all its target buffers.
  std::optional<uint64_t> held_version;
};

// What one run reads: the wrappers' options (ExecuteTransfers, ExecuteWaves), and what an
// Executor (executor.h) hands each of its waves, composed from its ExecutorDeps, ExecutorHooks
// and the SyncRequest.
struct ExecuteOptions {
  uint64_t sync_id = 0;  // Goes into every message tag.
  // The wave of a streamed sync this run moves (ExecuteWaves sets it; 0 otherwise). The waves of
  // one sync share its sync id, message tags, lanes and chunk positions: keyed MACs are bound to
  // the wave too, so that one wave's chunks and MACs replayed into another fail verification.
  int32_t wave = 0;
  uint64_t plan_digest = 0;  // Plan::digest; compared across processes before any byte moves.
  absl::Time deadline = absl::InfiniteFuture();
  ArenaCache* arenas = nullptr;  // Optional, caller-owned; fresh arenas every run when null.
  // End-to-end integrity (verify.h): every chunk sent to a peer is digested by its sender and by
  // its receiver over what landed; a receiver whose digests differ fails with DataLoss naming the
  // peer and the chunk. kHash: xxh3-64 (accidents only); kKeyed: a keyed MAC from `data_key`
  // (required, caller-owned), bound to this sync, sender, receiver and chunk position
  // (chunk_mac.h; attackers without the key too). Local copies are not digested. CUDA regions
  // are digested through `device` (copied stream-ordered into one host bounce buffer of at most
  // min(budget, 1 MiB)), with the same digests as host memory, so host and CUDA sides check each
  // other.
  VerifyMode verify = VerifyMode::kOff;
  const DataKey* data_key = nullptr;
  // Optional, caller-owned: incremented by the messages of earlier syncs this run rejected
  // (Transport::DiscardStaleMessages, at the start and at the end of a run), also when the run
  // fails.
  int64_t* rejected_messages = nullptr;
  // When the run fails after the agreement, every peer still waiting for a message of this
  // process is told at once that it will not come (it then fails instead of waiting for the
  // deadline). Called with the failure just before that, on the executing thread, so that the
  // caller can vote no first and the commit decision names this process's reason rather than a
  // peer's consequence. Optional.
  std::function<void(const absl::Status&)> before_notices;
  // Copies and arenas for CUDA memory (memory_kinds.h), caller-owned. Required when this process
  // holds a CUDA buffer (the run is refused with Unimplemented otherwise); never called by a
  // host-only job. Packs are synchronised before their send is posted, unpacks of a round before
  // the next round's messages are posted into their arenas, local copies before the run returns.
  DeviceMemory* device = nullptr;
  // The clock the run reads: the failure path's grace (now + 200 ms, never past `deadline`) and
  // TransferStats::seconds. Null: absl::Now. A simulated transport (integration/simulation/simgrid)
  // passes its simulated clock, in whose time `deadline` is then given too; deadlines handed to the
  // transport and the device are always in this clock's time.
  std::function<absl::Time()> now;
  // Optional, caller-owned: where the run publishes its progress (relaxed stores, no lock): once
  // the agreement passed, the totals of this process's rounds and message bytes and the phase
  // kTransferring; each completed message's bytes and the rounds all of whose messages completed;
  // kVerifying while the chunk digests are checked. The caller sets the other phases (Begin before
  // the agreement, kVoting, End).
  SyncProgress* progress = nullptr;
  // The plan's quantization steps (Plan::quant, whole or this process's own), caller-owned;
  // required when the job has quantized parameters (refused on every process through the
  // agreement otherwise). executor/quant_work.h states how they run, quant_device.h how a CUDA
  // process runs them on its `device`.
  const QuantPlan* quant = nullptr;
  // Simulated quantization (integration/simulation, whose device memory holds nothing): when set,
  // a job with quantized parameters runs with CUDA buffers too, its quantization staging and
  // arena are memory of the process's kind (CUDA: options.device) as its relay arena is, and
  // each quantize step (a sender's before its rounds, a receiver's after them) calls this with
  // the bytes of source-dtype input its kernels would read instead of running them: no element
  // is quantized or written, the messages are those of a real run. It returns once the simulated
  // quantization finished; an error fails the run. Null: the host kernels (host memory only).
  std::function<absl::Status(int64_t input_bytes)> simulated_quantize;
  // Optional, caller-owned: set to true once every process agreed and the run started moving
  // data (left as it was when the agreement failed), so that a caller of several runs in one sync
  // (executor/waves.h) knows whether its peers saw the failure there.
  bool* agreed = nullptr;
  DeltaOptions delta;
};

// What a run did, counted as it ran. For the same inputs every figure equals the schedule's:
// segments, chunks, rounds, sent, received, local-copy, direct, staged and forwarded bytes and
// peak arena bytes (quantization staging and arena included), quantized elements.
struct TransferStats {
  int64_t segments = 0;
  int64_t chunks = 0;
  int64_t rounds = 0;
  int64_t sent_bytes = 0;
  int64_t received_bytes = 0;
  int64_t local_copy_bytes = 0;
  int64_t direct_bytes = 0;
  int64_t staged_bytes = 0;
  int64_t forwarded_bytes = 0;   // Stage 2 of relays, sent.
  int64_t peak_arena_bytes = 0;  // Relay arena included.
  double seconds = 0;            // Wall time of the run, agreement excluded.
  // CPU time of the executing thread spent packing staged sends into arenas and unpacking staged
  // receives from them (thread CPU time, so that other threads sharing the cores do not count).
  double pack_cpu_seconds = 0;
  double unpack_cpu_seconds = 0;
  // Staged sends packed before their round, in one pass with a staged send of another peer whose
  // rows line up with theirs (the sibling column blocks of one row shard; docs/data_path.md).
  int64_t packed_ahead_messages = 0;
  // With ExecuteOptions::verify: received chunks whose digest matched the sender's.
  int64_t verified_chunks = 0;
  // Messages of earlier syncs that arrived for this process and were rejected unread.
  int64_t rejected_messages = 0;
  // Elements quantized to FP8 (whole blocks, sender- and receiver-side steps) and the thread CPU
  // time spent on it.
  int64_t quantized_elements = 0;
  double quantize_cpu_seconds = 0;
  // The quantization staging the run allocated (equals ProcessSchedule::quant_staging_bytes) and
  // the most of it any quantization wrote: the end of the furthest e4m3 or scale region written.
  int64_t quant_staging_bytes = 0;
  int64_t quant_staging_written_bytes = 0;
  // Delta sync: messages that travelled as encodings (sent and received), and the bytes they
  // would have taken dense minus the bytes they took; sent_bytes and received_bytes count what
  // travelled.
  int64_t delta_messages = 0;
  int64_t delta_saved_bytes = 0;
  // delta_saved_bytes by the path class of the peer (PathClassIndex) and direction (0: sent,
  // 1: received): what the path byte metrics take off the planned bytes.
  int64_t delta_saved_by_path[kPathClassCount][2] = {};
  // Delta sync as a sender: elements of the chunks it compared with a base of their receiver's
  // version, and how many of them changed (a chunk sent dense because most of it changed, which
  // the encoder finds by sampling or stops comparing at, counts all its elements as changed);
  // the thread CPU time of encoding and recording its chunks before the rounds. As a receiver:
  // the thread CPU time of patching its targets with the encodings it received.
  int64_t delta_compared_elements = 0;
  int64_t delta_changed_elements = 0;
  // As a sender: the dense bytes of its messages to receivers holding a base (announced: they
  // travelled encoded, or dense where no encoding saved), and the bytes they took. Their ratio
  // over the changed fraction is what an encoding costs per changed element (PredictDeltaSync).
  int64_t delta_announced_sent_bytes = 0;
  int64_t delta_announced_wire_bytes = 0;
  double delta_encode_cpu_seconds = 0;
  double delta_apply_cpu_seconds = 0;
  // The agreed changed fraction the run decided delta=auto's lanes with (nullopt: none observed
  // yet); delta_changed_elements / delta_compared_elements are this process's part of it.
  std::optional<double> delta_changed_fraction;
};

// Agrees with every process of `group` on (plan digest, budget, local status), then runs.
// A local rejection (bad budget, missing buffer, unschedulable segment) or a digest that differs
// fails every process with the reason, before any byte moves. Transport errors and the deadline
// end the run with the error; the target buffers are then partially written and must be treated
// as dirty by the caller.
//
// A thin wrapper over Executor (executor.h; one code path): an Executor over `segments` as the one
// wave options.wave, with options.arenas (or arenas of its own, freed on return), Run once. A
// caller that syncs repeatedly builds an Executor once instead.
absl::StatusOr<TransferStats> ExecuteTransfers(const Job& job, absl::Span<const Segment> segments,
                                               const Endpoints& endpoints,
                                               const StagingBudget& budget, int32_t process,
                                               const LocalBuffers& buffers, Transport& transport,
                                               Group& group, const ExecuteOptions& options);

}  // namespace wsync

#endif  // WSYNC_EXECUTOR_EXECUTE_H_
