#include "integration/fill/fill.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/dtype.h"
#include "common/hash.h"
#include "common/status.h"
#include "integration/fill/elements.h"

namespace wsync::test {

uint64_t ParamKey(absl::string_view name) { return Xxh3(name.data(), name.size(), 0x9a7a); }

uint64_t LogicalValue(uint64_t param_key, int64_t flat_index, uint64_t version) {
  const uint64_t words[3] = {param_key, static_cast<uint64_t>(flat_index), version};
  const uint64_t hash = Xxh3(words, sizeof(words), 0x5eed);
  return (hash & ~uint64_t{1}) | (static_cast<uint64_t>(flat_index) & 1);
}

void StoreValue(uint64_t value, int64_t element_size, unsigned char* out) {
  for (int64_t b = 0; b < element_size; ++b) out[b] = static_cast<unsigned char>(value >> (8 * b));
}

int64_t FlatIndex(const Dims& shape, const Dims& index) {
  int64_t flat = 0;
  for (size_t a = 0; a < shape.size(); ++a) flat = flat * shape[a] + index[a];
  return flat;
}

unsigned char GuardByte(int64_t position) {
  return static_cast<unsigned char>(0x3B + 17 * position);
}

HostBuffers::HostBuffers(const Layout& layout, unsigned char fill) {
  for (const BufferInfo& info : layout.buffers) {
    Storage storage;
    storage.size = info.bytes < 0 ? 0 : info.bytes;
    storage.bytes.assign(static_cast<size_t>(storage.size + 2 * kGuardBytes), fill);
    for (int64_t g = 0; g < kGuardBytes; ++g) {
      storage.bytes[g] = GuardByte(g);
      storage.bytes[kGuardBytes + storage.size + g] = GuardByte(kGuardBytes + g);
    }
    buffers_[BufferKey{info.process, info.id}] = std::move(storage);
  }
}

unsigned char* HostBuffers::data(BufferKey key) {
  auto it = buffers_.find(key);
  return it == buffers_.end() ? nullptr : it->second.bytes.data() + kGuardBytes;
}

const unsigned char* HostBuffers::data(BufferKey key) const {
  auto it = buffers_.find(key);
  return it == buffers_.end() ? nullptr : it->second.bytes.data() + kGuardBytes;
}

int64_t HostBuffers::bytes(BufferKey key) const {
  auto it = buffers_.find(key);
  return it == buffers_.end() ? -1 : it->second.size;
}

std::vector<BufferKey> HostBuffers::keys() const {
  std::vector<BufferKey> keys;
  for (const auto& [key, storage] : buffers_) keys.push_back(key);
  return keys;
}

absl::Status HostBuffers::CheckGuards() const {
  for (const auto& [key, storage] : buffers_) {
    for (int64_t g = 0; g < kGuardBytes; ++g) {
      if (storage.bytes[g] != GuardByte(g)) {
        return absl::DataLossError(absl::StrCat("guard byte ", g - kGuardBytes, " before ",
                                                KeyString("buffer of", key), " was overwritten"));
      }
      if (storage.bytes[kGuardBytes + storage.size + g] != GuardByte(kGuardBytes + g)) {
        return absl::DataLossError(absl::StrCat("guard byte ", storage.size + g, " after ",
                                                KeyString("buffer of", key), " (", storage.size,
                                                " bytes) was overwritten"));
      }
    }
  }
  return absl::OkStatus();
}

namespace {

// Calls fn(element bytes, logical value bytes, size, parameter, buffer, index) for every element
// of every piece of `layout`, with the element's bytes in `buffers` and its logical value of its
// SparseVersion at `version`; fn returns a non-OK status to stop. Fails on an unknown parameter or
// buffer, or an address outside it.
template <typename Buffers, typename Fn>
absl::Status ForEachLogicalElement(const Layout& layout, Buffers& buffers, uint64_t version,
                                   int32_t per_mille, Fn&& fn) {
  for (const Piece& piece : layout.pieces) {
    if (piece.param < 0 || piece.param >= static_cast<int32_t>(layout.params.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("piece names unknown parameter ", piece.param));
    }
    const ParamInfo& param = layout.params[piece.param];
    const int64_t size = DTypeSize(param.dtype);
    const BufferKey key{piece.process, piece.buffer};
    auto* data = buffers.data(key);  // Mutable or const, as `buffers` is.
    if (data == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("piece of ", param.name, " names unknown ", KeyString("buffer of", key)));
    }
    const uint64_t param_key = ParamKey(param.name);
    absl::Status status;
    ForEachIndex(piece.box, [&](const Dims& index) {
      if (!status.ok()) return;
      const int64_t address = ElementAddress(piece.box, piece.offset, piece.strides, index);
      const std::optional<int64_t> byte = ByteOffset(address, size, buffers.bytes(key));
      if (!byte.has_value()) {
        status = absl::OutOfRangeError(absl::StrCat("piece of ", param.name, " index ",
                                                    DimsToString(index), " lies outside ",
                                                    KeyString("buffer of", key)));
        return;
      }
      unsigned char value[8];
      const int64_t flat = FlatIndex(param.shape, index);
      StoreValue(LogicalValue(param_key, flat, SparseVersion(param_key, flat, version, per_mille)),
                 size, value);
      status = fn(data + *byte, value, size, param, key, index);
    });
    WSYNC_RETURN_IF_ERROR(status);
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t SparseVersion(uint64_t param_key, int64_t flat_index, uint64_t version,
                       int32_t per_mille) {
  if (per_mille >= 1000) return version;
  constexpr uint64_t kChangeSalt = 0x9e3779b97f4a7c15ull;  // Not the values' own hash.
  for (uint64_t w = version; w >= 2; --w) {
    if ((LogicalValue(param_key ^ kChangeSalt, flat_index, w) >> 8) % 1000 <
        static_cast<uint64_t>(std::max(per_mille, 0))) {
      return w;
    }
  }
  return 1;
}

absl::Status FillLogical(const Layout& layout, uint64_t version, HostBuffers* buffers) {
  return FillSparseLogical(layout, version, 1000, buffers);
}

absl::Status CheckLogical(const Layout& layout, const HostBuffers& buffers, uint64_t version) {
  return CheckSparseLogical(layout, buffers, version, 1000);
}

absl::Status FillSparseLogical(const Layout& layout, uint64_t version, int32_t per_mille,
                               HostBuffers* buffers) {
  return ForEachLogicalElement(layout, *buffers, version, per_mille,
                               [](unsigned char* element, const unsigned char* value, int64_t size,
                                  const ParamInfo&, const BufferKey&, const Dims&) {
                                 std::memcpy(element, value, size);
                                 return absl::OkStatus();
                               });
}

absl::Status CheckSparseLogical(const Layout& layout, const HostBuffers& buffers, uint64_t version,
                                int32_t per_mille) {
  return ForEachLogicalElement(
      layout, buffers, version, per_mille,
      [version](const unsigned char* element, const unsigned char* value, int64_t size,
                const ParamInfo& param, const BufferKey& key, const Dims& index) {
        if (std::memcmp(element, value, size) == 0) return absl::OkStatus();
        return absl::DataLossError(absl::StrCat(
            "parameter ", param.name, " index ", DimsToString(index), " in ",
            KeyString("buffer of", key), " does not hold its value of version ", version));
      });
}

}  // namespace wsync::test
