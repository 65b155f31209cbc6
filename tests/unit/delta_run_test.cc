// Delta sync on the executor's data path (executor/delta_run.h): consecutive small updates travel
// as encodings and land bit-exact; a rollout that holds no version, or another version than its
// sender's base, gets dense; an aborted sync falls back to dense; bad encodings and
// announcements from the wire are refused with DataLoss and the target left untouched.

#include "executor/delta_run.h"

#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "executor/agreement.h"
#include "executor/delta_base.h"
#include "executor/delta_codec.h"
#include "executor/execute.h"
#include "executor/schedule.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/fill/fill.h"
#include "planner/builders.h"
#include "planner/policy.h"
#include "tests/testing/executor_checks.h"
#include "tests/testing/random_layouts.h"
#include "tests/unit/executor_test_support.h"
#include "transport/forwarding_transport.h"
#include "transport/loopback/loopback.h"

namespace wsync {
namespace {

using test::BufferKey;
using test::HostBuffers;
using ::testing::HasSubstr;

constexpr int32_t kTrainers = 2;
constexpr int32_t kRollouts = 3;

// "w" bf16 [240, 480] split by rows over 2 trainers and by columns over 3 rollouts (strided at
// the senders, packed at the receivers), "n" fp32 [960] split 2 ways and 3 ways (packed), each
// in a buffer of its own.
Job DeltaJob() {
  LayoutBuilder source(Role::kTrainer);
  LayoutBuilder target(Role::kRollout);
  for (int32_t p = 0; p < kTrainers; ++p) source.AddProcess("n");
  for (int32_t p = 0; p < kRollouts; ++p) target.AddProcess("n");
  for (LayoutBuilder* b : {&source, &target}) {
    const bool trainer = b == &source;
    const int32_t parts = trainer ? kTrainers : kRollouts;
    const int32_t w = b->AddParam("w", DType::kBFloat16, {240, 480});
    const int32_t n = b->AddParam("n", DType::kFloat32, {960});
    for (int32_t p = 0; p < parts; ++p) {
      const Box wb = SplitBox({240, 480}, trainer ? 0 : 1, parts, p);
      const Box nb = SplitBox({960}, 0, parts, p);
      b->AddPackedPiece(w, p, b->AddBuffer(p, Volume(wb) * 2), wb, 0);
      b->AddPackedPiece(n, p, b->AddBuffer(p, Volume(nb) * 4), nb, 0);
    }
  }
  return *Job::Create(std::move(source).Build(), std::move(target).Build());
}

// Changes about `fraction` of the 2-byte words of every trainer buffer (each bf16 element, each
// half of an fp32 one), each changed word for certain.
// `wholly_below`: buffers of fewer bytes (the "n" ones) change in every word.
void SmallUpdate(const Job& job, HostBuffers& source, double fraction, std::mt19937_64& random,
                 int64_t wholly_below = 0) {
  for (const BufferInfo& info : job.source().buffers) {
    std::bernoulli_distribution change(info.bytes < wholly_below ? 1.0 : fraction);
    const int64_t element = 2;
    unsigned char* data = source.data(BufferKey{info.process, info.id});
    for (int64_t at = 0; at + element <= info.bytes; at += element) {
      if (change(random)) data[at + random() % element] ^= 1 + random() % 255;
    }
  }
}

using test::executor::DeltaJobState;
using test::executor::FailingReceives;

// Every process new: an empty store, no held version.
DeltaJobState NewDeltaJobState(const Job& job) {
  DeltaJobState state;
  for (int32_t p = 0; p < job.num_processes(); ++p) {
    state.bases.push_back(std::make_unique<DeltaBaseStore>(int64_t{1} << 30));
  }
  state.held.assign(job.num_processes(), std::nullopt);
  return state;
}

// Runs sync `version` on every process as threads over one loopback fabric, with delta on and
// verify, then commits (every run OK) or aborts each store and held version, as a session does.
std::vector<absl::StatusOr<TransferStats>> Sync(
    const Job& job, const Plan& plan, HostBuffers& source, HostBuffers& target,
    DeltaJobState& state, uint64_t version, bool lockstep, int32_t fail_process = -1,
    std::function<void(int32_t, DeltaOptions&)> tweak = nullptr) {
  LoopbackFabric fabric(job.num_processes());
  std::vector<absl::StatusOr<TransferStats>> results(job.num_processes(),
                                                     absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int32_t p = 0; p < job.num_processes(); ++p) {
    threads.emplace_back([&, p] {
      absl::StatusOr<std::unique_ptr<Transport>> transport = fabric.Connect(p);
      absl::StatusOr<std::unique_ptr<Group>> group = fabric.MakeGroup(p);
      ASSERT_TRUE(transport.ok() && group.ok());
      std::unique_ptr<Transport> used = *std::move(transport);
      if (p == fail_process) used = std::make_unique<FailingReceives>(std::move(used), 4);
      if (lockstep) used = std::make_unique<test::executor::LockstepTransport>(std::move(used));
      // Verify, but in the failing sync: a sender's hash message to a receiver that failed waits
      // for the deadline (the verifier's, not delta's).
      ExecuteOptions options = test::SyncOptionsOf(
          plan, version, fail_process < 0 ? VerifyMode::kHash : VerifyMode::kOff);
      options.delta.on = true;
      options.delta.bases = state.bases[p].get();
      options.delta.held_version = state.held[p];
      if (tweak) tweak(p, options.delta);
      results[p] =
          ExecuteTransfers(job, plan.segments, test::AllProcesses(job), StagingBudget{4096}, p,
                           test::BuffersOf(job, p, source, target), *used, **group, options);
    });
  }
  for (std::thread& thread : threads) thread.join();
  state.Decide(job, results, version);
  return results;
}

// Every target byte equals what the reference copier writes from `source` for the plan.
void ExpectTargetsExact(const Job& job, const Plan& plan, const HostBuffers& source,
                        const HostBuffers& target) {
  HostBuffers expected(job.target(), test::kPoison);
  test::WriteCounts counts(job.target());
  ASSERT_TRUE(test::ExecutePlanReference(job, plan.segments, source, &expected, &counts).ok());
  ASSERT_TRUE(target.CheckGuards().ok());
  for (const BufferKey& key : expected.keys()) {
    ASSERT_EQ(0, std::memcmp(expected.data(key), target.data(key), expected.bytes(key)))
        << "rollout process " << key.process << " buffer " << key.buffer;
  }
}

TEST(DeltaRunTest, TwentySmallUpdatesLandBitExactAsDeltasAndFallBackToDensePerRollout) {
  const Job job = DeltaJob();
  const Plan plan = *MakePlan(job, *MakeFirstHolderPolicy());
  const std::vector<ProcessSchedule> schedules =
      *ScheduleTransfers(job, plan.segments, test::AllProcesses(job), StagingBudget{4096});
  HostBuffers source(job.source(), test::kSourceFill);
  ASSERT_TRUE(test::FillLogical(job.source(), 1, &source).ok());
  HostBuffers target(job.target(), test::kPoison);
  DeltaJobState state = NewDeltaJobState(job);
  std::mt19937_64 random(44);
  const int32_t kFirstRollout = kTrainers;
  int64_t wire_bytes = 0, dense_bytes = 0;  // Of the rollouts that got deltas.
  for (uint64_t version = 1; version <= 20; ++version) {
    SCOPED_TRACE(testing::Message() << "version " << version);
    if (version > 1) SmallUpdate(job, source, 0.02, random);
    // Dense for the rollout whose buffers were rebound (it holds no version), and for one that
    // holds another version than its senders' bases.
    std::optional<int32_t> dense_rollout;
    if (version == 9) state.held[kFirstRollout + 1] = std::nullopt;
    if (version == 12) state.held[kFirstRollout + 2] = version - 2;
    if (version == 9 || version == 12) dense_rollout = kFirstRollout + (version == 9 ? 1 : 2);
    const bool aborts = version == 6;
    const bool after_abort = version == 7;
    std::vector<absl::StatusOr<TransferStats>> results =
        Sync(job, plan, source, target, state, version, version % 2 == 1,
             aborts ? kFirstRollout + 1 : -1);
    if (aborts) {
      EXPECT_FALSE(results[kFirstRollout + 1].ok());
      for (int32_t p = kFirstRollout; p < job.num_processes(); ++p) {
        EXPECT_FALSE(state.held[p].has_value());
      }
      continue;
    }
    for (int32_t p = 0; p < job.num_processes(); ++p) {
      ASSERT_TRUE(results[p].ok()) << "process " << p << ": " << results[p].status();
    }
    ASSERT_NO_FATAL_FAILURE(ExpectTargetsExact(job, plan, source, target));
    for (int32_t p = kFirstRollout; p < job.num_processes(); ++p) {
      const TransferStats& stats = *results[p];
      const int64_t dense = schedules[p].received_bytes;
      EXPECT_GT(stats.verified_chunks, 0);  // verify hashed the patched targets.
      if (version == 1 || after_abort || dense_rollout == p) {
        EXPECT_EQ(stats.received_bytes, dense) << "rollout " << p << " must get dense";
        EXPECT_EQ(stats.delta_messages, 0);
      } else {
        // ~2% of the elements changed: the encodings are well under a fifth of the dense bytes.
        EXPECT_LT(stats.received_bytes * 5, dense) << "rollout " << p;
        EXPECT_GT(stats.delta_messages, 0);
        EXPECT_EQ(stats.received_bytes + stats.delta_saved_bytes, dense);
        wire_bytes += stats.received_bytes;
        dense_bytes += dense;
      }
    }
  }
  ASSERT_GT(dense_bytes, 0);
  const double fraction = static_cast<double>(wire_bytes) / static_cast<double>(dense_bytes);
  std::printf("delta steps: %lld bytes received of %lld dense (%.4f)\n",
              static_cast<long long>(wire_bytes), static_cast<long long>(dense_bytes), fraction);
  EXPECT_LT(fraction, 0.2);
}

// A message whose first chunks changed everywhere (sent dense) and whose later ones saved travels
// encoded with the dense chunks in their places (deferred until a chunk saves), bit-exact.
TEST(DeltaRunTest, ChunksThatChangedEverywhereTravelDenseBesideDeltas) {
  const Job job = DeltaJob();
  const Plan plan = *MakePlan(job, *MakeFirstHolderPolicy());
  HostBuffers source(job.source(), test::kSourceFill);
  ASSERT_TRUE(test::FillLogical(job.source(), 1, &source).ok());
  HostBuffers target(job.target(), test::kPoison);
  DeltaJobState state = NewDeltaJobState(job);
  std::mt19937_64 random(47);
  for (uint64_t version = 1; version <= 4; ++version) {
    SCOPED_TRACE(testing::Message() << "version " << version);
    if (version > 1) SmallUpdate(job, source, 0.02, random, /*wholly_below=*/4096);
    std::vector<absl::StatusOr<TransferStats>> results =
        Sync(job, plan, source, target, state, version, version % 2 == 0);
    for (int32_t p = 0; p < job.num_processes(); ++p) {
      ASSERT_TRUE(results[p].ok()) << "process " << p << ": " << results[p].status();
      if (version > 1) {
        EXPECT_GT(results[p]->delta_messages, 0) << "process " << p;
      }
    }
    ASSERT_NO_FATAL_FAILURE(ExpectTargetsExact(job, plan, source, target));
  }
}

// delta=auto decides each lane from its path class's rule and the changed fraction the agreement
// sums, alike on both ends: where the class pays (a slow link) the lanes run delta once a sync has
// measured the fraction (the first ones probe), where it does not (a class left out of the rule,
// as shared memory is) they run dense and no base is recorded, and once the agreed fraction is
// above the class's threshold they stop. A process with another rule is refused before any byte
// moves, so the two ends of a lane never decide differently.
TEST(DeltaRunTest, AutoRunsDeltaOnlyWhereItsPathClassPaysAndBothEndsDecideAlike) {
  const Job job = DeltaJob();
  const Plan plan = *MakePlan(job, *MakeFirstHolderPolicy());
  const std::string path(job.PathClass(0, kTrainers));  // Every trainer-rollout pair's class.
  struct Case {
    std::map<std::string, double> rule;
    int64_t delta_from;  // The first version whose rollouts get deltas; 0: none.
    int64_t delta_until;
  };
  const Case cases[] = {{{{path, 0.3}}, 2, 5},            // Pays: delta from the first base on.
                        {{{"inter_node_x", 0.3}}, 0, 0},  // Another class: dense throughout.
                        {{{path, 0.01}}, 2, 2}};          // Measured above 1 %: off after one.
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "threshold " << c.rule.begin()->second);
    HostBuffers source(job.source(), test::kSourceFill);
    ASSERT_TRUE(test::FillLogical(job.source(), 1, &source).ok());
    HostBuffers target(job.target(), test::kPoison);
    DeltaJobState state = NewDeltaJobState(job);
    std::vector<DeltaObservation> observed(job.num_processes());
    std::mt19937_64 random(46);
    for (int64_t version = 1; version <= 5; ++version) {
      SCOPED_TRACE(testing::Message() << "version " << version);
      if (version > 1) SmallUpdate(job, source, 0.02, random);
      std::vector<absl::StatusOr<TransferStats>> results =
          Sync(job, plan, source, target, state, version, false, -1,
               [&](int32_t p, DeltaOptions& delta) {
                 delta.automatic = true;
                 delta.pays_below = c.rule;
                 delta.observed = observed[p];
               });
      for (int32_t p = 0; p < job.num_processes(); ++p) {
        ASSERT_TRUE(results[p].ok()) << "process " << p << ": " << results[p].status();
        if (results[p]->delta_compared_elements > 0) {
          observed[p] = DeltaObservation{results[p]->delta_changed_elements,
                                         results[p]->delta_compared_elements};
        }
      }
      ASSERT_NO_FATAL_FAILURE(ExpectTargetsExact(job, plan, source, target));
      const bool deltas = version >= c.delta_from && version <= c.delta_until;
      for (int32_t p = 0; p < job.num_processes(); ++p) {
        EXPECT_EQ(results[p]->delta_messages > 0, deltas) << "process " << p;
      }
      if (c.delta_from == 0) {
        for (int32_t p = 0; p < kTrainers; ++p) EXPECT_EQ(state.bases[p]->held_bytes(), 0);
      }
      if (version >= 3 && c.delta_from != 0) {
        ASSERT_TRUE(results[0]->delta_changed_fraction.has_value());
        EXPECT_GT(*results[0]->delta_changed_fraction, 0.01);
        EXPECT_LT(*results[0]->delta_changed_fraction, 0.1);
      }
    }
  }
  // One process with another rule: every process refuses the batch, naming the rules.
  HostBuffers source(job.source(), test::kSourceFill);
  HostBuffers target(job.target(), test::kPoison);
  DeltaJobState state = NewDeltaJobState(job);
  std::vector<absl::StatusOr<TransferStats>> results =
      Sync(job, plan, source, target, state, 1, false, -1, [&](int32_t p, DeltaOptions& delta) {
        delta.automatic = true;
        delta.pays_below = {{path, p == kTrainers ? 0.2 : 0.3}};
      });
  for (int32_t p = 0; p < job.num_processes(); ++p) {
    EXPECT_EQ(results[p].status().code(), absl::StatusCode::kFailedPrecondition) << p;
    EXPECT_THAT(results[p].status().message(), HasSubstr("delta=auto rules differ")) << p;
  }
}

// The sender's side of a one-message lane, by hand: the agreement, then `announcement` and
// `payload` as the wire carries them. The receiver (process 1, delta on, holding version 5)
// must refuse with DataLoss and leave its target as it was.
absl::Status ReceiveForged(absl::Span<const int64_t> announcement,
                           absl::Span<const uint8_t> payload, std::vector<uint8_t>* before,
                           std::vector<uint8_t>* after) {
  const Job job = test::OneTrainerToWholeCopies({8, 8}, {"a"});
  const Plan plan = *MakePlan(job, *MakeFirstHolderPolicy());
  HostBuffers source(job.source(), test::kSourceFill);
  HostBuffers target(job.target(), test::kPoison);
  EXPECT_TRUE(test::FillLogical(job.target(), 1, &target).ok());
  const BufferKey key = target.keys()[0];
  before->assign(target.data(key), target.data(key) + target.bytes(key));
  LoopbackFabric fabric(2);
  constexpr uint64_t kSync = 9;
  absl::Status received = absl::UnknownError("not run");
  std::thread receiver([&] {
    auto transport = fabric.Connect(1);
    auto group = fabric.MakeGroup(1);
    ExecuteOptions options = test::SyncOptionsOf(plan, kSync, VerifyMode::kHash, absl::Seconds(10));
    options.delta.on = true;
    options.delta.held_version = 5;
    received =
        ExecuteTransfers(job, plan.segments, test::AllProcesses(job), StagingBudget{1 << 20}, 1,
                         test::BuffersOf(job, 1, source, target), **transport, **group, options)
            .status();
  });
  auto transport = fabric.Connect(0);
  auto group = fabric.MakeGroup(0);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  EXPECT_TRUE(AgreeOnBatch(**group, absl::OkStatus(), plan.digest, 1 << 20, 1, deadline,
                           DeltaClaim{true, std::nullopt})
                  .ok());
  std::vector<RequestId> sends;
  sends.push_back(*(*transport)
                       ->PostSend(1, MakeTag(kSync, executor_internal::kDeltaRound, 0),
                                  announcement.data(),
                                  static_cast<int64_t>(announcement.size() * sizeof(int64_t))));
  sends.push_back(*(*transport)
                       ->PostSend(1, MakeTag(kSync, 0, 0), payload.data(),
                                  static_cast<int64_t>(payload.size())));
  (*transport)->WaitAll(sends, absl::Now() + absl::Seconds(1)).IgnoreError();
  receiver.join();
  after->assign(target.data(key), target.data(key) + target.bytes(key));
  return received;
}

// A header of delta_codec.h: kind, element size 4, count.
std::vector<uint8_t> Header(uint8_t kind, uint64_t count) {
  std::vector<uint8_t> header(kDeltaHeaderBytes, 0);
  header[0] = kind;
  header[1] = 4;
  std::memcpy(header.data() + 8, &count, sizeof(count));
  return header;
}

TEST(DeltaRunTest, AnOutOfRangeIndexIsRefusedAndTheTargetUntouched) {
  std::vector<uint8_t> payload = Header(2, 1);  // Indices: one changed element...
  payload.insert(payload.end(), {0xC8, 0x01});  // ...at index 200 of 64.
  payload.insert(payload.end(), {1, 2, 3, 4});
  std::vector<uint8_t> before, after;
  const absl::Status status =
      ReceiveForged({9, static_cast<int64_t>(payload.size())}, payload, &before, &after);
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("delta from process 0"));
  EXPECT_EQ(before, after);
}

TEST(DeltaRunTest, ATruncatedEncodingIsRefusedAndTheTargetUntouched) {
  std::vector<uint8_t> payload = Header(1, 3);  // Bitmap: three changed elements...
  payload.insert(payload.end(), {0x07, 0, 0, 0, 0, 0, 0, 0});
  payload.insert(payload.end(), {1, 2, 3, 4, 5, 6, 7, 8});  // ...but two values.
  std::vector<uint8_t> before, after;
  const absl::Status status =
      ReceiveForged({9, static_cast<int64_t>(payload.size())}, payload, &before, &after);
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_EQ(before, after);
}

TEST(DeltaRunTest, AnAnnouncementThatDoesNotFitTheWorkIsRefused) {
  const std::vector<uint8_t> payload(8, 0);
  std::vector<uint8_t> before, after;
  // Below a header.
  absl::Status status = ReceiveForged({9, 8}, payload, &before, &after);
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("announces 8 bytes"));
  // Another sync's announcement.
  status = ReceiveForged({8, 8}, payload, &before, &after);
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("sync id"));
  // Not smaller than the dense message (64 fp32 elements).
  status = ReceiveForged({9, 16 + 256}, payload, &before, &after);
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  // An announcement of another length: the transport refuses it, no crash.
  status = ReceiveForged({9}, payload, &before, &after);
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(before, after);
}

}  // namespace
}  // namespace wsync
