#include "control/channel_keys.h"

#include <memory>
#include <utility>

#include "common/data_key.h"
#include "control/auth.h"

namespace wsync {
namespace {

constexpr char kClientToCoordinator[] = "wsync-control-channel-v3 client->coordinator";
constexpr char kCoordinatorToClient[] = "wsync-control-channel-v3 coordinator->client";

}  // namespace

ChannelKeys::~ChannelKeys() {
  WipeSecret(client_to_coordinator);
  WipeSecret(coordinator_to_client);
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
      HkdfSha256(secret, salt, info(kClientToCoordinator), static_cast<size_t>(kChannelKeyBytes));
  if (!up.ok()) return up.status();
  keys.client_to_coordinator = *std::move(up);
  absl::StatusOr<std::string> down =
      HkdfSha256(secret, salt, info(kCoordinatorToClient), static_cast<size_t>(kChannelKeyBytes));
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
