#include "common/hash.h"

#include <xxhash.h>

#include <cstring>

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace wsync {

uint64_t Xxh3(const void* data, size_t bytes, uint64_t seed) {
  return XXH3_64bits_withSeed(data, bytes, seed);
}

std::string DigestHex(uint64_t digest) { return absl::StrFormat("%016x", digest); }

CanonicalHasher::CanonicalHasher(uint64_t seed) : state_(XXH3_createState()) {
  XXH3_64bits_reset_withSeed(static_cast<XXH3_state_t*>(state_), seed);
}

CanonicalHasher::~CanonicalHasher() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void CanonicalHasher::AddInt(int64_t value) {
  unsigned char bytes[8];
  uint64_t bits = static_cast<uint64_t>(value);
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<unsigned char>(bits >> (8 * i));
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), bytes, sizeof(bytes));
}

void CanonicalHasher::AddString(absl::string_view value) {
  AddInt(static_cast<int64_t>(value.size()));
  AddBytes(value.data(), value.size());
}

void CanonicalHasher::AddBytes(const void* data, size_t bytes) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, bytes);
}

uint64_t CanonicalHasher::Digest() const {
  return XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_));
}

}  // namespace wsync
