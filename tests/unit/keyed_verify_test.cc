// Keyed verification (ExecuteOptions::verify = kKeyed, executor/verify.h, executor/chunk_mac.h)
// against an attacker on the wire between a trainer and a rollout: a forged chunk, a forged chunk
// with a forged digest (which xxh3 verification accepts), a forged, reordered or replayed MAC
// message, and a sender with another key all fail the rollout with DataLoss naming the sender.
// The MAC of a strided region equals the MAC of its packed copy, in host memory and through the
// bounce buffer of device memory, and every field it is bound to changes it.

#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/data_key.h"
#include "common/hash.h"
#include "executor/chunk_mac.h"
#include "executor/copy.h"
#include "executor/execute.h"
#include "executor/verify.h"
#include "executor/waves.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/fill/fill.h"
#include "planner/builders.h"
#include "planner/geometry.h"
#include "planner/job.h"
#include "planner/plan.h"
#include "planner/policy.h"
#include "planner/waves.h"
#include "tests/testing/executor_checks.h"
#include "tests/testing/loopback_threads.h"
#include "tests/testing/random_regions.h"
#include "tests/testing/reference.h"
#include "transport/forwarding_transport.h"

namespace wsync {
namespace {

using executor_internal::DeviceRegion;
using executor_internal::LaneMac;
using executor_internal::MacBinding;
using executor_internal::MacDeviceRegions;
using executor_internal::MacRegion;
using executor_internal::MacTag;
using test::AllProcesses;
using test::BufferKey;
using test::BuffersOf;
using test::HostBuffers;
using test::RunOnLoopbackThreads;
using test::SyncOptionsOf;
using ::testing::HasSubstr;

constexpr int32_t kTrainer = 0;
constexpr int32_t kRollout = 1;
// Messages of at least this many bytes carry chunks; the digest message is smaller.
constexpr int64_t kMinDataBytes = 1024;

DataKey KeyOf(absl::string_view secret) { return *DeriveDataKey(secret, "keyed-verify-test"); }

// ---------------------------------------------------------------------------------------------
// The MAC of regions.

using Region = test::StridedRegion;

Region RandomRegion(std::mt19937_64& rng) {
  constexpr int64_t kElementSizes[] = {1, 2, 4, 8};
  return test::RandomStridedRegion(rng, kElementSizes);
}

std::vector<unsigned char> Packed(const Region& r, const std::vector<unsigned char>& memory) {
  std::vector<unsigned char> packed(Volume(Box{Dims(r.shape.size(), 0), r.shape}) * r.element_size);
  PackRegion(packed.data(), memory.data(), r.strides, r.shape, r.element_size);
  return packed;
}

TEST(KeyedVerifyTest, TheMacOfAStridedRegionIsTheMacOfItsPackedCopyAndEveryByteCounts) {
  std::mt19937_64 rng(2026120101);
  const std::unique_ptr<LaneMac> mac = *LaneMac::Create(KeyOf("k"), MacBinding{7, 0, 1});
  for (int trial = 0; trial < 1000; ++trial) {
    const Region r = RandomRegion(rng);
    std::vector<unsigned char> memory(r.span_elements * r.element_size);
    for (unsigned char& byte : memory) byte = static_cast<unsigned char>(rng());
    const std::vector<unsigned char> packed = Packed(r, memory);
    const uint64_t position = rng() % 5;
    const MacTag expected = *mac->Of(packed.data(), packed.size(), position);
    ASSERT_EQ(*MacRegion(*mac, position, memory.data(), r.strides, r.shape, r.element_size),
              expected)
        << "trial " << trial;
    // A flipped byte of the region changes the tag.
    const size_t flip = rng() % packed.size();
    std::vector<unsigned char> forged = packed;
    forged[flip] ^= static_cast<unsigned char>(1 + rng() % 255);
    EXPECT_NE(*mac->Of(forged.data(), forged.size(), position), expected) << "trial " << trial;
  }
}

TEST(KeyedVerifyTest, TheKeyEverySyncWaveSenderReceiverLaneAndPositionChangeTheTag) {
  std::vector<unsigned char> bytes(4096);
  std::mt19937_64 rng(3);
  for (unsigned char& byte : bytes) byte = static_cast<unsigned char>(rng());
  const MacBinding base{9, 2, 5, MemoryKind::kHost};
  const auto tag = [&](const DataKey& key, const MacBinding& binding, uint64_t position) {
    return *(*LaneMac::Create(key, binding))->Of(bytes.data(), bytes.size(), position);
  };
  const MacTag reference = tag(KeyOf("k"), base, 3);
  EXPECT_EQ(tag(KeyOf("k"), base, 3), reference);  // Deterministic across processes.
  std::vector<MacTag> others = {
      tag(KeyOf("another key"), base, 3),
      tag(KeyOf("k"), MacBinding{10, 2, 5, MemoryKind::kHost}, 3),
      tag(KeyOf("k"), MacBinding{9, 5, 2, MemoryKind::kHost}, 3),  // The reverse lane.
      tag(KeyOf("k"), MacBinding{9, 2, 6, MemoryKind::kHost}, 3),
      tag(KeyOf("k"), MacBinding{9, 2, 5, MemoryKind::kCuda}, 3),
      tag(KeyOf("k"), MacBinding{9, 2, 5, MemoryKind::kHost, 1}, 3),  // The next wave.
      tag(KeyOf("k"), base, 4),
      tag(KeyOf("k"), base, 3 + (uint64_t{1} << 32)),
  };
  for (size_t i = 0; i < others.size(); ++i) EXPECT_NE(others[i], reference) << "variant " << i;
  // The stream reuses its context: a tag after another chunk is as from a fresh one.
  const std::unique_ptr<LaneMac> mac = *LaneMac::Create(KeyOf("k"), base);
  ASSERT_TRUE(mac->Of(bytes.data(), 17, 0).ok());
  EXPECT_EQ(*mac->Of(bytes.data(), bytes.size(), 3), reference);
}

// Device memory that is host memory, whose copies run only at Synchronize: a MAC fed before its
// copy landed would see stale bounce bytes.
class LazyDevice final : public DeviceMemory {
 public:
  MemoryKind kind() const override { return MemoryKind::kCuda; }
  absl::StatusOr<void*> Allocate(int64_t bytes) override { return new char[bytes]; }
  void Free(void* memory) override { delete[] static_cast<char*>(memory); }
  absl::Status CopyStridedAsync(void* dst, absl::Span<const int64_t> dst_strides, const void* src,
                                absl::Span<const int64_t> src_strides,
                                absl::Span<const int64_t> shape, int64_t element_size) override {
    pending_.push_back([=, dst_at = Dims(dst_strides.begin(), dst_strides.end()),
                        src_at = Dims(src_strides.begin(), src_strides.end()),
                        extent = Dims(shape.begin(), shape.end())] {
      CopyStrided(dst, dst_at, src, src_at, extent, element_size);
    });
    return absl::OkStatus();
  }
  absl::Status Synchronize(absl::Time) override {
    for (const auto& copy : pending_) copy();
    pending_.clear();
    return absl::OkStatus();
  }

 private:
  std::vector<std::function<void()>> pending_;
};

TEST(KeyedVerifyTest, DeviceRegionsMacAsInHostMemoryWhateverTheBounceSize) {
  std::mt19937_64 rng(11);
  LazyDevice device;
  const std::unique_ptr<LaneMac> mac =
      *LaneMac::Create(KeyOf("k"), MacBinding{1, 0, 1, MemoryKind::kCuda});
  for (int trial = 0; trial < 400; ++trial) {
    const int count = 1 + static_cast<int>(rng() % 4);
    std::vector<std::vector<unsigned char>> memory;
    std::vector<DeviceRegion> regions;
    std::vector<uint64_t> positions;
    std::vector<MacTag> expected;
    for (int i = 0; i < count; ++i) {
      const Region r = RandomRegion(rng);
      memory.emplace_back(r.span_elements * r.element_size);
      for (unsigned char& byte : memory.back()) byte = static_cast<unsigned char>(rng());
      regions.push_back(DeviceRegion{memory.back().data(), r.strides, r.shape, r.element_size});
      positions.push_back(static_cast<uint64_t>(i) + trial);
      expected.push_back(*MacRegion(*mac, positions.back(), memory.back().data(), r.strides,
                                    r.shape, r.element_size));
    }
    std::vector<char> bounce(8 + rng() % 300);
    std::vector<MacTag> tags(count);
    ASSERT_TRUE(MacDeviceRegions(device, regions, positions, *mac, absl::MakeSpan(bounce),
                                 absl::InfiniteFuture(), absl::MakeSpan(tags))
                    .ok());
    EXPECT_EQ(tags, expected) << "trial " << trial << ", bounce " << bounce.size() << " bytes";
  }
}

// ---------------------------------------------------------------------------------------------
// Syncs with an attacker on the trainer's sends.

// What the attacker does to the trainer's messages.
struct Attack {
  bool flip_data = false;  // Flips a byte of the first data message.
  // With flip_data (one-chunk jobs only): replaces the first chunk's digest with the xxh3 of the
  // forged bytes, which is all xxh3 verification checks.
  bool forge_hash = false;
  // Rewrites the digest message (the words as verify.h lays them out).
  std::function<void(std::vector<uint64_t>&)> rewrite_digests;
  // Receives the digest message as the trainer sent it.
  std::vector<uint64_t>* record_digests = nullptr;
  // Sends the first data message and the first digest message again in place of every later one
  // of their size (a streamed sync: wave 0's chunk and MAC replayed into wave 1).
  bool replay_first = false;
};

class Attacker final : public ForwardingTransport {
 public:
  Attacker(std::unique_ptr<Transport> inner, Attack attack)
      : ForwardingTransport(std::move(inner)), attack_(std::move(attack)) {}

  absl::StatusOr<RequestId> PostSend(int32_t peer, MessageTag tag, const void* data,
                                     int64_t bytes) override {
    if (attack_.replay_first) return Replay(peer, tag, data, bytes);
    if (bytes >= kMinDataBytes) {
      if (attack_.flip_data && !flipped_) {
        flipped_ = true;
        std::vector<char>& forged = copies_.emplace_back(static_cast<const char*>(data),
                                                         static_cast<const char*>(data) + bytes);
        forged[bytes / 2] ^= 0x5a;
        forged_hash_ = Xxh3(forged.data(), forged.size());
        data = forged.data();
      }
      return ForwardingTransport::PostSend(peer, tag, data, bytes);
    }
    std::vector<uint64_t> words(bytes / sizeof(uint64_t));
    std::memcpy(words.data(), data, words.size() * sizeof(uint64_t));
    if (attack_.record_digests != nullptr) *attack_.record_digests = words;
    if (attack_.forge_hash && flipped_) words[1] = forged_hash_;
    if (attack_.rewrite_digests) attack_.rewrite_digests(words);
    std::vector<char>& sent = copies_.emplace_back(bytes);
    std::memcpy(sent.data(), words.data(), words.size() * sizeof(uint64_t));
    return ForwardingTransport::PostSend(peer, tag, sent.data(), bytes);
  }

 private:
  absl::StatusOr<RequestId> Replay(int32_t peer, MessageTag tag, const void* data, int64_t bytes) {
    std::vector<char>*& first = bytes >= kMinDataBytes ? first_data_ : first_digests_;
    if (first == nullptr) {
      first = &copies_.emplace_back(static_cast<const char*>(data),
                                    static_cast<const char*>(data) + bytes);
    } else if (static_cast<int64_t>(first->size()) == bytes) {
      data = first->data();
    }
    return ForwardingTransport::PostSend(peer, tag, data, bytes);
  }

  const Attack attack_;
  std::vector<char>* first_data_ = nullptr;  // In copies_.
  std::vector<char>* first_digests_ = nullptr;
  bool flipped_ = false;
  uint64_t forged_hash_ = 0;
  std::deque<std::vector<char>> copies_;  // Sent in place of the executor's bytes.
};

// Trainer 0 holds "w" fp32 [64, 64] packed; rollout 1 holds it packed (`halves` false: one
// segment, one chunk with a large budget) or its two column halves in two buffers (strided
// sends, several chunks with a small budget).
Job TwoProcessJob(bool halves) {
  LayoutBuilder source(Role::kTrainer);
  const int32_t w = source.AddParam("w", DType::kFloat32, {64, 64});
  source.AddProcess("n");
  source.AddPackedPiece(w, 0, source.AddBuffer(0, 64 * 64 * 4), WholeBox({64, 64}), 0);
  LayoutBuilder target(Role::kRollout);
  target.AddParam("w", DType::kFloat32, {64, 64});
  target.AddProcess("n");
  if (halves) {
    for (int64_t column : {0, 32}) {
      target.AddPackedPiece(0, 0, target.AddBuffer(0, 64 * 32 * 4), Box{{0, column}, {64, 32}}, 0);
    }
  } else {
    target.AddPackedPiece(0, 0, target.AddBuffer(0, 64 * 64 * 4), WholeBox({64, 64}), 0);
  }
  return *Job::Create(std::move(source).Build(), std::move(target).Build());
}

struct SyncSetup {
  VerifyMode mode = VerifyMode::kKeyed;
  uint64_t sync_id = 1;
  int64_t budget = 1 << 20;
  Attack attack;
  std::string trainer_secret = "job secret";
  std::string rollout_secret = "job secret";
};

// One sync of `job` with both processes as threads over a loopback fabric, the trainer's sends
// through the attacker. Returns each process's result.
std::vector<absl::StatusOr<TransferStats>> Sync(const Job& job, HostBuffers& source,
                                                HostBuffers& target, const SyncSetup& setup) {
  const Plan plan = *MakePlan(job, *MakeFirstHolderPolicy());
  return RunOnLoopbackThreads<absl::StatusOr<TransferStats>>(
      job.num_processes(), [&](int32_t p, std::unique_ptr<Transport> used, Group& group) {
        if (p == kTrainer) used = std::make_unique<Attacker>(std::move(used), setup.attack);
        const DataKey key = KeyOf(p == kTrainer ? setup.trainer_secret : setup.rollout_secret);
        ExecuteOptions options = SyncOptionsOf(plan, setup.sync_id, setup.mode);
        options.data_key = &key;
        return ExecuteTransfers(job, plan.segments, AllProcesses(job),
                                StagingBudget{static_cast<double>(setup.budget)}, p,
                                BuffersOf(job, p, source, target), *used, group, options);
      });
}

void FillRandom(const Layout& layout, uint64_t seed, HostBuffers* buffers) {
  std::mt19937_64 rng(seed);
  for (const BufferInfo& info : layout.buffers) {
    const BufferKey key{info.process, info.id};
    for (int64_t i = 0; i < buffers->bytes(key); ++i) {
      buffers->data(key)[i] = static_cast<unsigned char>(rng());
    }
  }
}

bool TargetEqualsSource(const Job& job, HostBuffers& source, HostBuffers& target) {
  HostBuffers expected(job.target(), 0);
  test::WriteCounts counts(job.target());
  const Plan plan = *MakePlan(job, *MakeFirstHolderPolicy());
  if (!test::ExecutePlanReference(job, plan.segments, source, &expected, &counts).ok()) {
    return false;
  }
  for (const BufferKey& key : expected.keys()) {
    if (std::memcmp(expected.data(key), target.data(key), target.bytes(key)) != 0) return false;
  }
  return true;
}

void ExpectMacFailureFromTheTrainer(const std::vector<absl::StatusOr<TransferStats>>& results) {
  const absl::Status& rollout = results[kRollout].status();
  EXPECT_EQ(rollout.code(), absl::StatusCode::kDataLoss) << rollout;
  EXPECT_THAT(std::string(rollout.message()),
              ::testing::ContainsRegex("verify: the MAC of chunk [0-9]+ of [0-9]+ from process 0 "
                                       "does not match its bytes"));
}

TEST(KeyedVerifyTest, ACleanKeyedSyncChecksEveryChunk) {
  for (const bool halves : {false, true}) {
    SCOPED_TRACE(halves ? "column halves" : "one chunk");
    const Job job = TwoProcessJob(halves);
    HostBuffers source(job.source(), 0), target(job.target(), 0);
    FillRandom(job.source(), 5, &source);
    SyncSetup setup;
    setup.budget = halves ? 4096 : 1 << 20;
    const auto results = Sync(job, source, target, setup);
    ASSERT_TRUE(results[kTrainer].ok()) << results[kTrainer].status();
    ASSERT_TRUE(results[kRollout].ok()) << results[kRollout].status();
    EXPECT_EQ(results[kRollout]->verified_chunks, results[kRollout]->chunks);
    if (halves) {
      EXPECT_GT(results[kRollout]->verified_chunks, 2);  // Cut to the budget.
    } else {
      EXPECT_EQ(results[kRollout]->verified_chunks, 1);
    }
    EXPECT_TRUE(TargetEqualsSource(job, source, target));
  }
}

// The attack xxh3 verification cannot see: the chunk and its hash both forged on the wire.
TEST(KeyedVerifyTest, AForgedChunkWithAForgedDigestPassesHashVerifyButNotKeyed) {
  const Job job = TwoProcessJob(false);
  for (const VerifyMode mode : {VerifyMode::kHash, VerifyMode::kKeyed}) {
    SCOPED_TRACE(VerifyModeName(mode));
    HostBuffers source(job.source(), 0), target(job.target(), 0);
    FillRandom(job.source(), 6, &source);
    SyncSetup setup;
    setup.mode = mode;
    setup.attack.flip_data = true;
    setup.attack.forge_hash = true;
    const auto results = Sync(job, source, target, setup);
    EXPECT_FALSE(TargetEqualsSource(job, source, target));  // The forged chunk landed.
    if (mode == VerifyMode::kHash) {
      EXPECT_TRUE(results[kRollout].ok()) << results[kRollout].status();
    } else {
      ExpectMacFailureFromTheTrainer(results);
    }
  }
}

TEST(KeyedVerifyTest, AForgedChunkFailsWhicheverMessageCarriesIt) {
  for (const bool halves : {false, true}) {
    SCOPED_TRACE(halves ? "column halves" : "one chunk");
    const Job job = TwoProcessJob(halves);
    HostBuffers source(job.source(), 0), target(job.target(), 0);
    FillRandom(job.source(), 7, &source);
    SyncSetup setup;
    setup.budget = halves ? 4096 : 1 << 20;
    setup.attack.flip_data = true;
    ExpectMacFailureFromTheTrainer(Sync(job, source, target, setup));
  }
}

TEST(KeyedVerifyTest, AForgedOrReorderedMacMessageFails) {
  const Job job = TwoProcessJob(true);
  const std::vector<std::pair<std::string, std::function<void(std::vector<uint64_t>&)>>> forgeries =
      {
          {"one tag bit flipped", [](std::vector<uint64_t>& words) { words[3] ^= 1; }},
          {"tags of chunks 0 and 1 swapped",
           [](std::vector<uint64_t>& words) {
             std::swap(words[1], words[3]);
             std::swap(words[2], words[4]);
           }},
          {"every tag the xxh3 of nothing",
           [](std::vector<uint64_t>& words) {
             for (size_t i = 1; i < words.size(); ++i) words[i] = Xxh3(nullptr, 0);
           }},
      };
  for (const auto& [name, rewrite] : forgeries) {
    SCOPED_TRACE(name);
    HostBuffers source(job.source(), 0), target(job.target(), 0);
    FillRandom(job.source(), 8, &source);
    SyncSetup setup;
    setup.budget = 4096;
    setup.attack.rewrite_digests = rewrite;
    const auto results = Sync(job, source, target, setup);
    ExpectMacFailureFromTheTrainer(results);
    EXPECT_TRUE(TargetEqualsSource(job, source, target));  // The bytes were right; the MACs not.
  }
}

// The MAC message of sync 1, its sync id rewritten, replayed into sync 2 of the same bytes.
TEST(KeyedVerifyTest, AMacMessageReplayedFromAPreviousSyncIsRefused) {
  const Job job = TwoProcessJob(true);
  HostBuffers source(job.source(), 0), target(job.target(), 0);
  FillRandom(job.source(), 9, &source);
  std::vector<uint64_t> first_sync_macs;
  SyncSetup setup;
  setup.budget = 4096;
  setup.attack.record_digests = &first_sync_macs;
  const auto first = Sync(job, source, target, setup);
  ASSERT_TRUE(first[kRollout].ok()) << first[kRollout].status();
  ASSERT_GT(first[kRollout]->verified_chunks, 2);
  ASSERT_EQ(first_sync_macs.size(), 1u + 2 * first[kRollout]->verified_chunks);
  ASSERT_EQ(first_sync_macs[0], 1u);

  setup.sync_id = 2;
  setup.attack.record_digests = nullptr;
  setup.attack.rewrite_digests = [&](std::vector<uint64_t>& words) {
    words = first_sync_macs;
    words[0] = 2;
  };
  ExpectMacFailureFromTheTrainer(Sync(job, source, target, setup));
  // Without the replay the same sync passes.
  setup.attack.rewrite_digests = nullptr;
  const auto clean = Sync(job, source, target, setup);
  EXPECT_TRUE(clean[kRollout].ok()) << clean[kRollout].status();
}

TEST(KeyedVerifyTest, ASenderWithAnotherKeyFails) {
  const Job job = TwoProcessJob(true);
  HostBuffers source(job.source(), 0), target(job.target(), 0);
  FillRandom(job.source(), 10, &source);
  SyncSetup setup;
  setup.budget = 4096;
  setup.trainer_secret = "a guessed secret";
  const auto results = Sync(job, source, target, setup);
  ExpectMacFailureFromTheTrainer(results);
  EXPECT_THAT(std::string(results[kRollout].status().message()), HasSubstr("parameter 'w'"));
}

// A streamed sync whose waves reuse the sync id, the lane and the chunk position: trainer 0 holds
// "a" and "b", fp32 [64, 64], packed in one buffer each; rollout 1 lands "a" in wave 0 and "b" in
// wave 1 (one chunk each). The attacker sends wave 0's chunk and MAC message again in wave 1.
TEST(KeyedVerifyTest, AWavesChunkAndMacReplayedIntoTheNextWaveAreDetected) {
  LayoutBuilder source(Role::kTrainer);
  LayoutBuilder target(Role::kRollout);
  source.AddProcess("n");
  target.AddProcess("n");
  for (const std::string name : {"a", "b"}) {
    const int32_t param = source.AddParam(name, DType::kFloat32, {64, 64});
    target.AddParam(name, DType::kFloat32, {64, 64});
    source.AddPackedPiece(param, 0, source.AddBuffer(0, 64 * 64 * 4), WholeBox({64, 64}), 0);
    target.AddPackedPiece(param, 0, target.AddBuffer(0, 64 * 64 * 4), WholeBox({64, 64}), 0);
  }
  Layout streamed = std::move(target).Build();
  streamed.params[1].wave = 1;
  const Job job = *Job::Create(std::move(source).Build(), std::move(streamed));
  const Plan plan = *MakePlan(job, *MakeFirstHolderPolicy());
  const std::vector<Wave> waves = SplitIntoWaves(job, plan.segments);
  ASSERT_EQ(waves.size(), 2u);
  for (const bool replay : {false, true}) {
    SCOPED_TRACE(replay ? "wave 0 replayed into wave 1" : "clean");
    HostBuffers from(job.source(), 0), to(job.target(), 0);
    FillRandom(job.source(), 11, &from);
    Attack attack;
    attack.replay_first = replay;
    const auto results = RunOnLoopbackThreads<absl::StatusOr<TransferStats>>(
        job.num_processes(), [&](int32_t p, std::unique_ptr<Transport> used, Group& group) {
          if (p == kTrainer) used = std::make_unique<Attacker>(std::move(used), attack);
          const DataKey key = KeyOf("job secret");
          ExecuteOptions options = SyncOptionsOf(plan, 1, VerifyMode::kKeyed);
          options.data_key = &key;
          return ExecuteWaves(job, waves, plan.quant, AllProcesses(job), StagingBudget{1 << 20}, p,
                              BuffersOf(job, p, from, to), *used, group, options, nullptr);
        });
    const BufferKey a{0, 0}, b{0, 1};
    if (!replay) {
      ASSERT_TRUE(results[kRollout].ok()) << results[kRollout].status();
      EXPECT_EQ(results[kRollout]->verified_chunks, 2);
      EXPECT_TRUE(TargetEqualsSource(job, from, to));
      continue;
    }
    // Wave 1 landed wave 0's bytes ("a" in "b"), with wave 0's MAC.
    ASSERT_EQ(std::memcmp(to.data(b), from.data(a), 64 * 64 * 4), 0);
    const absl::Status& rollout = results[kRollout].status();
    EXPECT_EQ(rollout.code(), absl::StatusCode::kDataLoss) << rollout;
    EXPECT_THAT(std::string(rollout.message()),
                ::testing::ContainsRegex("wave 1: .*the MAC of chunk [0-9]+ of 1 from process 0 "
                                         "does not match its bytes"));
  }
}

TEST(KeyedVerifyTest, KeyedVerifyWithoutAKeyIsRefusedBeforeAnyByteMoves) {
  const Job job = TwoProcessJob(false);
  const Plan plan = *MakePlan(job, *MakeFirstHolderPolicy());
  HostBuffers source(job.source(), 0), target(job.target(), 0);
  const std::vector<absl::Status> results = RunOnLoopbackThreads<absl::Status>(
      job.num_processes(), [&](int32_t p, std::unique_ptr<Transport> transport, Group& group) {
        return ExecuteTransfers(job, plan.segments, AllProcesses(job), StagingBudget{1 << 20}, p,
                                BuffersOf(job, p, source, target), *transport, group,
                                SyncOptionsOf(plan, 1, VerifyMode::kKeyed))
            .status();
      });
  for (const absl::Status& status : results) {
    EXPECT_FALSE(status.ok());
    EXPECT_THAT(std::string(status.message()), HasSubstr("without a data key"));
  }
}

TEST(KeyedVerifyTest, VerifyModesParseAndName) {
  for (const VerifyMode mode : {VerifyMode::kOff, VerifyMode::kHash, VerifyMode::kKeyed}) {
    EXPECT_EQ(*ParseVerifyMode(VerifyModeName(mode)), mode);
  }
  EXPECT_EQ(*ParseVerifyMode("true"), VerifyMode::kHash);
  EXPECT_EQ(*ParseVerifyMode("false"), VerifyMode::kOff);
  EXPECT_TRUE(absl::IsInvalidArgument(ParseVerifyMode("hmac").status()));
}

}  // namespace
}  // namespace wsync
