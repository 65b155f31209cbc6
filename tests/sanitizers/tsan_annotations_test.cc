// Checks the ThreadSanitizer annotations of absl_tsan_annotations.cc from the side that matters:
// sharing Abseil objects across threads the way wsync does raises no report in the TSan build
// (halt_on_error turns a report into this test's failure). Elsewhere the test only checks the
// values, which is all a build without TSan can see.
//
// The threads synchronize only through relaxed atomics, which give TSan no happens-before edge:
// whatever orders their accesses must come from the annotated Abseil calls themselves.

#include <atomic>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace {

void SpinUntil(const std::atomic<int>& flag, int value) {
  while (flag.load(std::memory_order_relaxed) != value) std::this_thread::yield();
}

// The executor_test report of 2026-12-01: loopback handed one failure status to several
// processes' threads; each copied it and dropped its copy; the last drop deleted the shared
// representation inside Abseil (uninstrumented), which TSan took for a race with the other
// threads' copies.
TEST(TsanAnnotationsTest, ThreadsDroppingCopiesOfOneErrorStatus) {
  constexpr int kThreads = 4;
  std::atomic<int> dropped{0};
  std::atomic<int> seen_code{0};
  std::vector<std::thread> threads;
  {
    const absl::Status original = absl::UnavailableError("peer 3 is gone");
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&] {
        {
          absl::Status copy = original;  // Increments the shared count in this thread.
          seen_code.fetch_add(static_cast<int>(copy.code()), std::memory_order_relaxed);
        }  // Decrements it inside Abseil.
        dropped.fetch_add(1, std::memory_order_relaxed);
        SpinUntil(dropped, -1);  // Alive until after the deletion, as a sync's threads are.
      });
    }
    SpinUntil(dropped, kThreads);
  }  // `original` holds the last reference: Abseil deletes the representation here.
  dropped.store(-1, std::memory_order_relaxed);
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(seen_code.load(), kThreads * static_cast<int>(absl::StatusCode::kUnavailable));
}

// A Mutex orders the accesses it guards, across threads that meet only through relaxed atomics.
TEST(TsanAnnotationsTest, MutexGuardedCounter) {
  absl::Mutex mu;
  int counter = 0;  // Guarded by mu.
  std::atomic<int> done{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        absl::MutexLock lock(&mu);
        ++counter;
      }
      done.fetch_add(1, std::memory_order_relaxed);
    });
  }
  SpinUntil(done, 4);
  {
    absl::MutexLock lock(&mu);
    EXPECT_EQ(counter, 4000);
  }
  for (std::thread& thread : threads) thread.join();
}

}  // namespace
