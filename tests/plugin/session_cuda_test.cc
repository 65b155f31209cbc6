// The session with CUDA buffers, every process a thread, against a fake of CUDA and NCCL
// (tests/unit/fake_cuda_fabric.h: device memory is host memory): CUDA pairs within a node go over
// CUDA IPC by default, over NCCL when configured or across nodes (the unique id travels through
// the control plane at connect), host pairs over UCX, all in the same syncs; every rollout element
// is checked, configurations that cannot work are refused at connect on every process with the
// reason (Unimplemented: WSYNC_UNSUPPORTED), and a replacement of a lost process (CUDA or host)
// joins the communicator at its first sync.

#include <barrier>
#include <functional>
#include <map>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/fill/fill.h"
#include "tests/plugin/tiny_session.h"
#include "tests/unit/fake_cuda_fabric.h"

namespace wsync {
namespace {

using ::testing::HasSubstr;
using Process = test::TinySessionProcess;

// The series of a rollout's bytes received over `path_class` and `transport`.
std::string ReceivedBytesMetric(absl::string_view path_class, absl::string_view transport) {
  return absl::StrCat("wsync_bytes_received_total{role=\"rollout\",path_class=\"", path_class,
                      "\",transport=\"", transport, "\"}");
}

class SessionCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("WSYNC_SESSION_CUDA_TEST_SECRET", "session-cuda-secret-0123456789abcdef", 1);
  }

  // The 2 + 2 tiny job; trainers' and rollouts' buffers of the given kinds, CUDA buffers declared
  // device memory to `cuda`.
  std::vector<Process> MakeJob(const std::string& job, const std::string& paths,
                               MemoryKind trainers, MemoryKind rollouts,
                               test::FakeCudaFabric& cuda) {
    return MakeJob(job, paths, {trainers, trainers, rollouts, rollouts}, cuda);
  }
  // The same with the memory kind of each process (trainer 0, trainer 1, rollout 0, rollout 1).
  // `nodes`: each process's node id (empty: all on one node).
  std::vector<Process> MakeJob(const std::string& job, const std::string& paths,
                               const std::vector<MemoryKind>& kinds, test::FakeCudaFabric& cuda) {
    port_ = test::FreeLoopbackPort();
    std::vector<Process> processes;
    for (const Role role : {Role::kTrainer, Role::kRollout}) {
      for (int32_t rank = 0; rank < 2; ++rank) {
        processes.push_back(
            MakeProcess(job, paths, role, rank, kinds[processes.size()], cuda, node_ids_));
      }
    }
    return processes;
  }
  // One process of the job MakeJob made last (on its port), on node `node_ids[role rank]` of the
  // role when given (else "local").
  Process MakeProcess(const std::string& job, const std::string& paths, Role role, int32_t rank,
                      MemoryKind kind, test::FakeCudaFabric& cuda,
                      const std::map<std::pair<Role, int32_t>, std::string>& node_ids = {}) {
    SessionConfig config =
        test::TinyJobConfig(role, rank, port_, job, "WSYNC_SESSION_CUDA_TEST_SECRET");
    config.deadline = absl::Seconds(20);
    config.path_transports = paths;
    config.nccl_api = [&cuda] { return cuda.Api(); };
    if (const auto node = node_ids.find({role, rank}); node != node_ids.end()) {
      config.node_id = node->second;
    }
    const auto device = device_ids_.find({role, rank});
    Process process = test::MakeTinySessionProcess(
        config, kind, device == device_ids_.end() ? 0 : device->second);
    if (kind == MemoryKind::kCuda) {
      for (const BufferInfo& buffer : process.part.buffers) {
        cuda.AddDeviceRange(process.memory->data({rank, buffer.id}), buffer.bytes);
      }
    }
    return process;
  }

  // Puts every process on a GPU of its own (devices 0 to 3 of `cuda`), which NCCL pairs within a
  // node need, and makes `cuda` refuse a communicator with two ranks on one device, as NCCL does.
  void OneGpuPerProcess(test::FakeCudaFabric& cuda) {
    device_ids_ = {{{Role::kTrainer, 0}, 0},
                   {{Role::kTrainer, 1}, 1},
                   {{Role::kRollout, 0}, 2},
                   {{Role::kRollout, 1}, 3}};
    cuda.set_refuses_duplicate_devices(true);
  }

  // Connects every process and runs `versions` verified syncs; the status of each process.
  std::vector<absl::Status> Run(std::vector<Process>& processes, int64_t versions) {
    std::vector<absl::Status> results(processes.size());
    std::vector<std::thread> threads;
    for (size_t p = 0; p < processes.size(); ++p) {
      threads.emplace_back([&, p] {
        Process& me = processes[p];
        results[p] = me.session->Connect();
        for (int64_t v = 1; v <= versions && results[p].ok(); ++v) {
          if (p < 2) results[p] = test::FillLogical(me.part, v, me.memory.get());
          if (results[p].ok()) results[p] = me.session->Sync(v);
          if (results[p].ok() && p >= 2) results[p] = test::CheckLogical(me.part, *me.memory, v);
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
    return results;
  }

  // Every process's connect failed with `reason` in its message (and of kind `code` unless OK),
  // leaving the session registered.
  static void ExpectRefusedEverywhere(const std::vector<Process>& processes,
                                      const std::vector<absl::Status>& results,
                                      absl::StatusCode code, const std::string& reason) {
    for (size_t p = 0; p < results.size(); ++p) {
      EXPECT_FALSE(results[p].ok()) << p;
      if (code != absl::StatusCode::kOk) {
        EXPECT_EQ(results[p].code(), code) << p << ": " << results[p];
      }
      EXPECT_THAT(std::string(results[p].message()), HasSubstr(reason)) << p;
      EXPECT_EQ(processes[p].session->State().second, SessionState::kRegistered) << p;
    }
  }

  // Runs `call(p)` for each p of `ids`, each in a thread of its own; the status of each (OK for
  // the others).
  static std::vector<absl::Status> On(const std::vector<int>& ids,
                                      const std::function<absl::Status(int)>& call) {
    std::vector<absl::Status> results(4);
    std::vector<std::thread> threads;
    for (int p : ids) threads.emplace_back([&, p] { results[p] = call(p); });
    for (std::thread& thread : threads) thread.join();
    return results;
  }
  // Sync `version` on process p (0, 1: trainers, which fill it first; 2, 3: rollouts, which then
  // check every element).
  static absl::Status SyncChecked(Process& me, int p, int64_t version) {
    if (p < 2) WSYNC_RETURN_IF_ERROR(test::FillLogical(me.part, version, me.memory.get()));
    WSYNC_RETURN_IF_ERROR(me.session->Sync(version));
    return p >= 2 ? test::CheckLogical(me.part, *me.memory, version) : absl::OkStatus();
  }
  // Connects all four processes and syncs version 1; then process `lost` is finalized (the
  // coordinator loses it) and version 2 fails on the others at once, naming it.
  static void ConnectSyncAndLose(std::vector<Process>& processes, int lost,
                                 const std::string& lost_name) {
    for (const absl::Status& s : On({0, 1, 2, 3}, [&](int p) {
           WSYNC_RETURN_IF_ERROR(processes[p].session->Connect());
           return SyncChecked(processes[p], p, 1);
         })) {
      ASSERT_TRUE(s.ok()) << s;
    }
    processes[lost].session->Finalize();
    std::vector<int> others;
    for (int p = 0; p < 4; ++p) {
      if (p != lost) others.push_back(p);
    }
    const absl::Time lost_at = absl::Now();
    const std::vector<absl::Status> failed =
        On(others, [&](int p) { return SyncChecked(processes[p], p, 2); });
    for (int p : others) {
      EXPECT_TRUE(absl::IsUnavailable(failed[p])) << p << ": " << failed[p];
      EXPECT_THAT(failed[p].message(), HasSubstr(lost_name)) << p;
    }
    EXPECT_LT(absl::Now() - lost_at, absl::Seconds(5));
  }
  // Connects the replacement `processes[p]` and syncs `version` everywhere: it commits on every
  // process, every rollout element checked.
  static void ReplacementConnectsAndSyncCommits(std::vector<Process>& processes, int p,
                                                int64_t version) {
    ASSERT_TRUE(processes[p].session->Connect().ok()) << processes[p].session->LastError();
    EXPECT_EQ(processes[p].session->State(), std::make_pair(int64_t{-1}, SessionState::kIdle));
    for (const absl::Status& s :
         On({0, 1, 2, 3}, [&](int q) { return SyncChecked(processes[q], q, version); })) {
      EXPECT_TRUE(s.ok()) << s;
    }
    for (int q = 0; q < 4; ++q) {
      EXPECT_EQ(processes[q].session->State(), std::make_pair(version, SessionState::kIdle)) << q;
    }
  }

  int port_ = 0;
  std::map<std::pair<Role, int32_t>, std::string> node_ids_;  // MakeJob's; empty: all "local".
  std::map<std::pair<Role, int32_t>, int> device_ids_;  // MakeProcess's CUDA device; absent: 0.
};

// Within a node CUDA pairs go over CUDA IPC by default: the rollouts map the trainers' fake
// allocations (at other addresses: tests/unit/fake_cuda_fabric.h) and copy on their streams.
TEST_F(SessionCudaTest, CudaBuffersWithinANodeSyncOverCudaIpcEveryElementChecked) {
  test::FakeCudaFabric cuda;
  std::vector<Process> processes =
      MakeJob("cuda-ipc", "", MemoryKind::kCuda, MemoryKind::kCuda, cuda);
  const std::vector<absl::Status> results = Run(processes, 3);
  for (size_t p = 0; p < results.size(); ++p)
    EXPECT_TRUE(results[p].ok()) << p << ": " << results[p];
  EXPECT_EQ(processes[2].session->State().first, 3);
  const std::string metrics = processes[2].session->MetricsText();
  EXPECT_THAT(metrics, HasSubstr("transport=\"cuda_ipc\""));
  EXPECT_THAT(metrics, ::testing::Not(HasSubstr("transport=\"nccl\"")));
}

TEST_F(SessionCudaTest, CudaBuffersSyncOverNcclEveryElementChecked) {
  test::FakeCudaFabric cuda(/*devices=*/4);
  OneGpuPerProcess(cuda);
  std::vector<Process> processes =
      MakeJob("cuda-all", "intra_node=nccl", MemoryKind::kCuda, MemoryKind::kCuda, cuda);
  const std::vector<absl::Status> results = Run(processes, 3);
  for (size_t p = 0; p < results.size(); ++p)
    EXPECT_TRUE(results[p].ok()) << p << ": " << results[p];
  absl::StatusOr<std::string> report = processes[2].session->ScheduleReport();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_THAT(*report, HasSubstr("(cuda memory)"));
  EXPECT_THAT(*report, ::testing::Not(HasSubstr("(host memory)")));
  EXPECT_EQ(processes[2].session->State().first, 3);
  // The bytes went over NCCL (the metrics label each path's transport by the backend routing it).
  EXPECT_THAT(processes[2].session->MetricsText(), HasSubstr("transport=\"nccl\""));
}

// A communicator failure fails the sync on every process (NCCL aborts the communicator); the
// next sync starts by forming a new one through the control plane and moves every byte again.
TEST_F(SessionCudaTest, ASyncAfterACommunicatorFailureReformsItAndCommits) {
  test::FakeCudaFabric cuda(/*devices=*/4);
  OneGpuPerProcess(cuda);
  std::vector<Process> processes =
      MakeJob("cuda-reform", "intra_node=nccl", MemoryKind::kCuda, MemoryKind::kCuda, cuda);
  std::vector<absl::Status> connected(4), failed(4), recovered(4);
  std::barrier synced(4, [&]() noexcept { cuda.FailCommunicators(); });
  std::vector<std::thread> threads;
  for (int p = 0; p < 4; ++p) {
    threads.emplace_back([&, p] {
      Process& me = processes[p];
      connected[p] = me.session->Connect();
      if (connected[p].ok() && p < 2) connected[p] = test::FillLogical(me.part, 1, me.memory.get());
      if (connected[p].ok()) connected[p] = me.session->Sync(1);
      synced.arrive_and_wait();  // The communicator fails now.
      if (!connected[p].ok()) return;
      failed[p] = me.session->Sync(2);
      if (p < 2) recovered[p] = test::FillLogical(me.part, 3, me.memory.get());
      if (recovered[p].ok()) recovered[p] = me.session->Sync(3);
      if (recovered[p].ok() && p >= 2) recovered[p] = test::CheckLogical(me.part, *me.memory, 3);
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int p = 0; p < 4; ++p) {
    ASSERT_TRUE(connected[p].ok()) << p << ": " << connected[p];
    EXPECT_FALSE(failed[p].ok()) << p;
    EXPECT_TRUE(recovered[p].ok()) << p << ": " << recovered[p];
    EXPECT_EQ(processes[p].session->State().first, 3) << p;
  }
}

// Trainers hold host memory, rollouts CUDA memory: trainer -> rollout pairs travel in host memory
// over UCX (the rollouts stage them into device memory); the rollouts' own pair would be NCCL.
TEST_F(SessionCudaTest, HostTrainersAndCudaRolloutsMixTransports) {
  test::FakeCudaFabric cuda;
  std::vector<Process> processes =
      MakeJob("cuda-mixed", "*=ucx:sm,cma,self", MemoryKind::kHost, MemoryKind::kCuda, cuda);
  const std::vector<absl::Status> results = Run(processes, 2);
  for (size_t p = 0; p < results.size(); ++p)
    EXPECT_TRUE(results[p].ok()) << p << ": " << results[p];
  absl::StatusOr<std::string> report = processes[3].session->ScheduleReport();
  ASSERT_TRUE(report.ok());
  EXPECT_THAT(*report, HasSubstr("(host memory)"));
  EXPECT_THAT(processes[3].session->MetricsText(), HasSubstr("transport=\"ucx:sm,cma,self\""));
}

// Trainer 0 and both rollouts hold CUDA memory, trainer 1 host memory: in the same syncs trainer
// 0 -> rollout 0 goes over NCCL and trainer 1 -> rollout 1 over UCX (rollout 1 stages its
// messages into device memory). (One process driving both backends in one round: the executor's
// random-placement test in tests/unit/nccl_executor_test.cc.)
TEST_F(SessionCudaTest, OneJobRunsNcclAndUcxPairsInTheSameSyncs) {
  test::FakeCudaFabric cuda(/*devices=*/4);
  OneGpuPerProcess(cuda);
  std::vector<Process> processes =
      MakeJob("cuda-both", "intra_node=nccl",
              {MemoryKind::kCuda, MemoryKind::kHost, MemoryKind::kCuda, MemoryKind::kCuda}, cuda);
  const std::vector<absl::Status> results = Run(processes, 2);
  for (size_t p = 0; p < results.size(); ++p) {
    EXPECT_TRUE(results[p].ok()) << p << ": " << results[p];
  }
  EXPECT_THAT(processes[2].session->MetricsText(),
              HasSubstr(ReceivedBytesMetric("intra_node", "nccl")));
  EXPECT_THAT(processes[3].session->MetricsText(),
              HasSubstr(ReceivedBytesMetric("intra_node", "ucx")));
  EXPECT_EQ(processes[2].session->State().first, 2);
  EXPECT_EQ(processes[3].session->State().first, 2);
}

// A colocated job on two nodes: on each node a trainer and a rollout share one GPU, the rollout
// holding the other trainer's shard, so every rollout byte crosses nodes over NCCL. NCCL refuses a
// communicator with two ranks on one GPU (the fabric does too), so the job forms several, each of
// the four pairs across nodes in one holding no two processes of a GPU (here four of two ranks
// each: no larger one exists). Pairs within a node would go over CUDA IPC.
TEST_F(SessionCudaTest, ColocatedProcessesOnTwoNodesSyncOverSeveralCommunicators) {
  test::FakeCudaFabric cuda(/*devices=*/2);
  cuda.set_refuses_duplicate_devices(true);
  node_ids_ = {{{Role::kTrainer, 0}, "a"},
               {{Role::kRollout, 1}, "a"},
               {{Role::kTrainer, 1}, "b"},
               {{Role::kRollout, 0}, "b"}};
  device_ids_ = {{{Role::kTrainer, 0}, 0},
                 {{Role::kRollout, 1}, 0},
                 {{Role::kTrainer, 1}, 1},
                 {{Role::kRollout, 0}, 1}};
  std::vector<Process> processes =
      MakeJob("cuda-colocated", "", MemoryKind::kCuda, MemoryKind::kCuda, cuda);
  const std::vector<absl::Status> results = Run(processes, 3);
  for (size_t p = 0; p < results.size(); ++p) {
    EXPECT_TRUE(results[p].ok()) << p << ": " << results[p];
  }
  for (int p : {2, 3}) {
    SCOPED_TRACE(testing::Message() << "rollout " << p - 2);
    EXPECT_THAT(processes[p].session->MetricsText(),
                HasSubstr(ReceivedBytesMetric("inter_node", "nccl")));
    EXPECT_EQ(processes[p].session->State().first, 3);
  }
  EXPECT_EQ(cuda.aborts(), 0);
}

// Two processes on one GPU whose pair is routed to NCCL cannot be connected by any communicator:
// every process's connect is refused naming them, before a communicator is formed.
TEST_F(SessionCudaTest, NcclBetweenProcessesOfOneGpuIsRefusedEverywhere) {
  test::FakeCudaFabric cuda;
  cuda.set_refuses_duplicate_devices(true);
  std::vector<Process> processes =
      MakeJob("cuda-one-gpu", "intra_node=nccl", MemoryKind::kCuda, MemoryKind::kCuda, cuda);
  const std::vector<absl::Status> results = Run(processes, 1);
  ExpectRefusedEverywhere(processes, results, absl::StatusCode::kUnimplemented,
                          "processes 0 and 1 exchange CUDA memory over NCCL but share one GPU");
}

// NCCL and CUDA IPC in the same syncs: trainer 0 on node a, the others on node b, all CUDA.
// Trainer 0 -> rollout 0 crosses nodes over NCCL (the communicator: the CUDA processes with a pair
// across nodes, all four here) while trainer 1 -> rollout 1 stays in node b over CUDA IPC; the
// routed transport runs both in lockstep rounds (NCCL needs round order).
TEST_F(SessionCudaTest, NcclAcrossNodesAndCudaIpcWithinInOneJob) {
  test::FakeCudaFabric cuda;
  node_ids_ = {{{Role::kTrainer, 0}, "a"},
               {{Role::kTrainer, 1}, "b"},
               {{Role::kRollout, 0}, "b"},
               {{Role::kRollout, 1}, "b"}};
  std::vector<Process> processes =
      MakeJob("cuda-two", "", MemoryKind::kCuda, MemoryKind::kCuda, cuda);
  const std::vector<absl::Status> results = Run(processes, 2);
  for (size_t p = 0; p < results.size(); ++p) {
    EXPECT_TRUE(results[p].ok()) << p << ": " << results[p];
  }
  EXPECT_THAT(processes[2].session->MetricsText(),
              HasSubstr("wsync_bytes_received_total{role=\"rollout\",path_class=\"inter_node\","
                        "transport=\"nccl\"}"));
  EXPECT_THAT(processes[3].session->MetricsText(),
              HasSubstr("wsync_bytes_received_total{role=\"rollout\",path_class=\"intra_node\","
                        "transport=\"cuda_ipc\"}"));
  EXPECT_GT(cuda.ipc_opens(), 0);
  for (int p : {2, 3}) EXPECT_EQ(processes[p].session->State().first, 2) << p;
}

// CUDA IPC configured for the class that leaves the node is refused at connect on every process,
// with the reason.
TEST_F(SessionCudaTest, CudaIpcConfiguredAcrossNodesIsRefusedEverywhere) {
  test::FakeCudaFabric cuda;
  node_ids_ = {{{Role::kTrainer, 0}, "a"},
               {{Role::kTrainer, 1}, "a"},
               {{Role::kRollout, 0}, "b"},
               {{Role::kRollout, 1}, "b"}};
  std::vector<Process> processes =
      MakeJob("cuda-ipc-across", "inter_node=cuda_ipc", MemoryKind::kCuda, MemoryKind::kCuda, cuda);
  ExpectRefusedEverywhere(processes, Run(processes, 1), absl::StatusCode::kUnimplemented,
                          "reaches only processes of the same node");
}

TEST_F(SessionCudaTest, CudaOverAUcxWithoutCudaSupportIsRefusedEverywhere) {
  test::FakeCudaFabric cuda;
  std::vector<Process> processes =
      MakeJob("cuda-ucx", "intra_node=ucx:sm,cma,self", MemoryKind::kCuda, MemoryKind::kCuda, cuda);
  ExpectRefusedEverywhere(processes, Run(processes, 1), absl::StatusCode::kUnimplemented,
                          "this UCX build reports no CUDA memory support");
}

TEST_F(SessionCudaTest, NoCudaDeviceIsRefusedEverywhereWithTheReason) {
  test::FakeCudaFabric no_gpu(/*devices=*/0);
  std::vector<Process> processes =
      MakeJob("cuda-none", "", MemoryKind::kHost, MemoryKind::kCuda, no_gpu);
  ExpectRefusedEverywhere(processes, Run(processes, 1), absl::StatusCode::kUnimplemented,
                          "no CUDA device");
}

// Explicitly over NCCL for same-node CUDA pairs (the default for them may be another backend).
constexpr char kOverNccl[] = "intra_node=nccl;*=ucx:sm,cma,self";

// A CUDA rollout is lost and replaced: the replacement runs its CUDA collective (its device memory,
// its verdict) at its first sync, where every running process re-forms the communicator on taking
// the roster that admitted it; that sync moves every byte to it over NCCL and commits.
TEST_F(SessionCudaTest, ACudaRolloutReplacementJoinsTheCommunicatorAndGetsEveryElement) {
  test::FakeCudaFabric cuda(/*devices=*/4);
  OneGpuPerProcess(cuda);
  std::vector<Process> processes =
      MakeJob("cuda-replace", kOverNccl, MemoryKind::kCuda, MemoryKind::kCuda, cuda);
  ConnectSyncAndLose(processes, 3, "process 3 (rollout rank 1");
  processes[3] = MakeProcess("cuda-replace", kOverNccl, Role::kRollout, 1, MemoryKind::kCuda, cuda);
  ReplacementConnectsAndSyncCommits(processes, 3, 3);
  EXPECT_GT(processes[3].session->LastStats().stats.received_bytes, 0);
  EXPECT_THAT(processes[3].session->MetricsText(),
              HasSubstr(ReceivedBytesMetric("intra_node", "nccl")));
  // And the job goes on: one more sync over the new communicator.
  for (const absl::Status& s :
       On({0, 1, 2, 3}, [&](int p) { return SyncChecked(processes[p], p, 4); })) {
    EXPECT_TRUE(s.ok()) << s;
  }
}

// The same over CUDA IPC (the default within a node): the running processes reconnect their UCX
// messenger to the replacement's new address, and the replacement maps the trainers' allocations.
TEST_F(SessionCudaTest, ACudaRolloutReplacementIsReachedOverCudaIpc) {
  test::FakeCudaFabric cuda;
  std::vector<Process> processes =
      MakeJob("cuda-ipc-replace", "", MemoryKind::kCuda, MemoryKind::kCuda, cuda);
  ConnectSyncAndLose(processes, 3, "process 3 (rollout rank 1");
  processes[3] = MakeProcess("cuda-ipc-replace", "", Role::kRollout, 1, MemoryKind::kCuda, cuda);
  ReplacementConnectsAndSyncCommits(processes, 3, 3);
  EXPECT_GT(processes[3].session->LastStats().stats.received_bytes, 0);
  EXPECT_THAT(processes[3].session->MetricsText(),
              HasSubstr(ReceivedBytesMetric("intra_node", "cuda_ipc")));
  for (const absl::Status& s :
       On({0, 1, 2, 3}, [&](int p) { return SyncChecked(processes[p], p, 4); })) {
    EXPECT_TRUE(s.ok()) << s;
  }
}

// A replacement that cannot move CUDA memory connects, and its "no" fails its first sync on every
// process with its reason, long before the deadline: first one without a CUDA device, then one
// whose path configuration sends CUDA pairs over a UCX without CUDA support (it has no transport
// at all). Once each is gone, the next sync fails naming it; then a good replacement joins and
// the next sync commits.
TEST_F(SessionCudaTest, ARefusedCudaReplacementFailsTheSyncEverywhereAndAnotherMayJoin) {
  test::FakeCudaFabric cuda(/*devices=*/4);
  OneGpuPerProcess(cuda);
  test::FakeCudaFabric no_gpu(/*devices=*/0);
  std::vector<Process> processes =
      MakeJob("cuda-refused", kOverNccl, MemoryKind::kCuda, MemoryKind::kCuda, cuda);
  ConnectSyncAndLose(processes, 3, "process 3 (rollout rank 1");
  struct Refusal {
    std::string paths;
    test::FakeCudaFabric* fabric;
    std::string reason;
  };
  int64_t version = 3;
  for (const Refusal& refusal : {Refusal{kOverNccl, &no_gpu, "no CUDA device"},
                                 Refusal{"intra_node=ucx:sm,cma,self;*=ucx:sm,cma,self", &cuda,
                                         "this UCX build reports no CUDA memory support"}}) {
    SCOPED_TRACE(refusal.reason);
    processes[3] = MakeProcess("cuda-refused", refusal.paths, Role::kRollout, 1, MemoryKind::kCuda,
                               *refusal.fabric);
    ASSERT_TRUE(processes[3].session->Connect().ok()) << processes[3].session->LastError();
    const absl::Time started = absl::Now();
    const std::vector<absl::Status> refused =
        On({0, 1, 2, 3}, [&](int p) { return SyncChecked(processes[p], p, version); });
    EXPECT_LT(absl::Now() - started, absl::Seconds(10));  // The deadline is 20 s.
    for (int p = 0; p < 4; ++p) {
      EXPECT_EQ(refused[p].code(), absl::StatusCode::kUnimplemented) << p << ": " << refused[p];
      EXPECT_THAT(refused[p].message(), HasSubstr("process 3 cannot move the job's CUDA memory"))
          << p;
      EXPECT_THAT(refused[p].message(), HasSubstr(refusal.reason)) << p;
    }
    EXPECT_EQ(processes[2].session->State(), std::make_pair(int64_t{1}, SessionState::kDirty));
    EXPECT_EQ(processes[3].session->State(), std::make_pair(int64_t{-1}, SessionState::kDirty));
    processes[3].session->Finalize();
    const std::vector<absl::Status> lost_again =
        On({0, 1, 2}, [&](int p) { return SyncChecked(processes[p], p, version + 1); });
    for (int p = 0; p < 3; ++p) {
      EXPECT_TRUE(absl::IsUnavailable(lost_again[p])) << lost_again[p];
    }
    version += 2;
  }
  processes[3] = MakeProcess("cuda-refused", kOverNccl, Role::kRollout, 1, MemoryKind::kCuda, cuda);
  ReplacementConnectsAndSyncCommits(processes, 3, version);
}

// Trainer 1 holds host memory (on another node, its pairs over UCX) in a job whose other processes
// share an NCCL communicator: its replacement takes no part in the communicator but still runs the
// CUDA collective at its first sync, with the others, who re-form it there.
TEST_F(SessionCudaTest, AHostReplacementInACudaJobKeepsTheCollectivesInStep) {
  test::FakeCudaFabric cuda(/*devices=*/4);
  OneGpuPerProcess(cuda);
  node_ids_ = {{{Role::kTrainer, 1}, "other"}};
  const std::vector<MemoryKind> kinds = {MemoryKind::kCuda, MemoryKind::kHost, MemoryKind::kCuda,
                                         MemoryKind::kCuda};
  std::vector<Process> processes = MakeJob("cuda-host-replace", kOverNccl, kinds, cuda);
  ConnectSyncAndLose(processes, 1, "process 1 (trainer rank 1");
  processes[1] = MakeProcess("cuda-host-replace", kOverNccl, Role::kTrainer, 1, MemoryKind::kHost,
                             cuda, node_ids_);
  ReplacementConnectsAndSyncCommits(processes, 1, 3);
  EXPECT_THAT(processes[3].session->MetricsText(),
              HasSubstr(ReceivedBytesMetric("inter_node", "ucx:sm,cma,self")));
  EXPECT_THAT(processes[2].session->MetricsText(),
              HasSubstr(ReceivedBytesMetric("intra_node", "nccl")));
}

}  // namespace
}  // namespace wsync
