#ifndef WSYNC_CONTROL_FRAME_SEAL_H_
#define WSYNC_CONTROL_FRAME_SEAL_H_

// The per-frame proof of the control channel after the handshake (auth.h describes the channel,
// framing.h the wire layout of a sealed frame).
//
// Each direction of a connection has its own key (channel_keys.h) and counts its frames from 0:
// the sender's k-th frame after the handshake carries
//   tag = HMAC-SHA256(direction key, be64(k) | be64(body length) | SHA-256(body))
// and the receiver recomputes it for the k-th frame it receives. A frame that was forged, altered,
// replayed, reordered, dropped before a later one, or sealed for another connection (another key)
// fails. The body digest is computed once per encoded frame (OutgoingFrame in framing.h), so one
// body broadcast to N connections costs one hash of the body and N HMACs of 48 bytes.
//
// Thread safety: FrameSealer and FrameOpener are used by one thread at a time (their owner's
// writer or reader); the free functions are thread-safe.

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace wsync {

inline constexpr int64_t kFrameTagBytes = 32;  // HMAC-SHA256.
inline constexpr int64_t kFrameDigestBytes = 32;

using FrameDigest = std::array<unsigned char, kFrameDigestBytes>;

// SHA-256 of a frame body.
FrameDigest DigestFrameBody(absl::string_view body);

// The tag of frame `sequence` of a direction keyed `key`, whose body has `body_bytes` bytes and
// the digest `digest`: kFrameTagBytes raw bytes.
std::string FrameTag(absl::string_view key, uint64_t sequence, uint64_t body_bytes,
                     const FrameDigest& digest);

// The sending side of one direction: owns its key (wiped on destruction) and the number of the
// next frame it seals. Not copyable or movable (the key is never copied).
class FrameSealer {
 public:
  explicit FrameSealer(std::string key);
  ~FrameSealer();
  FrameSealer(const FrameSealer&) = delete;
  FrameSealer& operator=(const FrameSealer&) = delete;

  // The tag of the next frame, which is then counted as sent: call it in the order the frames go
  // on the wire.
  std::string Seal(uint64_t body_bytes, const FrameDigest& digest);
  uint64_t next_sequence() const { return next_sequence_; }

 private:
  std::string key_;
  uint64_t next_sequence_ = 0;
};

// The receiving side of one direction: owns its key (wiped on destruction), the number of the
// next frame it expects, and the name of the peer for its errors.
class FrameOpener {
 public:
  FrameOpener(std::string key, std::string peer);
  ~FrameOpener();
  FrameOpener(const FrameOpener&) = delete;
  FrameOpener& operator=(const FrameOpener&) = delete;

  // OK when `tag` is the tag of frame next_sequence() with this `body` (compared in constant
  // time); the frame is then counted as received. Otherwise Unauthenticated: "control frame N from
  // <peer> failed authentication: forged, replayed or reordered", and nothing is counted.
  absl::Status Open(absl::string_view body, absl::string_view tag);
  // The same error for a frame too short to carry a tag.
  absl::Status Refuse() const;
  uint64_t next_sequence() const { return next_sequence_; }

 private:
  std::string key_;
  std::string peer_;
  uint64_t next_sequence_ = 0;
};

}  // namespace wsync

#endif  // WSYNC_CONTROL_FRAME_SEAL_H_
