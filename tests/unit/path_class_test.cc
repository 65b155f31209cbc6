// Path classes of process pairs (Job::PathClass): random placements (nodes and GPUs) against a
// reference rule, the placement of colocated named layouts, and the device field through the
// manifest codec, validation and the layouts digest.

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/job.h"
#include "planner/layout.h"
#include "planner/manifest_codec.h"
#include "planner/named_layouts.h"
#include "planner/validate.h"
#include "tests/unit/named_layouts_testing.h"

namespace wsync {
namespace {

using ::testing::HasSubstr;
using ::wsync::test::named::Model;

// The rule of the issue, written from the ProcessInfo of both processes.
std::string ReferencePathClass(bool same_process, const ProcessInfo& a, const ProcessInfo& b) {
  if (same_process) return "local";
  if (a.node_id != b.node_id) return "inter_node";
  if (a.device >= 0 && a.device == b.device) return "same_device";
  return "intra_node";
}

const ProcessInfo& Info(const Job& job, int32_t id) {
  const JobProcess& process = job.processes()[id];
  const Layout& layout = job.IsSource(id) ? job.source() : job.target();
  return layout.processes[process.rank];
}

NamedJobLayouts Layouts(const std::string& from, const std::string& to) {
  absl::StatusOr<NamedJobLayouts> layouts = BuildNamedJobLayouts(Model("qwen2.5-0.5b"), from, to);
  EXPECT_TRUE(layouts.ok()) << from << " " << to << ": " << layouts.status();
  return *std::move(layouts);
}

TEST(PathClassTest, RandomPlacementsFollowTheReferenceRule) {
  std::mt19937 rng(28);
  const std::vector<std::string> trainers = {"megatron(tp=2,dp=2)", "fsdp(3)", "megatron(tp=1)"};
  const std::vector<std::string> rollouts = {"vllm(tp=2)", "vllm(tp=1,dp=3)", "vllm(tp=2,dp=2)"};
  int same_device = 0;
  for (int trial = 0; trial < 200; ++trial) {
    NamedJobLayouts layouts =
        Layouts(trainers[rng() % trainers.size()], rollouts[rng() % rollouts.size()]);
    // Nodes from two names and devices from {unknown, 0, 1}: every class turns up.
    for (Layout* layout : {&layouts.source, &layouts.target}) {
      for (ProcessInfo& process : layout->processes) {
        process.node_id = absl::StrCat("n", rng() % 2);
        process.device = static_cast<int32_t>(rng() % 3) - 1;
      }
    }
    absl::StatusOr<Job> job = Job::Create(std::move(layouts.source), std::move(layouts.target));
    ASSERT_TRUE(job.ok()) << job.status();
    for (int32_t a = 0; a < job->num_processes(); ++a) {
      for (int32_t b = 0; b < job->num_processes(); ++b) {
        const std::string expected = ReferencePathClass(a == b, Info(*job, a), Info(*job, b));
        ASSERT_EQ(job->PathClass(a, b), expected) << "trial " << trial << ": " << a << " -> " << b;
        same_device += expected == "same_device" ? 1 : 0;
      }
    }
  }
  EXPECT_GT(same_device, 0);
}

TEST(PathClassTest, ColocatedLayoutsPutRolloutRankOnItsTrainerRanksGpu) {
  std::mt19937 rng(2028);
  for (int trial = 0; trial < 40; ++trial) {
    const int32_t ppn = 1 + static_cast<int32_t>(rng() % 4);
    const bool colocated = rng() % 2 == 0;
    const std::string keys = absl::StrCat("ppn=", ppn, ",colocated=", colocated ? 1 : 0);
    NamedJobLayouts layouts = Layouts(absl::StrCat("megatron(tp=2,dp=2,", keys, ")"),
                                      absl::StrCat("vllm(tp=2,dp=2,", keys, ")"));
    absl::StatusOr<Job> job = Job::Create(std::move(layouts.source), std::move(layouts.target));
    ASSERT_TRUE(job.ok()) << job.status();
    for (int32_t trainer = 0; trainer < 4; ++trainer) {
      for (int32_t rollout = 0; rollout < 4; ++rollout) {
        std::string expected;
        if (!colocated || trainer / ppn != rollout / ppn) {
          expected = "inter_node";
        } else {
          expected = trainer % ppn == rollout % ppn ? "same_device" : "intra_node";
        }
        EXPECT_EQ(job->PathClass(trainer, job->TargetId(rollout)), expected)
            << keys << ": trainer " << trainer << " -> rollout " << rollout;
      }
    }
  }
}

TEST(PathClassTest, DeviceTravelsInTheManifestAndTheDigest) {
  NamedJobLayouts layouts = Layouts("megatron(tp=2,colocated=1)", "vllm(tp=2)");
  EXPECT_EQ(layouts.target.processes[1].device, 1);
  absl::StatusOr<Layout> parsed = ParseLayout(SerializeLayout(layouts.target));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->processes[1].device, 1);
  const uint64_t digest = LayoutsDigest(layouts.source, layouts.target);
  // Unknown stays unknown (no device field), and a different GPU is a different digest.
  NamedJobLayouts separate = Layouts("megatron(tp=2)", "vllm(tp=2)");
  absl::StatusOr<Layout> unknown = ParseLayout(SerializeLayout(separate.target));
  ASSERT_TRUE(unknown.ok()) << unknown.status();
  EXPECT_EQ(unknown->processes[0].device, kUnknownDevice);
  layouts.target.processes[1].device = 0;
  EXPECT_NE(LayoutsDigest(layouts.source, layouts.target), digest);
}

TEST(PathClassTest, OutOfRangeDevicesAreRefused) {
  NamedJobLayouts layouts = Layouts("megatron(tp=2)", "vllm(tp=2)");
  layouts.target.processes[0].device = -2;
  absl::Status status = ValidateLayout(layouts.target);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("has device -2"));
  layouts.target.processes[0].device = kMaxDevice + 1;
  EXPECT_FALSE(ValidateLayout(layouts.target).ok());
  // The decoder refuses a device outside [0, kMaxDevice] before validation sees it.
  proto::Manifest manifest = ToManifest(layouts.target);
  manifest.mutable_processes(0)->set_device(-1);
  absl::StatusOr<Layout> decoded = ParseLayout(manifest.SerializeAsString());
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(decoded.status().message()), HasSubstr("manifest device -1"));
}

}  // namespace
}  // namespace wsync
