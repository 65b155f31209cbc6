#ifndef WSYNC_TESTS_TESTING_LOOPBACK_THREADS_H_
#define WSYNC_TESTS_TESTING_LOOPBACK_THREADS_H_

// Threads as processes: every process of a job runs `body` on a thread of its own over a fresh
// in-process loopback fabric (transport/loopback), the tests' stand-in for a multi-process sync.

#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "transport/loopback/loopback.h"
#include "transport/transport.h"

namespace wsync::test {

// Runs body(p, transport, group) for p = 0 .. processes - 1, each on its own thread, over one
// LoopbackFabric of `processes` processes with UCX's eager sends (kUcxLikeEagerBytes: a notice a
// failed process sent still reaches a peer that posts its receive after the process returned),
// and returns each result once every thread has joined.
// The body owns its transport (it may wrap it, e.g. in a ForwardingTransport). A process whose
// Connect or MakeGroup fails gets that status as its result, without calling body. `Result` is
// absl::Status or an absl::StatusOr. Sets *counters (when not null) to the fabric's counters after
// the threads joined.
template <typename Result>
std::vector<Result> RunOnLoopbackThreads(
    int32_t processes,
    const std::function<Result(int32_t, std::unique_ptr<Transport>, Group&)>& body,
    LoopbackCounters* counters = nullptr) {
  LoopbackFabric fabric(processes, kUcxLikeEagerBytes);
  std::vector<Result> results(processes, Result(absl::UnknownError("not run")));
  std::vector<std::thread> threads;
  for (int32_t p = 0; p < processes; ++p) {
    threads.emplace_back([&, p] {
      absl::StatusOr<std::unique_ptr<Transport>> transport = fabric.Connect(p);
      absl::StatusOr<std::unique_ptr<Group>> group = fabric.MakeGroup(p);
      if (!transport.ok() || !group.ok()) {
        results[p] = Result(transport.ok() ? group.status() : transport.status());
        return;
      }
      results[p] = body(p, *std::move(transport), **group);
    });
  }
  for (std::thread& thread : threads) thread.join();
  if (counters != nullptr) *counters = fabric.counters();
  return results;
}

}  // namespace wsync::test

#endif  // WSYNC_TESTS_TESTING_LOOPBACK_THREADS_H_
