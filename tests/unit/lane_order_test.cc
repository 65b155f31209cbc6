// The executor's lanes (a transport that needs no round order) under completions in adversarial
// orders: each process runs alone over a transport whose requests all finish, one per WaitAny,
// first, last or at a random position of the wait list (test::SinkTransport), watched at every
// call. Checked at every moment: each lane posts its scheduled messages in order, with at most
// two posted and not completed (in lane order); every WaitAny waits on exactly the requests
// posted and not finished; and when the run waits, no lane could post (it has two in flight, its
// next message's arena slot is taken, or it is a forward whose round the receive lanes have not
// reached), so none is starved. The run ends with every message posted and its stats equal to
// its schedule.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "executor/execute.h"
#include "executor/schedule.h"
#include "executor/work.h"
#include "gtest/gtest.h"
#include "integration/fill/fill.h"
#include "planner/policy.h"
#include "tests/testing/executor_checks.h"
#include "tests/testing/fan_out_job.h"
#include "tests/testing/random_layouts.h"
#include "tests/testing/sink_transport.h"
#include "transport/forwarding_transport.h"

namespace wsync {
namespace {

using executor_internal::Lane;
using executor_internal::Message;
using executor_internal::Work;
using test::SinkTransport;

constexpr uint64_t kSyncId = 7;
constexpr int64_t kLaneMessagesInFlight = 2;

// Watches process `work.process`'s run over a SinkTransport against `work`, the lanes it must
// run (executor/work.h), and records every breach of the properties above.
class LaneWatcher final : public ForwardingTransport {
 public:
  LaneWatcher(const Work& work, SinkTransport::Order order, uint64_t seed)
      : ForwardingTransport(std::make_unique<SinkTransport>(work.process, order, seed)),
        work_(work),
        lanes_(work.lanes.size()) {
    for (size_t lane = 0; lane < work.lanes.size(); ++lane) {
      lane_of_[Key(work.lanes[lane].peer, work.lanes[lane].direction)] = lane;
    }
  }

  absl::StatusOr<RequestId> PostSend(int32_t peer, MessageTag tag, const void* data,
                                     int64_t bytes) override {
    return Watch(peer, Direction::kSend, tag, bytes,
                 ForwardingTransport::PostSend(peer, tag, data, bytes));
  }
  absl::StatusOr<RequestId> PostReceive(int32_t peer, MessageTag tag, void* data,
                                        int64_t bytes) override {
    return Watch(peer, Direction::kReceive, tag, bytes,
                 ForwardingTransport::PostReceive(peer, tag, data, bytes));
  }
  absl::Status WaitAny(absl::Span<const RequestId> requests, absl::Time deadline,
                       std::vector<size_t>* finished) override {
    ++waits_;
    CheckWaitList(requests);
    CheckNoLaneCouldPost();
    const size_t before = finished->size();
    absl::Status status = ForwardingTransport::WaitAny(requests, deadline, finished);
    for (size_t i = before; i < finished->size(); ++i) Finish(requests[(*finished)[i]]);
    return status;
  }
  absl::Status WaitAll(absl::Span<const RequestId> requests, absl::Time deadline) override {
    for (RequestId request : requests) Finish(request);
    return ForwardingTransport::WaitAll(requests, deadline);
  }

  // Every breach seen, one line each.
  const std::vector<std::string>& breaches() const { return breaches_; }
  int64_t waits() const { return waits_; }
  // Messages lane `lane` posted.
  int64_t posted(size_t lane) const { return std::ssize(lanes_[lane].posted); }

 private:
  struct Posted {
    RequestId request = 0;
    bool finished = false;
  };
  struct LaneState {
    std::vector<Posted> posted;  // In post order.
    int64_t completed = 0;       // The posted prefix that finished: completed in lane order.
  };

  static int64_t Key(int32_t peer, Direction direction) {
    return int64_t{peer} * 2 + (direction == Direction::kSend ? 0 : 1);
  }

  absl::StatusOr<RequestId> Watch(int32_t peer, Direction direction, MessageTag tag, int64_t bytes,
                                  absl::StatusOr<RequestId> request) {
    const auto it = lane_of_.find(Key(peer, direction));
    if (it == lane_of_.end()) {
      breaches_.push_back(absl::StrCat("a post to peer ", peer, " that no lane has"));
      return request;
    }
    const size_t lane = it->second;
    const Lane& l = work_.lanes[lane];
    LaneState& state = lanes_[lane];
    const int64_t index = std::ssize(state.posted);
    if (index >= std::ssize(l.messages)) {
      breaches_.push_back(absl::StrCat("lane ", lane, " posted more than its messages"));
      return request;
    }
    const Message& expected = l.messages[index];
    const int32_t sender = direction == Direction::kSend ? work_.process : peer;
    if (!(tag == MakeTag(kSyncId, expected.round, sender)) || bytes != expected.bytes) {
      breaches_.push_back(absl::StrCat("lane ", lane, " message ", index,
                                       " is not its scheduled message (out of order)"));
    }
    if (index - state.completed >= kLaneMessagesInFlight) {
      breaches_.push_back(absl::StrCat("lane ", lane, " posted message ", index, " with ",
                                       index - state.completed, " in flight"));
    }
    if (request.ok()) {
      state.posted.push_back({*request, false});
      lane_by_request_[*request] = lane;
    }
    return request;
  }

  void Finish(RequestId request) {
    const auto it = lane_by_request_.find(request);
    if (it == lane_by_request_.end()) return;
    LaneState& state = lanes_[it->second];
    for (Posted& posted : state.posted) {
      if (posted.request == request) posted.finished = true;
    }
    while (state.completed < std::ssize(state.posted) && state.posted[state.completed].finished) {
      ++state.completed;
    }
    lane_by_request_.erase(it);
  }

  void CheckWaitList(absl::Span<const RequestId> requests) {
    std::vector<RequestId> waited(requests.begin(), requests.end());
    std::vector<RequestId> unfinished;
    for (const LaneState& state : lanes_) {
      for (const Posted& posted : state.posted) {
        if (!posted.finished) unfinished.push_back(posted.request);
      }
    }
    std::sort(waited.begin(), waited.end());
    std::sort(unfinished.begin(), unfinished.end());
    if (waited != unfinished) {
      breaches_.push_back(absl::StrCat("wait ", waits_, " waits on ", waited.size(),
                                       " requests, not the ", unfinished.size(), " unfinished"));
    }
  }

  // The run waits: every lane with a message left to post must be unable to post it.
  void CheckNoLaneCouldPost() {
    int32_t landed = std::numeric_limits<int32_t>::max();
    for (size_t lane = 0; lane < lanes_.size(); ++lane) {
      const Lane& l = work_.lanes[lane];
      if (l.direction == Direction::kReceive && lanes_[lane].completed < std::ssize(l.messages)) {
        landed = std::min(landed, l.messages[lanes_[lane].completed].round);
      }
    }
    for (size_t lane = 0; lane < lanes_.size(); ++lane) {
      const Lane& l = work_.lanes[lane];
      const LaneState& state = lanes_[lane];
      const int64_t next = std::ssize(state.posted);
      if (next == std::ssize(l.messages)) continue;
      if (next - state.completed >= kLaneMessagesInFlight) continue;  // Full.
      const Message& message = l.messages[next];
      if (l.forwarding && l.direction == Direction::kSend && message.round > landed) continue;
      bool slot_taken = false;
      for (int64_t index = state.completed; index < next && !message.direct; ++index) {
        const Message& in_flight = l.messages[index];
        slot_taken |= !in_flight.direct && in_flight.slot == message.slot;
      }
      if (slot_taken) continue;
      breaches_.push_back(absl::StrCat("wait ", waits_, ": lane ", lane, " could post message ",
                                       next, " but waits (starved)"));
    }
  }

  const Work& work_;
  absl::flat_hash_map<int64_t, size_t> lane_of_;  // By Key(peer, direction).
  std::vector<LaneState> lanes_;
  absl::flat_hash_map<RequestId, size_t> lane_by_request_;  // Unfinished requests.
  std::vector<std::string> breaches_;
  int64_t waits_ = 0;
};

// Runs process `p` of the job alone under every completion order, checking the properties above;
// adds to `waits` the WaitAny calls of the runs (how often lanes were checked for starvation).
void ExpectLanesKeepOrderAndBound(const Job& job, const std::vector<Segment>& segments,
                                  const StagingBudget& budget, int32_t p, uint64_t seed,
                                  int64_t* waits) {
  const Endpoints endpoints = test::AllProcesses(job);
  absl::StatusOr<Work> work = executor_internal::BuildWork(job, segments, endpoints, budget, p);
  absl::StatusOr<ProcessSchedule> schedule = ScheduleTransfers(job, segments, endpoints, budget, p);
  ASSERT_EQ(work.ok(), schedule.ok());
  if (!work.ok()) return;  // A budget too small to stage some row: refused, tested elsewhere.
  test::HostBuffers source(job.source(), test::kSourceFill);
  test::HostBuffers target(job.target(), test::kPoison);
  const LocalBuffers buffers = test::BuffersOf(job, p, source, target);
  for (const SinkTransport::Order order :
       {SinkTransport::Order::kFirst, SinkTransport::Order::kLast, SinkTransport::Order::kRandom}) {
    SCOPED_TRACE(testing::Message()
                 << "process " << p << ", completion order " << static_cast<int>(order));
    LaneWatcher watcher(*work, order, seed);
    test::SoloGroup group(p);
    ExecuteOptions options;
    options.sync_id = kSyncId;
    options.deadline = absl::Now() + absl::Seconds(30);
    absl::StatusOr<TransferStats> stats =
        ExecuteTransfers(job, segments, endpoints, budget, p, buffers, watcher, group, options);
    ASSERT_TRUE(stats.ok()) << stats.status();
    test::ExpectStatsMatchSchedule(*schedule, *stats);
    for (const std::string& breach : watcher.breaches()) ADD_FAILURE() << breach;
    *waits += watcher.waits();
    for (size_t lane = 0; lane < work->lanes.size(); ++lane) {
      EXPECT_EQ(watcher.posted(lane), std::ssize(work->lanes[lane].messages)) << "lane " << lane;
    }
  }
}

TEST(LaneOrderTest, RandomJobsKeepLaneOrderAndTheInFlightBoundUnderAnyCompletionOrder) {
  const int64_t kBudgets[] = {64, 256, 1024, 4096};
  int64_t waits = 0;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    std::mt19937_64 rng(seed);
    test::RandomLayoutOptions layout_options;
    layout_options.max_nodes = 2;  // Relaying (planned by default when it pays) forwards.
    const test::LayoutPair pair = test::RandomLayoutPair(rng, layout_options);
    absl::StatusOr<Job> job = Job::Create(pair.source, pair.target);
    ASSERT_TRUE(job.ok()) << job.status();
    test::RandomAnswersPolicy policy(seed);
    absl::StatusOr<Plan> plan = MakePlan(*job, policy);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const StagingBudget budget{static_cast<double>(kBudgets[seed % 4])};
    for (int32_t p = 0; p < job->num_processes(); ++p) {
      ExpectLanesKeepOrderAndBound(*job, plan->segments, budget, p, seed, &waits);
    }
  }
  EXPECT_GT(waits, 1000);
}

// Relayed plans: forwarding sends wait for the receive lanes (every process its own plan).
TEST(LaneOrderTest, ForwardsWaitForTheirRoundUnderAnyCompletionOrder) {
  int64_t forwarding = 0, waits = 0;
  for (uint64_t seed = 0; seed < 30; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    absl::StatusOr<test::RelayedCase> relayed = test::MakeRelayedCase(seed, 4096);
    ASSERT_TRUE(relayed.ok()) << relayed.status();
    const StagingBudget budget{static_cast<double>(seed % 2 == 0 ? 256 : 4096)};
    for (int32_t p = 0; p < relayed->job.num_processes(); ++p) {
      absl::StatusOr<ProcessSchedule> schedule = ScheduleTransfers(
          relayed->job, relayed->own[p], test::AllProcesses(relayed->job), budget, p);
      if (schedule.ok()) {
        for (const PeerSchedule& lane : schedule->peers) forwarding += lane.forwarding;
      }
      ExpectLanesKeepOrderAndBound(relayed->job, relayed->own[p], budget, p, seed, &waits);
    }
  }
  EXPECT_GT(forwarding, 0);  // Forwarding lanes were exercised.
  EXPECT_GT(waits, 1000);
}

// Many lanes of many staged messages (column blocks of one row shard, packed ahead in shared
// passes): one trainer sends to 24 rollouts, 12 messages each.
TEST(LaneOrderTest, ManyStagedLanesUnderAnyCompletionOrder) {
  constexpr int32_t kLanes = 24;
  const Dims shape{24, kLanes * 16};
  const Job job = *test::FanOutJob(shape, 1, kLanes);
  const Plan plan = *MakePlan(job, *MakeFirstHolderPolicy());
  const StagingBudget budget{256};  // Two rows (128 bytes, strided at the sender) per message.
  const ProcessSchedule trainer =
      *ScheduleTransfers(job, plan.segments, test::AllProcesses(job), budget, 0);
  ASSERT_EQ(trainer.peers.size(), static_cast<size_t>(kLanes));
  ASSERT_EQ(trainer.peers[0].rounds.size(), 12u);
  ASSERT_EQ(trainer.staged_bytes, Volume(WholeBox(shape)) * 4);
  int64_t waits = 0;
  for (int32_t p = 0; p <= kLanes; ++p) {
    ExpectLanesKeepOrderAndBound(job, plan.segments, budget, p, /*seed=*/p + 1, &waits);
  }
  EXPECT_GE(waits, 3 * 2 * kLanes * 12);  // Each message waited for, at both ends.
}

}  // namespace
}  // namespace wsync
