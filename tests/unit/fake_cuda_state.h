#ifndef WSYNC_TESTS_UNIT_FAKE_CUDA_STATE_H_
#define WSYNC_TESTS_UNIT_FAKE_CUDA_STATE_H_

// Private to the fake of CUDA and NCCL (fake_cuda_fabric.h): the state every API of one fabric
// shares, and the encoding of its fake handles. fake_cuda_fabric.cc holds the fabric's calls,
// fake_cuda_api.cc the NcclApi over this state.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "executor/copy.h"
#include "tests/unit/fake_cuda_fabric.h"
#include "transport/nccl/nccl_api.h"

namespace wsync::test {
namespace fake_cuda_internal {

inline void* Handle(int64_t id) { return reinterpret_cast<void*>(static_cast<uintptr_t>(id)); }
inline int64_t Id(const void* handle) {
  return static_cast<int64_t>(reinterpret_cast<uintptr_t>(handle));
}

// What a fake IPC handle carries (the rest of its 64 bytes is zero).
struct IpcHandleFields {
  char magic[8];
  int64_t pid;
  int64_t fd;  // -1: a declared range (AddDeviceRange) at `address`, in process `pid` only.
  int64_t bytes;
  int64_t serial;
  uint64_t address;
};
static_assert(sizeof(IpcHandleFields) <= NcclApi::kIpcHandleBytes);
inline constexpr char kIpcMagic[8] = {'w', 's', 'f', 'a', 'k', 'e', 'i', 'p'};

// Bytes mapped for an allocation of `bytes` (whole pages, at least one).
inline size_t MappedBytes(size_t bytes) {
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return std::max<size_t>(1, (bytes + page - 1) / page) * page;
}

inline std::string MemfdName(int64_t serial) { return absl::StrCat("wsync-fake-cuda-", serial); }

}  // namespace fake_cuda_internal

struct FakeCudaFabric::State {
  struct Stream {
    std::deque<std::function<bool()>> items;  // Each returns true once done.
    int64_t enqueued = 0;
    int64_t completed = 0;
  };
  struct Event {
    int64_t stream = 0;
    int64_t target = 0;
  };
  struct Comm {
    std::string uid;
    int rank = 0;
  };
  struct Clique {
    int nranks = 0;
    std::set<int> joined;
    std::map<int, int> device_of_rank;
    bool aborted = false;
    std::string error;
    std::map<std::pair<int, int>, std::deque<std::string>> mailbox;  // (from, to) rank.
  };

  struct Allocation {
    int64_t bytes = 0;
    int fd = -1;  // The memfd backing it.
    int64_t serial = 0;
  };

  ~State() {
    for (const auto& [memory, allocation] : allocations) {
      munmap(memory, fake_cuda_internal::MappedBytes(allocation.bytes));
      close(allocation.fd);
    }
    for (const auto& [memory, bytes] : ipc_mappings)
      munmap(memory, fake_cuda_internal::MappedBytes(bytes));
  }

  absl::Mutex mu;
  int devices = 1;
  std::map<uintptr_t, int64_t> device_ranges;  // Start -> bytes.
  std::map<void*, Allocation> allocations;
  std::map<void*, int64_t> ipc_mappings;  // Opened handles: mapped base -> bytes.
  int64_t next_serial = 1;
  int64_t ipc_handles_made = 0;
  int64_t ipc_opens = 0;
  int64_t ipc_closes = 0;
  bool opens_own_ipc_handles = true;
  bool refuses_duplicate_devices = false;
  std::map<void*, int64_t> declared_opens;  // Opened handles of declared ranges: open count.
  int64_t allocated = 0;
  int64_t peak = 0;
  int fail_malloc_after = 0;
  int flip_received_after = 0;
  std::vector<std::pair<int, int>> flipped;  // (sender, receiver) ranks.
  std::map<int64_t, Stream> streams;
  std::map<int64_t, Event> events;
  std::map<int64_t, Comm> comms;
  std::map<std::string, Clique> cliques;
  int64_t next_handle = 16;
  int64_t next_uid = 1;
  int aborts = 0;
  int64_t kernel_launches = 0;

  void Advance(Stream& stream) {
    while (!stream.items.empty() && stream.items.front()()) {
      stream.items.pop_front();
      ++stream.completed;
    }
  }
  void Enqueue(int64_t stream_id, std::function<bool()> item) {
    Stream& stream = streams[stream_id];
    stream.items.push_back(std::move(item));
    ++stream.enqueued;
  }
  // The device range holding `pointer`, or device_ranges.end().
  std::map<uintptr_t, int64_t>::const_iterator RangeOf(const void* pointer) const {
    const auto address = reinterpret_cast<uintptr_t>(pointer);
    auto it = device_ranges.upper_bound(address);
    if (it == device_ranges.begin()) return device_ranges.end();
    --it;
    // An empty range holds its own address.
    const auto end = it->first + static_cast<uintptr_t>(std::max<int64_t>(it->second, 1));
    return address < end ? it : device_ranges.end();
  }
  bool IsDevice(const void* pointer) const { return RangeOf(pointer) != device_ranges.end(); }
};

// An NcclApi over `state` (FakeCudaFabric::Api).
std::unique_ptr<NcclApi> MakeFakeApi(std::shared_ptr<FakeCudaFabric::State> state);

}  // namespace wsync::test

#endif  // WSYNC_TESTS_UNIT_FAKE_CUDA_STATE_H_
