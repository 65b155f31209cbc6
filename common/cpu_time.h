#ifndef WSYNC_COMMON_CPU_TIME_H_
#define WSYNC_COMMON_CPU_TIME_H_

#include <time.h>

namespace wsync {

// CPU time consumed by the calling thread, in seconds (CLOCK_THREAD_CPUTIME_ID). Differences of two
// readings measure work done by this thread, excluding time other threads held the core.
inline double ThreadCpuSeconds() {
  timespec now;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

}  // namespace wsync

#endif  // WSYNC_COMMON_CPU_TIME_H_
