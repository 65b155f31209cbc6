// The coordinator's protocol core without sockets (coordinator_core.h): handshake admission and
// refusal, the rendezvous (the same roster whatever the join order; a timeout naming who is
// missing and who was refused), `wsync status`, and bad frames. Rounds and silence:
// coordinator_core_rounds_test.cc. A fake clock: nothing here sleeps.

#include <algorithm>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator_core_harness.h"

namespace wsync {
namespace {

using control_testing::Options;
using core_testing::Harness;
using core_testing::kJob;
using core_testing::kSecret;
using core_testing::PeerView;
using core_testing::RandomOptions;
using core_testing::RejectOf;
using ::testing::HasSubstr;

// Every bad Hello is refused with its own reason and a Reject that says why (nothing but
// "authentication failed" before the MAC checked out); a good one gets a Welcome whose MAC proves
// the coordinator's fields, then the channel is sealed; a second Hello for the same rank is a
// duplicate.
TEST(CoordinatorCoreTest, AdmitsAGoodHelloAndRefusesEveryBadOne) {
  Harness h(Options(2, 1));
  struct Case {
    const char* name;
    std::function<void(control::Hello&)> spoil;
    RefusalReason reason;
    absl::StatusCode code;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"wrong secret", [&](control::Hello& x) { x.set_mac(std::string(kMacBytes, 'x')); },
       RefusalReason::kAuthenticationFailed, absl::StatusCode::kUnauthenticated,
       "authentication failed"},
      {"protocol version", [](control::Hello& x) { x.set_protocol_version(2); },
       RefusalReason::kProtocolVersion, absl::StatusCode::kFailedPrecondition,
       "protocol version 2 is not supported"},
      {"role", [](control::Hello& x) { x.set_role(control::Role(7)); }, RefusalReason::kBadField,
       absl::StatusCode::kInvalidArgument, "bad role"},
      {"nonce", [](control::Hello& x) { x.set_client_nonce("short"); }, RefusalReason::kBadField,
       absl::StatusCode::kInvalidArgument, "bad nonce or MAC length"},
      {"node id", [](control::Hello& x) { x.set_node_id("has space"); }, RefusalReason::kBadField,
       absl::StatusCode::kInvalidArgument, "node id"},
  };
  for (const Case& c : cases) {
    const ConnectionId id = h.Open();
    control::Frame hello = h.Hello(id, ControlRole::kTrainer, 0);
    c.spoil(*hello.mutable_hello());
    h.Deliver(id, hello);
    const PeerView& p = h.peers[id];
    EXPECT_TRUE(p.closed && !p.dropped) << c.name;
    EXPECT_EQ(p.refusal, c.reason) << c.name;
    EXPECT_EQ(RejectOf(p).code(), c.code) << c.name;
    EXPECT_THAT(RejectOf(p).message(), HasSubstr(c.says)) << c.name;
    EXPECT_FALSE(p.sealed) << c.name;
  }
  EXPECT_EQ(h.core.counters().Refused(RefusalReason::kAuthenticationFailed), 1);
  EXPECT_EQ(h.core.counters().Refused(RefusalReason::kProtocolVersion), 1);
  EXPECT_EQ(h.core.counters().Refused(RefusalReason::kBadField), 3);
  // Authenticated refusals say more.
  const ConnectionId other_job = h.Open();
  h.Deliver(other_job, h.Hello(other_job, ControlRole::kTrainer, 0, kSecret, "job-2"));
  EXPECT_EQ(h.peers[other_job].refusal, RefusalReason::kUnknownJob);
  EXPECT_THAT(RejectOf(h.peers[other_job]).message(), HasSubstr("unknown job id 'job-2'"));
  const ConnectionId far = h.Open();
  h.Deliver(far, h.Hello(far, ControlRole::kRollout, 1));
  EXPECT_EQ(h.peers[far].refusal, RefusalReason::kRankOutOfRange);
  EXPECT_THAT(RejectOf(h.peers[far]).message(), HasSubstr("the job has 1 rollouts"));

  const ConnectionId good = h.Open();
  const control::Frame hello = h.Hello(good, ControlRole::kRollout, 0);
  h.Deliver(good, hello);
  const PeerView& p = h.peers[good];
  ASSERT_EQ(p.Of(control::Frame::kWelcome).size(), 1u);
  const control::Welcome welcome = p.Of(control::Frame::kWelcome)[0].welcome();
  EXPECT_EQ(welcome.process(), 2);
  EXPECT_EQ(welcome.heartbeat_interval_ms(), 250);
  EXPECT_EQ(welcome.silence_limit_ms(), 3000);
  EXPECT_EQ(welcome.mac(), WelcomeMac(kSecret, hello.hello().client_nonce(), p.nonce, kJob,
                                      WelcomeFieldsOf(welcome)));
  EXPECT_TRUE(p.sealed);
  EXPECT_EQ(p.process, 2);
  EXPECT_FALSE(p.ended());

  const ConnectionId twin = h.Open();
  h.Deliver(twin, h.Hello(twin, ControlRole::kRollout, 0));
  EXPECT_EQ(h.peers[twin].refusal, RefusalReason::kDuplicateRank);
  EXPECT_THAT(RejectOf(h.peers[twin]).message(),
              HasSubstr("rollout rank 0 has already joined (process 2 (rollout rank 0"));
  const CoordinatorCounters counters = h.core.counters();
  EXPECT_EQ(counters.accepted, 9);
  EXPECT_EQ(counters.welcomed, 1);
  EXPECT_EQ(counters.TotalRefused(), 8);
}

// Property: N processes that connect, join, sometimes leave and come back, in a random order,
// always get the same roster (by global id, equal layouts sent once), each exactly once and only
// when the last one joined.
TEST(CoordinatorCoreTest, RandomJoinOrderAlwaysYieldsTheSameRoster) {
  for (uint32_t seed = 0; seed < 200; ++seed) {
    std::mt19937 rng(seed);
    Harness h(RandomOptions(rng, 4, 4));
    const int32_t trainers = h.core.options().num_trainers;
    const int32_t rollouts = h.core.options().num_rollouts;
    const int32_t world = trainers + rollouts;
    auto role = [&](int32_t p) {
      return p < trainers ? ControlRole::kTrainer : ControlRole::kRollout;
    };
    auto rank = [&](int32_t p) { return p < trainers ? p : p - trainers; };
    // Each process: Hello, Join, and maybe a disconnection and a second Hello and Join.
    std::vector<int32_t> steps;
    std::vector<uint8_t> leaves(world);
    for (int32_t p = 0; p < world; ++p) {
      leaves[p] = world > 1 && rng() % 3 == 0;  // A process alone cannot leave unnoticed.
      for (int i = 0; i < (leaves[p] ? 5 : 2); ++i) steps.push_back(p);
    }
    // Only schedules in which the last step is the first moment all are joined (otherwise the
    // roster goes out early and a later leave is a loss, not a rejoin).
    auto early = [&] {
      std::vector<int> at(world, 0);
      int32_t in = 0;
      for (size_t i = 0; i + 1 < steps.size(); ++i) {
        const int step = at[steps[i]]++;
        in += (step == 1 || step == 4) ? 1 : step == 2 ? -1 : 0;
        if (in == world) return true;
      }
      return false;
    };
    int attempts = 0;
    do {
      std::shuffle(steps.begin(), steps.end(), rng);
      ASSERT_LT(++attempts, 100000) << seed;
    } while (early());
    std::vector<int> done(world, 0);
    std::vector<ConnectionId> conn(world, 0);
    std::vector<ConnectionId> all;
    int32_t joined = 0;
    for (int32_t p : steps) {
      ASSERT_TRUE(h.core.rendezvous_status().code() == absl::StatusCode::kUnavailable) << seed;
      const int step = done[p]++;
      if (step == 0 || step == 3) {
        conn[p] = h.Open(absl::StrCat("10.1.", p, ".1:7000"));
        all.push_back(conn[p]);
        h.Deliver(conn[p], h.Hello(conn[p], role(p), rank(p)));
      } else if (step == 1 || step == 4) {
        h.Join(conn[p], absl::StrCat("layout-", p % 2), absl::StrCat("addr-", p));
        ++joined;
      } else {
        h.core.Closed(conn[p], "disconnected");
        h.Apply();
        --joined;
      }
      h.Advance(absl::Milliseconds(1));
      for (ConnectionId c : all) {
        const PeerView& v = h.peers[c];
        const size_t rosters = v.Of(control::Frame::kRoster).size();
        EXPECT_EQ(rosters, v.ended() || joined < world ? 0u : 1u) << seed;
      }
    }
    ASSERT_TRUE(h.core.rendezvous_status().ok()) << seed;
    control::Roster expected;
    expected.set_num_trainers(trainers);
    expected.set_num_rollouts(rollouts);
    // Blobs in order of first use, manifest before metadata: layout-0, the empty metadata,
    // layout-1.
    expected.add_blobs("layout-0");
    expected.add_blobs("");
    if (world > 1) expected.add_blobs("layout-1");
    for (int32_t p = 0; p < world; ++p) {
      control::RosterEntry* e = expected.add_processes();
      e->set_process(p);
      e->set_role(RoleToProto(role(p)));
      e->set_rank(rank(p));
      e->set_node_id(absl::StrCat("node-", rank(p)));
      e->set_manifest(p % 2 == 0 ? 0 : 2);
      e->set_metadata(1);
      e->set_address(absl::StrCat("addr-", p));
    }
    for (int32_t p = 0; p < world; ++p) {
      const std::vector<control::Frame> rosters = h.peers[conn[p]].Of(control::Frame::kRoster);
      ASSERT_EQ(rosters.size(), 1u) << seed;
      EXPECT_EQ(rosters[0].roster().SerializeAsString(), expected.SerializeAsString()) << seed;
    }
  }
}

// The rendezvous deadline fails the job for every connected process, naming who is missing (and
// whether it connected) and the refusal of a peer that claimed a rank; from then on every new
// connection is refused. Before it, joined processes are told the progress.
TEST(CoordinatorCoreTest, ARendezvousThatTimesOutNamesWhoIsMissing) {
  CoordinatorOptions options = Options(2, 1);
  options.heartbeat_interval = absl::ZeroDuration();  // Nobody is lost for silence meanwhile.
  Harness h(std::move(options));
  const ConnectionId t0 = h.Welcomed(ControlRole::kTrainer, 0);
  h.Join(t0, "layout", "addr-0");
  const ConnectionId t1 = h.Welcomed(ControlRole::kTrainer, 1);
  const ConnectionId forger = h.Open("10.9.9.9:4444");
  h.Deliver(forger, h.Hello(forger, ControlRole::kRollout, 0, "not-the-secret-not-the-secret-xx"));
  EXPECT_EQ(h.peers[forger].refusal, RefusalReason::kAuthenticationFailed);

  h.Advance(absl::Milliseconds(1));
  const std::vector<control::Frame> progress = h.peers[t0].Of(control::Frame::kRendezvousProgress);
  ASSERT_EQ(progress.size(), 1u);
  EXPECT_EQ(progress[0].rendezvous_progress().joined(), 1);
  EXPECT_EQ(progress[0].rendezvous_progress().expected(), 3);
  EXPECT_THAT(progress[0].rendezvous_progress().missing_processes(0),
              HasSubstr("connected but did not join"));
  h.Advance(absl::Milliseconds(100));  // Nothing changed: no more progress.
  EXPECT_EQ(h.peers[t0].Of(control::Frame::kRendezvousProgress).size(), 1u);

  h.Advance(absl::Seconds(10) - absl::Milliseconds(102));
  EXPECT_FALSE(h.peers[t0].ended());
  h.Advance(absl::Milliseconds(1));
  for (ConnectionId id : {t0, t1}) {
    const absl::Status reject = RejectOf(h.peers[id]);
    EXPECT_TRUE(h.peers[id].closed);
    EXPECT_EQ(reject.code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_THAT(reject.message(), HasSubstr("2 of 3 processes did not join within 10000ms"));
    EXPECT_THAT(reject.message(),
                HasSubstr("process 1 (trainer rank 1, node node-1) connected but did not join"));
    EXPECT_THAT(reject.message(), HasSubstr("process 2 (rollout rank 0)"));
    EXPECT_THAT(reject.message(),
                HasSubstr("refused: rollout rank 0, node node-0 claimed by a connection from "
                          "10.9.9.9:4444 was refused: authentication failed"));
    EXPECT_EQ(reject, h.core.rendezvous_status());
  }
  const ConnectionId late = h.Open();
  EXPECT_EQ(h.peers[late].refusal, RefusalReason::kRendezvousClosed);
  EXPECT_EQ(h.core.NextDeadline(), absl::InfiniteFuture());
}

// `wsync status` is answered from the core's state with a MAC the client can check, and the
// connection closes; a request with a wrong MAC learns nothing.
TEST(CoordinatorCoreTest, AStatusQueryIsAnsweredFromTheCoreState) {
  Harness h(Options(1, 1));
  const ConnectionId t0 = h.Welcomed(ControlRole::kTrainer, 0);
  h.Join(t0, "layout", "addr-0");
  h.Advance(absl::Milliseconds(1200));
  auto request = [&](ConnectionId id, absl::string_view secret) {
    control::Frame frame;
    control::StatusRequest* r = frame.mutable_status_request();
    r->set_job_id(kJob);
    r->set_client_nonce(std::string(kNonceBytes, 'q'));
    r->set_mac(StatusRequestMac(secret, h.peers[id].nonce, r->client_nonce(), kJob));
    return frame;
  };
  const ConnectionId bad = h.Open();
  h.Deliver(bad, request(bad, "not-the-secret-not-the-secret-xx"));
  EXPECT_EQ(h.peers[bad].refusal, RefusalReason::kAuthenticationFailed);
  EXPECT_TRUE(h.peers[bad].Of(control::Frame::kJobStatus).empty());

  const ConnectionId ask = h.Open();
  h.Deliver(ask, request(ask, kSecret));
  const PeerView& p = h.peers[ask];
  ASSERT_EQ(p.Of(control::Frame::kJobStatus).size(), 1u);
  EXPECT_TRUE(p.closed);
  EXPECT_FALSE(p.refusal.has_value());
  const control::JobStatus status = p.Of(control::Frame::kJobStatus)[0].job_status();
  EXPECT_EQ(status.mac(),
            StatusReplyMac(kSecret, std::string(kNonceBytes, 'q'), p.nonce, status.body()));
  control::JobStatusBody body;
  ASSERT_TRUE(body.ParseFromString(status.body()));
  EXPECT_EQ(body.rendezvous(), "pending");
  EXPECT_EQ(body.joined(), 1);
  ASSERT_EQ(body.processes_size(), 2);
  EXPECT_EQ(body.processes(0).state(), "joined");
  EXPECT_EQ(body.processes(0).heard_ms_ago(), 1200);
  EXPECT_EQ(body.processes(1).state(), "missing");
  EXPECT_EQ(body.processes(1).heard_ms_ago(), -1);
  ASSERT_EQ(body.refused_size(), 1);  // The forged query named itself.
  EXPECT_THAT(body.refused(0).text(), HasSubstr("a status query claimed by a connection"));
  EXPECT_EQ(h.core.counters().status_queries, 1);
}

// What the reader reports refuses the connection with the matching reason; a disconnection is no
// refusal; a handshake left silent times out on the fake clock; after the roster, a refused
// process is lost and the others are told at once.
TEST(CoordinatorCoreTest, BadFramesAreRefusedAndAfterTheRosterTheProcessIsLost) {
  CoordinatorOptions options = Options(1, 2);
  options.handshake_timeout = absl::Seconds(3);
  Harness h(std::move(options));
  const ConnectionId big = h.Open();
  h.core.ReadFailed(h.now, big, absl::ResourceExhaustedError("control: frame of 99 bytes"));
  h.Apply();
  EXPECT_EQ(h.peers[big].refusal, RefusalReason::kOversizedFrame);
  const ConnectionId cut = h.Open();
  h.core.ReadFailed(h.now, cut, absl::DataLossError("control: truncated"));
  h.Apply();
  EXPECT_EQ(h.peers[cut].refusal, RefusalReason::kTruncatedFrame);
  const ConnectionId garbage = h.Open();
  h.Deliver(garbage, DecodeFrameBody("\xff\xff\xff"));
  EXPECT_EQ(h.peers[garbage].refusal, RefusalReason::kMalformedFrame);
  const ConnectionId early = h.Open();
  control::Frame contribute;
  contribute.mutable_contribute()->set_number(0);
  h.Deliver(early, contribute);
  EXPECT_EQ(h.peers[early].refusal, RefusalReason::kUnexpectedFrame);
  const ConnectionId gone = h.Open();
  h.core.ReadFailed(h.now, gone, absl::UnavailableError("control: closed"));
  h.Apply();
  EXPECT_TRUE(h.peers[gone].dropped);
  EXPECT_EQ(h.peers[gone].why, "disconnected");
  const ConnectionId silent = h.Open();
  h.Advance(absl::Seconds(3) - absl::Milliseconds(1));
  EXPECT_FALSE(h.peers[silent].ended());
  h.Advance(absl::Milliseconds(1));
  EXPECT_EQ(h.peers[silent].refusal, RefusalReason::kHandshakeTimeout);

  const std::vector<ConnectionId> ids = h.JoinAll();
  h.core.ReadFailed(h.now, ids[1], absl::ResourceExhaustedError("control: frame too large"));
  h.Apply();
  EXPECT_EQ(h.peers[ids[1]].refusal, RefusalReason::kOversizedFrame);
  for (ConnectionId other : {ids[0], ids[2]}) {
    const std::vector<control::Frame> lost = h.peers[other].Of(control::Frame::kLost);
    ASSERT_EQ(lost.size(), 1u);
    EXPECT_EQ(lost[0].lost().process(), 1);
    EXPECT_THAT(lost[0].lost().reason(),
                HasSubstr("process 1 (rollout rank 0, node node-0) was lost: refused: control: "
                          "frame too large"));
  }
  EXPECT_EQ(h.core.counters().lost, 1);
  EXPECT_TRUE(h.peers[ids[1]].Of(control::Frame::kLost).empty());
}

}  // namespace
}  // namespace wsync
