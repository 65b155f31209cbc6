#ifndef WSYNC_CONTROL_AUTH_H_
#define WSYNC_CONTROL_AUTH_H_

// Secrets and the HMAC-SHA256 proofs of the control-plane handshake.
//
// The job secret comes from a file or an environment variable (LoadSecret); it is never logged,
// never put in an error message and never passed on a command line. Errors here name the file or
// the variable, never its contents. Functions are thread-safe.
//
// Handshake proofs (each input field is length-prefixed, so no two field lists encode alike):
//   Hello:   HMAC(secret, "wsync-control-hello-v1" | nonce | client_nonce | job_id | role | rank |
//            node_id), proving the client holds the secret; the coordinator's fresh nonce makes a
//            Hello captured on one connection useless on another.
//   Welcome: HMAC(secret, "wsync-control-welcome-v2" | client_nonce | nonce | job_id | process |
//            num_trainers | num_rollouts | max_frame_bytes | heartbeat_interval_ms |
//            silence_limit_ms), proving to the client that the coordinator holds it too and that
//            every Welcome field the client acts on is the coordinator's (WelcomeFields).
//   StatusRequest: HMAC(secret, "wsync-control-status-v1" | nonce | client_nonce | job_id).
//   JobStatus:     HMAC(secret, "wsync-control-status-reply-v1" | client_nonce | nonce | body).
// After the handshake (protocol version 3) every frame of a coordinator<->client connection, in
// both directions, is sealed: HKDF-SHA256 derives one key per direction from the secret and both
// nonces (channel_keys.h), and each frame carries an HMAC over its sequence number, length and
// body digest (frame_seal.h; wire layout in framing.h). A forged, altered, replayed, reordered or
// dropped frame, or one spliced in from another connection, is refused (Unauthenticated) before
// its body is parsed, and the connection ends. Control frames are authenticated and ordered, not
// confidential: they carry layouts, transport addresses, counts and small payloads, never the
// weights, and an on-path observer can read them. The one-shot `wsync status` exchange keeps its
// own MACs above (one request, one reply).

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "control/protocol.h"

namespace wsync {

// Secrets shorter than this are refused: an HMAC over a captured nonce would be open to guessing.
// 32 bytes: the key material of HMAC-SHA256's full strength (e.g. 32 random bytes, or their 64
// hex digits or 44 base64 characters; a passphrase must be at least as long, no KDF stretches it).
inline constexpr int64_t kMinSecretBytes = 32;
inline constexpr int64_t kMaxSecretBytes = 4096;

struct SecretSource {
  enum class Kind { kFile, kEnvironment, kValue };
  Kind kind = Kind::kFile;
  std::string name;   // A file path or an environment variable name (kValue: empty).
  std::string value;  // kValue: the secret itself. Its holder wipes it (WipeSecret) once loaded.

  static SecretSource File(std::string path) { return {Kind::kFile, std::move(path), ""}; }
  static SecretSource Environment(std::string variable) {
    return {Kind::kEnvironment, std::move(variable), ""};
  }
  static SecretSource Value(std::string secret) { return {Kind::kValue, "", std::move(secret)}; }
};

// Reads the secret. A file must be a regular file (symlinks are followed, as in mounted secrets),
// owned by the effective user, without any group or other permission bits (mode 0600, 0400 or
// stricter): otherwise PermissionDenied naming the path and its mode. Trailing "\n" or "\r\n" is
// removed (not from a kValue). An environment variable is removed from the environment once read
// (unsetenv, under a lock that every read here takes), so that the processes the host starts
// later do not inherit the secret; a second read of it finds nothing. NotFound for a missing file
// or unset variable; InvalidArgument for a secret shorter than kMinSecretBytes or longer than
// kMaxSecretBytes.
absl::StatusOr<std::string> LoadSecret(const SecretSource& source);

// OK when the length of `secret` is within [kMinSecretBytes, kMaxSecretBytes].
absl::Status CheckSecret(absl::string_view secret);

// HMAC-SHA256 of `message` under `key`: kMacBytes raw bytes.
std::string HmacSha256(absl::string_view key, absl::string_view message);

// Cryptographically random bytes (RAND_bytes). Internal on failure of the generator.
absl::StatusOr<std::string> RandomBytes(int64_t count);

// Equality of two byte strings in time independent of their contents (CRYPTO_memcmp); strings of
// different lengths are unequal.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

std::string HelloMac(absl::string_view secret, absl::string_view nonce,
                     absl::string_view client_nonce, absl::string_view job_id, ControlRole role,
                     int32_t rank, absl::string_view node_id);

// `wsync status` (control.proto: StatusRequest, JobStatus).
std::string StatusRequestMac(absl::string_view secret, absl::string_view nonce,
                             absl::string_view client_nonce, absl::string_view job_id);
std::string StatusReplyMac(absl::string_view secret, absl::string_view client_nonce,
                           absl::string_view nonce, absl::string_view body);

// Every field of a Welcome the client acts on; its MAC covers them all, so that none can be
// changed on the way without the client refusing the Welcome.
struct WelcomeFields {
  int32_t process = 0;
  int32_t num_trainers = 0;
  int32_t num_rollouts = 0;
  int64_t max_frame_bytes = 0;
  int64_t heartbeat_interval_ms = 0;
  int64_t silence_limit_ms = 0;
};

std::string WelcomeMac(absl::string_view secret, absl::string_view client_nonce,
                       absl::string_view nonce, absl::string_view job_id,
                       const WelcomeFields& fields);

// The fields of a Welcome frame, as its MAC covers them.
inline WelcomeFields WelcomeFieldsOf(const control::Welcome& welcome) {
  return WelcomeFields{
      welcome.process(),         welcome.num_trainers(),          welcome.num_rollouts(),
      welcome.max_frame_bytes(), welcome.heartbeat_interval_ms(), welcome.silence_limit_ms()};
}

// Overwrites `text` with zeros (OPENSSL_cleanse) and clears it. For copies of the secret.
void WipeSecret(std::string& text);

// MAC and key-derivation input encoding: `value` as 4 big-endian bytes; a field as its 4-byte
// length followed by its bytes, so that no two field sequences encode alike.
void AppendU32(std::string& out, uint32_t value);
void AppendField(std::string& out, absl::string_view field);

}  // namespace wsync

#endif  // WSYNC_CONTROL_AUTH_H_
