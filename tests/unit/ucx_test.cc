#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/barrier.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/wait_any_checks.h"
#include "tests/unit/ucx_test_fixture.h"
#include "transport/ucx/ucx_impl.h"
#include "transport/ucx/ucx_transport.h"

namespace wsync {
namespace {

using test::Drain;
using test::Fabric;
using test::FabricName;
using test::In;
using test::Pattern;
using test::RunConcurrently;
using test::UcxTest;

using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Not;

TEST_P(UcxTest, ExchangesEverySizeInBothPostingOrders) {
  constexpr int32_t kProcesses = 3;
  const std::vector<int64_t> sizes = {0, 1, 8 << 10, 1 << 20, 16 << 20};
  auto job = MakeJob(kProcesses);
  ASSERT_EQ(job.size(), kProcesses);
  EXPECT_EQ(job[0]->name(), "ucx");
  EXPECT_EQ(job[2]->process(), 2);
  // Send buffers per (sender, size); every receiver of a sender gets the same bytes, and the
  // pattern differs per sender, so a message matched to the wrong receive is caught.
  std::vector<std::vector<std::vector<uint8_t>>> sent(kProcesses);
  for (int32_t p = 0; p < kProcesses; ++p) {
    for (size_t i = 0; i < sizes.size(); ++i) sent[p].push_back(Pattern(sizes[i], p * 10 + i));
  }
  for (bool receives_first : {true, false}) {
    SCOPED_TRACE(receives_first ? "receives first" : "sends first");
    absl::Barrier* posted = new absl::Barrier(kProcesses);  // Deletes itself after the last.
    std::vector<std::function<void()>> fns;
    for (int32_t me = 0; me < kProcesses; ++me) {
      fns.push_back([&, me] {
        Transport& t = *job[me];
        std::vector<std::vector<uint8_t>> got(kProcesses * sizes.size());
        std::vector<RequestId> ids;
        auto post_receives = [&] {
          for (int32_t from = 0; from < kProcesses; ++from) {
            for (size_t i = 0; i < sizes.size(); ++i) {
              auto& buf = got[from * sizes.size() + i];
              buf.assign(static_cast<size_t>(sizes[i]), 0);
              auto id = t.PostReceive(from, MakeTag(7, static_cast<int64_t>(i), from), buf.data(),
                                      sizes[i]);
              ASSERT_TRUE(id.ok()) << id.status();
              ids.push_back(*id);
            }
          }
        };
        auto post_sends = [&] {
          for (int32_t to = 0; to < kProcesses; ++to) {
            for (size_t i = 0; i < sizes.size(); ++i) {
              auto id = t.PostSend(to, MakeTag(7, static_cast<int64_t>(i), me), sent[me][i].data(),
                                   sizes[i]);
              ASSERT_TRUE(id.ok()) << id.status();
              ids.push_back(*id);
            }
          }
        };
        if (receives_first) {
          post_receives();
        } else {
          post_sends();
        }
        if (posted->Block()) delete posted;
        if (receives_first) {
          post_sends();
        } else {
          Drain(t, me, absl::Milliseconds(100));
          post_receives();
        }
        absl::Status s = t.WaitAll(ids, In(absl::Seconds(20)));
        ASSERT_TRUE(s.ok()) << s;
        for (int32_t from = 0; from < kProcesses; ++from) {
          for (size_t i = 0; i < sizes.size(); ++i) {
            EXPECT_TRUE(got[from * sizes.size() + i] == sent[from][i])
                << "process " << me << " from " << from << " size " << sizes[i];
          }
        }
      });
    }
    RunConcurrently(fns);
  }
  // The lanes UCX chose, for the record.
  for (absl::string_view line : absl::StrSplit(job[0]->EndpointInfo(1), '\n')) {
    if (absl::StrContains(line, "lane[") || absl::StrContains(line, "error handling")) {
      std::cout << GetParam().name << " 0->1: " << line << "\n";
    }
  }
  EXPECT_THAT(job[0]->EndpointInfo(0), HasSubstr("lane"));
  EXPECT_EQ(job[0]->EndpointInfo(kProcesses), "");
  // Shared memory keeps CMA (one copy) for rendezvous data: a dead peer is survived through the
  // endpoints' error callback, not by dropping it (transport/ucx/README.md).
  if (GetParam().transports == "sm,cma,self") {
    EXPECT_THAT(job[0]->EndpointInfo(1), HasSubstr("cma/memory"));
  }
}

TEST_P(UcxTest, FourProcessesWithRegisteredMemoryAndTestPolling) {
  constexpr int32_t kProcesses = 4;
  constexpr int64_t kBytes = 256 << 10;
  auto job = MakeJob(kProcesses);
  ASSERT_EQ(job.size(), kProcesses);
  std::vector<std::function<void()>> fns;
  for (int32_t me = 0; me < kProcesses; ++me) {
    fns.push_back([&, me] {
      Transport& t = *job[me];
      // One registered arena for all sends and one for all receives.
      std::vector<uint8_t> out(kProcesses * kBytes);
      std::vector<uint8_t> in(kProcesses * kBytes, 0);
      for (int32_t to = 0; to < kProcesses; ++to) {
        auto part = Pattern(kBytes, me * 100 + to);
        std::copy(part.begin(), part.end(), out.begin() + to * kBytes);
      }
      auto r_out = t.RegisterMemory(out.data(), out.size(), MemoryKind::kHost);
      auto r_in = t.RegisterMemory(in.data(), in.size(), MemoryKind::kHost);
      ASSERT_TRUE(r_out.ok() && r_in.ok()) << r_out.status() << r_in.status();
      std::vector<RequestId> ids;
      for (int32_t p = 0; p < kProcesses; ++p) {
        auto r = t.PostReceive(p, MakeTag(3, 1, p), in.data() + p * kBytes, kBytes);
        auto s = t.PostSend(p, MakeTag(3, 1, me), out.data() + p * kBytes, kBytes);
        ASSERT_TRUE(r.ok() && s.ok()) << r.status() << s.status();
        ids.push_back(*r);
        ids.push_back(*s);
      }
      // Poll with Test instead of WaitAll.
      const absl::Time deadline = In(absl::Seconds(15));
      while (!ids.empty() && absl::Now() < deadline) {
        auto done = t.Test(ids.back());
        ASSERT_TRUE(done.ok()) << done.status();
        if (*done) ids.pop_back();
      }
      ASSERT_TRUE(ids.empty());
      for (int32_t p = 0; p < kProcesses; ++p) {
        auto part = Pattern(kBytes, p * 100 + me);
        EXPECT_TRUE(std::equal(part.begin(), part.end(), in.begin() + p * kBytes)) << p;
      }
      EXPECT_EQ(t.Test(1 << 30).status().code(), absl::StatusCode::kNotFound);
      EXPECT_TRUE(t.DeregisterMemory(*r_out).ok());
      EXPECT_TRUE(t.DeregisterMemory(*r_in).ok());
      EXPECT_EQ(t.DeregisterMemory(*r_in).code(), absl::StatusCode::kNotFound);
    });
  }
  RunConcurrently(fns);
}

TEST_P(UcxTest, SizeMismatchFailsTheReceiveWithBothSizes) {
  auto job = MakeJob(2);
  ASSERT_EQ(job.size(), 2);
  struct Case {
    int64_t send;
    int64_t receive;
  };
  const std::vector<Case> cases = {
      {100, 50}, {50, 100}, {1 << 20, 512 << 10}, {512 << 10, 1 << 20}};
  int64_t round = 0;
  for (const Case& c : cases) {
    for (bool receive_first : {true, false}) {
      SCOPED_TRACE(absl::StrCat(c.send, " -> ", c.receive, receive_first ? " receive first" : ""));
      const MessageTag tag_send = MakeTag(9, ++round, 0);
      const MessageTag tag_receive = MakeTag(9, round, 0);
      std::vector<uint8_t> data = Pattern(c.send, 1);
      std::vector<uint8_t> out(c.receive + 64, 0xee);
      absl::Barrier* posted = new absl::Barrier(2);
      absl::Status send_status;
      absl::Status receive_status;
      RunConcurrently({
          [&] {
            if (receive_first && posted->Block()) delete posted;
            auto s = job[0]->PostSend(1, tag_send, data.data(), c.send);
            ASSERT_TRUE(s.ok()) << s.status();
            if (!receive_first && posted->Block()) delete posted;
            send_status = job[0]->WaitAll({*s}, In(absl::Seconds(2)));
          },
          [&] {
            if (!receive_first) {
              if (posted->Block()) delete posted;
              Drain(*job[1], 0, absl::Milliseconds(50));
            }
            auto r = job[1]->PostReceive(0, tag_receive, out.data(), c.receive);
            if (receive_first && posted->Block()) delete posted;
            ASSERT_TRUE(r.ok()) << r.status();
            receive_status = job[1]->WaitAll({*r}, In(absl::Seconds(5)));
          },
      });
      EXPECT_EQ(receive_status.code(), absl::StatusCode::kInvalidArgument) << receive_status;
      EXPECT_THAT(receive_status.message(), HasSubstr("size mismatch"));
      EXPECT_THAT(receive_status.message(), HasSubstr(absl::StrCat(c.receive, " bytes")));
      EXPECT_THAT(receive_status.message(), HasSubstr("receive from process 0"));
      if (c.send < c.receive) {
        EXPECT_THAT(receive_status.message(), HasSubstr(absl::StrCat("has ", c.send, " bytes")));
      }
      // UCX does not tell the sender; its request ends either way (here: successfully, or at the
      // deadline when the rendezvous is abandoned).
      EXPECT_THAT(send_status.code(),
                  AnyOf(absl::StatusCode::kOk, absl::StatusCode::kDeadlineExceeded))
          << send_status;
      EXPECT_EQ(out[c.receive], 0xee) << "written past the posted receive";
    }
  }
}

// UCX's WaitAny (sleeping on the worker's wakeup event) keeps Transport::WaitAny's contract.
TEST_P(UcxTest, WaitAnyReturnsTheFirstFinishedAndLeavesTheRestPosted) {
  auto job = MakeJob(2);
  ASSERT_EQ(job.size(), 2);
  test::ExpectWaitAnyContract(*job[0], *job[1]);
}

TEST_P(UcxTest, DeadlineCancelsAReceiveWhoseBufferStaysUntouched) {
  auto job = MakeJob(2);
  ASSERT_EQ(job.size(), 2);
  for (int64_t bytes : {int64_t{100}, int64_t{1} << 20}) {
    SCOPED_TRACE(bytes);
    const MessageTag tag = MakeTag(11, bytes, 0);
    std::vector<uint8_t> stale(bytes, 0xaa);
    auto r = job[1]->PostReceive(0, tag, stale.data(), bytes);
    ASSERT_TRUE(r.ok()) << r.status();
    const absl::Time start = absl::Now();
    absl::Status s = job[1]->WaitAll({*r}, In(absl::Milliseconds(200)));
    const absl::Duration took = absl::Now() - start;
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_THAT(s.message(), HasSubstr("receive from process 0"));
    EXPECT_GE(took, absl::Milliseconds(190));
    EXPECT_LT(took, absl::Seconds(2));
    EXPECT_EQ(job[1]->Test(*r).status().code(), absl::StatusCode::kNotFound);  // Released.

    // The matching send arrives later: a new receive with the same tag gets it, the old buffer
    // stays as it was.
    const std::vector<uint8_t> data = Pattern(bytes, 5);
    std::vector<uint8_t> fresh(bytes, 0);
    RunConcurrently({
        [&] {
          auto id = job[0]->PostSend(1, tag, data.data(), bytes);
          ASSERT_TRUE(id.ok()) << id.status();
          EXPECT_TRUE(job[0]->WaitAll({*id}, In(absl::Seconds(5))).ok());
        },
        [&] {
          absl::SleepFor(absl::Milliseconds(50));
          auto id = job[1]->PostReceive(0, tag, fresh.data(), bytes);
          ASSERT_TRUE(id.ok()) << id.status();
          EXPECT_TRUE(job[1]->WaitAll({*id}, In(absl::Seconds(5))).ok());
        },
    });
    EXPECT_TRUE(fresh == data);
    EXPECT_TRUE(std::all_of(stale.begin(), stale.end(), [](uint8_t b) { return b == 0xaa; }));
  }
}

TEST_P(UcxTest, DeadlineOnAnUnmatchedSendReconnectsForTheNextOne) {
  auto job = MakeJob(2);
  ASSERT_EQ(job.size(), 2);
  constexpr int64_t kBytes = 4 << 20;  // Rendezvous: the send waits for a receive.
  const std::vector<uint8_t> data = Pattern(kBytes, 8);
  auto s = job[0]->PostSend(1, MakeTag(12, 1, 0), data.data(), kBytes);
  ASSERT_TRUE(s.ok()) << s.status();
  absl::Status st = job[0]->WaitAll({*s}, In(absl::Milliseconds(200)));
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_THAT(st.message(), HasSubstr("send to process 1"));
  // Over TCP the peer sees the closed connection as a failure of process 0 once both progress;
  // ConnectPeers connects a failed peer again (it does nothing over shared memory, where the
  // close goes unnoticed).
  RunConcurrently({[&] { Drain(*job[0], 1, absl::Milliseconds(300)); },
                   [&] { Drain(*job[1], 0, absl::Milliseconds(300)); }});
  ASSERT_TRUE(job[1]->ConnectPeers({job[0]->WorkerAddress(), job[1]->WorkerAddress()}).ok());
  // Another message, on a fresh endpoint, goes through.
  std::vector<uint8_t> got(kBytes, 0);
  RunConcurrently({
      [&] {
        auto id = job[0]->PostSend(1, MakeTag(12, 2, 0), data.data(), kBytes);
        ASSERT_TRUE(id.ok()) << id.status();
        absl::Status w = job[0]->WaitAll({*id}, In(absl::Seconds(5)));
        EXPECT_TRUE(w.ok()) << w;
      },
      [&] {
        auto id = job[1]->PostReceive(0, MakeTag(12, 2, 0), got.data(), kBytes);
        ASSERT_TRUE(id.ok()) << id.status();
        absl::Status w = job[1]->WaitAll({*id}, In(absl::Seconds(5)));
        EXPECT_TRUE(w.ok()) << w;
      },
  });
  EXPECT_TRUE(got == data);
}

TEST_P(UcxTest, AbortFromAnotherThreadWakesWaitAll) {
  auto job = MakeJob(2);
  ASSERT_EQ(job.size(), 2);
  std::vector<uint8_t> buf(64, 0), other(64, 0);
  auto r = job[0]->PostReceive(1, MakeTag(13, 1, 1), buf.data(), 64);
  auto idle = job[0]->PostReceive(1, MakeTag(13, 9, 1), other.data(), 64);  // Not waited on.
  ASSERT_TRUE(r.ok() && idle.ok()) << r.status() << idle.status();
  absl::Status waited;
  absl::Duration took;
  RunConcurrently({
      [&] {
        const absl::Time start = absl::Now();
        waited = job[0]->WaitAll({*r}, In(absl::Seconds(10)));
        took = absl::Now() - start;
      },
      [&] {
        absl::SleepFor(absl::Milliseconds(200));
        job[0]->Abort(absl::InternalError("trainer lost"));
      },
  });
  EXPECT_EQ(waited.code(), absl::StatusCode::kAborted) << waited;
  EXPECT_THAT(waited.message(), HasSubstr("trainer lost"));
  EXPECT_LT(took, absl::Seconds(3));
  // Outstanding requests failed too; future ones fail at once; Abort is idempotent and keeps the
  // first reason.
  EXPECT_EQ(job[0]->Test(*idle).status().code(), absl::StatusCode::kAborted);
  job[0]->Abort(absl::InternalError("second"));
  auto s = job[0]->PostSend(1, MakeTag(13, 2, 0), buf.data(), 64);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(s.status().message(), HasSubstr("trainer lost"));
  EXPECT_EQ(job[0]->ConnectPeers({"", ""}).code(), absl::StatusCode::kAborted);
}

TEST_P(UcxTest, PeerFailureEndsTheWaitWithAnErrorOrTheDeadline) {
  for (bool abort_peer : {false, true}) {
    SCOPED_TRACE(abort_peer ? "peer aborted" : "peer destroyed");
    auto job = MakeJob(2);
    ASSERT_EQ(job.size(), 2);
    std::vector<uint8_t> buf(1 << 20, 0);
    auto r = job[0]->PostReceive(1, MakeTag(14, 1, 1), buf.data(), buf.size());
    ASSERT_TRUE(r.ok()) << r.status();
    absl::Status waited;
    absl::Duration took;
    RunConcurrently({
        [&] {
          const absl::Time start = absl::Now();
          waited = job[0]->WaitAll({*r}, In(absl::Seconds(1)));
          took = absl::Now() - start;
        },
        [&] {
          absl::SleepFor(absl::Milliseconds(100));
          if (abort_peer) {
            job[1]->Abort(absl::CancelledError("rollout restarted"));
          } else {
            job[1].reset();
          }
        },
    });
    std::cout << GetParam().name << (abort_peer ? " abort: " : " destroy: ") << waited << " after "
              << took << "\n";
    EXPECT_THAT(waited.code(),
                AnyOf(absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded));
    EXPECT_THAT(waited.message(), HasSubstr("process 1"));
    EXPECT_LT(took, absl::Seconds(1) + absl::Seconds(2));
    if (waited.code() == absl::StatusCode::kUnavailable) {
      // The failure is sticky: posts with the peer fail at once until ConnectPeers.
      EXPECT_EQ(job[0]->PostSend(1, MakeTag(14, 2, 0), buf.data(), 8).status().code(),
                absl::StatusCode::kUnavailable);
      EXPECT_EQ(job[0]->PostReceive(1, MakeTag(14, 2, 1), buf.data(), 8).status().code(),
                absl::StatusCode::kUnavailable);
    }
    if (GetParam().transports == "tcp" && !abort_peer) {
      // TCP endpoints have a peer failure handler and a destroyed worker closes its sockets, so
      // the error comes before the deadline. An aborted peer keeps its worker (and UCX's
      // internal endpoint for the connection) alive, so then only the deadline is certain.
      EXPECT_EQ(waited.code(), absl::StatusCode::kUnavailable) << waited;
    }
  }
}

// PeerLost fails the requests with the peer at once; the error says whether the peer was lost or
// the coordinator was (then every peer is reported, though it may be alive).
TEST_P(UcxTest, PeerLostWordsALostPeerAndALostCoordinatorApart) {
  for (bool coordinator : {false, true}) {
    SCOPED_TRACE(coordinator ? "coordinator lost" : "peer lost");
    auto job = MakeJob(2);
    ASSERT_EQ(job.size(), 2);
    std::vector<uint8_t> buf(64, 0);
    auto r = job[0]->PostReceive(1, MakeTag(15, 1, 1), buf.data(), buf.size());
    ASSERT_TRUE(r.ok()) << r.status();
    job[0]->PeerLost(1, coordinator
                            ? CoordinatorLoss("control: lost the coordinator: connection closed")
                            : absl::UnavailableError("process 1 (rollout rank 0) was lost"));
    const absl::Status waited = job[0]->WaitAll({*r}, In(absl::Seconds(10)));
    EXPECT_TRUE(absl::IsUnavailable(waited)) << waited;
    if (coordinator) {
      EXPECT_THAT(waited.message(),
                  HasSubstr("ucx: messages with process 1 stopped because this process lost "
                            "its connection to the coordinator: control: lost the coordinator: "
                            "connection closed"));
      EXPECT_THAT(waited.message(), ::testing::Not(HasSubstr("is gone")));
    } else {
      EXPECT_THAT(waited.message(), HasSubstr("ucx: peer process 1 is gone (process 1 (rollout "
                                              "rank 0) was lost); ConnectPeers connects it again"));
    }
  }
}

// A loss reported while nothing was posted (the control plane saw process 1 die between two
// syncs), then a replacement of process 1 at a new address: ConnectPeers applies the report to the
// old endpoint it replaces, so messages with the replacement go through. (Before, the report was
// taken at the next post and failed the replacement's new endpoint: "peer process 1 is gone".)
TEST_P(UcxTest, ALossReportedBeforeAReplacementDoesNotFailTheReplacement) {
  auto job = MakeJob(2);
  ASSERT_EQ(job.size(), 2);
  job[0]->PeerLost(1, absl::UnavailableError("process 1 (rollout rank 0) was lost"));
  absl::StatusOr<std::unique_ptr<UcxTransport>> replacement = UcxTransport::Create(Options(1));
  ASSERT_TRUE(replacement.ok()) << replacement.status();
  const std::vector<std::string> addresses = {job[0]->WorkerAddress(),
                                              (*replacement)->WorkerAddress()};
  ASSERT_TRUE(job[0]->ConnectPeers(addresses).ok());
  ASSERT_TRUE((*replacement)->ConnectPeers(addresses).ok());
  const std::vector<uint8_t> sent = Pattern(4096, 3);
  std::vector<uint8_t> received(sent.size(), 0);
  absl::StatusOr<RequestId> receive = (*replacement)
                                          ->PostReceive(0, MakeTag(16, 0, 0), received.data(),
                                                        static_cast<int64_t>(received.size()));
  ASSERT_TRUE(receive.ok()) << receive.status();
  absl::StatusOr<RequestId> send =
      job[0]->PostSend(1, MakeTag(16, 0, 0), sent.data(), static_cast<int64_t>(sent.size()));
  ASSERT_TRUE(send.ok()) << send.status();
  absl::Status sent_status, received_status;
  RunConcurrently(
      {[&] { sent_status = job[0]->WaitAll({*send}, In(absl::Seconds(10))); },
       [&] { received_status = (*replacement)->WaitAll({*receive}, In(absl::Seconds(10))); }});
  EXPECT_TRUE(sent_status.ok()) << sent_status;
  EXPECT_TRUE(received_status.ok()) << received_status;
  EXPECT_EQ(received, sent);
}

// A peer whose process has exited (its pid, from its address, is gone, or a zombie not yet
// reaped) fails its requests within the check period, before UCX's progress runs anything queued
// for it (over shared memory UCX would abort this process on a CMA copy from an exited process).
TEST_P(UcxTest, APeerWhoseProcessExitedFailsItsRequests) {
  for (bool reaped : {false, true}) {
    SCOPED_TRACE(reaped ? "reaped" : "zombie");
    auto job = MakeJob(2);
    ASSERT_EQ(job.size(), 2);
    const pid_t child = fork();
    if (child == 0) _exit(0);
    ASSERT_GT(child, 0);
    if (reaped) {
      ASSERT_EQ(waitpid(child, nullptr, 0), child);  // kill(child, 0) now fails with ESRCH.
    } else {
      siginfo_t info{};  // Waits for the exit and leaves the child a zombie.
      ASSERT_EQ(waitid(P_PID, child, &info, WEXITED | WNOWAIT), 0);
    }
    std::string exited = job[1]->WorkerAddress();
    int32_t pid = 0;
    uint64_t pid_namespace = 0;
    ASSERT_TRUE(ucx_internal::ParseProcessTrailer(exited, &pid, &pid_namespace));
    EXPECT_EQ(pid, getpid());
    exited.resize(exited.size() - ucx_internal::ProcessTrailer(0, 0).size());
    exited += ucx_internal::ProcessTrailer(child, pid_namespace);
    ASSERT_TRUE(job[0]->ConnectPeers({job[0]->WorkerAddress(), exited}).ok());
    std::vector<uint8_t> buf(64, 0);
    // The post checks too (a receive may match an announced message inside the post): the
    // request fails at the post when the period since the last check has passed, else when
    // waited for. The send goes first, after the period: only the post's own check fails it.
    for (bool send : {true, false}) {
      SCOPED_TRACE(send ? "send" : "receive");
      if (send) absl::SleepFor(absl::Milliseconds(300));  // The check at the post runs.
      auto posted = send ? job[0]->PostSend(1, MakeTag(16, 1, 0), buf.data(), buf.size())
                         : job[0]->PostReceive(1, MakeTag(16, 1, 1), buf.data(), buf.size());
      const absl::Status failed =
          posted.ok() ? job[0]->WaitAll({*posted}, In(absl::Seconds(10))) : posted.status();
      EXPECT_TRUE(absl::IsUnavailable(failed)) << failed;
      EXPECT_THAT(failed.message(),
                  HasSubstr(absl::StrCat("ucx: peer process 1 (pid ", child, ") has exited")));
      if (send) {
        EXPECT_FALSE(posted.ok()) << "the post did not check for exited peers";
      }
    }
    if (!reaped) {
      EXPECT_EQ(waitpid(child, nullptr, 0), child);
    }
    if (!reaped) continue;
    // The same pid in another pid namespace (or on another host) says nothing: not checked.
    exited.resize(exited.size() - ucx_internal::ProcessTrailer(0, 0).size());
    exited += ucx_internal::ProcessTrailer(child, pid_namespace + 1);
    ASSERT_TRUE(job[0]->ConnectPeers({job[0]->WorkerAddress(), exited}).ok());
    auto r = job[0]->PostReceive(1, MakeTag(16, 2, 1), buf.data(), buf.size());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(absl::IsDeadlineExceeded(job[0]->WaitAll({*r}, In(absl::Milliseconds(600)))));
  }
}

TEST_P(UcxTest, DestructionWithOutstandingRequestsIsBounded) {
  auto job = MakeJob(2);
  ASSERT_EQ(job.size(), 2);
  constexpr int64_t kBytes = 4 << 20;
  std::vector<uint8_t> out = Pattern(kBytes, 3), in(kBytes, 0);
  auto reg = job[0]->RegisterMemory(out.data(), kBytes, MemoryKind::kHost);
  ASSERT_TRUE(reg.ok()) << reg.status();
  // Never matched: a rendezvous send and a receive, each left outstanding.
  ASSERT_TRUE(job[0]->PostSend(1, MakeTag(15, 1, 0), out.data(), kBytes).ok());
  ASSERT_TRUE(job[0]->PostReceive(1, MakeTag(15, 2, 1), in.data(), kBytes).ok());
  ASSERT_TRUE(job[0]->PostSend(0, MakeTag(15, 3, 0), out.data(), 100).ok());
  const absl::Time start = absl::Now();
  job[0].reset();
  job[1].reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

// Shared memory within a node; TCP over loopback as between nodes.
INSTANTIATE_TEST_SUITE_P(Fabrics, UcxTest,
                         ::testing::Values(Fabric{"shm", "sm,cma,self", ""},
                                           Fabric{"tcp", "tcp", "lo"}),
                         FabricName);

}  // namespace
}  // namespace wsync
