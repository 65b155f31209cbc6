#ifndef WSYNC_COMMON_DATA_KEY_H_
#define WSYNC_COMMON_DATA_KEY_H_

// The job-wide key of keyed verification (executor/verify.h): derived once from the job secret at
// connect, so that the secret itself need not be kept, and wiped when its holder is destroyed.
//
// DeriveDataKey = HKDF-SHA256 (RFC 5869) with the secret as input key material, no salt, and
// info = "wsync-data-mac-v1" || 0x00 || job id. Every process of a job derives the same key; a
// process with another secret or of another job derives an unrelated one.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace wsync {

// 32 bytes of key material. Copies are independent; every copy is wiped (OPENSSL_cleanse) when it
// is destroyed or assigned over. Not thread-safe for writes; const use from any thread.
class DataKey {
 public:
  static constexpr size_t kBytes = 32;

  DataKey() { bytes_.fill(0); }
  // Copies kBytes bytes from `bytes`.
  explicit DataKey(const uint8_t* bytes);
  DataKey(const DataKey& other) = default;
  DataKey& operator=(const DataKey& other);
  ~DataKey();

  absl::Span<const uint8_t> bytes() const { return bytes_; }

 private:
  std::array<uint8_t, kBytes> bytes_;
};

// HKDF-SHA256 of RFC 5869 (extract then expand): `length` bytes, 1..8160. InvalidArgument for a
// length out of range; Internal when OpenSSL fails.
absl::StatusOr<std::string> HkdfSha256(absl::string_view key_material, absl::string_view salt,
                                       absl::string_view info, size_t length);

// The job's data key (see above). InvalidArgument for an empty secret or job id.
absl::StatusOr<DataKey> DeriveDataKey(absl::string_view secret, absl::string_view job_id);

}  // namespace wsync

#endif  // WSYNC_COMMON_DATA_KEY_H_
