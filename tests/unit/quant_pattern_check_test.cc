// test::CheckQuantizedPattern, the FP8 check of `wsync_test_worker --verify_quant`: after a real
// sync (the executor, every process a thread over the loopback transport) from trainers that wrote
// FillPattern into FP8 rollouts of qwen2.5-tiny, every rollout's e4m3 bytes and scales pass; a
// flipped e4m3 byte or scale, another version, or a replicated trainer (whose copies hold
// different pattern bytes) fail, naming what differs.

#include "integration/fill/quant_check.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "executor/execute.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/fill/fill.h"
#include "planner/job.h"
#include "planner/layout_parts.h"
#include "planner/models.h"
#include "planner/named_layouts.h"
#include "planner/policy.h"
#include "tests/testing/executor_checks.h"
#include "tests/testing/loopback_threads.h"
#include "tests/testing/reference.h"

namespace wsync::test {
namespace {

using ::testing::HasSubstr;

struct Synced {
  Job job;
  HostBuffers source;
  HostBuffers target;
};

// One sync of qwen2.5-tiny `from` -> `to` with the trainers' FillPattern(version).
Synced SyncPattern(const std::string& from, const std::string& to, uint64_t version) {
  absl::StatusOr<NamedJobLayouts> layouts =
      BuildNamedJobLayouts(*GetModel("qwen2.5-tiny"), from, to);
  EXPECT_TRUE(layouts.ok()) << layouts.status();
  absl::StatusOr<Job> job = Job::Create(layouts->source, layouts->target);
  EXPECT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(job->HasQuantizedParams());
  Synced synced{*job, HostBuffers(job->source(), kSourceFill), HostBuffers(job->target(), kPoison)};
  FillPattern(version, &synced.source);
  const Plan plan = *MakePlan(synced.job, *MakeFirstHolderPolicy());
  const std::vector<absl::Status> results = RunOnLoopbackThreads<absl::Status>(
      synced.job.num_processes(),
      [&](int32_t p, std::unique_ptr<Transport> transport, Group& group) {
        ExecuteOptions options = SyncOptionsOf(plan, version);
        options.quant = &plan.quant;
        return ExecuteTransfers(synced.job, plan.segments, AllProcesses(synced.job),
                                StagingBudget{1 << 20}, p,
                                BuffersOf(synced.job, p, synced.source, synced.target), *transport,
                                group, options)
            .status();
      });
  for (const absl::Status& status : results) EXPECT_TRUE(status.ok()) << status;
  return synced;
}

// The e4m3 elements the pieces of `part` hold.
int64_t Fp8Elements(const Layout& part) {
  int64_t elements = 0;
  for (const Piece& piece : part.pieces) {
    if (part.params[piece.param].quant.quantized()) elements += Volume(piece.box);
  }
  return elements;
}

// The first piece of `part` of a quantized parameter (or, with `scales`, of a scale parameter).
const Piece& FirstPiece(const Layout& part, bool scales) {
  for (const Piece& piece : part.pieces) {
    const ParamInfo& info = part.params[piece.param];
    const bool is_scale = info.dtype == DType::kFloat32 && !info.quant.quantized() &&
                          absl::StrContains(info.name, "scale");
    if (scales ? is_scale : info.quant.quantized()) return piece;
  }
  ADD_FAILURE() << "no such piece";
  return part.pieces.front();
}

TEST(QuantPatternCheckTest, EveryRolloutPassesAfterARealSync) {
  for (const char* to : {"vllm(dp=2,quant=fp8_block)", "vllm(dp=2,quant=fp8_channel)",
                         "vllm(tp=2,quant=fp8_tensor)"}) {
    SCOPED_TRACE(to);
    Synced synced = SyncPattern("megatron(tp=2)", to, 3);
    for (int32_t rank = 0; rank < 2; ++rank) {
      const Layout part = LayoutPart(synced.job.target(), rank);
      absl::StatusOr<int64_t> checked =
          CheckQuantizedPattern(synced.job.source(), part, synced.target, 3);
      ASSERT_TRUE(checked.ok()) << checked.status();
      EXPECT_EQ(*checked, Fp8Elements(part));
      EXPECT_GT(*checked, 0);
    }
  }
}

TEST(QuantPatternCheckTest, AFlippedByteOrScaleOrAnotherVersionFails) {
  Synced synced = SyncPattern("megatron(tp=2)", "vllm(dp=2,quant=fp8_block)", 1);
  const Layout part = LayoutPart(synced.job.target(), 1);
  const absl::StatusOr<int64_t> stale =
      CheckQuantizedPattern(synced.job.source(), part, synced.target, 2);
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kDataLoss) << stale.status();

  const Piece& weight = FirstPiece(part, /*scales=*/false);
  unsigned char* byte = synced.target.data({weight.process, weight.buffer}) + weight.offset;
  *byte ^= 0x01;
  absl::StatusOr<int64_t> flipped =
      CheckQuantizedPattern(synced.job.source(), part, synced.target, 1);
  EXPECT_EQ(flipped.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(flipped.status().message()),
              HasSubstr(absl::StrCat("parameter ", part.params[weight.param].name, ": e4m3 byte")));
  *byte ^= 0x01;
  ASSERT_TRUE(CheckQuantizedPattern(synced.job.source(), part, synced.target, 1).ok());

  const Piece& scale = FirstPiece(part, /*scales=*/true);
  unsigned char* scale_byte = synced.target.data({scale.process, scale.buffer}) + 4 * scale.offset;
  scale_byte[0] ^= 0x01;  // The lowest mantissa bit of the first scale.
  flipped = CheckQuantizedPattern(synced.job.source(), part, synced.target, 1);
  EXPECT_EQ(flipped.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(flipped.status().message()), HasSubstr(": scale ("));
}

TEST(QuantPatternCheckTest, ReplicatedOrMissingSourceElementsAreRefused) {
  Synced synced = SyncPattern("megatron(tp=2)", "vllm(dp=2,quant=fp8_block)", 1);
  const Layout part = LayoutPart(synced.job.target(), 0);
  Layout doubled = synced.job.source();
  doubled.pieces.insert(doubled.pieces.end(), synced.job.source().pieces.begin(),
                        synced.job.source().pieces.end());
  absl::StatusOr<int64_t> checked = CheckQuantizedPattern(doubled, part, synced.target, 1);
  EXPECT_EQ(checked.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(checked.status().message()), HasSubstr("held by several"));

  Layout none = synced.job.source();
  none.pieces.clear();
  checked = CheckQuantizedPattern(none, part, synced.target, 1);
  EXPECT_EQ(checked.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(checked.status().message()), HasSubstr("held by no trainer piece"));
}

TEST(QuantPatternCheckTest, ARolloutWithoutFp8ChecksNothing) {
  absl::StatusOr<NamedJobLayouts> layouts =
      BuildNamedJobLayouts(*GetModel("qwen2.5-tiny"), "megatron(tp=2)", "vllm(tp=2)");
  ASSERT_TRUE(layouts.ok());
  const Layout part = LayoutPart(layouts->target, 0);
  HostBuffers buffers(part, kPoison);
  absl::StatusOr<int64_t> checked = CheckQuantizedPattern(layouts->source, part, buffers, 1);
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_EQ(*checked, 0);
}

}  // namespace
}  // namespace wsync::test
