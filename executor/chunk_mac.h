#ifndef WSYNC_EXECUTOR_CHUNK_MAC_H_
#define WSYNC_EXECUTOR_CHUNK_MAC_H_

// The keyed MAC of keyed verification (verify.h), per chunk of one lane of one sync.
//
// Keys: HKDF-SHA256 of the job's DataKey (common/data_key.h) with info "wsync-lane-mac-v2" ||
// sync id || wave || sender || receiver || lane memory kind (little-endian, fixed widths) gives 64
// bytes:
// a GMAC key and a tag-wrapping key. A chunk's tag is
//   AES-256(wrap key, GMAC(GMAC key, nonce = chunk position in the lane || 0, bytes of the chunk))
// with GMAC = AES-256-GCM over additional data only (the chunk's bytes in row-major order of its
// box). The binding in the key and the position in the nonce make a tag of another sync, another
// wave of a streamed sync (whose waves share the sync id, lanes and positions), another sender or
// receiver, another lane or another position useless; wrapping the GMAC tag with a
// block cipher keeps a repeated sync id (a version synced twice with different bytes) from
// revealing the GHASH key through two tags under one nonce.
//
// Not thread-safe: one LaneMac and its streams are used by one thread.

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/data_key.h"
#include "common/memory_kind.h"

typedef struct evp_cipher_ctx_st EVP_CIPHER_CTX;

namespace wsync::executor_internal {

// A chunk's tag as the hash message carries it (two words of the message).
using MacTag = std::array<uint64_t, 2>;

// What a lane's tags are bound to.
struct MacBinding {
  uint64_t sync_id = 0;
  int32_t sender = 0;
  int32_t receiver = 0;
  MemoryKind kind = MemoryKind::kHost;
  int32_t wave = 0;  // The wave of a streamed sync (executor/waves.h); 0 without waves.
};

class LaneMac;

// The MAC of one chunk, fed its bytes in order. Reusable: Start begins another chunk.
class MacStream {
 public:
  explicit MacStream(LaneMac& lane);
  ~MacStream();
  MacStream(MacStream&& other) noexcept;
  MacStream& operator=(MacStream&&) = delete;
  MacStream(const MacStream&) = delete;
  MacStream& operator=(const MacStream&) = delete;

  // Begins the chunk at `position` of the lane (forgets anything fed before).
  void Start(uint64_t position);
  void Update(const void* data, size_t bytes);
  // The tag of what was fed since Start. Internal when OpenSSL failed at any step.
  absl::StatusOr<MacTag> Finish();

 private:
  LaneMac* lane_;
  EVP_CIPHER_CTX* context_ = nullptr;
  bool broken_ = false;  // No usable context: every Finish fails.
  bool failed_ = false;  // Since the last Start.
};

class LaneMac {
 public:
  // Internal when OpenSSL cannot set up the keys.
  static absl::StatusOr<std::unique_ptr<LaneMac>> Create(const DataKey& key,
                                                         const MacBinding& binding);
  ~LaneMac();
  LaneMac(const LaneMac&) = delete;
  LaneMac& operator=(const LaneMac&) = delete;

  // The tag of `bytes` bytes at `data` as the chunk at `position` (one reused stream).
  absl::StatusOr<MacTag> Of(const void* data, size_t bytes, uint64_t position);
  MacStream& stream() { return stream_.value(); }

 private:
  friend class MacStream;
  LaneMac() = default;
  absl::StatusOr<MacTag> Wrap(const MacTag& gmac);

  EVP_CIPHER_CTX* gmac_ = nullptr;  // Keyed, no nonce: streams copy it.
  EVP_CIPHER_CTX* wrap_ = nullptr;  // AES-256-ECB, no padding.
  std::optional<MacStream> stream_;
};

}  // namespace wsync::executor_internal

#endif  // WSYNC_EXECUTOR_CHUNK_MAC_H_
