#ifndef WSYNC_INTEGRATION_FILL_PATTERN_H_
#define WSYNC_INTEGRATION_FILL_PATTERN_H_

// A pseudo-random fill pattern at memory speed, for jobs whose chunk hashes (wsync's verify) and
// FP8 reference checks (quant_check.h) compare distinct bytes without walking every element:
// written by the trainers of `wsync-bench sync`'s verification jobs and the tests, read back by
// a rollout that does not hold the trainers' memory (PatternView).

#include <cstdint>

#include "integration/fill/fill.h"

// The namespace is the one these functions had in tests/testing/reference.h.
namespace wsync::test {

// Writes a pseudo-random pattern of `version` over every byte of every buffer in `buffers`
// (pieces and padding alike): 8-byte words of a SplitMix64 finalizer keyed by the buffer's key,
// the word's position and `version`, each masked with kPatternMask, so bytes of different buffers,
// positions or versions differ with the probability of a 56-bit hash. It runs at memory speed (no
// walk over the layout's elements), for chunk-hash verification (ExecuteOptions::verify), which
// compares the sender's bytes with the receiver's: the pattern makes a stale, lost or misplaced
// chunk change its hash. It ties no value to a logical index, so CheckLogical cannot check what
// it moved; PatternView reads it back where the buffer is not at hand.
void FillPattern(uint64_t version, HostBuffers* buffers);

// Bit 6 of every byte cleared: the most significant exponent bit of every float dtype (bit 6 of
// the top byte of fp64, fp32, fp16 and bf16, little-endian; bit 6 of an e4m3 or e5m2 byte) is 0 in
// every element FillPattern writes at an address aligned to its size, so no element of a float
// dtype is a NaN or an infinity (the FP8 quantizer refuses those): |x| < 2 for fp64, fp32, fp16
// and bf16; e4m3 and e5m2 exponents stay below their all-ones code.
inline constexpr uint64_t kPatternMask = 0xbfbfbfbfbfbfbfbfULL;

// Random access to what FillPattern(version) writes into the buffer `key`, for a process that
// does not hold that buffer (a rollout recomputing a trainer's bytes). Pure.
class PatternView {
 public:
  PatternView(uint64_t version, BufferKey key);

  // The `count` (1 to 8) bytes at byte `position` (>= 0, inside the buffer) as a little-endian
  // integer: what FillPattern wrote there (the bytes after the last whole word included).
  uint64_t Bytes(int64_t position, int count) const;

 private:
  uint64_t Word(int64_t w) const;  // Word w of the buffer's pattern (masked).
  uint64_t seed_;
};

}  // namespace wsync::test

#endif  // WSYNC_INTEGRATION_FILL_PATTERN_H_
