#include "integration/fill/quant_check.h"

#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/dtype.h"
#include "common/status.h"
#include "integration/fill/fp8_reference.h"
#include "planner/geometry.h"
#include "planner/quant_layout.h"

namespace wsync::test {
namespace {

// The index of `box` at row-major position `flat` of its first `axes` axes (the other axes at
// their origin).
Dims IndexAt(const Box& box, int64_t flat, int axes) {
  Dims index = box.origin;
  for (int a = axes - 1; a >= 0; --a) {
    index[a] += flat % box.extent[a];
    flat /= box.extent[a];
  }
  return index;
}

// Calls f(index) for the first element of every row of `box` (rank >= 1; the last axis at its
// origin), in row-major order; nothing for an empty box.
template <typename F>
void ForEachRow(const Box& box, F&& f) {
  if (Volume(box) == 0) return;
  const int last = box.rank() - 1;
  const int64_t rows = Volume(box) / box.extent[last];
  for (int64_t r = 0; r < rows; ++r) f(IndexAt(box, r, last));
}

// Element address of `index` in a piece: offset + sum_a (index[a] - origin[a]) * strides[a].
int64_t Address(const Piece& piece, const Dims& index) {
  int64_t address = piece.offset;
  for (int a = 0; a < piece.box.rank(); ++a) {
    address += (index[a] - piece.box.origin[a]) * piece.strides[a];
  }
  return address;
}

// Row-major position of `index` in `box`.
int64_t PositionIn(const Box& box, const Dims& index) {
  int64_t position = 0;
  for (int a = 0; a < box.rank(); ++a)
    position = position * box.extent[a] + index[a] - box.origin[a];
  return position;
}

std::string IndexText(const Dims& index) {
  std::string text = "(";
  for (size_t a = 0; a < index.size(); ++a) absl::StrAppend(&text, a ? ", " : "", index[a]);
  return text + ")";
}

// Byte sizes of the buffers of `layout`, by key.
std::map<BufferKey, int64_t> BufferSizes(const Layout& layout) {
  std::map<BufferKey, int64_t> sizes;
  for (const BufferInfo& b : layout.buffers) sizes[BufferKey{b.process, b.id}] = b.bytes;
  return sizes;
}

absl::Status OutsideBuffer(const std::string& what, BufferKey key, int64_t byte, int64_t size) {
  return absl::InvalidArgumentError(absl::StrCat(what, ": byte ", byte, " of buffer ", key.buffer,
                                                 " of process ", key.process, " (", size,
                                                 " bytes) is outside it"));
}

// The source values of the whole-block box `whole` of source parameter `param`, row-major, from
// the trainers' pattern of `version`. FailedPrecondition for an element held by none or several.
absl::StatusOr<std::vector<double>> SourceValues(const Layout& source, int32_t param,
                                                 const Box& whole, uint64_t version) {
  const ParamInfo& info = source.params[param];
  if (info.dtype != DType::kBFloat16 && info.dtype != DType::kFloat32) {
    return absl::FailedPreconditionError(
        absl::StrCat("parameter ", info.name, ": the trainers' dtype is neither bf16 nor fp32"));
  }
  const int size = static_cast<int>(DTypeSize(info.dtype));
  const std::map<BufferKey, int64_t> sizes = BufferSizes(source);
  std::vector<double> values(Volume(whole));
  std::vector<uint8_t> holders(values.size(), 0);
  const int last = whole.rank() - 1;
  for (const Piece& piece : source.pieces) {
    if (piece.param != param) continue;
    const std::optional<Box> common = Intersect(piece.box, whole);
    if (!common.has_value()) continue;
    const BufferKey key{piece.process, piece.buffer};
    const auto buffer = sizes.find(key);
    if (buffer == sizes.end()) {
      return absl::InvalidArgumentError(absl::StrCat("a piece of ", info.name,
                                                     " names unknown buffer ", key.buffer,
                                                     " of process ", key.process));
    }
    const PatternView pattern(version, key);
    absl::Status status;
    ForEachRow(*common, [&](const Dims& row) {
      if (!status.ok()) return;
      const int64_t address = Address(piece, row);
      const int64_t position = PositionIn(whole, row);
      for (int64_t c = 0; c < common->extent[last]; ++c) {
        const int64_t byte = (address + c * piece.strides[last]) * size;
        if (byte < 0 || byte + size > buffer->second) {
          status = OutsideBuffer(absl::StrCat("a piece of ", info.name), key, byte, buffer->second);
          return;
        }
        const uint64_t bits = pattern.Bytes(byte, size);
        if (holders[position + c]++ > 0) {
          Dims index = row;
          index[last] += c;
          status = absl::FailedPreconditionError(absl::StrCat(
              "parameter ", info.name, ": element ", IndexText(index),
              " is held by several trainer pieces, whose pattern bytes differ; the check needs "
              "one holder per element"));
          return;
        }
        if (size == 2) {
          values[position + c] = wsync::testing::Bf16Value(static_cast<uint16_t>(bits));
        } else {
          float value;
          const uint32_t word = static_cast<uint32_t>(bits);
          std::memcpy(&value, &word, sizeof value);
          values[position + c] = value;
        }
      }
    });
    WSYNC_RETURN_IF_ERROR(status);
  }
  for (size_t i = 0; i < holders.size(); ++i) {
    if (holders[i] == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("parameter ", info.name, ": element ", i, " of the whole-block box ",
                       BoxToString(whole), " is held by no trainer piece"));
    }
  }
  return values;
}

// Compares the e4m3 bytes of `piece`'s box with `expected` (row-major over `whole`).
absl::Status CompareFp8(const ParamInfo& info, const Piece& piece, const Box& whole,
                        const std::vector<uint8_t>& expected, const HostBuffers& buffers) {
  const BufferKey key{piece.process, piece.buffer};
  const unsigned char* data = buffers.data(key);
  const int64_t bytes = buffers.bytes(key);
  if (data == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("a piece of ", info.name, " names unknown buffer ", key.buffer));
  }
  const int last = piece.box.rank() - 1;
  absl::Status status;
  ForEachRow(piece.box, [&](const Dims& row) {
    if (!status.ok()) return;
    const int64_t address = Address(piece, row);
    const int64_t position = PositionIn(whole, row);
    for (int64_t c = 0; c < piece.box.extent[last]; ++c) {
      const int64_t byte = address + c * piece.strides[last];
      if (byte < 0 || byte >= bytes) {
        status = OutsideBuffer(absl::StrCat("a piece of ", info.name), key, byte, bytes);
        return;
      }
      if (data[byte] != expected[position + c]) {
        Dims index = row;
        index[last] += c;
        status = absl::DataLossError(absl::StrFormat(
            "parameter %s: e4m3 byte of element %s is 0x%02x, the reference quantizer's 0x%02x",
            info.name, IndexText(index), data[byte], expected[position + c]));
        return;
      }
    }
  });
  return status;
}

// Compares the scales of `scale_box` (of parameter `scale_param` of `part`) with `expected`
// (row-major over scale_box), each read from the piece of `part` holding it.
absl::Status CompareScales(const Layout& part, int32_t scale_param, const Box& scale_box,
                           const std::vector<float>& expected, const HostBuffers& buffers) {
  const ParamInfo& info = part.params[scale_param];
  for (int64_t i = 0; i < Volume(scale_box); ++i) {
    const Box at{IndexAt(scale_box, i, scale_box.rank()), Dims(scale_box.rank(), 1)};
    const Piece* holder = nullptr;
    for (const Piece& piece : part.pieces) {
      if (piece.param == scale_param && Contains(piece.box, at)) holder = &piece;
    }
    if (holder == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "parameter ", info.name, ": scale ", IndexText(at.origin), " is in no piece here"));
    }
    const BufferKey key{holder->process, holder->buffer};
    const unsigned char* data = buffers.data(key);
    const int64_t byte = Address(*holder, at.origin) * 4;
    if (data == nullptr || byte < 0 || byte + 4 > buffers.bytes(key)) {
      return OutsideBuffer(absl::StrCat("a piece of ", info.name), key, byte, buffers.bytes(key));
    }
    uint32_t got, want;
    std::memcpy(&got, data + byte, 4);
    std::memcpy(&want, &expected[i], 4);
    if (got != want) {
      float value;
      std::memcpy(&value, &got, 4);
      return absl::DataLossError(absl::StrFormat(
          "parameter %s: scale %s is %a (0x%08x), the reference quantizer's %a (0x%08x)", info.name,
          IndexText(at.origin), value, got, expected[i], want));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int64_t> CheckQuantizedPattern(const Layout& source, const Layout& part,
                                              const HostBuffers& buffers, uint64_t version) {
  const QuantLinks links = LinkQuantParams(part);
  std::map<std::string, int32_t> source_params;
  for (size_t p = 0; p < source.params.size(); ++p) {
    source_params[source.params[p].name] = static_cast<int32_t>(p);
  }
  int64_t checked = 0;
  for (const Piece& piece : part.pieces) {
    if (piece.param < 0 || piece.param >= static_cast<int32_t>(part.params.size())) {
      return absl::InvalidArgumentError(absl::StrCat("piece names parameter ", piece.param));
    }
    const ParamInfo& info = part.params[piece.param];
    if (!info.quant.quantized()) continue;
    const auto from = source_params.find(info.name);
    if (from == source_params.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", info.name, " is not in the trainer layout"));
    }
    const int rank = static_cast<int>(info.shape.size());
    const Dims blocks = QuantBlockDims(info.quant, rank);
    const Box whole = WholeBlockBox(blocks, info.shape, piece.box);
    WSYNC_ASSIGN_OR_RETURN(const std::vector<double> values,
                           SourceValues(source, from->second, whole, version));
    const int64_t experts = rank == 3 ? whole.extent[0] : 1;
    WSYNC_ASSIGN_OR_RETURN(const wsync::testing::ReferenceFp8 reference,
                           wsync::testing::ReferenceQuantizeFp8(
                               values, experts, whole.extent[rank - 2], whole.extent[rank - 1],
                               blocks[rank - 2], blocks[rank - 1], info.name));
    WSYNC_RETURN_IF_ERROR(CompareFp8(info, piece, whole, reference.fp8, buffers));
    WSYNC_RETURN_IF_ERROR(CompareScales(part, links.scale_of[piece.param],
                                        ScaleBox(blocks, info.shape, whole), reference.scales,
                                        buffers));
    checked += Volume(piece.box);
  }
  return checked;
}

}  // namespace wsync::test
