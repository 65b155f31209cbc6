#ifndef WSYNC_CONTROL_PROTOCOL_H_
#define WSYNC_CONTROL_PROTOCOL_H_

// Vocabulary shared by the coordinator and its clients: roles, limits, process descriptions and
// the mapping of absl::Status to and from the wire. Pure functions; thread-safe.

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "control/control.pb.h"

namespace wsync {

// 2: the Welcome's MAC covers every field the client acts on (auth.h, WelcomeFields), so a client
// and a coordinator of version 1 refuse each other by version, not as an authentication failure.
// 3: every frame after the handshake is sealed (framing.h, frame_seal.h); a peer of version 2 is
// refused by version (the coordinator's Reject, the client's "did not send a challenge of
// protocol version 3").
inline constexpr uint32_t kControlProtocolVersion = 3;
// Bytes of a challenge nonce, of a client nonce, and of an HMAC-SHA256 tag.
inline constexpr int kNonceBytes = 32;
inline constexpr int kMacBytes = 32;
// Job ids, node ids and the coordinator id: 1..kMaxIdBytes printable ASCII bytes, no spaces.
inline constexpr int64_t kMaxIdBytes = 256;
// Processes of one job (trainers + rollouts); MessageTag keeps 16 bits of the sender.
inline constexpr int32_t kMaxControlProcesses = 65536;
// A Decide reason or failure text; longer ones are cut by the sender and refused by the receiver.
inline constexpr int64_t kMaxReasonBytes = 4096;

// Same numeric values as wsync::Role (planner/layout.h), which the control plane does not include.
enum class ControlRole : uint8_t { kTrainer = 1, kRollout = 2 };

// "trainer", "rollout", or "invalid".
absl::string_view ControlRoleName(ControlRole role);
control::Role RoleToProto(ControlRole role);
// The role of a wire value; nullopt for anything but ROLE_TRAINER and ROLE_ROLLOUT.
std::optional<ControlRole> RoleFromProto(int value);

// OK when `value` has 1..kMaxIdBytes bytes, each printable ASCII other than space. The error names
// `what` but never echoes the value, which may come from an unauthenticated peer.
absl::Status CheckIdentifier(absl::string_view what, absl::string_view value);

// "process 3 (rollout rank 1, node gpu-7)". Used in every error that names a process.
std::string DescribeProcess(int32_t process, ControlRole role, int32_t rank,
                            absl::string_view node_id);

// Global process id of (role, rank) in a job of `num_trainers` trainers: trainers first, as in
// planner/job.h.
inline int32_t GlobalProcessId(ControlRole role, int32_t rank, int32_t num_trainers) {
  return role == ControlRole::kTrainer ? rank : num_trainers + rank;
}

// "AllGather", "Broadcast", "Barrier", "Decide" for control::CollectiveKind values; else
// "unknown collective".
absl::string_view CollectiveName(int kind);

// A status from its wire form. Codes outside absl::StatusCode become kUnknown; an OK code with a
// message stays OK (the message is dropped).
absl::Status StatusFromWire(int32_t code, absl::string_view message);

// `text` cut to at most `max_bytes` bytes; a cut text ends with "...".
std::string TruncateText(absl::string_view text, int64_t max_bytes);

}  // namespace wsync

#endif  // WSYNC_CONTROL_PROTOCOL_H_
