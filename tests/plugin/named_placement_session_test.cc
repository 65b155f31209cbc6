// Placement keys given to Session::SetNamedLayout (the C ABI's set_named_layout): every process
// of a 2 + 2 job names its side with ppn and colocated, connects (so the plan digests agree), and
// the plan it runs is the plan `wsync plan` makes of the same specs (BuildNamedJobLayouts): the
// same digest, and the path class of every peer as that placement says.

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/fill/fill.h"
#include "planner/job.h"
#include "planner/layout_parts.h"
#include "planner/models.h"
#include "planner/named_layouts.h"
#include "planner/plan.h"
#include "planner/policy.h"
#include "plugin/session.h"
#include "tests/plugin/tiny_session.h"

namespace wsync {
namespace {

using ::testing::HasSubstr;

constexpr char kModel[] = "qwen2.5-tiny";

struct NamedProcess {
  std::unique_ptr<Session> session;
  Layout part;
  std::unique_ptr<test::HostBuffers> memory;
};

// A process whose layout is only the named spec: buffers registered as the layout names them,
// then SetNamedLayout. node_id "host" is what processes without placement keys report.
NamedProcess MakeNamedProcess(Role role, int32_t rank, int port, const std::string& job,
                              const std::string& spec) {
  SessionConfig config = test::TinyJobConfig(role, rank, port, job, "WSYNC_PLACEMENT_SECRET");
  config.node_id = "host";
  config.deadline = absl::Seconds(20);
  NamedProcess process;
  absl::StatusOr<std::unique_ptr<Session>> session = Session::Create(config);
  EXPECT_TRUE(session.ok()) << session.status();
  process.session = *std::move(session);
  absl::StatusOr<Layout> whole = BuildNamedLayout(*GetModel(kModel), spec);
  EXPECT_TRUE(whole.ok()) << whole.status();
  process.part = LayoutPart(*whole, rank);
  process.memory = std::make_unique<test::HostBuffers>(process.part, test::kPoison);
  for (const BufferInfo& buffer : process.part.buffers) {
    EXPECT_TRUE(process.session
                    ->RegisterBuffer(buffer.id, process.memory->data({rank, buffer.id}),
                                     buffer.bytes, MemoryKind::kHost, 0)
                    .ok());
  }
  const absl::Status named = process.session->SetNamedLayout(kModel, spec);
  EXPECT_TRUE(named.ok()) << named;
  return process;
}

// The plan `wsync plan --model qwen2.5-tiny --from FROM --to TO` makes, as the session's default
// policy plans it.
struct ExpectedPlan {
  std::unique_ptr<Job> job;
  std::string digest;
};
ExpectedPlan PlanOfWsyncPlan(const std::string& from, const std::string& to) {
  absl::StatusOr<NamedJobLayouts> layouts = BuildNamedJobLayouts(*GetModel(kModel), from, to);
  EXPECT_TRUE(layouts.ok()) << layouts.status();
  absl::StatusOr<Job> job = Job::Create(std::move(layouts->source), std::move(layouts->target));
  EXPECT_TRUE(job.ok()) << job.status();
  ExpectedPlan expected;
  expected.job = std::make_unique<Job>(*std::move(job));
  auto policy = MakeReplicaPolicy("local_first_least_loaded");
  EXPECT_TRUE(policy.ok());
  absl::StatusOr<Plan> plan = MakePlan(*expected.job, **policy, PlanOptions{});
  EXPECT_TRUE(plan.ok()) << plan.status();
  expected.digest = DigestHex(plan->digest);
  return expected;
}

// Connects the four processes, syncs version 1 (rollouts check every element), and checks each
// schedule report against `expected`: its digest, and each peer's path class.
void ConnectSyncAndCompare(std::vector<NamedProcess>& processes, const ExpectedPlan& expected) {
  std::vector<absl::Status> results(processes.size());
  std::vector<std::thread> threads;
  for (size_t p = 0; p < processes.size(); ++p) {
    threads.emplace_back([&, p] {
      NamedProcess& me = processes[p];
      results[p] = me.session->Connect();
      if (results[p].ok() && p < 2) results[p] = test::FillLogical(me.part, 1, me.memory.get());
      if (results[p].ok()) results[p] = me.session->Sync(1);
      if (results[p].ok() && p >= 2) results[p] = test::CheckLogical(me.part, *me.memory, 1);
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (size_t p = 0; p < processes.size(); ++p) {
    ASSERT_TRUE(results[p].ok()) << p << ": " << results[p];
    absl::StatusOr<std::string> report = processes[p].session->ScheduleReport();
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_THAT(*report, HasSubstr(absl::StrCat("plan digest ", expected.digest)));
    for (int32_t peer = 0; peer < expected.job->num_processes(); ++peer) {
      if (peer == static_cast<int32_t>(p)) continue;
      const std::string path(expected.job->PathClass(static_cast<int32_t>(p), peer));
      for (const char* direction : {"to", "from"}) {
        const std::string line = absl::StrCat(direction, " process ", peer, " (");
        const size_t at = report->find(line);
        if (at == std::string::npos) continue;
        EXPECT_EQ(report->substr(at + line.size(), path.size() + 1), path + ")")
            << "process " << p << " " << line << "\n"
            << *report;
      }
    }
  }
}

class NamedPlacementSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("WSYNC_PLACEMENT_SECRET", "placement-session-secret-0123456789abcdef", 1);
  }

  void Run(const std::string& from, const std::string& to, const std::string& job) {
    const int port = test::FreeLoopbackPort();
    std::vector<NamedProcess> processes;
    for (int r = 0; r < 2; ++r)
      processes.push_back(MakeNamedProcess(Role::kTrainer, r, port, job, from));
    for (int r = 0; r < 2; ++r)
      processes.push_back(MakeNamedProcess(Role::kRollout, r, port, job, to));
    ConnectSyncAndCompare(processes, PlanOfWsyncPlan(from, to));
  }
};

TEST_F(NamedPlacementSessionTest, ColocatedKeysPlaceEachRankOnItsTrainerRanksGpu) {
  const std::string from = "megatron(tp=2,ppn=2,colocated=1)";
  const std::string to = "vllm(tp=2,ppn=2,colocated=1)";
  const ExpectedPlan expected = PlanOfWsyncPlan(from, to);
  // What the comparison relies on: rollout rank r shares trainer rank r's GPU.
  EXPECT_EQ(expected.job->PathClass(0, expected.job->TargetId(0)), kPathSameDevice);
  EXPECT_EQ(expected.job->PathClass(0, expected.job->TargetId(1)), kPathIntraNode);
  Run(from, to, "colocated");
}

TEST_F(NamedPlacementSessionTest, SeparateNodeKeysPlaceEachSideOnItsOwnNodes) {
  Run("megatron(tp=2,ppn=1)", "vllm(tp=2,ppn=2,colocated=0)", "separate");
}

TEST_F(NamedPlacementSessionTest, WithoutKeysTheProcessIsOnItsNodeIdWithNoGpu) {
  SessionConfig config =
      test::TinyJobConfig(Role::kRollout, 1, 1, "plain", "WSYNC_PLACEMENT_SECRET");
  config.node_id = "host";
  absl::StatusOr<std::unique_ptr<Session>> session = Session::Create(config);
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_TRUE((*session)->SetNamedLayout(kModel, "vllm(tp=2)").ok());
  ASSERT_EQ((*session)->part().processes.size(), 1u);
  EXPECT_EQ((*session)->part().processes[0].node_id, "host");
  EXPECT_EQ((*session)->part().processes[0].device, kUnknownDevice);
  // With keys: the named layout's node and GPU.
  absl::StatusOr<std::unique_ptr<Session>> keyed = Session::Create(config);
  ASSERT_TRUE(keyed.ok()) << keyed.status();
  ASSERT_TRUE((*keyed)->SetNamedLayout(kModel, "vllm(tp=2,ppn=1,colocated=1)").ok());
  EXPECT_EQ((*keyed)->part().processes[0].node_id, "node1");
  EXPECT_EQ((*keyed)->part().processes[0].device, 0);
  // A malformed placement key is refused as the named layouts refuse it.
  absl::StatusOr<std::unique_ptr<Session>> bad = Session::Create(config);
  ASSERT_TRUE(bad.ok()) << bad.status();
  const absl::Status refused = (*bad)->SetNamedLayout(kModel, "vllm(tp=2,colocated=2)");
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("colocated must be 0 or 1"));
}

}  // namespace
}  // namespace wsync
