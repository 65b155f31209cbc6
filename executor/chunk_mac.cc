#include "executor/chunk_mac.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace wsync::executor_internal {
namespace {

constexpr absl::string_view kLaneKeyLabel = "wsync-lane-mac-v2";
constexpr size_t kKeyBytes = 32;
constexpr size_t kNonceBytes = 12;
constexpr size_t kTagBytes = 16;
// OpenSSL takes additional data lengths as int: longer runs are fed in parts.
constexpr size_t kMaxUpdateBytes = size_t{1} << 30;

void AppendLittleEndian(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

MacTag TagOf(const unsigned char* bytes) {
  MacTag tag;
  std::memcpy(tag.data(), bytes, kTagBytes);
  return tag;
}

}  // namespace

MacStream::MacStream(LaneMac& lane) : lane_(&lane), context_(EVP_CIPHER_CTX_new()) {
  broken_ = context_ == nullptr || EVP_CIPHER_CTX_copy(context_, lane.gmac_) != 1;
  failed_ = broken_;
}

MacStream::MacStream(MacStream&& other) noexcept
    : lane_(other.lane_),
      context_(std::exchange(other.context_, nullptr)),
      broken_(std::exchange(other.broken_, true)),
      failed_(std::exchange(other.failed_, true)) {}

MacStream::~MacStream() { EVP_CIPHER_CTX_free(context_); }

void MacStream::Start(uint64_t position) {
  if (broken_) return;
  unsigned char nonce[kNonceBytes] = {};
  for (int i = 0; i < 8; ++i) nonce[i] = static_cast<unsigned char>((position >> (8 * i)) & 0xff);
  failed_ = EVP_EncryptInit_ex(context_, nullptr, nullptr, nullptr, nonce) != 1;
}

void MacStream::Update(const void* data, size_t bytes) {
  const auto* at = static_cast<const unsigned char*>(data);
  while (bytes > 0 && !failed_) {
    const size_t part = std::min(bytes, kMaxUpdateBytes);
    int unused = 0;
    failed_ = EVP_EncryptUpdate(context_, nullptr, &unused, at, static_cast<int>(part)) != 1;
    at += part;
    bytes -= part;
  }
}

absl::StatusOr<MacTag> MacStream::Finish() {
  unsigned char tag[kTagBytes];
  int unused = 0;
  if (failed_ || EVP_EncryptFinal_ex(context_, tag, &unused) != 1 ||
      EVP_CIPHER_CTX_ctrl(context_, EVP_CTRL_GCM_GET_TAG, kTagBytes, tag) != 1) {
    failed_ = true;
    return absl::InternalError("verify: OpenSSL failed to compute a chunk MAC");
  }
  return lane_->Wrap(TagOf(tag));
}

absl::StatusOr<std::unique_ptr<LaneMac>> LaneMac::Create(const DataKey& key,
                                                         const MacBinding& binding) {
  std::string info(kLaneKeyLabel);
  AppendLittleEndian(info, binding.sync_id, 8);
  AppendLittleEndian(info, static_cast<uint32_t>(binding.wave), 4);
  AppendLittleEndian(info, static_cast<uint32_t>(binding.sender), 4);
  AppendLittleEndian(info, static_cast<uint32_t>(binding.receiver), 4);
  AppendLittleEndian(info, static_cast<uint8_t>(binding.kind), 4);
  const absl::string_view key_material(reinterpret_cast<const char*>(key.bytes().data()),
                                       key.bytes().size());
  WSYNC_ASSIGN_OR_RETURN(std::string keys, HkdfSha256(key_material, "", info, 2 * kKeyBytes));
  const auto* gmac_key = reinterpret_cast<const unsigned char*>(keys.data());
  const unsigned char* wrap_key = gmac_key + kKeyBytes;
  std::unique_ptr<LaneMac> mac(new LaneMac());
  mac->gmac_ = EVP_CIPHER_CTX_new();
  mac->wrap_ = EVP_CIPHER_CTX_new();
  const bool ok =
      mac->gmac_ != nullptr && mac->wrap_ != nullptr &&
      EVP_EncryptInit_ex(mac->gmac_, EVP_aes_256_gcm(), nullptr, nullptr, nullptr) == 1 &&
      EVP_CIPHER_CTX_ctrl(mac->gmac_, EVP_CTRL_GCM_SET_IVLEN, kNonceBytes, nullptr) == 1 &&
      EVP_EncryptInit_ex(mac->gmac_, nullptr, nullptr, gmac_key, nullptr) == 1 &&
      EVP_EncryptInit_ex(mac->wrap_, EVP_aes_256_ecb(), nullptr, wrap_key, nullptr) == 1 &&
      EVP_CIPHER_CTX_set_padding(mac->wrap_, 0) == 1;
  OPENSSL_cleanse(keys.data(), keys.size());
  if (!ok) return absl::InternalError("verify: OpenSSL failed to set up the chunk MAC keys");
  mac->stream_.emplace(*mac);
  return mac;
}

LaneMac::~LaneMac() {
  stream_.reset();
  EVP_CIPHER_CTX_free(gmac_);  // Cleanses the key schedules.
  EVP_CIPHER_CTX_free(wrap_);
}

absl::StatusOr<MacTag> LaneMac::Of(const void* data, size_t bytes, uint64_t position) {
  MacStream& stream = *stream_;
  stream.Start(position);
  stream.Update(data, bytes);
  return stream.Finish();
}

absl::StatusOr<MacTag> LaneMac::Wrap(const MacTag& gmac) {
  unsigned char in[kTagBytes];
  unsigned char out[kTagBytes];
  std::memcpy(in, gmac.data(), kTagBytes);
  int written = 0;
  if (EVP_EncryptUpdate(wrap_, out, &written, in, kTagBytes) != 1 || written != kTagBytes) {
    return absl::InternalError("verify: OpenSSL failed to wrap a chunk MAC");
  }
  return TagOf(out);
}

}  // namespace wsync::executor_internal
