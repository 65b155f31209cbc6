#include "executor/delta_codec.h"

#include <algorithm>
#include <bit>
#include <climits>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "absl/strings/str_cat.h"

namespace wsync {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the header's count is stored little-endian by memcpy");

bool ValidElementBytes(int element_bytes) {
  return element_bytes == 1 || element_bytes == 2 || element_bytes == 4 || element_bytes == 8;
}

// A varint as CodedOutputStream writes it (LEB128); returns the byte after it.
inline uint8_t* PutVarint(uint64_t value, uint8_t* out) {
  while (value >= 0x80) {
    *out++ = static_cast<uint8_t>(value | 0x80);
    value >>= 7;
  }
  *out++ = static_cast<uint8_t>(value);
  return out;
}

// A varint this file wrote (a Scan's): no bounds to check. Returns the byte after it.
inline const uint8_t* TakeVarint(const uint8_t* in, uint64_t* value) {
  uint64_t result = 0;
  for (int shift = 0;; shift += 7) {
    const uint8_t byte = *in++;
    result |= static_cast<uint64_t>(byte & 0x7F) << shift;
    if (byte < 0x80) break;
  }
  *value = result;
  return in;
}

// The most bytes a varint takes.
constexpr int64_t kMaxVarintBytes = 10;

// What one pass over a chunk found: the changed elements' gap varints and difference varints,
// back to back in the first gap_bytes of `gaps` and diff_bytes of `diffs`. Reused across
// chunks (thread_local in Encode): no allocation per chunk once it has grown.
struct Scan {
  std::vector<uint8_t> gaps;
  std::vector<uint8_t> diffs;
  int64_t gap_bytes = 0;
  int64_t diff_bytes = 0;
  int64_t changed = 0;
  bool stopped = false;  // More than the limit changed: the pass stopped there.
};

// The block a pass compares at once: one bit of a 64-bit mask per byte.
constexpr int64_t kBlockBytes = 64;

// Bit i set when byte i of the 64-byte blocks at `a` and `b` differs.
inline uint64_t DifferingBytes(const uint8_t* a, const uint8_t* b) {
#if defined(__SSE2__)
  uint64_t equal = 0;
  for (int part = 0; part < 4; ++part) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + 16 * part));
    const __m128i y = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16 * part));
    equal |= static_cast<uint64_t>(static_cast<uint16_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(x, y))))
             << (16 * part);
  }
  return ~equal;
#else
  uint64_t differing = 0;
  for (int byte = 0; byte < kBlockBytes; ++byte) {
    differing |= static_cast<uint64_t>(a[byte] != b[byte]) << byte;
  }
  return differing;
#endif
}

// One bit per differing `kBytes`-wide element of a DifferingBytes mask, at its first byte.
template <int kBytes>
uint64_t DifferingElements(uint64_t bytes) {
  if constexpr (kBytes >= 2) bytes |= bytes >> 1;
  if constexpr (kBytes >= 4) bytes |= bytes >> 2;
  if constexpr (kBytes >= 8) bytes |= bytes >> 4;
  constexpr uint64_t kFirstBytes = kBytes == 1   ? ~uint64_t{0}
                                   : kBytes == 2 ? 0x5555555555555555
                                   : kBytes == 4 ? 0x1111111111111111
                                                 : 0x0101010101010101;
  return bytes & kFirstBytes;
}

// One pass over `size` bytes of `base` and `current` in 64-byte blocks (the last one zero-padded
// alike on both sides): appends each changed element's gap and zigzag difference to `scan`, and
// stops after the block in which more than `limit` elements changed. With kAdvance, `advance`
// (base's bytes, writable) then holds `current`: each changed element is written once encoded
// (after it is read: `advance` may be `base`), the rest of a chunk the pass stopped in copied.
template <int kBytes, bool kAdvance>
void ScanChunk(const uint8_t* base, const uint8_t* current, int64_t size, int64_t limit,
               uint8_t* advance, Scan* scan) {
  constexpr int kBits = 8 * kBytes;
  constexpr int64_t kRoom = kBlockBytes / kBytes * kMaxVarintBytes;  // A block's varints at most.
  int64_t previous = -1;
  int64_t changed = 0;
  uint8_t* gap = scan->gaps.data();
  uint8_t* diff = scan->diffs.data();
  uint8_t tail[2][kBlockBytes];
  int64_t at = 0;
  for (; at < size && changed <= limit; at += kBlockBytes) {
    const int64_t bytes = std::min(kBlockBytes, size - at);
    const uint8_t* a = base + at;
    const uint8_t* b = current + at;
    if (bytes < kBlockBytes) {
      std::memset(tail, 0, sizeof(tail));
      std::memcpy(tail[0], a, bytes);
      std::memcpy(tail[1], b, bytes);
      a = tail[0];
      b = tail[1];
    }
    uint64_t lanes = DifferingElements<kBytes>(DifferingBytes(a, b));
    if (lanes == 0) continue;
    // Offsets, not pointers: an empty vector's data() may be null (no arithmetic on it).
    const int64_t gaps_at = gap - scan->gaps.data(), diffs_at = diff - scan->diffs.data();
    if (gaps_at + kRoom > std::ssize(scan->gaps) || diffs_at + kRoom > std::ssize(scan->diffs)) {
      scan->gaps.resize(2 * (gaps_at + kRoom));
      scan->diffs.resize(2 * (diffs_at + kRoom));
      gap = scan->gaps.data() + gaps_at;
      diff = scan->diffs.data() + diffs_at;
    }
    for (; lanes != 0; lanes &= lanes - 1) {
      const int offset = std::countr_zero(lanes);
      const int64_t index = (at + offset) / kBytes;
      gap = PutVarint(static_cast<uint64_t>(index - previous - 1), gap);
      previous = index;
      uint64_t x = 0, y = 0;
      std::memcpy(&x, a + offset, kBytes);
      std::memcpy(&y, b + offset, kBytes);
      const int64_t signed_diff = static_cast<int64_t>((y - x) << (64 - kBits)) >> (64 - kBits);
      diff = PutVarint(
          (static_cast<uint64_t>(signed_diff) << 1) ^ static_cast<uint64_t>(signed_diff >> 63),
          diff);
      if constexpr (kAdvance) std::memcpy(advance + at + offset, &y, kBytes);
      ++changed;
    }
  }
  if constexpr (kAdvance) {
    if (at < size) std::memcpy(advance + at, current + at, size - at);
  }
  scan->changed = changed;
  scan->stopped = changed > limit;
  scan->gap_bytes = gap - scan->gaps.data();
  scan->diff_bytes = diff - scan->diffs.data();
}

template <bool kAdvance>
void ScanChunk(const uint8_t* base, const uint8_t* current, int64_t size, int element_bytes,
               int64_t limit, uint8_t* advance, Scan* scan) {
  switch (element_bytes) {
    case 1:
      return ScanChunk<1, kAdvance>(base, current, size, limit, advance, scan);
    case 2:
      return ScanChunk<2, kAdvance>(base, current, size, limit, advance, scan);
    case 4:
      return ScanChunk<4, kAdvance>(base, current, size, limit, advance, scan);
    default:
      return ScanChunk<8, kAdvance>(base, current, size, limit, advance, scan);
  }
}

// An element's bytes as an unsigned integer (little-endian, zero-extended).
uint64_t ElementBits(const uint8_t* element, int element_bytes) {
  uint64_t bits = 0;
  std::memcpy(&bits, element, element_bytes);
  return bits;
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

// Reads a varint from [*in, end) as CodedInputStream does (at most kMaxVarintBytes bytes, bits
// past the 64th dropped), advancing *in. False when it is cut short or longer.
inline bool ReadVarint(const uint8_t** in, const uint8_t* end, uint64_t* value) {
  const uint8_t* at = *in;
  if (at < end && *at < 0x80) {  // Most gaps and differences of a delta take one byte.
    *value = *at;
    *in = at + 1;
    return true;
  }
  uint64_t result = 0;
  for (int shift = 0; shift < 7 * kMaxVarintBytes && at < end; shift += 7) {
    const uint8_t byte = *at++;
    if (shift < 64) result |= static_cast<uint64_t>(byte & 0x7F) << shift;
    if (byte < 0x80) {
      *value = result;
      *in = at;
      return true;
    }
  }
  return false;
}

// Walks the gap varints of `body`: checks each index against `elements` and, when `values` and
// `target` are given, writes the element. Returns the bytes the varints took.
absl::StatusOr<int64_t> WalkIndices(absl::Span<const uint8_t> body, uint64_t changed,
                                    int64_t elements, int element_bytes, const uint8_t* values,
                                    uint8_t* target) {
  const uint8_t* in = body.data();
  const uint8_t* const end = body.data() + body.size();
  int64_t previous = -1;
  for (uint64_t i = 0; i < changed; ++i) {
    uint64_t gap = 0;
    if (!ReadVarint(&in, end, &gap)) return Refuse(absl::StrCat("index ", i, " is cut short"));
    if (gap >= static_cast<uint64_t>(elements - previous - 1)) {
      return Refuse(absl::StrCat("index ", i, " is past element ", elements));
    }
    previous += static_cast<int64_t>(gap) + 1;
    if (target != nullptr) {
      std::memcpy(target + previous * element_bytes, values + i * element_bytes, element_bytes);
    }
  }
  return in - body.data();
}

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
  const uint8_t* const diffs = body.data() + *index_bytes;
  const uint8_t* const end = body.data() + body.size();
  const uint8_t* in = diffs;
  for (uint64_t i = 0; i < changed; ++i) {
    uint64_t zigzag = 0;
    if (!ReadVarint(&in, end, &zigzag)) {
      return Refuse(absl::StrCat("difference ", i, " is cut short"));
    }
    if (!AddZigzagDiff(zigzag, element_bytes, nullptr)) {
      return Refuse(absl::StrCat("difference ", i, " is wider than ", element_bytes, " bytes"));
    }
  }
  if (in != end) return Refuse(absl::StrCat(end - in, " bytes follow the last difference"));
  // Checked whole: read again without bounds.
  const uint8_t* gap = body.data();
  in = diffs;
  int64_t index = -1;
  for (uint64_t i = 0; i < changed; ++i) {
    uint64_t skip = 0, zigzag = 0;
    gap = TakeVarint(gap, &skip);
    in = TakeVarint(in, &zigzag);
    index += static_cast<int64_t>(skip) + 1;
    AddZigzagDiff(zigzag, element_bytes, target + index * element_bytes);
  }
  return absl::OkStatus();
}

// Writes the encoding `summary` chose of the chunk `scan` found changed in `current` at `out`
// (summary.encoded_bytes bytes).
void WriteEncoding(const DeltaEncodingSummary& summary, const Scan& scan,
                   absl::Span<const uint8_t> current, int element_bytes, uint8_t* out) {
  WriteHeader(summary.kind, element_bytes,
              summary.kind == DeltaKind::kDense ? summary.elements : summary.changed_elements, out);
  uint8_t* body = out + kDeltaHeaderBytes;
  if (summary.kind == DeltaKind::kDense) {
    if (!current.empty()) std::memcpy(body, current.data(), current.size());
    return;
  }
  if (summary.kind == DeltaKind::kDiffs) {
    if (scan.gap_bytes > 0) std::memcpy(body, scan.gaps.data(), scan.gap_bytes);
    if (scan.diff_bytes > 0) std::memcpy(body + scan.gap_bytes, scan.diffs.data(), scan.diff_bytes);
    return;
  }
  // The bitmap or the gaps, then the values, gathered along the gaps.
  const bool bitmap = summary.kind == DeltaKind::kBitmap;
  const int64_t index_bytes = bitmap ? (summary.elements + 7) / 8 : scan.gap_bytes;
  if (bitmap) {
    std::memset(body, 0, index_bytes);
  } else if (scan.gap_bytes > 0) {
    std::memcpy(body, scan.gaps.data(), scan.gap_bytes);
  }
  uint8_t* values = body + index_bytes;
  const uint8_t* gap = scan.gaps.data();
  int64_t index = -1;
  for (int64_t i = 0; i < scan.changed; ++i) {
    uint64_t skip = 0;
    gap = TakeVarint(gap, &skip);
    index += static_cast<int64_t>(skip) + 1;
    if (bitmap) body[index / 8] |= uint8_t{1} << (index % 8);
    std::memcpy(values, current.data() + index * element_bytes, element_bytes);
    values += element_bytes;
  }
}

// EncodeDelta, appending to `out`; with `advance` (base's bytes, writable), the base then holds
// `current`.
absl::StatusOr<DeltaEncodingSummary> Encode(absl::Span<const uint8_t> base,
                                            absl::Span<const uint8_t> current, int element_bytes,
                                            uint8_t* advance, std::vector<uint8_t>* out) {
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
  const auto limit =
      static_cast<int64_t>(kDenseAboveChangedFraction * static_cast<double>(summary.elements));
  thread_local Scan scan;
  const int64_t size = static_cast<int64_t>(current.size());
  if (advance != nullptr) {
    ScanChunk<true>(base.data(), current.data(), size, element_bytes, limit, advance, &scan);
  } else {
    ScanChunk<false>(base.data(), current.data(), size, element_bytes, limit, nullptr, &scan);
  }
  summary.changed_elements = scan.changed;
  summary.mostly_changed = scan.stopped;
  if (!summary.mostly_changed) {
    const int64_t values_bytes = summary.changed_elements * element_bytes;
    summary.bitmap_bytes = kDeltaHeaderBytes + (summary.elements + 7) / 8 + values_bytes;
    summary.indices_bytes = kDeltaHeaderBytes + scan.gap_bytes + values_bytes;
    summary.diffs_bytes = kDeltaHeaderBytes + scan.gap_bytes + scan.diff_bytes;
  }
  summary.kind = Choose(summary);
  summary.encoded_bytes = EncodedBytes(summary);
  const size_t at = out->size();
  out->resize(at + static_cast<size_t>(summary.encoded_bytes));
  WriteEncoding(summary, scan, current, element_bytes, out->data() + at);
  return summary;
}

}  // namespace

absl::StatusOr<DeltaEncodingSummary> EncodeDelta(absl::Span<const uint8_t> base,
                                                 absl::Span<const uint8_t> current,
                                                 int element_bytes, std::vector<uint8_t>* out) {
  out->clear();
  return Encode(base, current, element_bytes, nullptr, out);
}

absl::StatusOr<DeltaEncodingSummary> AppendDeltaAdvancingBase(absl::Span<uint8_t> base,
                                                              absl::Span<const uint8_t> current,
                                                              int element_bytes,
                                                              std::vector<uint8_t>* out) {
  return Encode(base, current, element_bytes, base.data(), out);
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
      if (!body.empty()) std::memcpy(target.data(), body.data(), body.size());
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
