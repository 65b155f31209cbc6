// The session with CUDA buffers, every process a thread, against a fake of CUDA and NCCL
// (tests/unit/fake_cuda_fabric.h: device memory is host memory): CUDA pairs within a node go over
// CUDA IPC by default, over NCCL when configured or across nodes (the unique id travels through
// the control plane at connect), host pairs over UCX, all in the same syncs; every rollout element
// is checked, and configurations that cannot work are refused at connect on every process with the
// reason (Unimplemented: WSYNC_UNSUPPORTED).

#include <barrier>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/plugin/tiny_session.h"
#include "tests/testing/reference.h"
#include "tests/unit/fake_cuda_fabric.h"

namespace wsync {
namespace {

using ::testing::HasSubstr;
using Process = test::TinySessionProcess;

class SessionCudaTest : public ::testing::Test {
 protected:
  void SetUp() override { setenv("WSYNC_SESSION_CUDA_TEST_SECRET", "session-cuda-secret-0123", 1); }

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
                               const std::vector<MemoryKind>& kinds, test::FakeCudaFabric& cuda,
                               const std::vector<std::string>& nodes = {}) {
    const int port = test::FreeLoopbackPort();
    std::vector<Process> processes;
    for (const Role role : {Role::kTrainer, Role::kRollout}) {
      for (int32_t rank = 0; rank < 2; ++rank) {
        SessionConfig config =
            test::TinyJobConfig(role, rank, port, job, "WSYNC_SESSION_CUDA_TEST_SECRET");
        config.deadline = absl::Seconds(20);
        config.path_transports = paths;
        if (!nodes.empty()) config.node_id = nodes[processes.size()];
        config.nccl_api = [&cuda] { return cuda.Api(); };
        const MemoryKind kind = kinds[processes.size()];
        processes.push_back(test::MakeTinySessionProcess(config, kind));
        if (kind == MemoryKind::kCuda) {
          for (const BufferInfo& buffer : processes.back().part.buffers) {
            cuda.AddDeviceRange(processes.back().memory->data({rank, buffer.id}), buffer.bytes);
          }
        }
      }
    }
    return processes;
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
  test::FakeCudaFabric cuda;
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
  test::FakeCudaFabric cuda;
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
  test::FakeCudaFabric cuda;
  std::vector<Process> processes =
      MakeJob("cuda-both", "intra_node=nccl",
              {MemoryKind::kCuda, MemoryKind::kHost, MemoryKind::kCuda, MemoryKind::kCuda}, cuda);
  const std::vector<absl::Status> results = Run(processes, 2);
  for (size_t p = 0; p < results.size(); ++p) {
    EXPECT_TRUE(results[p].ok()) << p << ": " << results[p];
  }
  EXPECT_THAT(processes[2].session->MetricsText(),
              HasSubstr("wsync_bytes_received_total{role=\"rollout\",path_class=\"intra_node\","
                        "transport=\"nccl\"}"));
  EXPECT_THAT(processes[3].session->MetricsText(),
              HasSubstr("wsync_bytes_received_total{role=\"rollout\",path_class=\"intra_node\","
                        "transport=\"ucx\"}"));
  EXPECT_EQ(processes[2].session->State().first, 2);
  EXPECT_EQ(processes[3].session->State().first, 2);
}

// NCCL and CUDA IPC in the same syncs: trainer 0 on node a, the others on node b, all CUDA.
// Trainer 0 -> rollout 0 crosses nodes over NCCL (the communicator: the CUDA processes with a pair
// across nodes, all four here) while trainer 1 -> rollout 1 stays in node b over CUDA IPC; the
// routed transport runs both in lockstep rounds (NCCL needs round order).
TEST_F(SessionCudaTest, NcclAcrossNodesAndCudaIpcWithinInOneJob) {
  test::FakeCudaFabric cuda;
  std::vector<Process> processes = MakeJob(
      "cuda-two", "", {MemoryKind::kCuda, MemoryKind::kCuda, MemoryKind::kCuda, MemoryKind::kCuda},
      cuda, {"a", "b", "b", "b"});
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
  std::vector<Process> processes =
      MakeJob("cuda-ipc-across", "inter_node=cuda_ipc",
              {MemoryKind::kCuda, MemoryKind::kCuda, MemoryKind::kCuda, MemoryKind::kCuda}, cuda,
              {"a", "a", "b", "b"});
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

}  // namespace
}  // namespace wsync
