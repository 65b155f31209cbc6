// The CUDA IPC backend out of this test process: the real module's IPC calls on a machine without
// a GPU fail cleanly (in a forked child), and two forked processes, each with its own fake, move
// descriptors over UCX shared memory (every byte checked; a killed sender fails the receiver by
// its deadline). Part of cuda_ipc_test.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "device/cuda_module.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_count.h"
#include "tests/unit/cuda_ipc_pair.h"
#include "tests/unit/fake_cuda_fabric.h"

namespace wsync {
namespace {

using test::FakeCudaFabric;

// The real module's IPC calls on a machine without a GPU: errors, never a crash (the driver entry
// point lookup included). In a forked child, so that the gtest process never maps libcudart
// (tests/sanitizers/README.md); skipped where a GPU exists (gpu_cuda_ipc_test covers it).
int RealApiFailsCleanlyChild() {
  absl::StatusOr<std::unique_ptr<NcclApi>> loaded = LoadRealNcclApi();
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s\n", loaded.status().ToString().c_str());
    return 1;
  }
  NcclApi& api = **loaded;
  int host = 0;
  const std::vector<std::pair<const char*, bool>> checks = {
      {"no device", api.DeviceCount() == 0},
      {"AllocationRange fails", !api.AllocationRange(&host).ok()},
      {"IpcGetMemHandle fails", !api.IpcGetMemHandle(&host).ok()},
      {"IpcOpenMemHandle fails",
       !api.IpcOpenMemHandle(std::string(NcclApi::kIpcHandleBytes, '\0')).ok()},
      {"a short handle is InvalidArgument",
       api.IpcOpenMemHandle("short").status().code() == absl::StatusCode::kInvalidArgument},
      {"IpcCloseMemHandle fails", !api.IpcCloseMemHandle(&host).ok()},
      {"DeviceUuid fails", !api.DeviceUuid(0).ok()},
  };
  int failures = 0;
  for (const auto& [what, held] : checks) {
    if (!held) std::fprintf(stderr, "failed: %s\n", what);
    failures += held ? 0 : 1;
  }
  return failures;
}

TEST(CudaIpcRealApiTest, IpcCallsFailCleanlyWithoutAGpu) {
  if (test::GpuCount() > 0) GTEST_SKIP() << "a GPU is present; gpu_cuda_ipc_test covers it";
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid == 0) _exit(RealApiFailsCleanlyChild());
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
}

// Two forked processes, each with its own fake (handles name the sender's memfd by pid, so the
// receiver maps it through /proc), descriptors over UCX shared memory: every byte checked.
absl::StatusOr<std::unique_ptr<NcclApi>> ChildFakeApi() {
  static FakeCudaFabric* fabric = new FakeCudaFabric();  // One per child; never freed.
  return fabric->Api();
}

TEST(CudaIpcForkTest, TwoProcessesOverUcxSharedMemoryEveryByteChecked) {
  test::IpcPairOptions options;
  options.make_api = ChildFakeApi;
  EXPECT_EQ(test::RunIpcPair(options), (std::vector<int>{0, 0}));
}

TEST(CudaIpcForkTest, AKilledSenderFailsTheReceiverByItsDeadline) {
  test::IpcPairOptions options;
  options.make_api = ChildFakeApi;
  options.kill_sender = true;
  options.receive_timeout = absl::Seconds(2);
  EXPECT_EQ(test::RunIpcPair(options), (std::vector<int>{128 + SIGKILL, 0}));
}

}  // namespace
}  // namespace wsync
