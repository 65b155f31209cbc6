#include "integration/fill/pattern.h"

#include <cstdint>
#include <cstring>

namespace wsync::test {
namespace {

// The SplitMix64 finalizer: a bijection of 64-bit words that mixes every input bit into every
// output bit.
uint64_t Mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

PatternView::PatternView(uint64_t version, BufferKey key)
    : seed_(
          Mix64(Mix64(version) ^ (static_cast<uint64_t>(key.process) << 32) ^ Mix64(key.buffer))) {}

uint64_t PatternView::Word(int64_t w) const {
  return Mix64(seed_ + static_cast<uint64_t>(w)) & kPatternMask;
}

uint64_t PatternView::Bytes(int64_t position, int count) const {
  const int shift = static_cast<int>(position % 8);
  if (shift + count <= 8) {  // Within one word: every element at an address aligned to its size.
    const uint64_t value = Word(position / 8) >> (8 * shift);
    return count == 8 ? value : value & ((uint64_t{1} << (8 * count)) - 1);
  }
  uint64_t value = 0;
  for (int b = 0; b < count; ++b) value |= Bytes(position + b, 1) << (8 * b);
  return value;
}

void FillPattern(uint64_t version, HostBuffers* buffers) {
  for (const BufferKey& key : buffers->keys()) {
    unsigned char* data = buffers->data(key);
    const int64_t size = buffers->bytes(key);
    const PatternView view(version, key);
    const int64_t words = size / 8;
    for (int64_t w = 0; w < words; ++w) {
      const uint64_t value = view.Bytes(8 * w, 8);
      std::memcpy(data + 8 * w, &value, 8);
    }
    for (int64_t b = 8 * words; b < size; ++b) {
      data[b] = static_cast<unsigned char>(view.Bytes(b, 1));
    }
  }
}

}  // namespace wsync::test
