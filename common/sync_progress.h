#ifndef WSYNC_COMMON_SYNC_PROGRESS_H_
#define WSYNC_COMMON_SYNC_PROGRESS_H_

// Where one process stands in its current sync, for people and for its coordinator (the control
// client sends a snapshot with every heartbeat; `wsync status` shows it). Written by the thread
// that runs the sync (the session or a test worker, and the executor through
// ExecuteOptions::progress), read by any thread: every field is a relaxed atomic, so the data path
// never takes a lock and a reader may see fields of two neighbouring moments (e.g. bytes of the
// next message before its round), never a torn value. Not a synchronization point.

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "absl/strings/string_view.h"

namespace wsync {

// Values travel on the wire (control.proto: SyncPhase); never renumber.
enum class SyncPhase : int32_t {
  kIdle = 0,          // No sync in progress (before the first, or after a decision).
  kAgreeing = 1,      // The trigger and the pre-transfer agreement (digest, budget).
  kTransferring = 2,  // Rounds of messages with the peers, and local copies.
  kVerifying = 3,     // Exchanging and checking chunk digests (ExecuteOptions::verify).
  kVoting = 4,        // The commit decision.
};

inline constexpr int32_t kSyncPhaseCount = 5;

// "idle", "agreeing", "transferring", "verifying", "voting"; "unknown" for other values.
inline absl::string_view SyncPhaseName(int32_t phase) {
  switch (phase) {
    case static_cast<int32_t>(SyncPhase::kIdle):
      return "idle";
    case static_cast<int32_t>(SyncPhase::kAgreeing):
      return "agreeing";
    case static_cast<int32_t>(SyncPhase::kTransferring):
      return "transferring";
    case static_cast<int32_t>(SyncPhase::kVerifying):
      return "verifying";
    case static_cast<int32_t>(SyncPhase::kVoting):
      return "voting";
  }
  return "unknown";
}

// One reading of SyncProgress.
struct SyncProgressSnapshot {
  int64_t version = -1;  // The version of the current or last sync; -1 before the first.
  SyncPhase phase = SyncPhase::kIdle;
  // Rounds of this process's messages that completed (every message of those rounds, in both
  // directions) of the rounds it has; bytes of its messages, sent and received, completed of all.
  int64_t rounds_done = 0;
  int64_t rounds_total = 0;
  int64_t bytes_done = 0;
  int64_t bytes_total = 0;
  int64_t committed_version = -1;  // The last version whose decision committed; -1: none yet.
};

class SyncProgress {
 public:
  // A sync of `version` starts: agreeing, nothing done or known yet.
  void Begin(int64_t version) {
    Store(version_, version);
    Store(rounds_done_, 0);
    Store(rounds_total_, 0);
    Store(bytes_done_, 0);
    Store(bytes_total_, 0);
    SetPhase(SyncPhase::kAgreeing);
  }
  void SetPhase(SyncPhase phase) { Store(phase_, static_cast<int32_t>(phase)); }
  void SetTotals(int64_t rounds, int64_t bytes) {
    Store(rounds_total_, rounds);
    Store(bytes_total_, bytes);
  }
  void SetDone(int64_t rounds, int64_t bytes) {
    Store(rounds_done_, rounds);
    Store(bytes_done_, bytes);
  }
  // The decision of the current sync came back: idle, and its version committed when `committed`.
  void End(bool committed) {
    if (committed) Store(committed_version_, version_.load(std::memory_order_relaxed));
    SetPhase(SyncPhase::kIdle);
  }

  SyncProgressSnapshot Read() const {
    SyncProgressSnapshot s;
    s.version = version_.load(std::memory_order_relaxed);
    s.phase = static_cast<SyncPhase>(phase_.load(std::memory_order_relaxed));
    s.rounds_done = rounds_done_.load(std::memory_order_relaxed);
    s.rounds_total = rounds_total_.load(std::memory_order_relaxed);
    s.bytes_done = bytes_done_.load(std::memory_order_relaxed);
    s.bytes_total = bytes_total_.load(std::memory_order_relaxed);
    s.committed_version = committed_version_.load(std::memory_order_relaxed);
    return s;
  }

 private:
  template <typename T>
  static void Store(std::atomic<T>& field, std::type_identity_t<T> value) {
    field.store(value, std::memory_order_relaxed);
  }

  std::atomic<int64_t> version_{-1};
  std::atomic<int32_t> phase_{0};
  std::atomic<int64_t> rounds_done_{0};
  std::atomic<int64_t> rounds_total_{0};
  std::atomic<int64_t> bytes_done_{0};
  std::atomic<int64_t> bytes_total_{0};
  std::atomic<int64_t> committed_version_{-1};
};

}  // namespace wsync

#endif  // WSYNC_COMMON_SYNC_PROGRESS_H_
