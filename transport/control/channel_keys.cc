#include "transport/control/channel_keys.h"

#include <openssl/core_names.h>
#include <openssl/kdf.h>
#include <openssl/params.h>

#include <memory>
#include <utility>

#include "transport/control/auth.h"

namespace wsync {
namespace {

constexpr char kClientToCoordinator[] = "wsync-control-channel-v3 client->coordinator";
constexpr char kCoordinatorToClient[] = "wsync-control-channel-v3 coordinator->client";

void AppendU32(std::string& out, uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(value >> shift));
}

void AppendField(std::string& out, absl::string_view field) {
  AppendU32(out, static_cast<uint32_t>(field.size()));
  out.append(field.data(), field.size());
}

struct KdfDeleter {
  void operator()(EVP_KDF* kdf) const { EVP_KDF_free(kdf); }
  void operator()(EVP_KDF_CTX* context) const { EVP_KDF_CTX_free(context); }
};

// OSSL_PARAM wants non-const pointers; OpenSSL only reads them.
void* Bytes(absl::string_view text) { return const_cast<char*>(text.data()); }

}  // namespace

ChannelKeys::~ChannelKeys() {
  WipeSecret(client_to_coordinator);
  WipeSecret(coordinator_to_client);
}

absl::StatusOr<std::string> HkdfSha256(absl::string_view key_material, absl::string_view salt,
                                       absl::string_view info, int64_t length) {
  if (length <= 0 || length > 255 * 32) {
    return absl::InvalidArgumentError("control: HKDF-SHA256 output length out of range");
  }
  std::unique_ptr<EVP_KDF, KdfDeleter> kdf(EVP_KDF_fetch(nullptr, OSSL_KDF_NAME_HKDF, nullptr));
  std::unique_ptr<EVP_KDF_CTX, KdfDeleter> context(kdf != nullptr ? EVP_KDF_CTX_new(kdf.get())
                                                                  : nullptr);
  if (context == nullptr) return absl::InternalError("control: OpenSSL has no HKDF");
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, Bytes(key_material),
                                        key_material.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, Bytes(salt), salt.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, Bytes(info), info.size()),
      OSSL_PARAM_construct_end(),
  };
  std::string out(static_cast<size_t>(length), '\0');
  if (EVP_KDF_derive(context.get(), reinterpret_cast<unsigned char*>(out.data()), out.size(),
                     params) != 1) {
    WipeSecret(out);
    return absl::InternalError("control: HKDF-SHA256 failed");
  }
  return out;
}

absl::StatusOr<ChannelKeys> DeriveChannelKeys(absl::string_view secret, absl::string_view nonce,
                                              absl::string_view client_nonce,
                                              absl::string_view job_id, int32_t process) {
  std::string salt;
  AppendField(salt, nonce);
  AppendField(salt, client_nonce);
  auto info = [&](absl::string_view label) {
    std::string out;
    AppendField(out, label);
    AppendField(out, job_id);
    AppendU32(out, static_cast<uint32_t>(process));
    return out;
  };
  ChannelKeys keys;
  absl::StatusOr<std::string> up =
      HkdfSha256(secret, salt, info(kClientToCoordinator), kChannelKeyBytes);
  if (!up.ok()) return up.status();
  keys.client_to_coordinator = *std::move(up);
  absl::StatusOr<std::string> down =
      HkdfSha256(secret, salt, info(kCoordinatorToClient), kChannelKeyBytes);
  if (!down.ok()) return down.status();
  keys.coordinator_to_client = *std::move(down);
  return keys;
}

absl::Status SealChannel(ChannelSide side, absl::string_view secret, absl::string_view nonce,
                         absl::string_view client_nonce, absl::string_view job_id, int32_t process,
                         std::string peer, FrameReader& reader, FrameWriter& writer) {
  absl::StatusOr<ChannelKeys> keys =
      DeriveChannelKeys(secret, nonce, client_nonce, job_id, process);
  if (!keys.ok()) return keys.status();
  const bool client = side == ChannelSide::kClient;
  std::string& send = client ? keys->client_to_coordinator : keys->coordinator_to_client;
  std::string& receive = client ? keys->coordinator_to_client : keys->client_to_coordinator;
  writer.Seal(std::make_unique<FrameSealer>(std::move(send)));
  reader.Open(std::make_unique<FrameOpener>(std::move(receive), std::move(peer)));
  return absl::OkStatus();
}

}  // namespace wsync
