// GPU tests of the plugin session with CUDA buffers (label gpu; run by tests/gpu/run.sh): a fused
// qwen2.5-0.5b layout synced trainer -> rollout through the Session with every rollout element
// checked (integration/cuda: RunCudaJob) over CUDA IPC (two processes on one GPU, and threads) and
// over NCCL when configured, and the refusal of two NCCL ranks on one GPU.
// Each body runs in a forked child: CUDA must not be initialised in the gtest process itself.

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "integration/cuda/cuda_job.h"
#include "tests/gpu/gpu_count.h"

namespace wsync {
namespace {

using test::GpuCount;

// Runs `body` in a forked child; its exit code (128 + signal when killed).
template <typename Body>
int InChild(Body body) {
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) _exit(body());
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Runs the job of `options` and checks that every rollout element was verified; prints the
// placement. The exit code for InChild.
int RunAndCheck(const CudaJobOptions& options) {
  absl::StatusOr<CudaJobResult> job = RunCudaJob(options);
  if (!job.ok()) {
    std::printf("job failed: %s\n", job.status().ToString().c_str());
    return 1;
  }
  std::printf("rollout: placement %s, %d GPU(s), %lld of %lld rollout bytes checked, %lld B/sync\n",
              job->placement.c_str(), job->devices,
              static_cast<long long>(job->verified_elements_bytes),
              static_cast<long long>(job->rollout_buffer_bytes),
              static_cast<long long>(job->rollout_bytes));
  const bool all_checked = job->verified_elements_bytes == job->rollout_buffer_bytes &&
                           job->rollout_buffer_bytes > 0 && job->rollout_bytes > 0;
  return all_checked ? 0 : 2;
}

// The test: megatron(tp=1) -> vllm(tp=1) (vLLM's fused qkv_proj and gate_up_proj on the
// rollout), trainer and rollout two OS processes sharing GPU 0 (or on GPUs 0 and 1), every buffer
// cudaMalloc'ed; the pair goes over CUDA IPC (NCCL refuses two ranks on one GPU), the rollout maps
// the trainer's allocations and every element is checked.
TEST(GpuSessionTest, TwoProcessesSharingAGpuSyncFusedQwenThroughCudaIpc) {
  ASSERT_GT(GpuCount(), 0) << "no NVIDIA device: this gpu-labelled test needs one";
  const int code = InChild([] {
    CudaJobOptions options;
    options.syncs = 2;
    options.deadline = absl::Seconds(120);
    options.forked_processes = true;
    return RunAndCheck(options);
  });
  EXPECT_EQ(code, 0);
}

// The same job with the processes as threads of one process (CUDA IPC then uses the peer's device
// pointers directly: a process cannot open its own IPC handles).
TEST(GpuSessionTest, FusedQwenTrainerToRolloutWithCudaBuffersEveryElementChecked) {
  ASSERT_GT(GpuCount(), 0) << "no NVIDIA device: this gpu-labelled test needs one";
  const int code = InChild([] {
    CudaJobOptions options;
    options.syncs = 2;
    options.deadline = absl::Seconds(120);
    return RunAndCheck(options);
  });
  EXPECT_EQ(code, 0);
}

// intra_node routed to NCCL: with two GPUs both sides are CUDA memory over NCCL; with one, NCCL
// refuses two ranks on the GPU, so the trainer keeps host memory and the rollout stages into
// device memory (placement printed).
TEST(GpuSessionTest, FusedQwenOverNcclWhenConfigured) {
  ASSERT_GT(GpuCount(), 0) << "no NVIDIA device: this gpu-labelled test needs one";
  const int code = InChild([] {
    CudaJobOptions options;
    options.syncs = 2;
    options.deadline = absl::Seconds(120);
    options.path_transports = "intra_node=nccl";
    return RunAndCheck(options);
  });
  EXPECT_EQ(code, 0);
}

// One GPU, intra_node routed to NCCL and both sides forced into CUDA memory: no NCCL communicator
// can hold two ranks of one device, so connect is refused on every process naming the pair and the
// GPU (plugin/nccl_communicators.h), before any communicator forms; never a hang.
TEST(GpuSessionTest, TwoNcclRanksOnOneGpuAreRefusedWithinTheDeadline) {
  if (GpuCount() != 1) GTEST_SKIP() << "needs exactly one GPU (found " << GpuCount() << ")";
  const absl::Time start = absl::Now();
  const int code = InChild([] {
    CudaJobOptions options;
    options.syncs = 1;
    options.all_cuda = true;
    options.path_transports = "intra_node=nccl";
    options.deadline = absl::Seconds(20);
    absl::StatusOr<CudaJobResult> job = RunCudaJob(options);
    std::printf("survivor: one GPU, two CUDA ranks: %s\n", job.status().ToString().c_str());
    return !job.ok() && absl::StrContains(job.status().message(), "share one GPU") ? 0 : 1;
  });
  EXPECT_EQ(code, 0);
  EXPECT_LT(absl::Now() - start, absl::Seconds(20 + 15));
}

}  // namespace
}  // namespace wsync
