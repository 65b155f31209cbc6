// DescribeJobProgress (integration/cli/demo_progress_line.h), the text of `wsync demo`'s progress
// line: random jobs of processes reporting progress for the demo's step and for others, checked
// against sums and a minimum computed here.

#include "integration/cli/demo_progress_line.h"

#include <cstdint>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"

namespace wsync::cli {
namespace {

control::ProcessStatus* AddProcess(control::JobStatusBody& body, control::Role role, int32_t rank) {
  control::ProcessStatus* process = body.add_processes();
  process->set_process(body.processes_size() - 1);
  process->set_role(role);
  process->set_rank(rank);
  return process;
}

TEST(DescribeJobProgressTest, EmptyWhileNoProcessReportsTheStep) {
  control::JobStatusBody body;
  AddProcess(body, control::ROLE_TRAINER, 0);  // Never reported.
  control::ProcessStatus* earlier = AddProcess(body, control::ROLE_ROLLOUT, 0);
  earlier->mutable_progress()->set_version(2);
  earlier->mutable_progress()->set_phase(control::SYNC_PHASE_TRANSFERRING);
  EXPECT_EQ(DescribeJobProgress(body, 3, 5), "");
}

TEST(DescribeJobProgressTest, ExactTextOfOneJob) {
  control::JobStatusBody body;
  for (int rank = 0; rank < 2; ++rank) {
    control::SyncProgress* p = AddProcess(body, control::ROLE_TRAINER, rank)->mutable_progress();
    p->set_version(3);
    p->set_phase(control::SYNC_PHASE_VOTING);
    p->set_rounds_done(10);
    p->set_rounds_total(10);
    p->set_bytes_done(int64_t{64} << 20);
    p->set_bytes_total(int64_t{64} << 20);
  }
  control::SyncProgress* slow = AddProcess(body, control::ROLE_ROLLOUT, 1)->mutable_progress();
  slow->set_version(3);
  slow->set_phase(control::SYNC_PHASE_TRANSFERRING);
  slow->set_rounds_done(2);
  slow->set_rounds_total(10);
  slow->set_bytes_done(int64_t{16} << 20);
  slow->set_bytes_total(int64_t{64} << 20);
  EXPECT_EQ(DescribeJobProgress(body, 3, 5),
            "step 3/5: 1 transferring, 2 voting; rounds 22/30, 144.0/192.0 MiB; furthest "
            "behind: rollout rank 1 (round 2 of 10)");
}

TEST(DescribeJobProgressTest, RandomJobsSumTheStepAndNameTheSlowestTransfer) {
  std::mt19937_64 random(20261202);
  for (int trial = 0; trial < 300; ++trial) {
    control::JobStatusBody body;
    const int64_t version = 1 + static_cast<int64_t>(random() % 4);
    const int processes = 1 + static_cast<int>(random() % 12);
    int64_t rounds_done = 0, rounds_total = 0, bytes_done = 0, bytes_total = 0;
    int reporting = 0;
    int behind = -1;
    double behind_fraction = 2;
    for (int i = 0; i < processes; ++i) {
      const bool trainer = random() % 2 == 0;
      control::ProcessStatus* process =
          AddProcess(body, trainer ? control::ROLE_TRAINER : control::ROLE_ROLLOUT, i);
      if (random() % 5 == 0) continue;  // No heartbeat with progress yet.
      control::SyncProgress* p = process->mutable_progress();
      p->set_version(random() % 4 == 0 ? version + 1 : version);
      p->set_phase(static_cast<control::SyncPhase>(random() % 5));
      p->set_rounds_total(static_cast<int64_t>(random() % 100));
      p->set_rounds_done(
          p->rounds_total() == 0 ? 0 : static_cast<int64_t>(random()) % (p->rounds_total() + 1));
      p->set_bytes_total(static_cast<int64_t>(random() % (int64_t{1} << 30)));
      p->set_bytes_done(
          p->bytes_total() == 0
              ? 0
              : static_cast<int64_t>(random() % (static_cast<uint64_t>(p->bytes_total()) + 1)));
      if (p->version() != version) continue;
      ++reporting;
      rounds_done += p->rounds_done();
      rounds_total += p->rounds_total();
      bytes_done += p->bytes_done();
      bytes_total += p->bytes_total();
      if (p->phase() != control::SYNC_PHASE_TRANSFERRING) continue;
      const double fraction = p->bytes_total() > 0 ? static_cast<double>(p->bytes_done()) /
                                                         static_cast<double>(p->bytes_total())
                                                   : 1.0;
      if (fraction < behind_fraction) {
        behind_fraction = fraction;
        behind = i;
      }
    }
    const std::string text = DescribeJobProgress(body, version, 9);
    if (reporting == 0) {
      EXPECT_EQ(text, "") << trial;
      continue;
    }
    EXPECT_NE(text.find(absl::StrFormat("rounds %d/%d, %.1f/%.1f MiB", rounds_done, rounds_total,
                                        bytes_done / 1048576.0, bytes_total / 1048576.0)),
              std::string::npos)
        << trial << ": " << text;
    const size_t named = text.find("furthest behind: ");
    if (behind < 0) {
      EXPECT_EQ(named, std::string::npos) << trial << ": " << text;
      continue;
    }
    const control::ProcessStatus& slowest = body.processes(behind);
    EXPECT_EQ(text.substr(named),
              absl::StrCat("furthest behind: ",
                           slowest.role() == control::ROLE_TRAINER ? "trainer" : "rollout",
                           " rank ", slowest.rank(), " (round ", slowest.progress().rounds_done(),
                           " of ", slowest.progress().rounds_total(), ")"))
        << trial;
  }
}

}  // namespace
}  // namespace wsync::cli
