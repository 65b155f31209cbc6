#ifndef WSYNC_PLANNER_RELAY_H_
#define WSYNC_PLANNER_RELAY_H_

// The relay pass: crossing the node boundary once for bytes that several processes of one node
// need. Runs inside MakePlan after replica selection and coalescing, on the segments of every
// process. Pure and deterministic; thread-compatible.
//
// A relay group is the set of inter-node segments that write the same (parameter, box) into
// processes of one target node; it is a candidate when at least two distinct processes of the
// node receive it. For each candidate, largest first (ties by node, parameter, box):
// - the stage-1 sender is the group's sender with the fewest inter-node bytes left to send so far
//   (ties to the lowest process id); any holder of the box holds the same bytes;
// - the relay is the target process of the node that would forward the fewest bytes in total
//   after taking the group (a receiver forwards to the other k-1, another process to all k);
//   ties to a receiver, then the lowest id. A process that does not receive the box can only relay
//   it when the box fits in what is left of its relay arena (RelayOptions::arena_bytes);
// - stage 1 is one segment sender -> relay: into the relay's own target buffer when the relay
//   receives the box (its own segment, re-sourced), else into the relay arena (buffer
//   kRelayArenaBuffer, row-major packed, 64-byte aligned offsets);
// - stage 2 is one segment relay -> each other receiver, reading exactly the stage-1 destination
//   (same parameter and box; `from` equals the stage-1 segment's `to`).
// A receiver that needs the box twice (two buffers) keeps its second segment direct.
//
// Decision per group (RelayMode::kAuto): with link fits, relay when Predict (link_model) prices
// the group alone relayed (the stage-1 pair, then the stage-2 pairs: a forward leaves only once
// its first hop landed, so the two hops' predictions add up) below the group alone direct (its
// pairs, one round; the busiest resource binds). Without fits, or when
// the fits lack a path the group uses, the bytes rule: relay when the box is at least
// RelayOptions::min_relay_bytes (an extra hop is not worth its latency for small regions; every
// relayed byte saves (k-1) inter-node copies).

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cost/link_model.h"
#include "planner/geometry.h"
#include "planner/layout.h"  // kRelayArenaBuffer

namespace wsync {

enum class RelayMode : uint8_t { kNever = 0, kAlways = 1, kAuto = 2 };

absl::string_view RelayModeName(RelayMode mode);  // "never", "always", "auto"
// InvalidArgument for anything but the three names.
absl::StatusOr<RelayMode> ParseRelayMode(absl::string_view name);

inline constexpr int64_t kRelayArenaAlignment = 64;
inline constexpr int64_t kDefaultRelayArenaBytes = int64_t{64} << 20;
inline constexpr int64_t kDefaultMinRelayBytes = int64_t{64} << 10;

struct RelayOptions {
  RelayMode mode = RelayMode::kAuto;
  // Calibrated links for the auto decision; null: the bytes rule.
  std::shared_ptr<const LinkFits> fits;
  int64_t min_relay_bytes = kDefaultMinRelayBytes;
  // Relay arena bytes each process may hold (the executor counts them against its staging
  // memory and refuses an arena larger than the staging budget).
  int64_t arena_bytes = kDefaultRelayArenaBytes;
};

// One relayed region.
struct Relay {
  int32_t param = 0;  // Target parameter.
  Box box;
  int32_t node = 0;                // Job::NodeIndex of the target node.
  int32_t sender = 0;              // Stage-1 sender (a trainer process).
  int32_t relay = 0;               // Target process that receives stage 1 and forwards stage 2.
  std::vector<int32_t> receivers;  // Stage-2 receivers, ascending; the relay is not among them.
  bool in_arena = false;           // Stage 1 lands in the relay arena, not in a target buffer.
  int64_t arena_offset_bytes = 0;  // When in_arena.
  int64_t bytes = 0;               // Bytes of the box.
  // The cost model's seconds for the group alone, direct and relayed; 0 when it was not consulted.
  double predicted_direct_seconds = 0;
  double predicted_relay_seconds = 0;

  friend bool operator==(const Relay&, const Relay&) = default;
};

}  // namespace wsync

#endif  // WSYNC_PLANNER_RELAY_H_
