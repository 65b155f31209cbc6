// A sender's bases for delta sync (issue 44): per chunk, the bytes it last sent and the version
// that sync committed, in host memory within a byte budget.
//
// Correct by construction: a base is handed out only for the exact version its receiver holds
// (the receiver's base, agreed before the sync; none for a rollout that is dirty, new, replaced,
// rebound or was in an aborted sync), so a delta is never applied to other bytes than those it
// was computed against. What a sync records stays pending until that sync commits: `Abort`
// forgets it (the bytes may have reached some receivers and not others, which are dirty), `Commit`
// makes it the base of the committed version. A chunk that does not fit the budget holds no base
// and goes dense, every sync, until bytes are freed.
//
// Not thread-safe: one sync at a time, on one thread.
#ifndef WSYNC_EXECUTOR_DELTA_BASE_H_
#define WSYNC_EXECUTOR_DELTA_BASE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"

namespace wsync {

// The session's delta setting (wsync_config_t.delta). kAuto chooses per path class from the
// cost model (plugin/prediction.h DeltaPaysBelow, executor/execute.h DeltaOptions::automatic).
enum class DeltaMode : int { kOff = 0, kAuto = 1, kOn = 2 };

class DeltaBaseStore {
 public:
  explicit DeltaBaseStore(int64_t budget_bytes) : budget_bytes_(budget_bytes) {}

  // The bytes last sent for `chunk` when the sync that sent them committed `version` (the
  // version its receiver holds); nullopt otherwise: that chunk goes dense. Valid until the next
  // Record, Commit, Abort or Forget.
  std::optional<absl::Span<const uint8_t>> Base(uint64_t chunk, uint64_t version) const;

  // The committed base of `chunk` for `version`, as Base finds it, writable: this sync overwrites
  // it in place with what it sends (AppendDeltaAdvancingBase, delta_codec.h), so it becomes
  // pending as after Record, with no copy and no allocation. nullopt as Base (and nothing changes):
  // Record what is sent instead.
  std::optional<absl::Span<uint8_t>> Advance(uint64_t chunk, uint64_t version);

  // Keeps `sent` (what this sync sends for `chunk`) as the chunk's pending base, replacing its
  // committed one (the receiver's old base is patched by this sync or the receiver is dirty).
  // False, with no base kept for the chunk, when it does not fit the budget.
  bool Record(uint64_t chunk, absl::Span<const uint8_t> sent);

  // The sync committed `version`: every pending base becomes the base of `version`.
  void Commit(uint64_t version);
  // The sync aborted: every pending base is dropped (its bytes freed).
  void Abort();
  // Drops the chunk's base, committed or pending.
  void Forget(uint64_t chunk);

  int64_t held_bytes() const { return held_bytes_; }
  int64_t budget_bytes() const { return budget_bytes_; }

 private:
  struct FreeBytes {
    void operator()(uint8_t* bytes) const;
  };
  // A chunk's bytes: of 4 MiB or more 2 MiB-aligned and advised into transparent huge pages, so
  // that a first sync's Record faults its memory in 2 MiB pages rather than 4 KiB ones (the
  // allocation rounded up to 2 MiB, beyond what the budget counts).
  struct Entry {
    std::unique_ptr<uint8_t, FreeBytes> data;
    int64_t size = 0;
    std::optional<uint64_t> version;  // nullopt while pending.
  };

  int64_t budget_bytes_;
  int64_t held_bytes_ = 0;
  absl::flat_hash_map<uint64_t, Entry> entries_;
};

}  // namespace wsync

#endif  // WSYNC_EXECUTOR_DELTA_BASE_H_
