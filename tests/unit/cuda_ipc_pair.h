#ifndef WSYNC_TESTS_UNIT_CUDA_IPC_PAIR_H_
#define WSYNC_TESTS_UNIT_CUDA_IPC_PAIR_H_

// Two forked processes exchanging CUDA memory through CudaIpcTransport over a UCX messenger
// ("sm,self"), for the unit test (FakeCudaFabric in each child) and the gpu test (the real API
// on GPU 0, both processes on it). Process 0 sends messages from two device allocations at odd
// offsets and sizes (one empty, one of one byte, several of megabytes) to process 1, which checks
// every byte of its whole destination allocation on the host (bytes no message wrote stay zero).
// Header-only test code; the children report through their exit status and stderr.

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "transport/cuda_ipc/cuda_ipc_transport.h"
#include "transport/ucx/ucx_transport.h"

namespace wsync::test {

struct IpcPairOptions {
  // Makes the child's NcclApi; called in each child after the fork.
  std::function<absl::StatusOr<std::unique_ptr<NcclApi>>()> make_api;
  // The sender dies (SIGKILL) once connected, before posting; the receiver must then fail by its
  // deadline (exit 0 when it did, within the deadline and a few seconds).
  bool kill_sender = false;
  absl::Duration receive_timeout = absl::Seconds(60);
};

namespace ipc_pair_internal {

inline constexpr int64_t kAllocationBytes = int64_t{16} << 20;

struct PairMessage {
  int source_allocation;
  int64_t source_offset;
  int64_t destination_offset;
  int64_t bytes;
};

inline std::vector<PairMessage> Messages() {
  return {{0, 0, 0, 1},
          {0, 4097, 333, 1 << 20},
          {1, (3 << 20) + 5, 2 << 20, 0},
          {1, (1 << 22) + 7, (2 << 20) + 64, (1 << 22) - 100},
          {0, (8 << 20) + 1, (7 << 20) + 3, (5 << 20) + 11},
          {1, 12345, (13 << 20), 77777}};
}

inline char SourceByte(int allocation, int64_t i) {
  return static_cast<char>((i * 131 + 17 + allocation * 59) ^ (i >> 12));
}

inline bool WriteAll(int fd, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = write(fd, p, bytes);
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

inline bool ReadAll(int fd, void* data, size_t bytes, int timeout_ms = 60000) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    pollfd polled{fd, POLLIN, 0};
    if (poll(&polled, 1, timeout_ms) <= 0) return false;
    const ssize_t n = read(fd, p, bytes);
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

// Host <-> device copy through the API (Memcpy2DAsync, an event polled to completion).
inline absl::Status CopyAndWait(NcclApi& api, CudaStream stream, void* dst, const void* src,
                                size_t bytes) {
  absl::StatusOr<CudaEvent> event = api.EventCreate();
  if (!event.ok()) return event.status();
  absl::Status status = api.Memcpy2DAsync(dst, bytes, src, bytes, bytes, 1, stream);
  if (status.ok()) status = api.EventRecord(*event, stream);
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (status.ok()) {
    absl::StatusOr<bool> done = api.EventQuery(*event);
    if (!done.ok() || *done) {
      status = done.status();
      break;
    }
    if (absl::Now() > give_up) status = absl::DeadlineExceededError("copy did not finish");
    absl::SleepFor(absl::Microseconds(100));
  }
  api.EventDestroy(*event).IgnoreError();
  return status;
}

#define WSYNC_PAIR_CHECK(condition, what)                                           \
  do {                                                                              \
    if (!(condition)) {                                                             \
      std::fprintf(stderr, "process %d: %s\n", process, std::string(what).c_str()); \
      return 1;                                                                     \
    }                                                                               \
  } while (false)

// The body of process `process` (0 sends, 1 receives); its exit code.
inline int PairChild(int process, const IpcPairOptions& options, int to_peer, int from_peer) {
  absl::StatusOr<std::unique_ptr<NcclApi>> made = options.make_api();
  WSYNC_PAIR_CHECK(made.ok(), made.status().ToString());
  std::unique_ptr<NcclApi> api = std::move(*made);
  WSYNC_PAIR_CHECK(api->SetDevice(0).ok(), "SetDevice(0)");
  absl::StatusOr<CudaStream> stream = api->StreamCreate();
  WSYNC_PAIR_CHECK(stream.ok(), stream.status().ToString());

  std::vector<void*> memory;
  const int allocations = process == 0 ? 2 : 1;
  std::vector<char> host(kAllocationBytes);
  for (int a = 0; a < allocations; ++a) {
    absl::StatusOr<void*> m = api->Malloc(kAllocationBytes);
    WSYNC_PAIR_CHECK(m.ok(), m.status().ToString());
    memory.push_back(*m);
    for (int64_t i = 0; i < kAllocationBytes; ++i) {
      host[i] = process == 0 ? SourceByte(a, i) : 0;
    }
    const absl::Status copied = CopyAndWait(*api, *stream, *m, host.data(), host.size());
    WSYNC_PAIR_CHECK(copied.ok(), copied.ToString());
  }

  UcxOptions ucx;
  ucx.process = process;
  ucx.transports = "sm,self";
  absl::StatusOr<std::unique_ptr<UcxTransport>> messenger = UcxTransport::Create(ucx);
  WSYNC_PAIR_CHECK(messenger.ok(), messenger.status().ToString());
  const std::string mine = (*messenger)->WorkerAddress();
  const uint64_t length = mine.size();
  WSYNC_PAIR_CHECK(
      WriteAll(to_peer, &length, sizeof(length)) && WriteAll(to_peer, mine.data(), mine.size()),
      "address write");
  uint64_t peer_length = 0;
  WSYNC_PAIR_CHECK(ReadAll(from_peer, &peer_length, sizeof(peer_length)) && peer_length < (1 << 20),
                   "address read");
  std::string theirs(peer_length, '\0');
  WSYNC_PAIR_CHECK(ReadAll(from_peer, theirs.data(), theirs.size()), "address read");
  std::vector<std::string> addresses(2);
  addresses[process] = mine;
  addresses[1 - process] = theirs;
  const absl::Status connected = (*messenger)->ConnectPeers(addresses);
  WSYNC_PAIR_CHECK(connected.ok(), connected.ToString());
  // Both processes' endpoints exist before the sender may be killed: an endpoint to a process that
  // has exited cannot be made (UCX cannot attach its shared-memory FIFO any more), and the kill is
  // meant to land mid-transfer, not mid-connect.
  char connected_byte = 1;
  WSYNC_PAIR_CHECK(WriteAll(to_peer, &connected_byte, 1) && ReadAll(from_peer, &connected_byte, 1),
                   "connected exchange");

  CudaIpcOptions ipc;
  ipc.process = process;
  ipc.device = 0;
  absl::StatusOr<std::unique_ptr<CudaIpcTransport>> transport =
      CudaIpcTransport::Create(ipc, std::move(api), std::move(*messenger));
  WSYNC_PAIR_CHECK(transport.ok(), transport.status().ToString());
  // `api` moved into the transport; copies below use a second instance.
  absl::StatusOr<std::unique_ptr<NcclApi>> again = options.make_api();
  WSYNC_PAIR_CHECK(again.ok(), again.status().ToString());
  api = std::move(*again);

  if (process == 0 && options.kill_sender) raise(SIGKILL);
  std::vector<RequestId> ids;
  int64_t round = 0;
  for (const PairMessage& m : Messages()) {
    const MessageTag tag = MakeTag(1, round++, 0);
    absl::StatusOr<RequestId> id =
        process == 0
            ? (*transport)
                  ->PostSend(1, tag,
                             static_cast<char*>(memory[m.source_allocation]) + m.source_offset,
                             m.bytes)
            : (*transport)
                  ->PostReceive(0, tag, static_cast<char*>(memory[0]) + m.destination_offset,
                                m.bytes);
    if (!id.ok() && options.kill_sender) {
      // The messenger checks for exited peers at every post (transport/ucx/README.md): the
      // receive may fail here, before any wait.
      std::fprintf(stderr, "process %d: a post after the sender's death: %s\n", process,
                   id.status().ToString().c_str());
      WSYNC_PAIR_CHECK(absl::IsUnavailable(id.status()), id.status().ToString());
      transport->reset();
      return 0;
    }
    WSYNC_PAIR_CHECK(id.ok(), id.status().ToString());
    ids.push_back(*id);
  }
  const absl::Time start = absl::Now();
  const absl::Status waited = (*transport)->WaitAll(ids, start + options.receive_timeout);
  if (options.kill_sender) {
    const absl::Duration took = absl::Now() - start;
    std::fprintf(stderr, "process %d: after the sender's death: %s (%s)\n", process,
                 waited.ToString().c_str(), absl::FormatDuration(took).c_str());
    WSYNC_PAIR_CHECK(!waited.ok(), "the receive succeeded without a sender");
    WSYNC_PAIR_CHECK(took < options.receive_timeout + absl::Seconds(5), "returned late");
    transport->reset();
    return 0;
  }
  WSYNC_PAIR_CHECK(waited.ok(), waited.ToString());
  char done = 1;
  if (process == 1) {
    transport->reset();  // Closes the mappings before the sender frees its memory.
    const absl::Status copied = CopyAndWait(*api, *stream, host.data(), memory[0], host.size());
    WSYNC_PAIR_CHECK(copied.ok(), copied.ToString());
    std::vector<char> expected(kAllocationBytes, 0);
    for (const PairMessage& m : Messages()) {
      for (int64_t i = 0; i < m.bytes; ++i) {
        expected[m.destination_offset + i] = SourceByte(m.source_allocation, m.source_offset + i);
      }
    }
    for (int64_t i = 0; i < kAllocationBytes; ++i) {
      WSYNC_PAIR_CHECK(host[i] == expected[i], absl::StrCat("byte ", i, " differs"));
    }
    WSYNC_PAIR_CHECK(WriteAll(to_peer, &done, 1), "done write");
  } else {
    WSYNC_PAIR_CHECK(ReadAll(from_peer, &done, 1), "the receiver did not finish");
    transport->reset();
  }
  for (void* m : memory) WSYNC_PAIR_CHECK(api->Free(m).ok(), "Free");
  return 0;
}

#undef WSYNC_PAIR_CHECK

}  // namespace ipc_pair_internal

// Runs the pair; the exit codes of process 0 (sender) and 1 (receiver), 128 + signal when killed.
inline std::vector<int> RunIpcPair(const IpcPairOptions& options) {
  int zero_to_one[2], one_to_zero[2];
  if (pipe(zero_to_one) != 0 || pipe(one_to_zero) != 0) return {-1, -1};
  std::vector<pid_t> pids;
  for (int process = 0; process < 2; ++process) {
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t pid = fork();
    if (pid == 0) {
      const int to_peer = process == 0 ? zero_to_one[1] : one_to_zero[1];
      const int from_peer = process == 0 ? one_to_zero[0] : zero_to_one[0];
      // Only the peer holds the other ends, so a dead peer reads as end of file.
      for (int fd : {zero_to_one[0], zero_to_one[1], one_to_zero[0], one_to_zero[1]}) {
        if (fd != to_peer && fd != from_peer) close(fd);
      }
      const int code = ipc_pair_internal::PairChild(process, options, to_peer, from_peer);
      std::fflush(stderr);
      _exit(code);
    }
    pids.push_back(pid);
  }
  for (int fd : {zero_to_one[0], zero_to_one[1], one_to_zero[0], one_to_zero[1]}) close(fd);
  std::vector<int> codes;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  return codes;
}

}  // namespace wsync::test

#endif  // WSYNC_TESTS_UNIT_CUDA_IPC_PAIR_H_
