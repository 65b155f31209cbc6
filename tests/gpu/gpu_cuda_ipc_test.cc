// GPU tests of the CUDA IPC backend (label gpu; need one NVIDIA GPU, run by tests/gpu/run.sh):
// two forked processes on GPU 0 (trainer and rollout sharing it, which NCCL refuses) with the real
// API from the CUDA module (LoadRealNcclApi) and a UCX messenger over shared memory:
//  - process 0 sends six messages from two cudaMalloc allocations at odd offsets (empty, one
//    byte, megabytes) to process 1, which copies its whole 16 MiB destination back to the host
//    and checks every byte (tests/unit/cuda_ipc_pair.h);
//  - a sender killed before posting makes the receiver's wait fail by its 5 s deadline.
// Test bodies run in the forked children: CUDA is never initialised in the gtest process.

#include <signal.h>

#include <vector>

#include "device/cuda_module.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_count.h"
#include "tests/unit/cuda_ipc_pair.h"

namespace wsync {
namespace {

using test::GpuCount;

TEST(GpuCudaIpcTest, TwoProcessesOnOneGpuEveryByteChecked) {
  if (GpuCount() == 0) GTEST_SKIP() << "needs an NVIDIA GPU";
  test::IpcPairOptions options;
  options.make_api = LoadRealNcclApi;
  EXPECT_EQ(test::RunIpcPair(options), (std::vector<int>{0, 0}));
}

TEST(GpuCudaIpcTest, AKilledSenderFailsTheReceiverByItsDeadline) {
  if (GpuCount() == 0) GTEST_SKIP() << "needs an NVIDIA GPU";
  test::IpcPairOptions options;
  options.make_api = LoadRealNcclApi;
  options.kill_sender = true;
  options.receive_timeout = absl::Seconds(5);
  EXPECT_EQ(test::RunIpcPair(options), (std::vector<int>{128 + SIGKILL, 0}));
}

}  // namespace
}  // namespace wsync
