#include "executor/delta_base.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace wsync {
namespace {

constexpr size_t kHugePageBytes = size_t{2} << 20;

// `bytes` bytes (nullptr when the allocation fails); see DeltaBaseStore::Entry.
uint8_t* AllocateBase(size_t bytes) {
  if (bytes >= 2 * kHugePageBytes) {
    const size_t rounded = (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
    if (void* data = std::aligned_alloc(kHugePageBytes, rounded)) {
      madvise(data, rounded, MADV_HUGEPAGE);  // Advice: without huge pages, 4 KiB ones.
      return static_cast<uint8_t*>(data);
    }
  }
  return static_cast<uint8_t*>(std::malloc(std::max<size_t>(bytes, 1)));
}

}  // namespace

void DeltaBaseStore::FreeBytes::operator()(uint8_t* bytes) const { std::free(bytes); }

std::optional<absl::Span<const uint8_t>> DeltaBaseStore::Base(uint64_t chunk,
                                                              uint64_t version) const {
  const auto it = entries_.find(chunk);
  if (it == entries_.end() || it->second.version != version) return std::nullopt;
  return absl::MakeConstSpan(it->second.data.get(), it->second.size);
}

std::optional<absl::Span<uint8_t>> DeltaBaseStore::Advance(uint64_t chunk, uint64_t version) {
  const auto it = entries_.find(chunk);
  if (it == entries_.end() || it->second.version != version) return std::nullopt;
  it->second.version.reset();
  return absl::MakeSpan(it->second.data.get(), it->second.size);
}

bool DeltaBaseStore::Record(uint64_t chunk, absl::Span<const uint8_t> sent) {
  if (const auto it = entries_.find(chunk);
      it != entries_.end() && it->second.size == static_cast<int64_t>(sent.size())) {
    // The same chunk again, as every sync sends it: overwritten in place (no allocation, no
    // page faults), pending like a new one.
    if (!sent.empty()) std::memcpy(it->second.data.get(), sent.data(), sent.size());
    it->second.version.reset();
    return true;
  }
  Forget(chunk);
  const int64_t bytes = static_cast<int64_t>(sent.size());
  if (bytes > budget_bytes_ - held_bytes_) return false;
  uint8_t* const data = AllocateBase(sent.size());
  if (data == nullptr) return false;
  if (!sent.empty()) std::memcpy(data, sent.data(), sent.size());
  Entry& entry = entries_[chunk];
  entry.data.reset(data);
  entry.size = bytes;
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
    held_bytes_ -= entry.size;
    return true;
  });
}

void DeltaBaseStore::Forget(uint64_t chunk) {
  const auto it = entries_.find(chunk);
  if (it == entries_.end()) return;
  held_bytes_ -= it->second.size;
  entries_.erase(it);
}

}  // namespace wsync
