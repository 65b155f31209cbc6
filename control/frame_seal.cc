#include "control/frame_seal.h"

#include <openssl/evp.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "control/auth.h"

namespace wsync {
namespace {

void AppendU64(std::string& out, uint64_t value) {
  for (int shift = 56; shift >= 0; shift -= 8) out.push_back(static_cast<char>(value >> shift));
}

// False when OpenSSL fails (no memory for its context).
bool TryDigest(absl::string_view body, FrameDigest& digest) {
  unsigned int length = 0;
  return EVP_Digest(body.data(), body.size(), digest.data(), &length, EVP_sha256(), nullptr) == 1 &&
         length == digest.size();
}

}  // namespace

FrameDigest DigestFrameBody(absl::string_view body) {
  FrameDigest digest{};
  // On failure the sender's tag is over a zero digest, which the receiver (failing closed, see
  // Open) refuses.
  if (!TryDigest(body, digest)) digest.fill(0);
  return digest;
}

std::string FrameTag(absl::string_view key, uint64_t sequence, uint64_t body_bytes,
                     const FrameDigest& digest) {
  std::string message;
  message.reserve(16 + digest.size());
  AppendU64(message, sequence);
  AppendU64(message, body_bytes);
  message.append(reinterpret_cast<const char*>(digest.data()), digest.size());
  return HmacSha256(key, message);
}

FrameSealer::FrameSealer(std::string key) : key_(std::move(key)) {}

FrameSealer::~FrameSealer() { WipeSecret(key_); }

std::string FrameSealer::Seal(uint64_t body_bytes, const FrameDigest& digest) {
  return FrameTag(key_, next_sequence_++, body_bytes, digest);
}

FrameOpener::FrameOpener(std::string key, std::string peer)
    : key_(std::move(key)), peer_(std::move(peer)) {}

FrameOpener::~FrameOpener() { WipeSecret(key_); }

absl::Status FrameOpener::Open(absl::string_view body, absl::string_view tag) {
  FrameDigest digest{};
  if (!TryDigest(body, digest)) return Refuse();  // Fails closed.
  const std::string expected = FrameTag(key_, next_sequence_, body.size(), digest);
  if (expected.size() != static_cast<size_t>(kFrameTagBytes) ||
      !ConstantTimeEquals(expected, tag)) {
    return Refuse();
  }
  ++next_sequence_;
  return absl::OkStatus();
}

absl::Status FrameOpener::Refuse() const {
  return absl::UnauthenticatedError(absl::StrCat("control frame ", next_sequence_, " from ", peer_,
                                                 " failed authentication: forged, replayed or "
                                                 "reordered"));
}

}  // namespace wsync
