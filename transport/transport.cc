#include "transport/transport.h"

namespace wsync {

MessageTag MakeTag(uint64_t sync_id, int64_t round, int32_t sender) {
  const uint64_t sync_bits = sync_id & 0xffffffu;
  const uint64_t round_bits = static_cast<uint64_t>(round) & 0xffffffu;
  const uint64_t sender_bits = static_cast<uint32_t>(sender) & 0xffffu;
  return MessageTag{(sync_bits << 40) | (round_bits << 16) | sender_bits};
}

bool IsStaleTag(MessageTag tag, uint64_t sync_id) {
  const uint64_t behind = ((sync_id & 0xffffffu) - (tag.value >> 40)) & 0xffffffu;
  return behind >= 1 && behind <= kStaleSyncWindow;
}

}  // namespace wsync
