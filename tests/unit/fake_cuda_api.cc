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
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "executor/copy.h"
#include "quant/fp8_device_host.h"
#include "tests/unit/fake_cuda_state.h"

namespace wsync::test {
namespace {

using fake_cuda_internal::Handle;
using fake_cuda_internal::Id;
using fake_cuda_internal::IpcHandleFields;
using fake_cuda_internal::kIpcMagic;
using fake_cuda_internal::MappedBytes;
using fake_cuda_internal::MemfdName;

class FakeApi final : public NcclApi {
 public:
  using State = FakeCudaFabric::State;
  explicit FakeApi(std::shared_ptr<State> state) : s_(std::move(state)) {}

  int DeviceCount() override {
    absl::MutexLock lock(&s_->mu);
    return s_->devices;
  }
  absl::Status SetDevice(int device) override {
    absl::MutexLock lock(&s_->mu);
    if (device < 0 || device >= s_->devices) {
      return absl::InvalidArgumentError(absl::StrCat("fake: no device ", device));
    }
    device_ = device;
    return absl::OkStatus();
  }
  absl::StatusOr<void*> Malloc(size_t bytes) override {
    absl::MutexLock lock(&s_->mu);
    if (s_->fail_malloc_after > 0 && --s_->fail_malloc_after == 0) {
      return absl::ResourceExhaustedError(absl::StrCat("fake cudaMalloc of ", bytes, " bytes"));
    }
    // A memfd, so that IpcOpenMemHandle can map the same memory elsewhere (and in other
    // processes, through /proc/<pid>/fd).
    const int64_t serial = s_->next_serial++;
    const int fd = memfd_create(MemfdName(serial).c_str(), MFD_CLOEXEC);
    if (fd < 0) return absl::InternalError(absl::StrCat("fake cudaMalloc: memfd_create: ", errno));
    const size_t mapped = MappedBytes(bytes);
    void* memory = MAP_FAILED;
    if (ftruncate(fd, static_cast<off_t>(mapped)) == 0) {
      memory = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    if (memory == MAP_FAILED) {
      close(fd);
      return absl::ResourceExhaustedError(absl::StrCat("fake cudaMalloc of ", bytes, " bytes"));
    }
    std::memset(memory, 0xEE, mapped);  // Device memory is never zeroed.
    s_->allocations[memory] = State::Allocation{static_cast<int64_t>(bytes), fd, serial};
    s_->device_ranges[reinterpret_cast<uintptr_t>(memory)] = static_cast<int64_t>(bytes);
    s_->allocated += static_cast<int64_t>(bytes);
    s_->peak = std::max(s_->peak, s_->allocated);
    return memory;
  }
  absl::Status Free(void* memory) override {
    absl::MutexLock lock(&s_->mu);
    auto it = s_->allocations.find(memory);
    if (it == s_->allocations.end()) return absl::InvalidArgumentError("fake cudaFree: unknown");
    s_->allocated -= it->second.bytes;
    munmap(memory, MappedBytes(it->second.bytes));
    close(it->second.fd);
    s_->allocations.erase(it);
    s_->device_ranges.erase(reinterpret_cast<uintptr_t>(memory));
    return absl::OkStatus();
  }

  // CUDA IPC over memfds: a handle names (pid, fd, bytes, serial) of the allocation's memfd, and
  // opening it maps the same pages at another address (through /proc/<pid>/fd/<fd>), so bytes
  // read through a wrong base or offset are wrong bytes, and it works across processes.
  absl::StatusOr<Allocation> AllocationRange(const void* pointer) override {
    absl::MutexLock lock(&s_->mu);
    auto it = s_->RangeOf(pointer);
    if (it == s_->device_ranges.end()) {
      return absl::InvalidArgumentError("fake cuMemGetAddressRange: not device memory");
    }
    return Allocation{reinterpret_cast<void*>(it->first), static_cast<size_t>(it->second)};
  }
  absl::StatusOr<std::string> IpcGetMemHandle(void* allocation_base) override {
    absl::MutexLock lock(&s_->mu);
    auto it = s_->allocations.find(allocation_base);
    IpcHandleFields fields{};
    std::memcpy(fields.magic, kIpcMagic, sizeof(kIpcMagic));
    fields.pid = getpid();
    if (it == s_->allocations.end()) {
      auto range = s_->device_ranges.find(reinterpret_cast<uintptr_t>(allocation_base));
      if (range == s_->device_ranges.end() || s_->ipc_mappings.count(allocation_base) != 0) {
        return absl::InvalidArgumentError(
            "fake cudaIpcGetMemHandle: not the base of a cudaMalloc allocation");
      }
      fields.fd = -1;
      fields.bytes = range->second;
      fields.address = range->first;
      std::string handle(kIpcHandleBytes, '\0');
      std::memcpy(handle.data(), &fields, sizeof(fields));
      ++s_->ipc_handles_made;
      return handle;
    }
    fields.fd = it->second.fd;
    fields.bytes = it->second.bytes;
    fields.serial = it->second.serial;
    std::string handle(kIpcHandleBytes, '\0');
    std::memcpy(handle.data(), &fields, sizeof(fields));
    ++s_->ipc_handles_made;
    return handle;
  }
  absl::StatusOr<void*> IpcOpenMemHandle(const std::string& handle) override {
    IpcHandleFields fields{};
    if (handle.size() != kIpcHandleBytes) {
      return absl::InvalidArgumentError("fake cudaIpcOpenMemHandle: not a 64-byte handle");
    }
    std::memcpy(&fields, handle.data(), sizeof(fields));
    if (std::memcmp(fields.magic, kIpcMagic, sizeof(kIpcMagic)) != 0) {
      return absl::InvalidArgumentError("fake cudaIpcOpenMemHandle: not a fake handle");
    }
    if (fields.pid == getpid() || fields.fd < 0) {
      absl::MutexLock lock(&s_->mu);
      if (!s_->opens_own_ipc_handles) {
        return absl::InvalidArgumentError(
            "fake cudaIpcOpenMemHandle: a handle of this process (CUDA cannot open those)");
      }
      if (fields.fd < 0) {
        if (fields.pid != getpid()) {
          return absl::InvalidArgumentError(
              "fake cudaIpcOpenMemHandle: a declared range of another process");
        }
        void* address = reinterpret_cast<void*>(static_cast<uintptr_t>(fields.address));
        ++s_->declared_opens[address];
        ++s_->ipc_opens;
        return address;
      }
    }
    const std::string path = absl::StrCat("/proc/", fields.pid, "/fd/", fields.fd);
    // The fd must still be the allocation's memfd (a freed allocation's fd number may be reused).
    char target[256] = {};
    const ssize_t length = readlink(path.c_str(), target, sizeof(target) - 1);
    const std::string expected = absl::StrCat("/memfd:", MemfdName(fields.serial), " ");
    if (length <= 0 || std::string(target, length).rfind(expected, 0) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "fake cudaIpcOpenMemHandle: the allocation of ", path, " is gone (", target, ")"));
    }
    const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return absl::InternalError(absl::StrCat("fake cudaIpcOpenMemHandle: open ", path));
    void* memory =
        mmap(nullptr, MappedBytes(fields.bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (memory == MAP_FAILED) return absl::InternalError("fake cudaIpcOpenMemHandle: mmap");
    absl::MutexLock lock(&s_->mu);
    s_->ipc_mappings[memory] = fields.bytes;
    s_->device_ranges[reinterpret_cast<uintptr_t>(memory)] = fields.bytes;
    ++s_->ipc_opens;
    return memory;
  }
  absl::Status IpcCloseMemHandle(void* mapped_base) override {
    absl::MutexLock lock(&s_->mu);
    if (auto declared = s_->declared_opens.find(mapped_base);
        declared != s_->declared_opens.end()) {
      if (--declared->second == 0) s_->declared_opens.erase(declared);
      ++s_->ipc_closes;
      return absl::OkStatus();
    }
    auto it = s_->ipc_mappings.find(mapped_base);
    if (it == s_->ipc_mappings.end()) {
      return absl::InvalidArgumentError("fake cudaIpcCloseMemHandle: not an opened handle");
    }
    munmap(mapped_base, MappedBytes(it->second));
    s_->device_ranges.erase(reinterpret_cast<uintptr_t>(mapped_base));
    s_->ipc_mappings.erase(it);
    ++s_->ipc_closes;
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> DeviceUuid(int device) override {
    absl::MutexLock lock(&s_->mu);
    if (device < 0 || device >= s_->devices) {
      return absl::InvalidArgumentError(absl::StrCat("fake: no device ", device));
    }
    std::string uuid(16, '\0');
    std::memcpy(uuid.data(), "fakegpu", 7);
    uuid[15] = static_cast<char>(device);
    return uuid;
  }
  absl::StatusOr<CudaStream> StreamCreate() override { return Create(&State::streams); }
  absl::Status StreamDestroy(CudaStream stream) override {
    return Destroy(&State::streams, stream);
  }
  absl::StatusOr<CudaEvent> EventCreate() override { return Create(&State::events); }
  absl::Status EventDestroy(CudaEvent event) override { return Destroy(&State::events, event); }
  absl::Status EventRecord(CudaEvent event, CudaStream stream) override {
    absl::MutexLock lock(&s_->mu);
    auto it = s_->streams.find(Id(stream));
    if (it == s_->streams.end()) return absl::InvalidArgumentError("fake: unknown stream");
    s_->events[Id(event)] = State::Event{Id(stream), it->second.enqueued};
    return absl::OkStatus();
  }
  absl::StatusOr<bool> EventQuery(CudaEvent event) override {
    absl::MutexLock lock(&s_->mu);
    auto it = s_->events.find(Id(event));
    if (it == s_->events.end()) return absl::InvalidArgumentError("fake: unknown event");
    State::Stream& stream = s_->streams[it->second.stream];
    s_->Advance(stream);
    return stream.completed >= it->second.target;
  }
  absl::StatusOr<MemoryKind> PointerKind(const void* pointer) override {
    absl::MutexLock lock(&s_->mu);
    return s_->IsDevice(pointer) ? MemoryKind::kCuda : MemoryKind::kHost;
  }
  absl::Status Memcpy2DAsync(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                             size_t width, size_t height, CudaStream stream) override {
    if (dst_pitch < width || src_pitch < width) {
      return absl::InvalidArgumentError("fake cudaMemcpy2DAsync: pitch below width");
    }
    absl::MutexLock lock(&s_->mu);
    s_->Enqueue(Id(stream), [=] {
      for (size_t row = 0; row < height; ++row) {
        std::memcpy(static_cast<char*>(dst) + row * dst_pitch,
                    static_cast<const char*>(src) + row * src_pitch, width);
      }
      return true;
    });
    return absl::OkStatus();
  }

  // The kernel as a host strided copy, run in stream order like the copies.
  bool HasCopyKernel() override { return true; }
  bool OpensOwnIpcHandles() const override {
    absl::MutexLock lock(&s_->mu);
    return s_->opens_own_ipc_handles;
  }
  absl::Status CopyKernelAsync(void* dst, absl::Span<const int64_t> dst_strides, const void* src,
                               absl::Span<const int64_t> src_strides,
                               absl::Span<const int64_t> shape, int64_t element_size,
                               CudaStream stream) override {
    const Dims to(dst_strides.begin(), dst_strides.end());
    const Dims from(src_strides.begin(), src_strides.end());
    const Dims extent(shape.begin(), shape.end());
    absl::MutexLock lock(&s_->mu);
    // A kernel dereferences its pointers on the device: pageable host memory is out of its reach
    // (a real launch would fault), so the fake refuses it.
    if (!s_->IsDevice(dst) || !s_->IsDevice(src)) {
      return absl::InternalError("fake: copy kernel launched on host memory");
    }
    ++s_->kernel_launches;
    s_->Enqueue(Id(stream), [=] {
      CopyStrided(dst, to, src, from, extent, element_size);
      return true;
    });
    return absl::OkStatus();
  }

  // The FP8 kernels as their host emulation (the same per-element code), in stream order.
  bool HasQuantKernel() override { return true; }
  absl::Status QuantizeFp8Async(const quant::Fp8DeviceQuant& q, CudaStream stream) override {
    absl::MutexLock lock(&s_->mu);
    if (quant::MakeFp8Tiling(q).tiles > 0 &&
        (!s_->IsDevice(q.input) || !s_->IsDevice(q.scales) || !s_->IsDevice(q.report) ||
         (q.fp8 != nullptr && !s_->IsDevice(q.fp8)))) {
      return absl::InternalError("fake: FP8 kernel launched on host memory");
    }
    ++s_->kernel_launches;
    s_->Enqueue(Id(stream), [=] {
      quant::QuantizeFp8DeviceOnHost(q);
      return true;
    });
    return absl::OkStatus();
  }

  absl::StatusOr<NcclUniqueId> GetUniqueId() override {
    absl::MutexLock lock(&s_->mu);
    NcclUniqueId id;
    const int64_t value = s_->next_uid++;
    std::memcpy(id.bytes.data(), &value, sizeof(value));
    return id;
  }
  absl::StatusOr<NcclComm> CommInitRank(int nranks, const NcclUniqueId& id, int rank) override {
    absl::MutexLock lock(&s_->mu);
    State::Clique& clique = s_->cliques[id.ToBytes()];
    if (clique.nranks != 0 && clique.nranks != nranks) {
      return absl::InvalidArgumentError("fake: ranks disagree on the communicator size");
    }
    if (!clique.joined.insert(rank).second) {
      return absl::InvalidArgumentError(absl::StrCat("fake: rank ", rank, " joined twice"));
    }
    clique.nranks = nranks;
    for (const auto& [other, device] : clique.device_of_rank) {
      if (s_->refuses_duplicate_devices && device == device_ && clique.error.empty()) {
        clique.error = absl::StrCat("fake ncclInvalidUsage: Duplicate GPU detected: rank ", other,
                                    " and rank ", rank, " both on device ", device);
      }
    }
    clique.device_of_rank[rank] = device_;
    const int64_t handle = s_->next_handle++;
    s_->comms[handle] = State::Comm{id.ToBytes(), rank};
    return Handle(handle);
  }
  absl::StatusOr<bool> CommAsyncError(NcclComm comm) override {
    absl::MutexLock lock(&s_->mu);
    auto it = s_->comms.find(Id(comm));
    if (it == s_->comms.end()) return absl::InvalidArgumentError("fake: unknown communicator");
    const State::Clique& clique = s_->cliques[it->second.uid];
    if (!clique.error.empty()) return absl::InternalError(clique.error);
    if (clique.aborted) {
      return absl::UnavailableError("fake ncclRemoteError: a peer's communicator was aborted");
    }
    return static_cast<int>(clique.joined.size()) == clique.nranks;
  }
  absl::Status CommAbort(NcclComm comm) override {
    absl::MutexLock lock(&s_->mu);
    auto it = s_->comms.find(Id(comm));
    if (it == s_->comms.end()) return absl::InvalidArgumentError("fake: unknown communicator");
    s_->cliques[it->second.uid].aborted = true;
    s_->comms.erase(it);
    ++s_->aborts;
    return absl::OkStatus();
  }
  absl::Status CommDestroy(NcclComm comm) override {
    absl::MutexLock lock(&s_->mu);
    s_->comms.erase(Id(comm));
    return absl::OkStatus();
  }
  absl::StatusOr<void*> CommRegister(NcclComm, void* buffer, size_t) override { return buffer; }
  absl::Status CommDeregister(NcclComm, void*) override { return absl::OkStatus(); }

  absl::Status GroupStart() override {
    if (in_group_) return absl::FailedPreconditionError("fake: nested ncclGroupStart");
    in_group_ = true;
    return absl::OkStatus();
  }
  absl::StatusOr<bool> GroupEnd() override {
    if (!in_group_) return absl::FailedPreconditionError("fake: ncclGroupEnd without start");
    in_group_ = false;
    std::vector<Operation> operations = std::move(group_);
    group_.clear();
    if (operations.empty()) return true;
    absl::MutexLock lock(&s_->mu);
    auto comm = s_->comms.find(Id(operations[0].comm));
    if (comm == s_->comms.end()) return absl::InvalidArgumentError("fake: unknown communicator");
    const std::string uid = comm->second.uid;
    const int rank = comm->second.rank;
    State* s = s_.get();
    auto sent = std::make_shared<bool>(false);
    auto next_receive = std::make_shared<size_t>(0);
    s_->Enqueue(Id(operations[0].stream), [=]() -> bool {
      State::Clique& clique = s->cliques[uid];
      if (clique.aborted || !clique.error.empty()) return false;
      if (!*sent) {
        for (const Operation& op : operations) {
          if (!op.send) continue;
          clique.mailbox[{rank, op.peer}].emplace_back(static_cast<const char*>(op.data), op.bytes);
        }
        *sent = true;
      }
      for (; *next_receive < operations.size(); ++*next_receive) {
        const Operation& op = operations[*next_receive];
        if (op.send) continue;
        std::deque<std::string>& queue = clique.mailbox[{op.peer, rank}];
        if (queue.empty()) return false;
        if (queue.front().size() != op.bytes) {
          clique.error =
              absl::StrCat("fake NCCL: rank ", rank, " received ", queue.front().size(),
                           " bytes from rank ", op.peer, " into a receive of ", op.bytes);
          return false;
        }
        std::memcpy(op.data, queue.front().data(), op.bytes);
        queue.pop_front();
        if (op.bytes > 0 && s->flip_received_after > 0 && --s->flip_received_after == 0) {
          static_cast<char*>(op.data)[op.bytes / 2] ^= 0x20;
          s->flipped.emplace_back(op.peer, rank);
        }
      }
      return true;
    });
    return true;
  }
  absl::Status Send(const void* data, size_t bytes, int peer, NcclComm comm,
                    CudaStream stream) override {
    return Add(Operation{true, const_cast<void*>(data), bytes, peer, comm, stream});
  }
  absl::Status Recv(void* data, size_t bytes, int peer, NcclComm comm, CudaStream stream) override {
    return Add(Operation{false, data, bytes, peer, comm, stream});
  }

 private:
  // A new handle in the table `table` of the state (streams, events), and its removal.
  template <typename Table>
  void* Create(Table State::*table) {
    absl::MutexLock lock(&s_->mu);
    const int64_t id = s_->next_handle++;
    (s_.get()->*table)[id];
    return Handle(id);
  }
  template <typename Table>
  absl::Status Destroy(Table State::*table, void* handle) {
    absl::MutexLock lock(&s_->mu);
    (s_.get()->*table).erase(Id(handle));
    return absl::OkStatus();
  }

  struct Operation {
    bool send;
    void* data;
    size_t bytes;
    int peer;
    NcclComm comm;
    CudaStream stream;
  };
  absl::Status Add(Operation op) {
    if (!in_group_) return absl::FailedPreconditionError("fake: NCCL p2p outside a group");
    {
      absl::MutexLock lock(&s_->mu);
      if (!s_->IsDevice(op.data)) {
        return absl::InvalidArgumentError("fake NCCL: a p2p buffer that is not device memory");
      }
    }
    if (!group_.empty() && (group_[0].comm != op.comm || group_[0].stream != op.stream)) {
      return absl::UnimplementedError("fake: one communicator and stream per group");
    }
    group_.push_back(op);
    return absl::OkStatus();
  }

  std::shared_ptr<State> s_;
  bool in_group_ = false;
  std::vector<Operation> group_;
  int device_ = 0;  // The current device (SetDevice) of the thread using this API.
};

}  // namespace

std::unique_ptr<NcclApi> MakeFakeApi(std::shared_ptr<FakeCudaFabric::State> state) {
  return std::make_unique<FakeApi>(std::move(state));
}

}  // namespace wsync::test
