// The encoding of one chunk of a delta sync (issue 44): what a sender sends instead of the chunk's
// bytes when the receiver holds the bytes the sender last sent for that chunk (its base).
//
// Pure functions: no I/O, no state, no threads. Elements are compared bitwise at the chunk's
// element size (2 bytes for bf16, 4 for fp32, 1 for fp8), so +0.0 and -0.0, or two NaN payloads,
// are different elements and a patched target is bit-exact.
//
// An encoded chunk is a 16-byte header followed by one of four bodies:
//   byte 0: DeltaKind, byte 1: element size in bytes, bytes 2..7: zero,
//   bytes 8..15: the number of changed elements (uint64, little-endian; every element for dense).
//   kDense:   every element of the chunk.
//   kBitmap:  ceil(n / 8) bytes, bit i (byte i / 8, bit i % 8) set when element i changed, bits
//             past n zero; then the changed elements' values in index order.
//   kIndices: the changed indices as LEB128 varints of their gaps (the first index, then each
//             index minus the previous minus one); then the changed elements' values in order.
//   kDiffs:   the changed indices as in kIndices; then, in order, each changed element's
//             difference from its base element: the bit patterns read as unsigned integers of the
//             element size, current minus base modulo 2^(8 x size), taken as signed and written
//             as a zigzag LEB128 varint. An optimizer step at post-training learning rates moves
//             a bf16 weight by an ulp or two: one byte where kIndices spends two. Applied only to
//             a target holding the base, which is what a delta sync guarantees.
// Every count of an encoded chunk is checked against the target's size before any byte of the
// target is written (an encoding comes from the network).
#ifndef WSYNC_EXECUTOR_DELTA_CODEC_H_
#define WSYNC_EXECUTOR_DELTA_CODEC_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace wsync {

enum class DeltaKind : uint8_t { kDense = 0, kBitmap = 1, kIndices = 2, kDiffs = 3 };

inline constexpr int64_t kDeltaHeaderBytes = 16;

// Above this fraction of changed elements a chunk is sent dense even when an encoding would be a
// little smaller: the saving is then under half the chunk, and the dense chunk costs the receiver
// one copy instead of a scatter (the cost model of delta=auto is to refine this per path class).
inline constexpr double kDenseAboveChangedFraction = 0.5;

// What EncodeDelta chose and the sizes it chose from (bytes, headers included).
struct DeltaEncodingSummary {
  DeltaKind kind = DeltaKind::kDense;
  int64_t elements = 0;
  // More than kDenseAboveChangedFraction of the elements changed: the comparison stopped there,
  // changed_elements counts those it saw (more than that fraction) and the bitmap and indices
  // sizes are 0 (not computed).
  bool mostly_changed = false;
  int64_t changed_elements = 0;  // Exact unless mostly_changed.
  int64_t encoded_bytes = 0;     // Of the chosen kind: what `out` holds.
  int64_t dense_bytes = 0;
  int64_t bitmap_bytes = 0;
  int64_t indices_bytes = 0;
  int64_t diffs_bytes = 0;
};

// Encodes `current` against `base` (the same size, a multiple of `element_bytes`, which is 1, 2,
// 4 or 8) into `out` (replaced): the smallest of the four kinds, dense on a tie and whenever more
// than kDenseAboveChangedFraction of the elements changed (found as soon as that many are seen:
// the rest of the chunk is not compared); on other ties the first of bitmap, indices, diffs.
// InvalidArgument for sizes that break these rules (nothing is written then).
absl::StatusOr<DeltaEncodingSummary> EncodeDelta(absl::Span<const uint8_t> base,
                                                 absl::Span<const uint8_t> current,
                                                 int element_bytes, std::vector<uint8_t>* out);

// EncodeDelta's encoding (the same bytes), appended to `out`, with `base` overwritten by `current`
// in the same pass: the changed 8-byte words are written as they are found, and the rest of a
// mostly changed chunk copied after the comparison stops. One pass over the two chunks where
// EncodeDelta and a copy of `current` take three: a sender's base advanced to what it sends
// (DeltaBaseStore::Advance). On InvalidArgument nothing is written.
absl::StatusOr<DeltaEncodingSummary> AppendDeltaAdvancingBase(absl::Span<uint8_t> base,
                                                              absl::Span<const uint8_t> current,
                                                              int element_bytes,
                                                              std::vector<uint8_t>* out);

// Whether more than kDenseAboveChangedFraction of `samples` evenly spaced elements of `current`
// differ from `base` (the same size, a multiple of `element_bytes`): a cheap sign, before comparing
// every element, that EncodeDelta would choose dense (a chunk every element of which changed). Only
// a sign: either answer may be wrong for a chunk whose changes are not spread evenly, so it may
// only ever choose dense, never an encoding. False for an empty chunk.
bool SampledMostlyChanged(absl::Span<const uint8_t> base, absl::Span<const uint8_t> current,
                          int element_bytes, int samples = 64);

// Appends the kDense encoding of `current` (a multiple of `element_bytes`, which is 1, 2, 4 or 8)
// to `out`: what a chunk without a base travels as among encoded ones.
void AppendDenseDelta(absl::Span<const uint8_t> current, int element_bytes,
                      std::vector<uint8_t>* out);

// Patches `target`, which must hold the encoding's base, into the bytes the sender encoded: only
// changed elements are written (all of them for kDense). DataLoss, with `target` untouched, for
// an encoding that does not fit a target of this size and element size: an unknown kind, another
// element size, a count above the target's elements, a body of another size, an index out of
// range or out of order, a bitmap whose set bits are not the count or that sets bits past the end,
// a difference cut short or wider than the element.
absl::Status ApplyDelta(absl::Span<const uint8_t> encoded, int element_bytes,
                        absl::Span<uint8_t> target);

}  // namespace wsync

#endif  // WSYNC_EXECUTOR_DELTA_CODEC_H_
