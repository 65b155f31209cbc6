#include "executor/delta_base.h"

#include <cstring>

namespace wsync {

std::optional<absl::Span<const uint8_t>> DeltaBaseStore::Base(uint64_t chunk,
                                                              uint64_t version) const {
  const auto it = entries_.find(chunk);
  if (it == entries_.end() || it->second.version != version) return std::nullopt;
  return absl::MakeConstSpan(it->second.bytes);
}

bool DeltaBaseStore::Record(uint64_t chunk, absl::Span<const uint8_t> sent) {
  if (const auto it = entries_.find(chunk);
      it != entries_.end() && it->second.bytes.size() == sent.size()) {
    // The same chunk again, as every sync sends it: overwritten in place (no allocation, no
    // page faults), pending like a new one.
    if (!sent.empty()) std::memcpy(it->second.bytes.data(), sent.data(), sent.size());
    it->second.version.reset();
    return true;
  }
  Forget(chunk);
  const int64_t bytes = static_cast<int64_t>(sent.size());
  if (bytes > budget_bytes_ - held_bytes_) return false;
  Entry& entry = entries_[chunk];
  entry.bytes.assign(sent.begin(), sent.end());
  held_bytes_ += bytes;
  return true;
}

void DeltaBaseStore::Commit(uint64_t version) {
  for (auto& [chunk, entry] : entries_) {
    if (!entry.version.has_value()) entry.version = version;
  }
}

void DeltaBaseStore::Abort() {
  absl::erase_if(entries_, [this](const auto& chunk_entry) {
    const Entry& entry = chunk_entry.second;
    if (entry.version.has_value()) return false;
    held_bytes_ -= static_cast<int64_t>(entry.bytes.size());
    return true;
  });
}

void DeltaBaseStore::Forget(uint64_t chunk) {
  const auto it = entries_.find(chunk);
  if (it == entries_.end()) return;
  held_bytes_ -= static_cast<int64_t>(it->second.bytes.size());
  entries_.erase(it);
}

}  // namespace wsync
