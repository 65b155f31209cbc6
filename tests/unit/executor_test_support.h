#ifndef WSYNC_TESTS_UNIT_EXECUTOR_TEST_SUPPORT_H_
#define WSYNC_TESTS_UNIT_EXECUTOR_TEST_SUPPORT_H_

// What the executor's tests share (executor_test.cc, executor_refusals_test.cc, the delta and
// quantization tests): every process of a job run as a thread over one loopback fabric, a
// transport that needs round order, one that fails a receive, delta sync's state between syncs,
// and lane lookups in a schedule.

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "executor/delta_base.h"
#include "executor/execute.h"
#include "executor/schedule.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/fill/fill.h"
#include "planner/builders.h"
#include "planner/policy.h"
#include "tests/testing/executor_checks.h"
#include "tests/testing/random_layouts.h"
#include "transport/forwarding_transport.h"
#include "transport/loopback/loopback.h"

namespace wsync::test::executor {

using test::AllProcesses;
using test::HostBuffers;

// The transport of a backend that needs round order (as NCCL does): the executor runs lockstep
// rounds over it.
class LockstepTransport final : public ForwardingTransport {
 public:
  using ForwardingTransport::ForwardingTransport;
  bool NeedsRoundOrder() const override { return true; }
};

// Holds back the first receive from `peer` until `gone` is notified (at most 30 s): a process
// that reaches its receives after the peer's run ended.
class ReceiveAfterPeerGoneTransport final : public ForwardingTransport {
 public:
  ReceiveAfterPeerGoneTransport(std::unique_ptr<Transport> inner, int32_t peer,
                                absl::Notification& gone)
      : ForwardingTransport(std::move(inner)), peer_(peer), gone_(gone) {}
  absl::StatusOr<RequestId> PostReceive(int32_t peer, MessageTag tag, void* data,
                                        int64_t bytes) override {
    if (peer == peer_) gone_.WaitForNotificationWithTimeout(absl::Seconds(30));
    return ForwardingTransport::PostReceive(peer, tag, data, bytes);
  }

 private:
  const int32_t peer_;
  absl::Notification& gone_;
};

// Fails the receive this process posts after `after` others: a sync that aborts mid-transfer.
class FailingReceives final : public ForwardingTransport {
 public:
  FailingReceives(std::unique_ptr<Transport> inner, int32_t after)
      : ForwardingTransport(std::move(inner)), left_(after) {}
  absl::StatusOr<RequestId> PostReceive(int32_t peer, MessageTag tag, void* data,
                                        int64_t bytes) override {
    if (left_-- == 0) return absl::UnavailableError("injected receive failure");
    return ForwardingTransport::PostReceive(peer, tag, data, bytes);
  }

 private:
  int32_t left_;
};

// Delta sync's state of a job's processes between syncs: trainers' bases, rollouts' held
// versions.
struct DeltaJobState {
  std::vector<std::unique_ptr<DeltaBaseStore>> bases;
  std::vector<std::optional<uint64_t>> held;

  // After sync `version` ran on every process: commits every store and held version when every
  // run succeeded, else aborts them (no rollout holds a version then), as a session does.
  void Decide(const Job& job, const std::vector<absl::StatusOr<TransferStats>>& results,
              uint64_t version) {
    bool committed = true;
    for (const auto& result : results) committed = committed && result.ok();
    for (int32_t p = 0; p < job.num_processes(); ++p) {
      if (committed) {
        bases[p]->Commit(version);
      } else {
        bases[p]->Abort();
      }
      if (!job.IsSource(p)) held[p] = committed ? std::optional(version) : std::nullopt;
    }
  }
};

// Wraps process p's transport, or returns it as it is.
using WrapTransport =
    std::function<std::unique_ptr<Transport>(int32_t p, std::unique_ptr<Transport> transport)>;

struct BatchRun {
  std::vector<absl::StatusOr<TransferStats>> results;
  LoopbackCounters counters;
};

// Runs every process of the job as a thread over one loopback fabric. `digest_of(p)` is the plan
// digest process p claims; `drop_buffer_of` makes that process lose one buffer address;
// `segments_of(p)`, when given, replaces `segments` for process p (its own plan).
inline BatchRun RunBatch(const Job& job, const std::vector<Segment>& segments, StagingBudget budget,
                         HostBuffers& source, HostBuffers& target,
                         const std::function<uint64_t(int32_t)>& digest_of = {},
                         int32_t drop_buffer_of = -1,
                         const std::function<std::vector<Segment>(int32_t)>& segments_of = {},
                         bool verify = false, const WrapTransport& wrap = {},
                         absl::Duration deadline = absl::Seconds(60),
                         const std::function<VerifyMode(int32_t)>& verify_of = {}) {
  LoopbackFabric fabric(job.num_processes());
  BatchRun run;
  run.results.resize(job.num_processes(), absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  const Endpoints endpoints = AllProcesses(job);
  for (int32_t p = 0; p < job.num_processes(); ++p) {
    threads.emplace_back([&, p] {
      auto transport = fabric.Connect(p);
      auto group = fabric.MakeGroup(p);
      if (!transport.ok() || !group.ok()) {
        run.results[p] = transport.ok() ? group.status() : transport.status();
        return;
      }
      if (wrap) *transport = wrap(p, *std::move(transport));
      LocalBuffers buffers = test::BuffersOf(job, p, source, target);
      if (p == drop_buffer_of && !buffers.empty()) buffers.erase(buffers.begin());
      ExecuteOptions options;
      options.sync_id = 7;
      options.plan_digest = digest_of ? digest_of(p) : 42;
      options.deadline = absl::Now() + deadline;
      options.verify = verify ? VerifyMode::kHash : VerifyMode::kOff;
      if (verify_of) options.verify = verify_of(p);
      const std::vector<Segment> mine = segments_of ? segments_of(p) : segments;
      run.results[p] =
          ExecuteTransfers(job, mine, endpoints, budget, p, buffers, **transport, **group, options);
    });
  }
  for (std::thread& thread : threads) thread.join();
  run.counters = fabric.counters();
  return run;
}

// The lane of `schedule` with `peer` in `direction`, or nullptr.
inline const PeerSchedule* FindLane(const ProcessSchedule& schedule, int32_t peer,
                                    Direction direction) {
  for (const PeerSchedule& lane : schedule.peers) {
    if (lane.peer == peer && lane.direction == direction) return &lane;
  }
  return nullptr;
}

inline Job RowsToColumns() { return test::RowsToColumnsJob(); }

}  // namespace wsync::test::executor

#endif  // WSYNC_TESTS_UNIT_EXECUTOR_TEST_SUPPORT_H_
