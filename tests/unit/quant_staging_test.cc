// The sender's quantization staging layout (executor/quant_work.h: LayOutQuantStaging) over the
// rounds of named layouts at several budgets, checked against the send lanes it is computed from:
// each send's e4m3 blocks are quantized at the first message of its lane carrying them; two sends
// share staging bytes only when one's life (its first message to the one after its last) ends
// before the other's begins; scales, the scratch and the transient overlap nothing; every region
// lies in the staging; and its addresses map each virtual staging byte a segment reads to its
// place.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/quant_work.h"
#include "executor/schedule.h"
#include "executor/work.h"
#include "gtest/gtest.h"
#include "tests/testing/executor_checks.h"
#include "tests/unit/quant_plan_support.h"

namespace wsync {
namespace {

using executor_internal::QuantStagingLayout;
using executor_internal::QuantWork;
using executor_internal::Work;

struct Region {
  int64_t begin = 0, end = 0;
  bool Overlaps(const Region& other) const { return begin < other.end && other.begin < end; }
};

// Where each send's e4m3 bytes travel, found from the lanes: (lane, first message, last message).
struct Life {
  int32_t lane = -1;
  int32_t first = std::numeric_limits<int32_t>::max();
  int32_t last = -1;
};

std::vector<Life> Lives(const Work& work, const QuantWork& quant) {
  std::vector<Life> lives(quant.sends.size());
  std::map<int32_t, size_t> send_of;  // By e4m3 segment.
  for (size_t i = 0; i < quant.sends.size(); ++i) send_of[quant.sends[i].fp8_segment] = i;
  for (int32_t lane = 0; lane < static_cast<int32_t>(work.lanes.size()); ++lane) {
    if (work.lanes[lane].direction != Direction::kSend) continue;
    for (int32_t m = 0; m < static_cast<int32_t>(work.lanes[lane].messages.size()); ++m) {
      for (int32_t chunk : work.lanes[lane].messages[m].chunks) {
        const auto it = send_of.find(work.chunks[chunk].segment);
        if (it == send_of.end()) continue;
        Life& life = lives[it->second];
        life.lane = lane;
        life.first = std::min(life.first, m);
        life.last = std::max(life.last, m);
      }
    }
  }
  return lives;
}

void CheckLayout(const Work& work, const QuantWork& quant) {
  const QuantStagingLayout& layout = quant.layout;
  ASSERT_EQ(layout.steps.size(), quant.sends.size());
  const std::vector<Life> lives = Lives(work, quant);
  std::vector<Region> fp8(quant.sends.size()), scales(quant.sends.size());
  for (size_t i = 0; i < quant.sends.size(); ++i) {
    const QuantTransform& step = quant.sends[i].step;
    const QuantStagingLayout::Placement& placement = layout.steps[i];
    fp8[i] = {placement.fp8, placement.fp8 + Volume(step.blocks)};
    scales[i] = {placement.scales, placement.scales + Volume(step.scale_box) * 4};
    EXPECT_EQ(placement.lane, lives[i].lane) << i;
    if (placement.lane >= 0) {
      EXPECT_EQ(placement.birth, lives[i].first) << i;
      const auto births = layout.births.find({placement.lane, placement.birth});
      ASSERT_NE(births, layout.births.end());
      EXPECT_NE(std::find(births->second.begin(), births->second.end(), i), births->second.end());
    }
    for (const Region& r : {fp8[i], scales[i]}) {
      EXPECT_GE(r.begin, 0);
      EXPECT_LE(r.end, layout.bytes);
    }
    // The virtual bytes the segments read map to the placed ones.
    EXPECT_EQ(layout.Physical(quant.sends[i].fp8_offset), placement.fp8);
    EXPECT_EQ(layout.Physical(quant.sends[i].fp8_offset + Volume(step.blocks) - 1), fp8[i].end - 1);
    EXPECT_EQ(layout.Physical(quant.sends[i].scale_offset), placement.scales);
  }
  const Region transient{layout.transient, layout.transient};  // Its size: the largest user's.
  for (size_t i = 0; i < quant.sends.size(); ++i) {
    for (size_t j = 0; j < quant.sends.size(); ++j) {
      EXPECT_TRUE(i == j || !scales[i].Overlaps(scales[j])) << i << " " << j;
      EXPECT_FALSE(scales[i].Overlaps(fp8[j])) << i << " " << j;
      if (i == j || lives[i].lane < 0 || lives[j].lane < 0 || !fp8[i].Overlaps(fp8[j])) continue;
      // Sharing bytes: on one lane, one send's life over before the other's begins.
      EXPECT_EQ(lives[i].lane, lives[j].lane) << i << " " << j;
      EXPECT_TRUE(lives[i].last + 1 < lives[j].first || lives[j].last + 1 < lives[i].first)
          << "sends " << i << " and " << j << " share staging while both alive: messages ["
          << lives[i].first << ", " << lives[i].last << "] and [" << lives[j].first << ", "
          << lives[j].last << "]";
    }
    if (lives[i].lane >= 0) {
      EXPECT_GE(fp8[i].begin, transient.begin) << i;
    }
  }
}

TEST(QuantStagingTest, StepsShareStagingOnlyWhenTheirLivesDoNotOverlap) {
  using Case = quant_plan_test::NamedSpec;
  const Case cases[] = {
      {"qwen2.5-0.5b", "megatron(tp=2)", "vllm(dp=4, quant=fp8_block)"},
      {"qwen2.5-tiny", "megatron(tp=2, pp=2)", "vllm(tp=2, quant=fp8_channel)"},
      {"deepseek-v3-tiny", "megatron(tp=2, ep=2)", "vllm(tp=2, ep=2, quant=fp8_block)"},
  };
  int shared = 0;  // Sends placed over bytes another send used before.
  for (const Case& c : cases) {
    absl::StatusOr<quant_plan_test::NamedJob> named = quant_plan_test::MakeNamedJob(c);
    ASSERT_TRUE(named.ok()) << named.status();
    const Job* job = &named->job;
    const Plan* plan = &named->plan;
    for (const int64_t budget : {int64_t{64} << 20, int64_t{1} << 20, int64_t{16} << 10}) {
      for (int32_t p = 0; p < job->num_processes(); ++p) {
        if (!job->IsSource(p)) continue;
        SCOPED_TRACE(::testing::Message() << c.model << " " << c.source << " -> " << c.target
                                          << " budget " << budget << " process " << p);
        absl::StatusOr<QuantWork> quant =
            executor_internal::BuildQuantWork(*job, plan->segments, plan->quant, p);
        ASSERT_TRUE(quant.ok()) << quant.status();
        absl::StatusOr<Work> work = executor_internal::BuildWorkWithQuant(
            *job, plan->segments, *quant, test::AllProcesses(*job),
            StagingBudget{static_cast<double>(budget)}, p);
        ASSERT_TRUE(work.ok()) << work.status();
        EXPECT_EQ(work->quant_staging_bytes, quant->layout.bytes);
        CheckLayout(*work, *quant);
        if (HasFatalFailure()) return;
        for (size_t i = 0; i < quant->sends.size(); ++i) {
          for (size_t j = 0; j < i; ++j) {
            const auto& a = quant->layout.steps[i];
            const auto& b = quant->layout.steps[j];
            shared += a.lane >= 0 && a.lane == b.lane && a.fp8 == b.fp8;
          }
        }
      }
    }
  }
  EXPECT_GT(shared, 100);  // The rings reuse their bytes.
}

}  // namespace
}  // namespace wsync
