#include "common/data_key.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>

#include <algorithm>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace wsync {
namespace {

constexpr absl::string_view kDataKeyLabel = "wsync-data-mac-v1";

struct PkeyContextDeleter {
  void operator()(EVP_PKEY_CTX* context) const { EVP_PKEY_CTX_free(context); }
};

// OpenSSL takes lengths as int.
bool FitsInt(absl::string_view bytes) { return bytes.size() <= (size_t{1} << 30); }

const unsigned char* Unsigned(absl::string_view bytes) {
  return reinterpret_cast<const unsigned char*>(bytes.data());
}

}  // namespace

DataKey::DataKey(const uint8_t* bytes) { std::copy(bytes, bytes + kBytes, bytes_.begin()); }

DataKey& DataKey::operator=(const DataKey& other) {
  if (this != &other) bytes_ = other.bytes_;
  return *this;
}

DataKey::~DataKey() { OPENSSL_cleanse(bytes_.data(), bytes_.size()); }

absl::StatusOr<std::string> HkdfSha256(absl::string_view key_material, absl::string_view salt,
                                       absl::string_view info, size_t length) {
  if (length == 0 || length > 255 * 32) {
    return absl::InvalidArgumentError(
        absl::StrCat("HKDF-SHA256: cannot derive ", length, " bytes (1 to 8160)"));
  }
  if (!FitsInt(key_material) || !FitsInt(salt) || !FitsInt(info)) {
    return absl::InvalidArgumentError("HKDF-SHA256: input too long");
  }
  std::unique_ptr<EVP_PKEY_CTX, PkeyContextDeleter> context(
      EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr));
  std::string out(length, '\0');
  size_t out_length = length;
  // An empty salt is RFC 5869's default (HashLen zero bytes); OpenSSL wants it left unset.
  const bool ok =
      context != nullptr && EVP_PKEY_derive_init(context.get()) == 1 &&
      EVP_PKEY_CTX_set_hkdf_md(context.get(), EVP_sha256()) == 1 &&
      (salt.empty() || EVP_PKEY_CTX_set1_hkdf_salt(context.get(), Unsigned(salt),
                                                   static_cast<int>(salt.size())) == 1) &&
      EVP_PKEY_CTX_set1_hkdf_key(context.get(), Unsigned(key_material),
                                 static_cast<int>(key_material.size())) == 1 &&
      (info.empty() || EVP_PKEY_CTX_add1_hkdf_info(context.get(), Unsigned(info),
                                                   static_cast<int>(info.size())) == 1) &&
      EVP_PKEY_derive(context.get(), reinterpret_cast<unsigned char*>(out.data()), &out_length) ==
          1 &&
      out_length == length;
  if (!ok) {
    OPENSSL_cleanse(out.data(), out.size());
    return absl::InternalError("HKDF-SHA256: OpenSSL failed");
  }
  return out;
}

absl::StatusOr<DataKey> DeriveDataKey(absl::string_view secret, absl::string_view job_id) {
  if (secret.empty()) return absl::InvalidArgumentError("data key: empty secret");
  if (job_id.empty()) return absl::InvalidArgumentError("data key: empty job id");
  std::string info = absl::StrCat(kDataKeyLabel, absl::string_view("\0", 1), job_id);
  absl::StatusOr<std::string> derived = HkdfSha256(secret, "", info, DataKey::kBytes);
  if (!derived.ok()) return derived.status();
  DataKey key(reinterpret_cast<const uint8_t*>(derived->data()));
  OPENSSL_cleanse(derived->data(), derived->size());
  return key;
}

}  // namespace wsync
