#ifndef WSYNC_INTEGRATION_CLI_PLAN_MEASURE_H_
#define WSYNC_INTEGRATION_CLI_PLAN_MEASURE_H_

// What `wsync plan` measures of itself: wall time per phase and resident memory. Linux only
// (/proc, getrusage); thread-compatible.

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>

namespace wsync::cli {

// Resident set size now, from /proc/self/statm; nullopt where it cannot be read.
inline std::optional<int64_t> ResidentBytes() {
  std::FILE* file = std::fopen("/proc/self/statm", "r");
  if (file == nullptr) return std::nullopt;
  long long size_pages = 0;
  long long resident_pages = 0;
  const int fields = std::fscanf(file, "%lld %lld", &size_pages, &resident_pages);
  std::fclose(file);
  if (fields != 2) return std::nullopt;
  return static_cast<int64_t>(resident_pages) * sysconf(_SC_PAGESIZE);
}

// Peak resident set size of this process so far (Linux reports ru_maxrss in KiB).
inline int64_t PeakResidentBytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

class Stopwatch {
 public:
  // Milliseconds since construction or the previous Lap.
  double Lap() {
    const auto now = std::chrono::steady_clock::now();
    const double ms = std::chrono::duration<double, std::milli>(now - last_).count();
    last_ = now;
    return ms;
  }

 private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

}  // namespace wsync::cli

#endif  // WSYNC_INTEGRATION_CLI_PLAN_MEASURE_H_
