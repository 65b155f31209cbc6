// A process refuses a roster whose copy of its own layout is not what it sent, or that would make
// it touch memory it never registered (plugin/roster_check.h). The rosters are built directly, as
// a tampering coordinator or an on-path attacker would send them.
//
// The bug each case catches: the session planning on the roster's copy of its own manifest
// unchecked (the executor then trusts buffer sizes from the wire and writes past the host's
// buffers).

#include "plugin/roster_check.h"

#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/builders.h"
#include "planner/layout_parts.h"
#include "planner/manifest_codec.h"
#include "planner/policy.h"

namespace wsync {
namespace {

using ::testing::HasSubstr;

// "w" [8, 8] fp32: one trainer holding all of it in a 256-byte buffer, one rollout likewise.
Layout Side(Role role, int64_t buffer_bytes = 256) {
  LayoutBuilder b(role);
  const int32_t w = b.AddParam("w", DType::kFloat32, {8, 8});
  b.AddProcess(role == Role::kTrainer ? "t" : "r");
  const uint64_t buffer = b.AddBuffer(0, buffer_bytes);
  b.AddPackedPiece(w, 0, buffer, WholeBox({8, 8}), 0);
  return std::move(b).Build();
}

Roster TwoProcessRoster(const std::string& trainer_manifest, const std::string& rollout_manifest) {
  Roster roster;
  roster.num_trainers = 1;
  roster.num_rollouts = 1;
  roster.blobs = {trainer_manifest, rollout_manifest, ""};
  roster.processes = {RosterEntry{0, ControlRole::kTrainer, 0, "t", 0, 2, "a"},
                      RosterEntry{1, ControlRole::kRollout, 0, "r", 1, 2, "b"}};
  return roster;
}

std::string Message(const absl::Status& status) { return std::string(status.message()); }

TEST(RosterCheckTest, AcceptsTheManifestItSent) {
  const std::string sent = SerializeLayout(Side(Role::kRollout));
  const Roster roster = TwoProcessRoster(SerializeLayout(Side(Role::kTrainer)), sent);
  EXPECT_TRUE(CheckOwnRosterEntry(roster, 1, ControlRole::kRollout, 0, sent).ok());
}

TEST(RosterCheckTest, RefusesATamperedCopyOfItsOwnManifest) {
  const std::string sent = SerializeLayout(Side(Role::kRollout));
  // The rollout's buffer claimed 16 times larger: planning on it would write past the real one.
  const Roster roster = TwoProcessRoster(SerializeLayout(Side(Role::kTrainer)),
                                         SerializeLayout(Side(Role::kRollout, 4096)));
  const absl::Status status = CheckOwnRosterEntry(roster, 1, ControlRole::kRollout, 0, sent);
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_EQ(ErrorKind(status), std::string(kErrorLayoutRefused));
  EXPECT_THAT(Message(status), HasSubstr("differs from the one it sent"));
  EXPECT_THAT(Message(status), HasSubstr("before any byte moves"));
}

TEST(RosterCheckTest, RefusesAnEntryNamingAnotherProcess) {
  const std::string sent = SerializeLayout(Side(Role::kRollout));
  Roster roster = TwoProcessRoster(SerializeLayout(Side(Role::kTrainer)), sent);
  roster.processes[1].rank = 3;
  EXPECT_THAT(Message(CheckOwnRosterEntry(roster, 1, ControlRole::kRollout, 0, sent)),
              HasSubstr("rollout rank 3, this process is rollout rank 0"));
  roster = TwoProcessRoster(SerializeLayout(Side(Role::kTrainer)), sent);
  roster.processes.pop_back();
  EXPECT_FALSE(CheckOwnRosterEntry(roster, 1, ControlRole::kRollout, 0, sent).ok());
  roster = TwoProcessRoster(SerializeLayout(Side(Role::kTrainer)), sent);
  roster.processes[1].manifest_blob = 7;
  EXPECT_THAT(Message(CheckOwnRosterEntry(roster, 1, ControlRole::kRollout, 0, sent)),
              HasSubstr("manifest is missing"));
}

// Plans the job of two sides and checks process `process` against `registered`.
absl::Status CheckJob(const Layout& trainer, const Layout& rollout, int32_t process,
                      const std::vector<BufferInfo>& registered) {
  absl::StatusOr<Job> job = Job::Create(trainer, rollout);
  if (!job.ok()) return job.status();
  PlanOptions options;
  options.process = process;
  absl::StatusOr<Plan> plan = MakePlan(*job, *MakeFirstHolderPolicy(), options);
  if (!plan.ok()) return plan.status();
  return CheckOwnMemory(*job, plan->segments, process, registered);
}

TEST(RosterCheckTest, RefusesAJobWhoseBuffersAreNotTheRegisteredOnes) {
  const std::vector<BufferInfo> registered = {BufferInfo{0, 0, 256, MemoryKind::kHost}};
  EXPECT_TRUE(CheckJob(Side(Role::kTrainer), Side(Role::kRollout), 1, registered).ok());
  // The roster's layout grew the buffer: refused, whatever the manifest said.
  absl::Status status = CheckJob(Side(Role::kTrainer), Side(Role::kRollout, 4096), 1, registered);
  EXPECT_THAT(Message(status), HasSubstr("4096 bytes of host memory in the roster, 256 bytes"));
  EXPECT_EQ(ErrorKind(status), std::string(kErrorLayoutRefused));
  // A buffer never registered.
  status = CheckJob(Side(Role::kTrainer), Side(Role::kRollout), 1, {});
  EXPECT_THAT(Message(status), HasSubstr("never registered"));
  // Same size, other memory kind.
  status = CheckJob(Side(Role::kTrainer), Side(Role::kRollout), 1,
                    {BufferInfo{0, 0, 256, MemoryKind::kCuda}});
  EXPECT_THAT(Message(status), HasSubstr("cuda memory registered"));
}

TEST(RosterCheckTest, RefusesSegmentsReachingPastARegisteredBuffer) {
  // The trainer side checks its reads as well: a registration smaller than the roster's buffer.
  const std::vector<BufferInfo> small = {BufferInfo{0, 0, 128, MemoryKind::kHost}};
  const absl::Status status = CheckJob(Side(Role::kTrainer), Side(Role::kRollout), 0, small);
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(Message(status), HasSubstr("256 bytes of host memory in the roster, 128 bytes"));
}

}  // namespace
}  // namespace wsync
