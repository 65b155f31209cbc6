// The CUDA job of `wsync-bench sync --memory cuda` and the gpu session tests (integration/cuda:
// RunCudaJob) on a fake of CUDA and NCCL (tests/unit/fake_cuda_fabric.h), so that what a GPU
// machine runs is exercised here too: qwen2.5-tiny megatron(tp=1) -> vllm(tp=1) (fused qkv_proj
// and gate_up_proj on the rollout), every rollout element checked by the job itself.
// - trainer and rollout as two forked OS processes over CUDA IPC: the rollout maps the trainer's
//   fake allocations through /proc/<pid>/fd (the one-GPU test of tests/gpu, on the fake);
// - the same as threads of one process with an API that cannot open its own handles, like CUDA:
//   the rollout reads the trainer's memory at its own address;
// - intra_node routed to NCCL (threads: the fake's NCCL runs between threads), with every buffer
//   in CUDA memory and, on one device, with host trainers.

#include "integration/cuda/cuda_job.h"

#include <string>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/fake_cuda_fabric.h"

namespace wsync {
namespace {

using ::testing::HasSubstr;

CudaJobOptions TinyJob(test::FakeCudaFabric& cuda) {
  CudaJobOptions options;
  options.model = "qwen2.5-tiny";
  options.syncs = 2;
  options.deadline = absl::Seconds(60);
  options.api = [&cuda] { return cuda.Api(); };
  return options;
}

void ExpectEveryRolloutElementChecked(const absl::StatusOr<CudaJobResult>& job, int devices = 1) {
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_GT(job->rollout_buffer_bytes, 0);
  EXPECT_EQ(job->verified_elements_bytes, job->rollout_buffer_bytes);
  EXPECT_GT(job->rollout_bytes, 0);
  EXPECT_EQ(job->transfer_seconds.size(), 2u);
  EXPECT_EQ(job->devices, devices);
}

TEST(CudaJobTest, TwoForkedProcessesSharingADeviceSyncOverCudaIpc) {
  test::FakeCudaFabric cuda;
  CudaJobOptions options = TinyJob(cuda);
  options.forked_processes = true;
  absl::StatusOr<CudaJobResult> job = RunCudaJob(options);
  ExpectEveryRolloutElementChecked(job);
  if (job.ok()) {
    EXPECT_EQ(job->placement, "cuda->cuda (cuda_ipc, processes)");
  }
}

TEST(CudaJobTest, ThreadsOfOneProcessReadEachOtherOverCudaIpcWithoutOpeningHandles) {
  test::FakeCudaFabric cuda;
  cuda.set_opens_own_ipc_handles(false);
  absl::StatusOr<CudaJobResult> job = RunCudaJob(TinyJob(cuda));
  ExpectEveryRolloutElementChecked(job);
  if (job.ok()) {
    EXPECT_EQ(job->placement, "cuda->cuda (cuda_ipc, threads)");
  }
  EXPECT_EQ(cuda.ipc_opens(), 0);
}

TEST(CudaJobTest, NcclWhenConfigured) {
  test::FakeCudaFabric cuda;
  CudaJobOptions options = TinyJob(cuda);
  options.path_transports = "intra_node=nccl";
  // One device, two processes: the trainer keeps host memory (NCCL refuses two ranks on a GPU).
  absl::StatusOr<CudaJobResult> staged = RunCudaJob(options);
  ExpectEveryRolloutElementChecked(staged);
  if (staged.ok()) {
    EXPECT_THAT(staged->placement, HasSubstr("host->cuda (ucx"));
  }
  // Forced into CUDA memory: no communicator can hold two ranks of one device (NCCL refuses them,
  // and so does the fabric here), so connect is refused naming the GPU (the gpu test
  // TwoNcclRanksOnOneGpuAreRefusedWithinTheDeadline, on the fake).
  cuda.set_refuses_duplicate_devices(true);
  options.all_cuda = true;
  absl::StatusOr<CudaJobResult> refused = RunCudaJob(options);
  EXPECT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("share one GPU"));
}

TEST(CudaJobTest, NcclBetweenTwoDevicesInCudaMemory) {
  test::FakeCudaFabric cuda(/*devices=*/2);
  cuda.set_refuses_duplicate_devices(true);
  CudaJobOptions options = TinyJob(cuda);
  options.path_transports = "intra_node=nccl";
  options.all_cuda = true;
  absl::StatusOr<CudaJobResult> direct = RunCudaJob(options);
  ExpectEveryRolloutElementChecked(direct, /*devices=*/2);
  if (direct.ok()) {
    EXPECT_EQ(direct->placement, "cuda->cuda (nccl, threads)");
  }
}

}  // namespace
}  // namespace wsync
