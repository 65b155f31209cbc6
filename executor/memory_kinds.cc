#include "executor/memory_kinds.h"

#include <algorithm>

#include "absl/synchronization/mutex.h"
#include "planner/layout.h"

namespace wsync {

namespace {

std::shared_ptr<const JobMemoryKinds::Tables> BuildTables(const Job& job) {
  auto tables = std::make_shared<JobMemoryKinds::Tables>();
  for (const bool source : {true, false}) {
    const Layout& layout = source ? job.source() : job.target();
    for (const BufferInfo& buffer : layout.buffers) {
      if (buffer.kind != MemoryKind::kCuda) continue;
      const int32_t process = source ? job.SourceId(buffer.process) : job.TargetId(buffer.process);
      tables->cuda_processes.insert(process);
      tables->cuda_buffers.insert({process, buffer.id});
    }
  }
  return tables;
}

// The last construction's tables, by the layouts digest they were built from.
struct LastTables {
  absl::Mutex mutex;
  uint64_t digest ABSL_GUARDED_BY(mutex) = 0;
  std::shared_ptr<const JobMemoryKinds::Tables> tables ABSL_GUARDED_BY(mutex);
};

LastTables& Last() {
  static LastTables* const last = new LastTables;  // Never destroyed: used until exit.
  return *last;
}

}  // namespace

JobMemoryKinds::JobMemoryKinds(const Job& job) {
  LastTables& last = Last();
  {
    absl::MutexLock lock(&last.mutex);
    if (last.tables != nullptr && last.digest == job.layouts_digest()) {
      tables_ = last.tables;
      return;
    }
  }
  tables_ = BuildTables(job);
  absl::MutexLock lock(&last.mutex);
  last.digest = job.layouts_digest();
  last.tables = tables_;
}

MemoryKind JobMemoryKinds::Process(int32_t process) const {
  return tables_->cuda_processes.contains(process) ? MemoryKind::kCuda : MemoryKind::kHost;
}

MemoryKind JobMemoryKinds::Buffer(int32_t process, uint64_t buffer) const {
  if (buffer == kRelayArenaBuffer || buffer == kQuantArenaBuffer || buffer == kQuantStagingBuffer) {
    return Process(process);
  }
  return tables_->cuda_buffers.contains({process, buffer}) ? MemoryKind::kCuda : MemoryKind::kHost;
}

MemoryKind JobMemoryKinds::Pair(int32_t a, int32_t b) const {
  return Process(a) == MemoryKind::kCuda && Process(b) == MemoryKind::kCuda ? MemoryKind::kCuda
                                                                            : MemoryKind::kHost;
}

std::vector<int32_t> JobMemoryKinds::CudaProcesses() const {
  std::vector<int32_t> result(tables_->cuda_processes.begin(), tables_->cuda_processes.end());
  std::sort(result.begin(), result.end());
  return result;
}

}  // namespace wsync
