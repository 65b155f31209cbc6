#ifndef WSYNC_TESTS_GPU_GPU_COUNT_H_
#define WSYNC_TESTS_GPU_GPU_COUNT_H_

// GPUs by their device files (/dev/nvidia0, /dev/nvidia1, ...), without initialising CUDA (the
// gpu tests fork children that do). Header-only; test code.

#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace wsync::test {

inline int GpuCount() {
  int count = 0;
  while (access(absl::StrCat("/dev/nvidia", count).c_str(), F_OK) == 0) ++count;
  return count;
}

}  // namespace wsync::test

#endif  // WSYNC_TESTS_GPU_GPU_COUNT_H_
