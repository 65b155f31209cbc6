#include "integration/host/fast_values.h"

#include <cstdint>
#include <cstring>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/status.h"
#include "planner/geometry.h"

namespace wsync::host {

namespace {

inline uint64_t FastLogicalValue(uint64_t param_key, int64_t flat_index, uint64_t version) {
  const uint64_t words[3] = {param_key, static_cast<uint64_t>(flat_index), version};
  const uint64_t hash = XXH3_64bits_withSeed(words, sizeof(words), 0x5eed);
  return (hash & ~uint64_t{1}) | (static_cast<uint64_t>(flat_index) & 1);
}

}  // namespace

absl::Status CheckFastValues() {
  for (const int64_t index : {int64_t{0}, int64_t{1}, int64_t{12345}, int64_t{1} << 40}) {
    for (const uint64_t version : {uint64_t{1}, uint64_t{7}}) {
      const uint64_t key = test::ParamKey("model.layers.0.mlp.up_proj.weight");
      if (FastLogicalValue(key, index, version) != test::LogicalValue(key, index, version)) {
        return absl::InternalError("the fast logical values differ from LogicalValue");
      }
    }
  }
  return absl::OkStatus();
}

namespace {

// Walks every element of every piece of `part`: fn(element bytes in `memory`, its logical value of
// `version`, element size) returns false on a mismatch, which ends the walk with a DataLoss error
// naming the parameter, index and buffer. Fails first when a piece lies outside its buffer.
template <typename Memory, typename Fn>
absl::Status ForEachElement(const Layout& part, Memory& memory, uint64_t version, Fn&& fn) {
  for (const Piece& piece : part.pieces) {
    const ParamInfo& param = part.params[piece.param];
    const int64_t size = DTypeSize(param.dtype);
    const test::BufferKey key{piece.process, piece.buffer};
    auto* data = memory.data(key);
    const int64_t buffer_bytes = memory.bytes(key);
    if (data == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("piece of ", param.name, " names unknown buffer ", piece.buffer));
    }
    const Box& box = piece.box;
    const int rank = box.rank();
    bool empty = false;
    int64_t lowest = piece.offset, highest = piece.offset;
    for (int a = 0; a < rank; ++a) {
      if (box.extent[a] <= 0) empty = true;
      const int64_t span = (box.extent[a] - 1) * piece.strides[a];
      (span < 0 ? lowest : highest) += span;
    }
    if (empty) continue;
    if (lowest < 0 || (highest + 1) * size > buffer_bytes) {
      return absl::OutOfRangeError(absl::StrCat("piece of ", param.name, " at ",
                                                DimsToString(box.origin), " lies outside buffer ",
                                                piece.buffer));
    }
    const uint64_t param_key = test::ParamKey(param.name);
    // Rows along the last axis (a rank-0 parameter is one row of one element).
    const int64_t row_length = rank == 0 ? 1 : box.extent[rank - 1];
    const int64_t row_stride = rank == 0 ? 0 : piece.strides[rank - 1];
    Dims index = box.origin;
    while (true) {
      int64_t address = piece.offset;
      for (int a = 0; a < rank; ++a) address += (index[a] - box.origin[a]) * piece.strides[a];
      const int64_t flat = test::FlatIndex(param.shape, index);
      auto* element = data + address * size;
      for (int64_t j = 0; j < row_length; ++j, element += row_stride * size) {
        if (!fn(element, FastLogicalValue(param_key, flat + j, version), size)) {
          Dims at = index;
          if (rank > 0) at[rank - 1] += j;
          return absl::DataLossError(absl::StrCat("parameter ", param.name, " index ",
                                                  DimsToString(at), " in buffer ", piece.buffer,
                                                  " does not hold its value of version ", version));
        }
      }
      int a = rank - 2;  // Next row: the odometer over every axis but the last.
      for (; a >= 0; --a) {
        if (++index[a] < box.origin[a] + box.extent[a]) break;
        index[a] = box.origin[a];
      }
      if (a < 0) break;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status FillLogicalFast(const Layout& part, uint64_t version, test::HostBuffers& memory) {
  return ForEachElement(part, memory, version,
                        [](unsigned char* element, uint64_t value, int64_t size) {
                          if (size == 2) {
                            element[0] = static_cast<unsigned char>(value);
                            element[1] = static_cast<unsigned char>(value >> 8);
                          } else {
                            test::StoreValue(value, size, element);
                          }
                          return true;
                        });
}

absl::Status CheckLogicalFast(const Layout& part, uint64_t version,
                              const test::HostBuffers& memory) {
  WSYNC_RETURN_IF_ERROR(ForEachElement(
      part, memory, version, [](const unsigned char* element, uint64_t value, int64_t size) {
        if (size == 2) {
          return element[0] == static_cast<unsigned char>(value) &&
                 element[1] == static_cast<unsigned char>(value >> 8);
        }
        unsigned char expected[8];
        test::StoreValue(value, size, expected);
        return std::memcmp(element, expected, size) == 0;
      }));
  return memory.CheckGuards();
}

void CorruptFirstElements(const Layout& part, test::HostBuffers& memory) {
  for (const Piece& piece : part.pieces) {
    if (Volume(piece.box) == 0) continue;
    unsigned char* data = memory.data({piece.process, piece.buffer});
    data[piece.offset * DTypeSize(part.params[piece.param].dtype)] ^= 1;
  }
}

}  // namespace wsync::host
