// How many random cases a property test runs: its full count scaled by WSYNC_PROPERTY_PERCENT
// (default 100). The sanitizer builds set a lower percentage for the heaviest property tests
// (tests/unit/CMakeLists.txt); the plain build runs every case.
#ifndef WSYNC_TESTS_TESTING_PROPERTY_SCALE_H_
#define WSYNC_TESTS_TESTING_PROPERTY_SCALE_H_

#include <algorithm>
#include <cstdint>
#include <cstdlib>

namespace wsync::test {

// An integer environment variable, or `fallback` where it is unset.
inline int64_t EnvInt(const char* name, int64_t fallback) {
  const char* value = std::getenv(name);
  return value == nullptr ? fallback : std::strtoll(value, nullptr, 10);
}

// `full` scaled by WSYNC_PROPERTY_PERCENT, at least `at_least`.
inline int64_t ScaledCases(int64_t full, int64_t at_least = 1) {
  return std::max<int64_t>(at_least, full * EnvInt("WSYNC_PROPERTY_PERCENT", 100) / 100);
}

}  // namespace wsync::test

#endif  // WSYNC_TESTS_TESTING_PROPERTY_SCALE_H_
