// Rendezvous progress: a process that times out waiting for the roster names who joined, who is
// missing and which connections the coordinator refused (with the reason and how long ago), from
// the coordinator's RendezvousProgress frames; the coordinator's own rendezvous failure names the
// refusals too; a client that does not ask for progress gets none and still works.

#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "control/client.h"
#include "control/coordinator.h"
#include "control/rendezvous_progress.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/control_job.h"

namespace wsync {
namespace {

using control_testing::ClientOptions;
using control_testing::Options;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// Connects trainer 0 and joins with a deadline of `wait`; returns the Join's error.
absl::Status JoinAlone(int port, absl::Duration wait, bool ask_progress) {
  ControlClientOptions options = ClientOptions(port, ControlRole::kTrainer, 0);
  options.rendezvous_progress = ask_progress;
  absl::StatusOr<std::unique_ptr<ControlClient>> client = ControlClient::Connect(options);
  if (!client.ok()) return client.status();
  return (*client)->Join(JoinRequest{"m", "a", ""}, absl::Now() + wait).status();
}

// Rollout rank 0 with a wrong secret: refused for authentication.
absl::Status ConnectWithWrongSecret(int port) {
  ControlClientOptions options = ClientOptions(port, ControlRole::kRollout, 0);
  options.secret = "not-the-job-secret-but-long-enough-0123";
  options.connect_timeout = absl::Seconds(2);
  return ControlClient::Connect(options).status();
}

TEST(RendezvousProgressTest, TimeoutNamesJoinedMissingAndRefused) {
  absl::StatusOr<std::unique_ptr<Coordinator>> c = Coordinator::Start(Options(1, 1));
  ASSERT_TRUE(c.ok()) << c.status();
  absl::Status refused;
  std::thread rollout([&] {
    absl::SleepFor(absl::Milliseconds(300));  // After the trainer joined.
    refused = ConnectWithWrongSecret((*c)->port());
  });
  const absl::Status joined = JoinAlone((*c)->port(), absl::Seconds(2), true);
  rollout.join();
  EXPECT_TRUE(absl::IsUnauthenticated(refused)) << refused;
  EXPECT_TRUE(absl::IsDeadlineExceeded(joined)) << joined;
  EXPECT_THAT(joined.message(),
              AllOf(HasSubstr("waiting for the roster"), HasSubstr("1 of 2 processes joined"),
                    HasSubstr("process 0 (trainer rank 0, node node-t0)"),
                    HasSubstr("missing: process 1 (rollout rank 0)"),
                    HasSubstr("refused: rollout rank 0, node node-r0 claimed by a connection "
                              "from 127.0.0.1:"),
                    HasSubstr("was refused: authentication failed, "), HasSubstr(" s ago")));
  EXPECT_THAT(joined.message(), Not(HasSubstr(control_testing::kSecret)));
}

// A waiting process names the latest report: rollout 0 joins 0.5 s after the trainer, which
// sees it joined; by the rollout's own deadline the trainer has left, which it names.
TEST(RendezvousProgressTest, TimeoutNamesTheLatestJoins) {
  absl::StatusOr<std::unique_ptr<Coordinator>> c = Coordinator::Start(Options(1, 2));
  ASSERT_TRUE(c.ok()) << c.status();
  absl::Status rollout_joined;
  std::thread rollout([&] {
    absl::SleepFor(absl::Milliseconds(500));
    absl::StatusOr<std::unique_ptr<ControlClient>> client =
        ControlClient::Connect(ClientOptions((*c)->port(), ControlRole::kRollout, 0));
    ASSERT_TRUE(client.ok()) << client.status();
    rollout_joined =
        (*client)->Join(JoinRequest{"m", "a", ""}, absl::Now() + absl::Seconds(2)).status();
  });
  const absl::Status joined = JoinAlone((*c)->port(), absl::Seconds(2), true);
  rollout.join();
  EXPECT_THAT(joined.message(), AllOf(HasSubstr("2 of 3 processes joined"),
                                      HasSubstr("missing: process 2 (rollout rank 1)")));
  EXPECT_THAT(joined.message(), Not(HasSubstr("missing: process 1")));
  // By the rollout's deadline the trainer had timed out and left: named as such.
  EXPECT_THAT(std::string(rollout_joined.message()),
              AllOf(HasSubstr("1 of 3 processes joined"),
                    HasSubstr("missing: process 0 (trainer rank 0, node node-t0) joined, then "
                              "left, process 2 (rollout rank 1)")));
}

TEST(RendezvousProgressTest, CoordinatorsRendezvousFailureNamesTheRefusal) {
  CoordinatorOptions options = Options(1, 1);
  options.rendezvous_timeout = absl::Seconds(1);
  absl::StatusOr<std::unique_ptr<Coordinator>> c = Coordinator::Start(options);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(absl::IsUnauthenticated(ConnectWithWrongSecret((*c)->port())));
  const absl::Status joined = JoinAlone((*c)->port(), absl::Seconds(5), true);
  EXPECT_TRUE(absl::IsDeadlineExceeded(joined)) << joined;
  EXPECT_THAT(joined.message(),
              AllOf(HasSubstr("rendezvous failed: 1 of 2 processes did not join"),
                    HasSubstr("missing process 1 (rollout rank 0)"),
                    HasSubstr("refused: rollout rank 0, node node-r0 claimed by a connection"),
                    HasSubstr("authentication failed, ")));
}

TEST(RendezvousProgressTest, ClientThatDoesNotAskGetsNoProgress) {
  absl::StatusOr<std::unique_ptr<Coordinator>> c = Coordinator::Start(Options(1, 1));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(absl::IsUnauthenticated(ConnectWithWrongSecret((*c)->port())));
  const absl::Status joined = JoinAlone((*c)->port(), absl::Seconds(1), false);
  EXPECT_TRUE(absl::IsDeadlineExceeded(joined)) << joined;
  EXPECT_THAT(joined.message(), HasSubstr("the coordinator reported no rendezvous progress"));
}

TEST(RendezvousProgressTest, DescriptionBoundsWhatTheWireSays) {
  control::RendezvousProgress progress;
  progress.set_joined(300);
  progress.set_expected(384);
  for (int i = 0; i < 300; ++i) progress.add_joined_processes(std::string(2000, 'j'));
  for (int i = 0; i < 84; ++i) progress.add_missing_processes(absl::StrCat("p", i));
  control::RefusalNote* note = progress.add_refused();
  note->set_text("rollout rank 7 claimed by a connection from x was refused: bad");
  note->set_age_ms(int64_t{-5});
  const std::string text = DescribeRendezvousProgress(progress, absl::Seconds(2));
  EXPECT_THAT(text, AllOf(HasSubstr("300 of 384 processes joined"), HasSubstr("and 268 more"),
                          HasSubstr("p31 and 52 more"), HasSubstr("was refused: bad, 2.0 s ago")));
  EXPECT_THAT(text, Not(HasSubstr("p32")));
  EXPECT_LT(text.size(), size_t{32} * (kMaxProgressTextBytes + 8) + 2000);
}

}  // namespace
}  // namespace wsync
