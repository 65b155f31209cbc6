#ifndef WSYNC_INTEGRATION_FILL_ELEMENTS_H_
#define WSYNC_INTEGRATION_FILL_ELEMENTS_H_

// Walking a box element by element and the addresses of its elements in a buffer: what fill.cc
// and the reference copier (tests/testing/reference.cc) share.

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "integration/fill/fill.h"
#include "planner/layout.h"

namespace wsync::test {

// Calls f(index) for every absolute index of `box` in row-major order (nothing for an empty box,
// once for a rank-0 box).
template <typename F>
void ForEachIndex(const Box& box, F&& f) {
  const int rank = box.rank();
  for (int a = 0; a < rank; ++a) {
    if (box.extent[a] <= 0) return;
  }
  Dims index = box.origin;
  while (true) {
    f(static_cast<const Dims&>(index));
    int a = rank - 1;
    for (; a >= 0; --a) {
      if (++index[a] < box.origin[a] + box.extent[a]) break;
      index[a] = box.origin[a];
    }
    if (a < 0) return;
  }
}

// offset + sum_a (index[a] - origin[a]) * strides[a], in elements. Inputs are small in tests;
// overflow is not a concern for the ranges the generators produce.
inline int64_t ElementAddress(const Box& box, int64_t offset, const Dims& strides,
                              const Dims& index) {
  int64_t address = offset;
  for (int a = 0; a < box.rank(); ++a) address += (index[a] - box.origin[a]) * strides[a];
  return address;
}

inline std::string KeyString(absl::string_view role, BufferKey key) {
  return absl::StrCat(role, " process ", key.process, " buffer ", key.buffer);
}

// The byte offset of element `address` of size `element_size`, or nullopt when the element does
// not lie entirely inside a buffer of `buffer_bytes` bytes.
inline std::optional<int64_t> ByteOffset(int64_t address, int64_t element_size,
                                         int64_t buffer_bytes) {
  if (address < 0 || element_size <= 0) return std::nullopt;
  if (address > (buffer_bytes - element_size) / element_size) return std::nullopt;
  const int64_t byte = address * element_size;
  if (byte + element_size > buffer_bytes) return std::nullopt;
  return byte;
}

}  // namespace wsync::test

#endif  // WSYNC_INTEGRATION_FILL_ELEMENTS_H_
