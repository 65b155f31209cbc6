#include "tests/testing/reference.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/dtype.h"
#include "common/status.h"
#include "integration/fill/elements.h"
#include "planner/relay.h"

namespace wsync::test {
namespace {

std::string HexBytes(const unsigned char* bytes, int64_t size) {
  std::string text = "0x";
  // Most significant byte first (values are stored little-endian).
  for (int64_t b = size - 1; b >= 0; --b) absl::StrAppendFormat(&text, "%02x", bytes[b]);
  return text;
}

}  // namespace

WriteCounts::WriteCounts(const Layout& layout) {
  for (const BufferInfo& info : layout.buffers) {
    counts_[BufferKey{info.process, info.id}].assign(info.bytes < 0 ? 0 : info.bytes, 0);
  }
}

std::vector<uint32_t>* WriteCounts::counts(BufferKey key) {
  auto it = counts_.find(key);
  return it == counts_.end() ? nullptr : &it->second;
}

const std::vector<uint32_t>* WriteCounts::counts(BufferKey key) const {
  auto it = counts_.find(key);
  return it == counts_.end() ? nullptr : &it->second;
}

absl::Status ExecutePlanReference(const Job& job, absl::Span<const Segment> segments,
                                  const HostBuffers& source, HostBuffers* target,
                                  WriteCounts* write_counts) {
  const int32_t num_source = static_cast<int32_t>(job.source().processes.size());
  const int32_t num_target = static_cast<int32_t>(job.target().processes.size());
  // Relay arenas by target process, as large as the furthest byte any segment writes there.
  std::map<int32_t, std::vector<unsigned char>> arenas;
  for (const Segment& segment : segments) {
    if (segment.to.buffer != kRelayArenaBuffer || segment.param < 0 ||
        segment.param >= static_cast<int32_t>(job.target().params.size())) {
      continue;
    }
    const int64_t size = DTypeSize(job.target().params[segment.param].dtype);
    int64_t last = segment.to.offset;
    for (int a = 0; a < segment.box.rank() && a < static_cast<int>(segment.to.strides.size());
         ++a) {
      last += (segment.box.extent[a] - 1) * std::max<int64_t>(segment.to.strides[a], 0);
    }
    std::vector<unsigned char>& arena = arenas[segment.to.process];
    arena.resize(std::max<int64_t>(static_cast<int64_t>(arena.size()), (last + 1) * size), kPoison);
  }
  // Forwards (segments from a target process) run after every segment from a source process.
  for (const bool forwards : {false, true}) {
    for (size_t s = 0; s < segments.size(); ++s) {
      const Segment& segment = segments[s];
      const bool from_target = segment.from.process >= num_source;
      if (from_target != forwards) continue;
      const std::string where = absl::StrCat("segment ", s, " (param ", segment.param, " box ",
                                             BoxToString(segment.box), ")");
      if (segment.param < 0 || segment.param >= static_cast<int32_t>(job.target().params.size())) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": unknown parameter"));
      }
      const ParamInfo& param = job.target().params[segment.param];
      const int64_t size = DTypeSize(param.dtype);
      const int rank = segment.box.rank();
      if (segment.box.origin.size() != segment.box.extent.size() ||
          static_cast<int>(param.shape.size()) != rank ||
          static_cast<int>(segment.from.strides.size()) != rank ||
          static_cast<int>(segment.to.strides.size()) != rank) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, " of ", param.name, ": rank mismatch"));
      }
      if (segment.from.process < 0 || segment.from.process >= num_source + num_target) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": sender ", segment.from.process, " is not a process"));
      }
      if (segment.to.process < num_source || segment.to.process >= num_source + num_target) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": receiver ", segment.to.process, " is not a target process"));
      }
      // One end: readable (and, but for a source buffer, writable) memory, its size in bytes, the
      // write counters of a target buffer, a description.
      struct Side {
        const unsigned char* data = nullptr;
        unsigned char* writable = nullptr;
        int64_t bytes = -1;
        std::vector<uint32_t>* counts = nullptr;
        std::string name;
      };
      auto side = [&](const Endpoint& end, bool writing) {
        Side out;
        if (end.buffer == kRelayArenaBuffer && end.process >= num_source) {
          auto it = arenas.find(end.process);
          if (it != arenas.end()) {
            out.data = out.writable = it->second.data();
            out.bytes = static_cast<int64_t>(it->second.size());
          }
          out.name = absl::StrCat("relay arena of process ", end.process);
          return out;
        }
        if (end.process < num_source) {
          const BufferKey key{end.process, end.buffer};
          out.data = source.data(key);
          out.bytes = source.bytes(key);
          out.name = KeyString("source", key);
        } else {
          const BufferKey key{end.process - num_source, end.buffer};
          out.data = out.writable = target->data(key);
          out.bytes = target->bytes(key);
          if (writing) out.counts = write_counts->counts(key);
          out.name = KeyString("target", key);
        }
        return out;
      };
      const Side from = side(segment.from, false);
      const Side to = side(segment.to, true);
      const bool to_arena = segment.to.buffer == kRelayArenaBuffer;
      if (from.data == nullptr || to.writable == nullptr || (!to_arena && to.counts == nullptr)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": unknown ", from.name, " or ", to.name));
      }
      // Check every address first so that a refused segment copies nothing.
      std::vector<std::pair<int64_t, int64_t>> moves;  // (source byte, target byte)
      absl::Status status;
      ForEachIndex(segment.box, [&](const Dims& index) {
        if (!status.ok()) return;
        const int64_t from_address =
            ElementAddress(segment.box, segment.from.offset, segment.from.strides, index);
        const int64_t to_address =
            ElementAddress(segment.box, segment.to.offset, segment.to.strides, index);
        const std::optional<int64_t> from_byte = ByteOffset(from_address, size, from.bytes);
        const std::optional<int64_t> to_byte = ByteOffset(to_address, size, to.bytes);
        if (!from_byte.has_value() || !to_byte.has_value()) {
          status = absl::OutOfRangeError(
              absl::StrCat(where, " of ", param.name, " index ", DimsToString(index), ": element ",
                           from_byte.has_value() ? to_address : from_address, " lies outside ",
                           from_byte.has_value() ? to.name : from.name));
          return;
        }
        moves.emplace_back(*from_byte, *to_byte);
      });
      WSYNC_RETURN_IF_ERROR(status);
      for (const auto& [from_byte, to_byte] : moves) {
        std::memmove(to.writable + to_byte, from.data + from_byte, size);
        if (to.counts == nullptr) continue;
        for (int64_t b = 0; b < size; ++b) ++(*to.counts)[to_byte + b];
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckTargets(const Layout& target, const HostBuffers& target_buffers,
                          const WriteCounts& write_counts, uint64_t version,
                          std::optional<int32_t> only_process) {
  WSYNC_RETURN_IF_ERROR(target_buffers.CheckGuards());
  // Bytes that a checked piece covers, per buffer.
  std::map<BufferKey, std::vector<bool>> covered;
  for (const BufferKey& key : target_buffers.keys()) {
    covered[key].assign(target_buffers.bytes(key), false);
  }
  for (const Piece& piece : target.pieces) {
    if (only_process.has_value() && piece.process != *only_process) continue;
    if (piece.param < 0 || piece.param >= static_cast<int32_t>(target.params.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("piece names unknown parameter ", piece.param));
    }
    const ParamInfo& param = target.params[piece.param];
    const int64_t size = DTypeSize(param.dtype);
    const BufferKey key{piece.process, piece.buffer};
    const unsigned char* data = target_buffers.data(key);
    const std::vector<uint32_t>* counts = write_counts.counts(key);
    if (data == nullptr || counts == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("piece of ", param.name, " names unknown ", KeyString("target", key)));
    }
    std::vector<bool>& mask = covered[key];
    const uint64_t param_key = ParamKey(param.name);
    absl::Status status;
    ForEachIndex(piece.box, [&](const Dims& index) {
      if (!status.ok()) return;
      const std::string where = absl::StrCat(param.name, " index ", DimsToString(index), " in ",
                                             KeyString("target", key));
      const int64_t address = ElementAddress(piece.box, piece.offset, piece.strides, index);
      const std::optional<int64_t> byte = ByteOffset(address, size, target_buffers.bytes(key));
      if (!byte.has_value()) {
        status = absl::InvalidArgumentError(absl::StrCat(where, ": outside the buffer"));
        return;
      }
      for (int64_t b = 0; b < size; ++b) {
        const uint32_t count = (*counts)[*byte + b];
        if (count != 1) {
          status = absl::DataLossError(absl::StrCat(where, " (element ", address, ") byte ", b,
                                                    " was written ", count, " times"));
          return;
        }
        mask[*byte + b] = true;
      }
      unsigned char expected[8];
      StoreValue(LogicalValue(param_key, FlatIndex(param.shape, index), version), size, expected);
      if (std::memcmp(expected, data + *byte, size) != 0) {
        status = absl::DataLossError(absl::StrCat(where, " (element ", address, ") holds ",
                                                  HexBytes(data + *byte, size), ", expected ",
                                                  HexBytes(expected, size)));
      }
    });
    WSYNC_RETURN_IF_ERROR(status);
  }
  for (const auto& [key, mask] : covered) {
    const unsigned char* data = target_buffers.data(key);
    const std::vector<uint32_t>* counts = write_counts.counts(key);
    for (size_t b = 0; b < mask.size(); ++b) {
      if (mask[b]) continue;
      const uint32_t count = counts == nullptr || b >= counts->size() ? 0 : (*counts)[b];
      if (count != 0 || data[b] != kPoison) {
        return absl::DataLossError(
            absl::StrCat("byte ", b, " of ", KeyString("target", key),
                         ", which no checked target piece covers, was written ", count,
                         " times and holds ", HexBytes(data + b, 1)));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status RunReference(const Job& job, absl::Span<const Segment> segments, const Layout& source,
                          const Layout& target, uint64_t version,
                          std::optional<int32_t> only_process) {
  HostBuffers source_buffers(source, kSourceFill);
  WSYNC_RETURN_IF_ERROR(FillLogical(source, version, &source_buffers));
  HostBuffers target_buffers(target, kPoison);
  WriteCounts counts(target);
  WSYNC_RETURN_IF_ERROR(
      ExecutePlanReference(job, segments, source_buffers, &target_buffers, &counts));
  WSYNC_RETURN_IF_ERROR(source_buffers.CheckGuards());
  return CheckTargets(target, target_buffers, counts, version, only_process);
}

}  // namespace wsync::test
