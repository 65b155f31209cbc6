#include "executor/memory_kinds.h"

#include <algorithm>

#include "planner/layout.h"

namespace wsync {

JobMemoryKinds::JobMemoryKinds(const Job& job) {
  for (const bool source : {true, false}) {
    const Layout& layout = source ? job.source() : job.target();
    for (const BufferInfo& buffer : layout.buffers) {
      if (buffer.kind != MemoryKind::kCuda) continue;
      const int32_t process = source ? job.SourceId(buffer.process) : job.TargetId(buffer.process);
      cuda_processes_.insert(process);
      cuda_buffers_.insert({process, buffer.id});
    }
  }
}

MemoryKind JobMemoryKinds::Process(int32_t process) const {
  return cuda_processes_.contains(process) ? MemoryKind::kCuda : MemoryKind::kHost;
}

MemoryKind JobMemoryKinds::Buffer(int32_t process, uint64_t buffer) const {
  if (buffer == kRelayArenaBuffer || buffer == kQuantArenaBuffer || buffer == kQuantStagingBuffer) {
    return Process(process);
  }
  return cuda_buffers_.contains({process, buffer}) ? MemoryKind::kCuda : MemoryKind::kHost;
}

MemoryKind JobMemoryKinds::Pair(int32_t a, int32_t b) const {
  return Process(a) == MemoryKind::kCuda && Process(b) == MemoryKind::kCuda ? MemoryKind::kCuda
                                                                            : MemoryKind::kHost;
}

std::vector<int32_t> JobMemoryKinds::CudaProcesses() const {
  std::vector<int32_t> result(cuda_processes_.begin(), cuda_processes_.end());
  std::sort(result.begin(), result.end());
  return result;
}

}  // namespace wsync
