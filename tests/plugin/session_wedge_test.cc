// A sender killed inside a send into a UCX shared-memory receive FIFO (issue 42): it reserved a
// slot (a compare-and-swap on the FIFO's head) and died before it marked the slot written, so the
// worker that owns the FIFO waits at that slot for good and every later message of every sender
// to it stalls. This test makes that state on purpose (WedgeOwnUcxReceiveFifos) in every process
// of the 2 + 2 job (processes as threads of this test), checks that the job then stalls, and that
// once a trainer is lost and a replacement joins, the next sync commits with every element
// checked: every process moved to fresh UCX workers at that sync (plugin/runtime.h,
// RenewWorkers).

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/fill/fill.h"
#include "plugin/session.h"
#include "tests/plugin/tiny_session.h"

namespace wsync {
namespace {

using Process = test::TinySessionProcess;

// UCX 1.13's mm receive FIFO (src/uct/sm/mm/base/mm_iface.h, uct_mm_fifo_ctl_t): the head (where
// the next sender writes) is the first word of the control block at the start of the segment, the
// tail (how far the owner consumed) the first word of its second cache line; then 64 elements of
// 128 bytes. The whole segment takes 3 pages, the descriptor pools megabytes.
constexpr int64_t kMaxFifoSegmentBytes = 64 << 10;
constexpr size_t kTailOffset = 64;
constexpr uint64_t kHeadEventArmed = uint64_t{1} << 63;

// Advances the head of the FIFO at `base` by one slot, as a sender's reservation does, when its
// head and tail look like a FIFO's. Returns whether it did.
bool ReserveASlotNoOneFills(void* base) {
  auto* head = static_cast<uint64_t*>(base);
  const auto* tail = reinterpret_cast<const uint64_t*>(static_cast<char*>(base) + kTailOffset);
  uint64_t seen = __atomic_load_n(head, __ATOMIC_ACQUIRE);
  const uint64_t consumed = __atomic_load_n(tail, __ATOMIC_ACQUIRE);
  const uint64_t written = seen & ~kHeadEventArmed;
  if (written < consumed || written - consumed > 4096) return false;
  return __atomic_compare_exchange_n(head, &seen, (seen + 1) & ~kHeadEventArmed, false,
                                     __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

// Simulates a sender killed between its reservation and its write in every UCX shared-memory
// receive FIFO this process owns: the SysV segments it created (/proc/sysvipc/shm) and the POSIX
// ones it holds open (/dev/shm/ucx_shm_posix_*), of a FIFO's size. Returns how many it advanced.
int WedgeOwnUcxReceiveFifos() {
  int wedged = 0;
  std::ifstream sysv("/proc/sysvipc/shm");
  std::string line;
  std::getline(sysv, line);  // The header.
  while (std::getline(sysv, line)) {
    std::istringstream fields(line);
    int64_t key = 0, id = 0, perms = 0, size = 0, creator = 0;
    if (!(fields >> key >> id >> perms >> size >> creator)) continue;
    if (creator != getpid() || size > kMaxFifoSegmentBytes) continue;
    void* base = shmat(static_cast<int>(id), nullptr, 0);
    if (base == reinterpret_cast<void*>(-1)) continue;
    wedged += ReserveASlotNoOneFills(base) ? 1 : 0;
    shmdt(base);
  }
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    const std::string target = std::filesystem::read_symlink(entry.path(), error).string();
    if (error || !absl::StartsWith(target, "/dev/shm/ucx_shm_posix_")) continue;
    const int fd = open(entry.path().c_str(), O_RDWR);
    struct stat info;
    if (fd < 0) continue;
    if (fstat(fd, &info) == 0 && info.st_size > 0 && info.st_size <= kMaxFifoSegmentBytes) {
      void* base = mmap(nullptr, info.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (base != MAP_FAILED) {
        wedged += ReserveASlotNoOneFills(base) ? 1 : 0;
        munmap(base, info.st_size);
      }
    }
    close(fd);
  }
  return wedged;
}

Process MakeProcess(Role role, int32_t rank, int port) {
  SessionConfig config =
      test::TinyJobConfig(role, rank, port, "wedge", "WSYNC_SESSION_WEDGE_TEST_SECRET");
  // A stalled sync fails at it; the others take well under a second (more under sanitizers).
  config.deadline = absl::Seconds(8);
  return test::MakeTinySessionProcess(config);
}

TEST(SessionWedgeTest, AWedgedSharedMemoryFifoIsLeftBehindWhenAReplacementJoins) {
  setenv("WSYNC_SESSION_WEDGE_TEST_SECRET", "session-wedge-test-secret-0123456789abcdef", 1);
  const int port = test::FreeLoopbackPort();
  std::vector<Process> processes;
  for (int r = 0; r < 2; ++r) processes.push_back(MakeProcess(Role::kTrainer, r, port));
  for (int r = 0; r < 2; ++r) processes.push_back(MakeProcess(Role::kRollout, r, port));
  const std::vector<int> all = {0, 1, 2, 3};
  const auto connect = [&](int p) { return processes[p].session->Connect(); };
  const auto sync = [&](int64_t v) {
    return [&, v](int p) { return test::SyncAndCheckTinyJob(processes[p], p, v); };
  };
  for (const absl::Status& s : test::OnEachProcess(4, all, connect)) ASSERT_TRUE(s.ok()) << s;
  for (const absl::Status& s : test::OnEachProcess(4, all, sync(1))) ASSERT_TRUE(s.ok()) << s;

  // Every worker's FIFO (at least one per process) now waits for a slot no one will fill.
  EXPECT_GE(WedgeOwnUcxReceiveFifos(), 4);
  std::vector<absl::Status> stalled = test::OnEachProcess(4, all, sync(2));
  for (int p = 2; p < 4; ++p) {
    EXPECT_THAT(stalled[p].message(), ::testing::HasSubstr("missed the deadline")) << p;
  }

  // Trainer rank 1 is lost and replaced; the next sync moves every byte through fresh workers.
  processes[1].session->Finalize();
  std::vector<absl::Status> lost = test::OnEachProcess(4, {0, 2, 3}, sync(3));
  for (int p : {0, 2, 3}) EXPECT_FALSE(lost[p].ok()) << p;
  processes[1] = MakeProcess(Role::kTrainer, 1, port);
  ASSERT_TRUE(processes[1].session->Connect().ok()) << processes[1].session->LastError();
  for (const absl::Status& s : test::OnEachProcess(4, all, sync(4))) EXPECT_TRUE(s.ok()) << s;
  for (int p = 0; p < 4; ++p) {
    EXPECT_EQ(processes[p].session->State(), std::make_pair(int64_t{4}, SessionState::kIdle)) << p;
  }
}

}  // namespace
}  // namespace wsync
