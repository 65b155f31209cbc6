// A message of sync N-1 still in flight (delayed, or replayed by a peer) during sync N is never
// matched by sync N's receives (the tag carries the sync id): it writes nothing, it is rejected
// and counted (TransferStats::rejected_messages, ExecuteOptions::rejected_messages and the
// wsync_rejected_messages_total metric), and sync N delivers exactly its own version. Over the
// in-process loopback fabric, with every process a thread. Also: a failpoint-failed send post
// (WSYNC_FAILPOINTS send:fail) fails the sync on the sender with the failpoint named, and the
// receivers by their deadline, never a false success.

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/failpoint.h"
#include "executor/execute.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/fill/fill.h"
#include "metrics/metrics.h"
#include "planner/builders.h"
#include "planner/plan.h"
#include "planner/policy.h"
#include "tests/testing/executor_checks.h"
#include "tests/testing/random_layouts.h"
#include "transport/forwarding_transport.h"
#include "transport/loopback/loopback.h"

namespace wsync {
namespace {

using test::BufferKey;
using test::HostBuffers;

Job RowsToColumns() { return test::RowsToColumnsJob(); }

// Forwards to a Transport and records the (peer, tag, bytes) of every send posted through it, so
// that a test can replay a past sync's messages exactly as the executor tagged them.
class RecordingTransport final : public ForwardingTransport {
 public:
  using ForwardingTransport::ForwardingTransport;
  struct Sent {
    int32_t peer;
    MessageTag tag;
    int64_t bytes;
  };
  std::vector<Sent>& sent() { return sent_; }
  absl::StatusOr<RequestId> PostSend(int32_t peer, MessageTag tag, const void* data,
                                     int64_t bytes) override {
    sent_.push_back(Sent{peer, tag, bytes});
    return ForwardingTransport::PostSend(peer, tag, data, bytes);
  }

 private:
  std::vector<Sent> sent_;
};

struct Sync {
  std::vector<absl::StatusOr<TransferStats>> results;
  std::vector<int64_t> rejected_by_option;  // ExecuteOptions::rejected_messages, by process.
};

// Runs sync `sync_id` on every process (threads). Before it, with `replay`, every source process
// posts again every send it posted in the previous sync (same peer, tag and size, as the executor
// tagged them), full of 0x5A: the previous sync's messages arriving late, or replayed.
Sync RunSync(const Job& job, const std::vector<Segment>& segments,
             std::vector<std::unique_ptr<RecordingTransport>>& transports,
             std::vector<std::unique_ptr<Group>>& groups, HostBuffers& source, HostBuffers& target,
             uint64_t sync_id, bool replay, absl::Duration deadline = absl::Seconds(30),
             bool verify = false) {
  Sync sync;
  sync.results.resize(job.num_processes(), absl::UnknownError("not run"));
  sync.rejected_by_option.assign(job.num_processes(), 0);
  Endpoints endpoints;
  for (int32_t p = 0; p < job.num_processes(); ++p) endpoints.processes.push_back(p);
  std::vector<unsigned char> garbage(1 << 16, 0x5A);
  std::vector<std::thread> threads;
  for (int32_t p = 0; p < job.num_processes(); ++p) {
    threads.emplace_back([&, p] {
      const bool is_source = job.IsSource(p);
      const LocalBuffers buffers = test::BuffersOf(job, p, source, target);
      const std::vector<RecordingTransport::Sent> previous = transports[p]->sent();
      if (is_source && replay) {
        ASSERT_FALSE(previous.empty());
        for (const RecordingTransport::Sent& m : previous) {
          ASSERT_LE(m.bytes, static_cast<int64_t>(garbage.size()));
          ASSERT_TRUE(transports[p]->PostSend(m.peer, m.tag, garbage.data(), m.bytes).ok());
        }
      }
      transports[p]->sent().clear();
      ExecuteOptions options;
      options.sync_id = sync_id;
      options.plan_digest = 42;
      options.deadline = absl::Now() + deadline;
      options.verify = verify ? VerifyMode::kHash : VerifyMode::kOff;
      options.rejected_messages = &sync.rejected_by_option[p];
      sync.results[p] = ExecuteTransfers(job, segments, endpoints, StagingBudget{1 << 20}, p,
                                         buffers, *transports[p], *groups[p], options);
    });
  }
  for (std::thread& thread : threads) thread.join();
  return sync;
}

class ReplayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(failpoint::SetForTesting("").ok());
    for (int32_t p = 0; p < job_.num_processes(); ++p) {
      transports_.push_back(std::make_unique<RecordingTransport>(*fabric_.Connect(p)));
      groups_.push_back(*fabric_.MakeGroup(p));
    }
  }
  void TearDown() override { ASSERT_TRUE(failpoint::SetForTesting("").ok()); }

  const Job job_ = RowsToColumns();
  const Plan plan_ = *MakePlan(job_, *MakeFirstHolderPolicy());
  LoopbackFabric fabric_{6};
  std::vector<std::unique_ptr<RecordingTransport>> transports_;
  std::vector<std::unique_ptr<Group>> groups_;
};

TEST_F(ReplayTest, AMessageOfThePreviousSyncWritesNothingAndIsCounted) {
  HostBuffers source(job_.source(), test::kSourceFill);
  HostBuffers target(job_.target(), test::kPoison);
  SessionMetrics metrics("rollout");
  for (uint64_t version : {1, 2, 3}) {
    SCOPED_TRACE(version);
    ASSERT_TRUE(test::FillLogical(job_.source(), version, &source).ok());
    Sync sync = RunSync(job_, plan_.segments, transports_, groups_, source, target, version,
                        /*replay=*/version > 1);
    int64_t rejected = 0;
    for (int32_t p = 0; p < job_.num_processes(); ++p) {
      ASSERT_TRUE(sync.results[p].ok()) << "process " << p << ": " << sync.results[p].status();
      EXPECT_EQ(sync.results[p]->rejected_messages, sync.rejected_by_option[p]);
      EXPECT_TRUE(sync.results[p]->rejected_messages == 0 || !job_.IsSource(p))
          << "a sender rejected a message it never receives";
      rejected += sync.results[p]->rejected_messages;
      metrics.RecordRejected("stale_sync", sync.results[p]->rejected_messages);
    }
    // Every replayed send of the previous sync (8 of them) was rejected by its receiver before
    // the receiver finished, and nothing was left unmatched.
    EXPECT_EQ(rejected, version > 1 ? 8 : 0);
    EXPECT_EQ(fabric_.UnmatchedRequests(), 0);
    EXPECT_TRUE(test::CheckLogical(job_.target(), target, version).ok())
        << test::CheckLogical(job_.target(), target, version);
  }
  EXPECT_THAT(metrics.Text(),
              ::testing::HasSubstr(
                  "wsync_rejected_messages_total{role=\"rollout\",reason=\"stale_sync\"} 16"));
}

TEST_F(ReplayTest, AFailedSendPostFailsTheSyncNeverAFalseSuccess) {
  HostBuffers source(job_.source(), test::kSourceFill);
  HostBuffers target(job_.target(), test::kPoison);
  ASSERT_TRUE(test::FillLogical(job_.source(), 1, &source).ok());
  ASSERT_TRUE(failpoint::SetForTesting("send:fail@3").ok());
  Sync sync = RunSync(job_, plan_.segments, transports_, groups_, source, target, 1,
                      /*replay=*/false, absl::Seconds(2));
  int failed = 0;
  bool named = false;
  for (int32_t p = 0; p < job_.num_processes(); ++p) {
    if (sync.results[p].ok()) continue;
    ++failed;
    named = named ||
            sync.results[p].status().message().find("failpoint 'send'") != absl::string_view::npos;
  }
  EXPECT_TRUE(named);
  // The receiver of the unsent message cannot have succeeded; CheckLogical fails somewhere.
  EXPECT_GE(failed, 2);
  EXPECT_FALSE(test::CheckLogical(job_.target(), target, 1).ok());
}

// verify=true on a clean sync: every chunk any process received was hashed on both sides and
// compared, and the data is exactly the version.
TEST_F(ReplayTest, VerifyChecksEveryReceivedChunkOfACleanSync) {
  HostBuffers source(job_.source(), test::kSourceFill);
  HostBuffers target(job_.target(), test::kPoison);
  Endpoints endpoints;
  for (int32_t p = 0; p < job_.num_processes(); ++p) endpoints.processes.push_back(p);
  int64_t received_chunks = 0;
  for (int32_t p = 0; p < job_.num_processes(); ++p) {
    absl::StatusOr<ProcessSchedule> schedule =
        ScheduleTransfers(job_, plan_.segments, endpoints, StagingBudget{1 << 20}, p);
    ASSERT_TRUE(schedule.ok()) << schedule.status();
    for (const PeerSchedule& peer : schedule->peers) {
      if (peer.direction != Direction::kReceive) continue;
      for (const ScheduledRound& round : peer.rounds) received_chunks += round.chunks;
    }
  }
  ASSERT_GT(received_chunks, 0);
  for (uint64_t version : {1, 2}) {
    ASSERT_TRUE(test::FillLogical(job_.source(), version, &source).ok());
    Sync sync = RunSync(job_, plan_.segments, transports_, groups_, source, target, version,
                        /*replay=*/false, absl::Seconds(30), /*verify=*/true);
    int64_t verified = 0;
    for (int32_t p = 0; p < job_.num_processes(); ++p) {
      ASSERT_TRUE(sync.results[p].ok()) << "process " << p << ": " << sync.results[p].status();
      verified += sync.results[p]->verified_chunks;
    }
    EXPECT_EQ(verified, received_chunks);
    EXPECT_TRUE(test::CheckLogical(job_.target(), target, version).ok());
  }
}

// A byte flipped after packing the k-th staged message (every k the sync has): without verify
// the transfer "succeeds" with a wrong element (the control trial shows the fault is real); with
// verify=true the receiver of that message fails with DataLoss naming the sender and the chunk.
// Zero false successes over every trial.
TEST_F(ReplayTest, AFlippedByteWithVerifyNeverSucceeds) {
  HostBuffers source(job_.source(), test::kSourceFill);
  HostBuffers target(job_.target(), test::kPoison);
  ASSERT_TRUE(failpoint::SetForTesting("pack:flip@1000000").ok());
  ASSERT_TRUE(test::FillLogical(job_.source(), 1, &source).ok());
  RunSync(job_, plan_.segments, transports_, groups_, source, target, 1, false);
  const int64_t packs = failpoint::Hits("pack");
  ASSERT_GT(packs, 0) << "the job stages nothing: no pack to flip";
  uint64_t version = 1;
  for (int64_t k = 1; k <= packs; ++k) {
    for (bool verify : {false, true}) {
      SCOPED_TRACE(absl::StrCat("flip at pack ", k, verify ? " with" : " without", " verify"));
      ++version;
      ASSERT_TRUE(failpoint::SetForTesting(absl::StrCat("pack:flip@", k)).ok());
      ASSERT_TRUE(test::FillLogical(job_.source(), version, &source).ok());
      Sync sync = RunSync(job_, plan_.segments, transports_, groups_, source, target, version,
                          /*replay=*/false, absl::Seconds(30), verify);
      EXPECT_FALSE(test::CheckLogical(job_.target(), target, version).ok()) << "nothing flipped";
      int failed = 0;
      for (int32_t p = 0; p < job_.num_processes(); ++p) {
        if (sync.results[p].ok()) continue;
        ++failed;
        const absl::Status& status = sync.results[p].status();
        EXPECT_TRUE(absl::IsDataLoss(status)) << status;
        EXPECT_THAT(std::string(status.message()),
                    ::testing::ContainsRegex("verify: chunk [0-9]+ of [0-9]+ from process [01] "
                                             "differs \\(parameter 'w'"));
      }
      EXPECT_EQ(failed, verify ? 1 : 0);
    }
  }
}

// The k-th send goes out without the second half of its last chunk: the receiver fails (the
// transport refuses the size; verify would refuse the hash), never a false success.
TEST_F(ReplayTest, ATruncatedLastChunkWithVerifyNeverSucceeds) {
  HostBuffers source(job_.source(), test::kSourceFill);
  HostBuffers target(job_.target(), test::kPoison);
  for (int k = 1; k <= 8; ++k) {
    SCOPED_TRACE(absl::StrCat("truncated send ", k));
    ASSERT_TRUE(failpoint::SetForTesting(absl::StrCat("truncate:fail@", k)).ok());
    ASSERT_TRUE(test::FillLogical(job_.source(), k, &source).ok());
    Sync sync = RunSync(job_, plan_.segments, transports_, groups_, source, target, k,
                        /*replay=*/false, absl::Seconds(1), /*verify=*/true);
    int failed = 0;
    for (int32_t p = 0; p < job_.num_processes(); ++p) failed += sync.results[p].ok() ? 0 : 1;
    EXPECT_GE(failed, 1) << "a truncated message was reported as a success";
  }
}

}  // namespace
}  // namespace wsync
