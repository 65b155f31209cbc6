#ifndef WSYNC_COMMON_CHECKED_MATH_H_
#define WSYNC_COMMON_CHECKED_MATH_H_

#include <cstdint>
#include <optional>

namespace wsync {

// int64 arithmetic that reports overflow instead of wrapping. Each returns std::nullopt when the
// exact result does not fit in int64.
inline std::optional<int64_t> CheckedAdd(int64_t a, int64_t b) {
  int64_t result;
  if (__builtin_add_overflow(a, b, &result)) return std::nullopt;
  return result;
}

inline std::optional<int64_t> CheckedMul(int64_t a, int64_t b) {
  int64_t result;
  if (__builtin_mul_overflow(a, b, &result)) return std::nullopt;
  return result;
}

// Ceiling division for a >= 0, b > 0.
constexpr int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Rounds a >= 0 up to a multiple of b > 0.
constexpr int64_t RoundUp(int64_t a, int64_t b) { return CeilDiv(a, b) * b; }

}  // namespace wsync

#endif  // WSYNC_COMMON_CHECKED_MATH_H_
