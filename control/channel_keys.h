#ifndef WSYNC_CONTROL_CHANNEL_KEYS_H_
#define WSYNC_CONTROL_CHANNEL_KEYS_H_

// The keys of one coordinator<->client connection after its handshake (auth.h describes the
// channel, frame_seal.h the tags they key).
//
// KDF: HKDF-SHA256 (RFC 5869; common/data_key.h HkdfSha256, tested there) with
//   IKM  = the job secret
//   salt = len | coordinator nonce | len | client nonce   (the handshake's two fresh nonces)
//   info = len | label | len | job id | be32(process)
// and one label per direction ("wsync-control-channel-v3 client->coordinator" and
// "... coordinator->client"), 32 bytes each. Fresh nonces make every connection's keys new, so a
// frame sealed on one connection (or in one direction) fails on any other. Keys are wiped when
// their owners (ChannelKeys, FrameSealer, FrameOpener) are destroyed. Functions are thread-safe.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "control/framing.h"

namespace wsync {

inline constexpr int64_t kChannelKeyBytes = 32;

// One key per direction. Move-only; wiped on destruction.
struct ChannelKeys {
  ChannelKeys() = default;
  ChannelKeys(ChannelKeys&&) = default;
  ChannelKeys& operator=(ChannelKeys&&) = default;
  ~ChannelKeys();

  std::string client_to_coordinator;
  std::string coordinator_to_client;
};

// The keys of the connection whose handshake used `nonce` (the coordinator's Challenge) and
// `client_nonce` (the Hello) for `process` of `job_id`. Internal when the KDF fails.
absl::StatusOr<ChannelKeys> DeriveChannelKeys(absl::string_view secret, absl::string_view nonce,
                                              absl::string_view client_nonce,
                                              absl::string_view job_id, int32_t process);

enum class ChannelSide { kClient, kCoordinator };

// Derives the connection's keys and makes `writer` seal every frame queued from now on and
// `reader` open every frame whose header it has not read yet, as `side` of the connection; `peer`
// names the other end in authentication errors ("the coordinator 10.0.0.1:7000", "process 3
// (rollout rank 1, node n)"). Call right after the Welcome was sent (coordinator) or accepted
// (client). Internal when the KDF fails (reader and writer are then unchanged).
absl::Status SealChannel(ChannelSide side, absl::string_view secret, absl::string_view nonce,
                         absl::string_view client_nonce, absl::string_view job_id, int32_t process,
                         std::string peer, FrameReader& reader, FrameWriter& writer);

}  // namespace wsync

#endif  // WSYNC_CONTROL_CHANNEL_KEYS_H_
