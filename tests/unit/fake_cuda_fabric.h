#ifndef WSYNC_TESTS_UNIT_FAKE_CUDA_FABRIC_H_
#define WSYNC_TESTS_UNIT_FAKE_CUDA_FABRIC_H_

// A fake of the CUDA runtime and NCCL calls of NcclApi for threads of one process playing the
// processes of a job, with device memory implemented as host memory:
// - Malloc maps a memfd of whole pages; host memory a test declares with AddDeviceRange counts as
//   device memory too; PointerKind answers kCuda inside either (and inside opened IPC handles),
//   kHost elsewhere; AllocationRange answers the Malloc allocation or declared range.
// - CUDA IPC: IpcGetMemHandle of a Malloc allocation encodes (pid, fd, bytes, serial) of the
//   memfd; IpcOpenMemHandle maps the same pages at a different address through
//   /proc/<pid>/fd/<fd>, so a wrong base or offset reads wrong bytes, and handles work across
//   forked processes (each process uses its own copy of the fabric). A range declared with
//   AddDeviceRange gets a handle of its address, which opens (at that address) only in this OS
//   process. Unlike CUDA, a process may open its own handles (threads stand in for processes)
//   unless set_opens_own_ipc_handles(false). A handle of a freed allocation fails to open. Opens
//   and closes are counted.
// - The strided copy kernel (NcclApi::CopyKernelAsync) is a host strided copy; the FP8 kernels
//   (NcclApi::QuantizeFp8Async) are their host emulation (quant/fp8_device_host.h), in stream order.
// - Streams are queues run lazily: Memcpy2DAsync and each NCCL group are enqueued and run only
//   when an event recorded after them is queried (or the communicator polled), in order. A caller
//   that reads a copy's destination without synchronising sees stale bytes, so a missing
//   synchronisation fails the test instead of passing by luck.
// - NCCL: CommInitRank forms once every rank of the unique id has joined (in progress until then);
//   a group runs its sends first (each copies its bytes into the (sender, receiver) mailbox) and
//   then its receives (each takes the next message of its pair, in order, or waits for it). A
//   receive of another size than the message is a fabric error (CommAsyncError: Internal) since
//   real NCCL would corrupt memory. CommAbort on any rank makes every other rank's CommAsyncError
//   report Unavailable (how a lost peer shows) and drops the aborted communicator's queued work.
// Thread-safe: one mutex over the whole fabric.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "transport/nccl/nccl_api.h"

namespace wsync::test {

class FakeCudaFabric {
 public:
  explicit FakeCudaFabric(int devices = 1);
  ~FakeCudaFabric();

  // An NcclApi over this fabric (each transport and each DeviceMemory owns one).
  std::unique_ptr<NcclApi> Api();

  // Declares [memory, memory + bytes) device memory (a test's buffers standing in for cudaMalloc).
  void AddDeviceRange(const void* memory, int64_t bytes);

  // Device allocations not yet freed, bytes held, and the most ever held at once.
  int64_t live_allocations() const;
  int64_t peak_allocated_bytes() const;
  // Makes the k-th next Malloc fail (ResourceExhausted); 0: none.
  void FailMallocAfter(int k);
  // Every communicator formed so far reports an asynchronous error (CommAsyncError: Internal,
  // "injected") from now on; communicators formed later are healthy.
  void FailCommunicators();
  // Flips one byte (the middle one) of the k-th non-empty NCCL message received from now on, as it
  // lands in the receiver's device memory (k = 1: the next one); 0: none. The (sender, receiver)
  // ranks of each flipped message, in order.
  void FlipByteOfReceivedMessage(int k);
  std::vector<std::pair<int, int>> flipped_messages() const;
  // Communicators aborted so far, over all ranks; kernel launches, copy and FP8 (the fake runs
  // them on the host in stream order).
  int aborts() const;
  int64_t kernel_launches() const;
  // IpcGetMemHandle calls, IpcOpenMemHandle successes and IpcCloseMemHandle successes so far.
  int64_t ipc_handles_made() const;
  int64_t ipc_opens() const;
  int64_t ipc_closes() const;
  // Whether the fake opens IPC handles made in this OS process (default true, unlike CUDA, so that
  // threads standing in for processes map each other's allocations). False makes it answer like
  // CUDA: the CUDA IPC transport then reads peers of this OS process at their own addresses.
  void set_opens_own_ipc_handles(bool opens);
  // Whether a communicator with two ranks on one device fails to form, as NCCL's does ("Duplicate
  // GPU detected": every rank's CommAsyncError reports it). Default false: tests of threads
  // standing in for processes put every rank on device 0. The device of a rank is the last
  // SetDevice of the API it joined through.
  void set_refuses_duplicate_devices(bool refuses);

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace wsync::test

#endif  // WSYNC_TESTS_UNIT_FAKE_CUDA_FABRIC_H_
