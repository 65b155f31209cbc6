// test::FillPattern, the memory-speed content of the benchmarks' chunk-hash verification: the
// same (buffer, version) gives the same bytes, and a stale version, another buffer's bytes or a
// shifted chunk never reads the same, so a compared hash catches it; every element of every float
// dtype is finite (the FP8 quantizer refuses NaN), and PatternView reads back any byte; and over
// the executor with verify=true, a chunk that never lands fails the sync with the pattern and
// goes unnoticed without it.

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "executor/execute.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/fill/fill.h"
#include "planner/builders.h"
#include "planner/geometry.h"
#include "planner/job.h"
#include "planner/layout.h"
#include "planner/plan.h"
#include "planner/policy.h"
#include "tests/testing/executor_checks.h"
#include "tests/testing/loopback_threads.h"
#include "tests/testing/reference.h"
#include "transport/forwarding_transport.h"

namespace wsync::test {
namespace {

Layout Buffers(const std::vector<BufferInfo>& buffers) {
  Layout layout;
  layout.buffers = buffers;
  return layout;
}

std::vector<unsigned char> Bytes(const HostBuffers& buffers, BufferKey key) {
  const unsigned char* data = buffers.data(key);
  return std::vector<unsigned char>(data, data + buffers.bytes(key));
}

// The 8-byte words of `bytes` at `offset` + 8 k, for every whole word.
std::vector<uint64_t> Words(const std::vector<unsigned char>& bytes, size_t offset) {
  std::vector<uint64_t> words;
  for (size_t at = offset; at + 8 <= bytes.size(); at += 8) {
    uint64_t word = 0;
    std::memcpy(&word, bytes.data() + at, 8);
    words.push_back(word);
  }
  return words;
}

// Positions where two word sequences agree (compared up to the shorter one).
int Agreements(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
  int same = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) same += a[i] == b[i];
  return same;
}

constexpr int64_t kBytes = 64 * 1024;

TEST(FillPatternTest, SameBufferAndVersionGiveTheSameBytes) {
  const Layout layout = Buffers({{0, 7, kBytes}, {1, 7, kBytes}});
  HostBuffers a(layout, kPoison), b(layout, kSourceFill);
  FillPattern(3, &a);
  FillPattern(3, &b);
  for (const BufferKey key : {BufferKey{0, 7}, BufferKey{1, 7}}) {
    EXPECT_EQ(Bytes(a, key), Bytes(b, key)) << key.process;
  }
}

TEST(FillPatternTest, EveryWordChangesWithTheVersion) {
  const Layout layout = Buffers({{0, 7, kBytes}});
  HostBuffers one(layout, kPoison), two(layout, kPoison);
  FillPattern(1, &one);
  FillPattern(2, &two);
  const std::vector<uint64_t> a = Words(Bytes(one, {0, 7}), 0);
  const std::vector<uint64_t> b = Words(Bytes(two, {0, 7}), 0);
  ASSERT_EQ(a.size(), static_cast<size_t>(kBytes / 8));
  EXPECT_EQ(Agreements(a, b), 0);
}

TEST(FillPatternTest, BuffersOfOtherProcessesOrIdsDiffer) {
  const Layout layout = Buffers({{0, 7, kBytes}, {0, 8, kBytes}, {1, 7, kBytes}});
  HostBuffers buffers(layout, kPoison);
  FillPattern(1, &buffers);
  const std::vector<uint64_t> base = Words(Bytes(buffers, {0, 7}), 0);
  EXPECT_EQ(Agreements(base, Words(Bytes(buffers, {0, 8}), 0)), 0);
  EXPECT_EQ(Agreements(base, Words(Bytes(buffers, {1, 7}), 0)), 0);
}

TEST(FillPatternTest, AShiftedChunkReadsOtherBytes) {
  const Layout layout = Buffers({{0, 7, kBytes}});
  HostBuffers buffers(layout, kPoison);
  FillPattern(1, &buffers);
  const std::vector<unsigned char> bytes = Bytes(buffers, {0, 7});
  const std::vector<uint64_t> base = Words(bytes, 0);
  // Shifted by one bf16 element, one fp32 element and one word.
  for (const size_t shift : {2, 4, 8}) {
    EXPECT_EQ(Agreements(base, Words(bytes, shift)), 0) << "shift " << shift;
  }
}

TEST(FillPatternTest, FillsTheTailOfAnOddSizeAndKeepsTheGuards) {
  const Layout layout = Buffers({{0, 1, 13}, {0, 2, 0}});
  HostBuffers one(layout, kPoison), two(layout, kPoison);
  FillPattern(1, &one);
  FillPattern(2, &two);
  EXPECT_TRUE(one.CheckGuards().ok());
  EXPECT_EQ(one.bytes({0, 2}), 0);
  const std::vector<unsigned char> a = Bytes(one, {0, 1});
  const std::vector<unsigned char> b = Bytes(two, {0, 1});
  // The 5 tail bytes come from the version too: the two versions differ in at least one.
  EXPECT_NE(std::vector<unsigned char>(a.begin() + 8, a.end()),
            std::vector<unsigned char>(b.begin() + 8, b.end()));
  EXPECT_NE(a, std::vector<unsigned char>(13, kPoison));
}

// Whether `bits` (the element's bytes, little-endian) encode a finite value of `dtype`.
bool Finite(DType dtype, uint64_t bits) {
  switch (dtype) {
    case DType::kBFloat16:
      return ((bits >> 7) & 0xff) != 0xff;
    case DType::kFloat16:
      return ((bits >> 10) & 0x1f) != 0x1f;
    case DType::kFloat32:
      return ((bits >> 23) & 0xff) != 0xff;
    case DType::kFloat8E4M3:
      return (bits & 0x7f) != 0x7f;  // e4m3fn: no infinities, NaN S.1111.111.
    case DType::kFloat8E5M2:
      return ((bits >> 2) & 0x1f) != 0x1f;
    default:
      return true;
  }
}

TEST(FillPatternTest, EveryFloatElementIsFiniteAtRandomOffsetsAndSeeds) {
  std::mt19937_64 rng(22);
  for (const DType dtype : {DType::kBFloat16, DType::kFloat16, DType::kFloat32, DType::kFloat8E4M3,
                            DType::kFloat8E5M2}) {
    const int size = static_cast<int>(DTypeSize(dtype));
    std::set<uint64_t> exponents;
    for (int trial = 0; trial < 20000; ++trial) {
      const PatternView view(rng(), BufferKey{static_cast<int32_t>(rng() % 64), rng()});
      const int64_t position = static_cast<int64_t>(rng() % (int64_t{1} << 40)) * size;
      const uint64_t bits = view.Bytes(position, size);
      ASSERT_TRUE(Finite(dtype, bits)) << "dtype " << DTypeName(dtype) << " bits " << bits;
      exponents.insert(bits >> (8 * size - 6));  // Sign and the top exponent bits but one.
    }
    // The mask fixes one exponent bit only: both signs and the other top bits still vary.
    EXPECT_GE(exponents.size(), 16u) << DTypeName(dtype);
  }
}

TEST(FillPatternTest, APatternViewReadsWhatFillPatternWrote) {
  std::mt19937_64 rng(7);
  const Layout layout = Buffers({{3, 9, 1003}});
  HostBuffers buffers(layout, kPoison);
  FillPattern(5, &buffers);
  const std::vector<unsigned char> bytes = Bytes(buffers, {3, 9});
  const PatternView view(5, BufferKey{3, 9});
  for (int trial = 0; trial < 5000; ++trial) {
    const int count = 1 + static_cast<int>(rng() % 8);
    const int64_t position = static_cast<int64_t>(rng() % (bytes.size() - count + 1));
    uint64_t expected = 0;
    std::memcpy(&expected, bytes.data() + position, count);  // Little-endian.
    ASSERT_EQ(view.Bytes(position, count), expected) << position << " " << count;
  }
  EXPECT_NE(PatternView(6, BufferKey{3, 9}).Bytes(0, 8), view.Bytes(0, 8));
}

// Receives the first message of at least 1 KiB into scratch memory instead of where the executor
// asked (the hash message of verify=true is smaller): the chunk it carries never lands, and its
// destination keeps the last sync's bytes.
class DivertFirstDataReceive final : public ForwardingTransport {
 public:
  using ForwardingTransport::ForwardingTransport;

  absl::StatusOr<RequestId> PostReceive(int32_t peer, MessageTag tag, void* data,
                                        int64_t bytes) override {
    if (!diverted_ && bytes >= 1024) {
      diverted_ = true;
      scratch_.resize(bytes);
      data = scratch_.data();
    }
    return ForwardingTransport::PostReceive(peer, tag, data, bytes);
  }

 private:
  bool diverted_ = false;
  std::vector<char> scratch_;
};

// One trainer holding "w" fp32 [64, 64] (16 KiB, one chunk), one rollout taking all of it.
Job OneChunkJob() {
  LayoutBuilder source(Role::kTrainer);
  const int32_t w = source.AddParam("w", DType::kFloat32, {64, 64});
  source.AddProcess("n");
  source.AddPackedPiece(w, 0, source.AddBuffer(0, 64 * 64 * 4), WholeBox({64, 64}), 0);
  LayoutBuilder target(Role::kRollout);
  target.AddParam("w", DType::kFloat32, {64, 64});
  target.AddProcess("n");
  target.AddPackedPiece(0, 0, target.AddBuffer(0, 64 * 64 * 4), WholeBox({64, 64}), 0);
  return *Job::Create(std::move(source).Build(), std::move(target).Build());
}

// One sync of `job` with verify=true, both processes as threads over a fresh loopback fabric;
// the rollout's transport diverts its first data message when `divert`. Returns each process's
// result.
std::vector<absl::Status> VerifiedSync(const Job& job, const Plan& plan, uint64_t sync_id,
                                       HostBuffers& source, HostBuffers& target, bool divert) {
  return RunOnLoopbackThreads<absl::Status>(
      job.num_processes(), [&](int32_t p, std::unique_ptr<Transport> used, Group& group) {
        if (divert && !job.IsSource(p)) {
          used = std::make_unique<DivertFirstDataReceive>(std::move(used));
        }
        return ExecuteTransfers(job, plan.segments, AllProcesses(job), StagingBudget{1 << 20}, p,
                                BuffersOf(job, p, source, target), *used, group,
                                SyncOptionsOf(plan, sync_id, VerifyMode::kHash))
            .status();
      });
}

TEST(FillPatternTest, ALostChunkFailsVerifyOnlyWhenThePatternChangesWithTheVersion) {
  const Job job = OneChunkJob();
  const Plan plan = *MakePlan(job, *MakeFirstHolderPolicy());
  const int32_t rollout = 1;
  const BufferKey key{0, job.target().buffers[0].id};
  for (const bool pattern : {true, false}) {
    SCOPED_TRACE(pattern ? "pattern" : "constant bytes");
    HostBuffers source(job.source(), kSourceFill);
    HostBuffers target(job.target(), kPoison);
    if (pattern) FillPattern(1, &source);
    for (const absl::Status& status : VerifiedSync(job, plan, 1, source, target, false)) {
      ASSERT_TRUE(status.ok()) << status;
    }
    const BufferKey source_key{0, job.source().buffers[0].id};
    ASSERT_EQ(0, std::memcmp(source.data(source_key), target.data(key), target.bytes(key)));
    if (pattern) FillPattern(2, &source);
    const std::vector<absl::Status> second = VerifiedSync(job, plan, 2, source, target, true);
    if (pattern) {
      EXPECT_EQ(second[rollout].code(), absl::StatusCode::kDataLoss) << second[rollout];
      EXPECT_THAT(std::string(second[rollout].message()),
                  ::testing::HasSubstr("verify: chunk 0 of 1 from process 0 differs"));
    } else {
      // The stale chunk holds the same bytes as the new one: nothing to catch.
      EXPECT_TRUE(second[rollout].ok()) << second[rollout];
    }
  }
}

}  // namespace
}  // namespace wsync::test
