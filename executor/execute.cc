#include "executor/execute.h"

#include <memory>

#include "common/status.h"
#include "executor/executor.h"

namespace wsync {

ArenaCache::~ArenaCache() {
  for (const DeviceArena& arena : device_arenas_) {
    if (arena.memory != nullptr) arena.device->Free(arena.memory);
  }
}

char* ArenaCache::Get(size_t lane, int64_t bytes) {
  if (lane >= arenas_.size()) {
    arenas_.resize(lane + 1);
    sizes_.resize(lane + 1, 0);
  }
  if (sizes_[lane] < bytes) {
    arenas_[lane] = std::make_unique_for_overwrite<char[]>(bytes);
    sizes_[lane] = bytes;
  }
  return arenas_[lane].get();
}

absl::StatusOr<char*> ArenaCache::GetDevice(DeviceMemory& device, size_t lane, int64_t bytes) {
  if (lane >= device_arenas_.size()) device_arenas_.resize(lane + 1);
  DeviceArena& arena = device_arenas_[lane];
  if (arena.memory != nullptr && arena.device == &device && arena.bytes >= bytes) {
    return arena.memory;
  }
  if (arena.memory != nullptr) arena.device->Free(arena.memory);
  arena = DeviceArena{};
  WSYNC_ASSIGN_OR_RETURN(void* memory, device.Allocate(bytes));
  arena = DeviceArena{&device, static_cast<char*>(memory), bytes};
  return arena.memory;
}

int64_t ArenaCache::held_bytes() const {
  int64_t total = held_device_bytes();
  for (int64_t size : sizes_) total += size;
  return total;
}

int64_t ArenaCache::held_device_bytes() const {
  int64_t total = 0;
  for (const DeviceArena& arena : device_arenas_) total += arena.bytes;
  return total;
}

absl::StatusOr<TransferStats> ExecuteTransfers(const Job& job, absl::Span<const Segment> segments,
                                               const Endpoints& endpoints,
                                               const StagingBudget& budget, int32_t process,
                                               const LocalBuffers& buffers, Transport& transport,
                                               Group& group, const ExecuteOptions& options) {
  Executor executor(job, segments, options.quant, endpoints, budget, process, buffers, transport,
                    group, executor_internal::DepsOf(options), executor_internal::HooksOf(options),
                    options.wave);
  return executor.Run(executor_internal::SyncRequestOf(options));
}

}  // namespace wsync
