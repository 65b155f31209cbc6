#ifndef WSYNC_COMMON_FAILPOINT_H_
#define WSYNC_COMMON_FAILPOINT_H_

// Named failpoints for fault tests. Enabled only through the environment variable
// WSYNC_FAILPOINTS, read once on the first evaluation of any failpoint:
//
//   WSYNC_FAILPOINTS="send:fail@3,recv:delay=500ms@1,pack:flip@2,alloc:fail@1,control:fail@4"
//
// Each entry is NAME:ACTION[=ARG][@K[+]]: the K-th evaluation (1-based; default 1) of failpoint
// NAME in this process triggers ACTION; "@K+" triggers it on the K-th and every later one.
// Actions:
//   fail          the call site returns an error (Unavailable, naming the failpoint)
//   delay=DUR     the call site sleeps DUR (an absl duration: "500ms", "2s") and goes on
//   flip          Flip() inverts one byte of the data it is given (the middle one)
//   kill          the process sends itself SIGKILL (a crash at a precise point)
//   kill=DUR      the process is SIGKILLed DUR later by a forked helper and runs on until then
//                 (a crash at a random point of what follows)
//   stop=DUR      the process SIGSTOPs itself; a forked helper SIGCONTs it after DUR
//   throw         the evaluation throws std::runtime_error (what a library thread's exception
//                 firewall must catch)
// Failpoints used by wsync: send, recv (the k-th post of a message by the executor), alloc (the
// executor's arena allocation, once per sync), pack (after a staged send message is packed: flip),
// truncate (the k-th send post: fail sends it without the second half of its last chunk),
// control (the k-th control-plane collective frame a client writes), register (the k-th memory
// registration of the UCX transport), sync_thread (the sync_begin thread, at its start),
// sync_step (each sync step of a session, once it is SYNCING),
// background_thread (each step of the trainer-triggered loop), keepalive_thread (each turn of a
// control client's I/O thread, which sends the heartbeats), loss_watch_thread (each turn of
// LossWatch's thread), coordinator_thread (each turn of the coordinator's serving thread).
//
// Cost when disabled: one relaxed atomic load per evaluation. A malformed WSYNC_FAILPOINTS aborts
// the process with a message at the first evaluation (tests must not run with a silently ignored
// fault). Thread-safe.

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace wsync::failpoint {

enum class Action { kNone, kFail, kDelay, kFlip, kKill, kStop, kThrow };

struct Rule {
  Action action = Action::kNone;
  absl::Duration duration;  // delay, stop, kill (zero: at once)
  int64_t hit = 1;          // The K in @K (1-based).
  bool and_later = false;   // @K+
};

namespace internal {
// 0: not read yet, 1: disabled, 2: enabled.
extern std::atomic<int> g_state;
int Init();  // Reads WSYNC_FAILPOINTS once; returns the state.
Action EvaluateSlow(absl::string_view name);
}  // namespace internal

// Parses one WSYNC_FAILPOINTS value into (name, rule) pairs; InvalidArgument naming the bad entry.
absl::Status Parse(absl::string_view spec, std::vector<std::pair<std::string, Rule>>* rules);

// Replaces the configuration (and resets every hit counter), as if WSYNC_FAILPOINTS were `spec`;
// empty: disabled. For unit tests.
absl::Status SetForTesting(absl::string_view spec);

// Whether any failpoint is configured.
inline bool Enabled() {
  int state = internal::g_state.load(std::memory_order_relaxed);
  if (state == 0) state = internal::Init();
  return state == 2;
}

// Counts one evaluation of `name` and returns what it triggers (kNone mostly). Performs kDelay
// (sleeps), kKill, kStop and kThrow itself; returns kFail and kFlip for the call site to act on.
inline Action Evaluate(absl::string_view name) {
  if (internal::g_state.load(std::memory_order_relaxed) == 1) return Action::kNone;
  return internal::EvaluateSlow(name);
}

// OK unless `name` triggers kFail now: Unavailable("failpoint NAME triggered ...").
inline absl::Status Check(absl::string_view name) {
  if (internal::g_state.load(std::memory_order_relaxed) == 1) return absl::OkStatus();
  if (internal::EvaluateSlow(name) != Action::kFail) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("failpoint '", name, "' triggered (WSYNC_FAILPOINTS)"));
}

// Inverts the middle byte of [data, data + bytes) when `name` triggers kFlip now.
inline void Flip(absl::string_view name, void* data, int64_t bytes) {
  if (internal::g_state.load(std::memory_order_relaxed) == 1) return;
  if (internal::EvaluateSlow(name) != Action::kFlip || bytes <= 0) return;
  static_cast<unsigned char*>(data)[bytes / 2] ^= 0xFF;
}

// How many times `name` was evaluated since the configuration was set (0 when disabled).
int64_t Hits(absl::string_view name);

}  // namespace wsync::failpoint

#endif  // WSYNC_COMMON_FAILPOINT_H_
