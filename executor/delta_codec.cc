#include "executor/delta_codec.h"

#include <algorithm>
#include <bit>
#include <climits>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"

namespace wsync {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the header's count is stored little-endian by memcpy");

using google::protobuf::io::CodedInputStream;
using google::protobuf::io::CodedOutputStream;

// Equal runs of this many bytes (a multiple of every element size) are skipped whole.
constexpr int64_t kCompareBlockBytes = 64;

bool ValidElementBytes(int element_bytes) {
  return element_bytes == 1 || element_bytes == 2 || element_bytes == 4 || element_bytes == 8;
}

// Calls `visit(index)` for each element whose bytes differ, ascending, as `Element` (an unsigned
// integer of the element size) compares them, until it returns false; false then.
template <typename Element, typename Visit>
bool VisitChanged(absl::Span<const uint8_t> base, absl::Span<const uint8_t> current,
                  Visit&& visit) {
  const int64_t size = static_cast<int64_t>(base.size());
  for (int64_t block = 0; block < size; block += kCompareBlockBytes) {
    const int64_t end = std::min(block + kCompareBlockBytes, size);
    if (std::memcmp(base.data() + block, current.data() + block, end - block) == 0) continue;
    for (int64_t at = block; at < end; at += sizeof(Element)) {
      Element a, b;
      std::memcpy(&a, base.data() + at, sizeof(Element));
      std::memcpy(&b, current.data() + at, sizeof(Element));
      if (a != b && !visit(at / static_cast<int64_t>(sizeof(Element)))) return false;
    }
  }
  return true;
}

template <typename Visit>
bool VisitChanged(absl::Span<const uint8_t> base, absl::Span<const uint8_t> current,
                  int element_bytes, Visit&& visit) {
  switch (element_bytes) {
    case 1:
      return VisitChanged<uint8_t>(base, current, visit);
    case 2:
      return VisitChanged<uint16_t>(base, current, visit);
    case 4:
      return VisitChanged<uint32_t>(base, current, visit);
    default:
      return VisitChanged<uint64_t>(base, current, visit);
  }
}

// The gap varint of `index` after `previous` (-1 before the first).
uint64_t Gap(int64_t index, int64_t previous) {
  return static_cast<uint64_t>(index - previous - 1);
}

// An element's bytes as an unsigned integer (little-endian, zero-extended).
uint64_t ElementBits(const uint8_t* element, int element_bytes) {
  uint64_t bits = 0;
  std::memcpy(&bits, element, element_bytes);
  return bits;
}

// The zigzag form of current minus base, modulo 2^(8 x element_bytes), taken as signed.
uint64_t ZigzagDiff(const uint8_t* base, const uint8_t* current, int element_bytes) {
  const int shift = 64 - 8 * element_bytes;
  const uint64_t wrapped = (ElementBits(current, element_bytes) - ElementBits(base, element_bytes))
                           << shift;
  const int64_t diff = static_cast<int64_t>(wrapped) >> shift;  // Sign-extended.
  return (static_cast<uint64_t>(diff) << 1) ^ static_cast<uint64_t>(diff >> 63);
}

// Adds the difference a zigzag varint holds to the element at `target` (modulo its size). False
// when the difference does not fit an element of this size.
bool AddZigzagDiff(uint64_t zigzag, int element_bytes, uint8_t* target) {
  const int64_t diff = static_cast<int64_t>(zigzag >> 1) ^ -static_cast<int64_t>(zigzag & 1);
  const int bits = 8 * element_bytes;
  if (bits < 64 && (diff < -(int64_t{1} << (bits - 1)) || diff >= (int64_t{1} << (bits - 1)))) {
    return false;
  }
  if (target != nullptr) {
    const uint64_t sum = ElementBits(target, element_bytes) + static_cast<uint64_t>(diff);
    std::memcpy(target, &sum, element_bytes);
  }
  return true;
}

void WriteHeader(DeltaKind kind, int element_bytes, uint64_t changed, uint8_t* out) {
  std::memset(out, 0, kDeltaHeaderBytes);
  out[0] = static_cast<uint8_t>(kind);
  out[1] = static_cast<uint8_t>(element_bytes);
  std::memcpy(out + 8, &changed, sizeof(changed));
}

DeltaKind Choose(const DeltaEncodingSummary& sizes) {
  if (sizes.mostly_changed ||
      sizes.dense_bytes <= std::min({sizes.bitmap_bytes, sizes.indices_bytes, sizes.diffs_bytes})) {
    return DeltaKind::kDense;
  }
  if (sizes.bitmap_bytes <= std::min(sizes.indices_bytes, sizes.diffs_bytes)) {
    return DeltaKind::kBitmap;
  }
  return sizes.indices_bytes <= sizes.diffs_bytes ? DeltaKind::kIndices : DeltaKind::kDiffs;
}

int64_t EncodedBytes(const DeltaEncodingSummary& sizes) {
  switch (sizes.kind) {
    case DeltaKind::kDense:
      return sizes.dense_bytes;
    case DeltaKind::kBitmap:
      return sizes.bitmap_bytes;
    case DeltaKind::kIndices:
      return sizes.indices_bytes;
    case DeltaKind::kDiffs:
      return sizes.diffs_bytes;
  }
  return sizes.dense_bytes;
}

absl::Status Refuse(absl::string_view why) {
  return absl::DataLossError(absl::StrCat("delta chunk refused: ", why));
}

// Checks a bitmap of `elements` bits: `changed` bits set, none past the end.
absl::Status CheckBitmap(absl::Span<const uint8_t> bitmap, int64_t elements, uint64_t changed) {
  uint64_t set = 0;
  for (const uint8_t byte : bitmap) set += std::popcount(byte);
  if (set != changed) {
    return Refuse(absl::StrCat("the bitmap sets ", set, " elements, the header says ", changed));
  }
  const int64_t tail_bits = elements % 8;
  if (tail_bits != 0 && (bitmap.back() >> tail_bits) != 0) {
    return Refuse(absl::StrCat("the bitmap sets bits past element ", elements));
  }
  return absl::OkStatus();
}

void ApplyBitmap(absl::Span<const uint8_t> bitmap, const uint8_t* values, int element_bytes,
                 uint8_t* target) {
  for (size_t byte = 0; byte < bitmap.size(); ++byte) {
    for (uint8_t bits = bitmap[byte]; bits != 0; bits &= bits - 1) {
      const int64_t index = static_cast<int64_t>(byte) * 8 + std::countr_zero(bits);
      std::memcpy(target + index * element_bytes, values, element_bytes);
      values += element_bytes;
    }
  }
}

// Walks the gap varints of `body`: checks each index against `elements` and, when `values` and
// `target` are given, writes the element. Returns the bytes the varints took.
absl::StatusOr<int64_t> WalkIndices(absl::Span<const uint8_t> body, uint64_t changed,
                                    int64_t elements, int element_bytes, const uint8_t* values,
                                    uint8_t* target) {
  CodedInputStream input(body.data(), static_cast<int>(body.size()));
  int64_t previous = -1;
  for (uint64_t i = 0; i < changed; ++i) {
    uint64_t gap = 0;
    if (!input.ReadVarint64(&gap)) return Refuse(absl::StrCat("index ", i, " is cut short"));
    if (gap >= static_cast<uint64_t>(elements - previous - 1)) {
      return Refuse(absl::StrCat("index ", i, " is past element ", elements));
    }
    previous += static_cast<int64_t>(gap) + 1;
    if (target != nullptr) {
      std::memcpy(target + previous * element_bytes, values + i * element_bytes, element_bytes);
    }
  }
  return input.CurrentPosition();
}

// The bytes the gap varints at the start of `body` take, every index checked.
absl::StatusOr<int64_t> CheckedIndexBytes(absl::Span<const uint8_t> body, uint64_t changed,
                                          int64_t elements, int element_bytes) {
  if (body.size() > static_cast<size_t>(INT_MAX)) return Refuse("the body is over 2 GiB");
  return WalkIndices(body, changed, elements, element_bytes, nullptr, nullptr);
}

absl::Status ApplyIndices(absl::Span<const uint8_t> body, uint64_t changed, int64_t elements,
                          int element_bytes, uint8_t* target) {
  absl::StatusOr<int64_t> index_bytes = CheckedIndexBytes(body, changed, elements, element_bytes);
  if (!index_bytes.ok()) return index_bytes.status();
  const uint64_t values_bytes = body.size() - static_cast<uint64_t>(*index_bytes);
  if (values_bytes != changed * element_bytes) {
    return Refuse(absl::StrCat(values_bytes, " bytes of values for ", changed, " elements of ",
                               element_bytes, " bytes"));
  }
  return WalkIndices(body, changed, elements, element_bytes, body.data() + *index_bytes, target)
      .status();
}

// Checks a kDiffs body whole (indices in range and in order, every difference present and within
// the element, nothing after them), then adds each difference to its element of `target`.
absl::Status ApplyDiffs(absl::Span<const uint8_t> body, uint64_t changed, int64_t elements,
                        int element_bytes, uint8_t* target) {
  absl::StatusOr<int64_t> index_bytes = CheckedIndexBytes(body, changed, elements, element_bytes);
  if (!index_bytes.ok()) return index_bytes.status();
  const absl::Span<const uint8_t> diffs = body.subspan(static_cast<size_t>(*index_bytes));
  CodedInputStream check(diffs.data(), static_cast<int>(diffs.size()));
  for (uint64_t i = 0; i < changed; ++i) {
    uint64_t zigzag = 0;
    if (!check.ReadVarint64(&zigzag))
      return Refuse(absl::StrCat("difference ", i, " is cut short"));
    if (!AddZigzagDiff(zigzag, element_bytes, nullptr)) {
      return Refuse(absl::StrCat("difference ", i, " is wider than ", element_bytes, " bytes"));
    }
  }
  if (static_cast<size_t>(check.CurrentPosition()) != diffs.size()) {
    return Refuse(
        absl::StrCat(diffs.size() - check.CurrentPosition(), " bytes follow the last difference"));
  }
  CodedInputStream gaps(body.data(), static_cast<int>(*index_bytes));
  CodedInputStream values(diffs.data(), static_cast<int>(diffs.size()));
  int64_t index = -1;
  for (uint64_t i = 0; i < changed; ++i) {
    uint64_t gap = 0, zigzag = 0;
    gaps.ReadVarint64(&gap);
    values.ReadVarint64(&zigzag);
    index += static_cast<int64_t>(gap) + 1;
    AddZigzagDiff(zigzag, element_bytes, target + index * element_bytes);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DeltaEncodingSummary> EncodeDelta(absl::Span<const uint8_t> base,
                                                 absl::Span<const uint8_t> current,
                                                 int element_bytes, std::vector<uint8_t>* out) {
  if (!ValidElementBytes(element_bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("element_bytes must be 1, 2, 4 or 8, got ", element_bytes));
  }
  if (base.size() != current.size() || current.size() % element_bytes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("base (", base.size(), " bytes) and current (", current.size(),
                     " bytes) must be one size, a multiple of ", element_bytes));
  }
  DeltaEncodingSummary summary;
  summary.elements = static_cast<int64_t>(current.size()) / element_bytes;
  summary.dense_bytes = kDeltaHeaderBytes + static_cast<int64_t>(current.size());
  // Pass 1: count the changed elements and their gaps' varint bytes, stopping above the limit.
  const auto limit =
      static_cast<int64_t>(kDenseAboveChangedFraction * static_cast<double>(summary.elements));
  int64_t previous = -1;
  int64_t gap_bytes = 0;
  int64_t diff_bytes = 0;
  const auto diff_at = [&](int64_t index) {
    const int64_t at = index * element_bytes;
    return ZigzagDiff(base.data() + at, current.data() + at, element_bytes);
  };
  summary.mostly_changed = !VisitChanged(base, current, element_bytes, [&](int64_t index) {
    gap_bytes += CodedOutputStream::VarintSize64(Gap(index, previous));
    diff_bytes += CodedOutputStream::VarintSize64(diff_at(index));
    previous = index;
    return ++summary.changed_elements <= limit;
  });
  if (!summary.mostly_changed) {
    const int64_t values_bytes = summary.changed_elements * element_bytes;
    summary.bitmap_bytes = kDeltaHeaderBytes + (summary.elements + 7) / 8 + values_bytes;
    summary.indices_bytes = kDeltaHeaderBytes + gap_bytes + values_bytes;
    summary.diffs_bytes = kDeltaHeaderBytes + gap_bytes + diff_bytes;
  }
  summary.kind = Choose(summary);
  summary.encoded_bytes = EncodedBytes(summary);
  out->assign(summary.encoded_bytes, 0);
  WriteHeader(summary.kind, element_bytes,
              summary.kind == DeltaKind::kDense ? summary.elements : summary.changed_elements,
              out->data());
  uint8_t* body = out->data() + kDeltaHeaderBytes;
  if (summary.kind == DeltaKind::kDense) {
    std::memcpy(body, current.data(), current.size());
    return summary;
  }
  // Pass 2: the bitmap or the gaps, then the values or differences (after the bitmap or the gaps).
  uint8_t* values =
      body + (summary.kind == DeltaKind::kBitmap ? (summary.elements + 7) / 8 : gap_bytes);
  previous = -1;
  VisitChanged(base, current, element_bytes, [&](int64_t index) {
    if (summary.kind == DeltaKind::kBitmap) {
      body[index / 8] |= uint8_t{1} << (index % 8);
    } else {
      body = CodedOutputStream::WriteVarint64ToArray(Gap(index, previous), body);
      previous = index;
    }
    if (summary.kind == DeltaKind::kDiffs) {
      values = CodedOutputStream::WriteVarint64ToArray(diff_at(index), values);
    } else {
      std::memcpy(values, current.data() + index * element_bytes, element_bytes);
      values += element_bytes;
    }
    return true;
  });
  return summary;
}

bool SampledMostlyChanged(absl::Span<const uint8_t> base, absl::Span<const uint8_t> current,
                          int element_bytes, int samples) {
  const int64_t elements = static_cast<int64_t>(current.size()) / element_bytes;
  if (elements == 0 || base.size() != current.size() || samples <= 0) return false;
  const int64_t taken = std::min<int64_t>(samples, elements);
  int64_t changed = 0;
  for (int64_t i = 0; i < taken; ++i) {
    const int64_t at = (i * elements / taken) * element_bytes;
    changed += std::memcmp(base.data() + at, current.data() + at, element_bytes) != 0;
  }
  return static_cast<double>(changed) > kDenseAboveChangedFraction * static_cast<double>(taken);
}

void AppendDenseDelta(absl::Span<const uint8_t> current, int element_bytes,
                      std::vector<uint8_t>* out) {
  const size_t at = out->size();
  out->resize(at + kDeltaHeaderBytes + current.size());
  WriteHeader(DeltaKind::kDense, element_bytes, current.size() / element_bytes, out->data() + at);
  if (!current.empty()) {
    std::memcpy(out->data() + at + kDeltaHeaderBytes, current.data(), current.size());
  }
}

absl::Status ApplyDelta(absl::Span<const uint8_t> encoded, int element_bytes,
                        absl::Span<uint8_t> target) {
  if (!ValidElementBytes(element_bytes) || target.size() % element_bytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a target of ", target.size(), " bytes cannot hold elements of ", element_bytes, " bytes"));
  }
  if (static_cast<int64_t>(encoded.size()) < kDeltaHeaderBytes) {
    return Refuse(absl::StrCat(encoded.size(), " bytes is shorter than the header"));
  }
  const uint8_t kind = encoded[0];
  if (kind > static_cast<uint8_t>(DeltaKind::kDiffs)) {
    return Refuse(absl::StrCat("unknown kind ", kind));
  }
  if (encoded[1] != element_bytes) {
    return Refuse(
        absl::StrCat("elements of ", encoded[1], " bytes, the target's are ", element_bytes));
  }
  if (std::any_of(encoded.begin() + 2, encoded.begin() + 8, [](uint8_t b) { return b != 0; })) {
    return Refuse("reserved header bytes are not zero");
  }
  uint64_t changed = 0;
  std::memcpy(&changed, encoded.data() + 8, sizeof(changed));
  const int64_t elements = static_cast<int64_t>(target.size()) / element_bytes;
  if (changed > static_cast<uint64_t>(elements)) {
    return Refuse(absl::StrCat(changed, " changed elements in a chunk of ", elements));
  }
  const absl::Span<const uint8_t> body = encoded.subspan(kDeltaHeaderBytes);
  const uint64_t values_bytes = changed * element_bytes;
  switch (static_cast<DeltaKind>(kind)) {
    case DeltaKind::kDense:
      if (changed != static_cast<uint64_t>(elements) || body.size() != target.size()) {
        return Refuse(absl::StrCat("a dense body of ", body.size(), " bytes for a target of ",
                                   target.size()));
      }
      std::memcpy(target.data(), body.data(), body.size());
      return absl::OkStatus();
    case DeltaKind::kBitmap: {
      const uint64_t bitmap_bytes = static_cast<uint64_t>(elements + 7) / 8;
      if (body.size() != bitmap_bytes + values_bytes) {
        return Refuse(absl::StrCat("a bitmap body of ", body.size(), " bytes, expected ",
                                   bitmap_bytes + values_bytes));
      }
      const absl::Span<const uint8_t> bitmap = body.subspan(0, bitmap_bytes);
      if (absl::Status ok = CheckBitmap(bitmap, elements, changed); !ok.ok()) return ok;
      ApplyBitmap(bitmap, body.data() + bitmap_bytes, element_bytes, target.data());
      return absl::OkStatus();
    }
    case DeltaKind::kIndices:
      return ApplyIndices(body, changed, elements, element_bytes, target.data());
    case DeltaKind::kDiffs:
      return ApplyDiffs(body, changed, elements, element_bytes, target.data());
  }
  return Refuse("unreachable kind");
}

}  // namespace wsync
