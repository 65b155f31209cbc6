#include "executor/execute.h"

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "executor/agreement.h"
#include "executor/quant_work.h"
#include "executor/run.h"
#include "executor/work.h"
#include "planner/relay.h"

namespace wsync {
namespace {

using executor_internal::Work;

// Checks that every buffer the work touches on this process was handed over, and that a process
// holding CUDA memory was given a DeviceMemory.
absl::Status CheckBuffers(const Job& job, const Work& work, absl::Span<const Segment> segments,
                          const LocalBuffers& buffers, const ExecuteOptions& options) {
  if (work.relay_arena_kind == MemoryKind::kCuda && options.device == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        "process ", work.process,
        " holds CUDA buffers but was given no device memory (CUDA buffers need a build with NCCL "
        "and a CUDA device)"));
  }
  auto check = [&](const Endpoint& end) -> absl::Status {
    if (end.process != work.process || end.buffer == kRelayArenaBuffer ||
        end.buffer == kQuantArenaBuffer || end.buffer == kQuantStagingBuffer) {
      return absl::OkStatus();
    }
    if (!buffers.contains(end.buffer)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "process ", work.process, " was given no address for its buffer ", end.buffer));
    }
    return absl::OkStatus();
  };
  for (const Segment& s : segments) {
    if (s.from.process != work.process && s.to.process != work.process) continue;
    WSYNC_RETURN_IF_ERROR(check(s.from));
    WSYNC_RETURN_IF_ERROR(check(s.to));
  }
  return absl::OkStatus();
}

}  // namespace

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
  absl::Status local = executor_internal::CheckQuantRun(job, options.quant, process, options.device,
                                                        options.simulated_quantize != nullptr);
  absl::StatusOr<executor_internal::QuantWork> quant = executor_internal::QuantWork{};
  if (local.ok() && options.quant != nullptr) {
    quant = executor_internal::BuildQuantWork(job, segments, *options.quant, process);
    local = quant.status();
  }
  // The segments that run: the plan's, plus the quantization steps' (quant_work.h).
  const absl::Span<const Segment> all = quant.ok() && job.HasQuantizedParams()
                                            ? absl::Span<const Segment>(quant->segments)
                                            : segments;
  absl::StatusOr<Work> work = absl::FailedPreconditionError("not built");
  if (local.ok()) {
    work = executor_internal::BuildWorkWithQuant(job, segments, *quant, endpoints, budget, process);
    local = work.status();
  }
  if (local.ok()) local = CheckBuffers(job, *work, all, buffers, options);
  if (local.ok() && options.verify == VerifyMode::kKeyed && options.data_key == nullptr) {
    local = absl::FailedPreconditionError("verify: keyed verification without a data key");
  }
  executor_internal::DeltaAgreed agreed;
  WSYNC_RETURN_IF_ERROR(AgreeOnBatch(group, local, options.plan_digest, budget.bytes,
                                     static_cast<int32_t>(options.verify), options.deadline,
                                     executor_internal::DeltaClaimOf(options.delta),
                                     &agreed.held_versions, &agreed.changed_fraction));
  if (options.agreed != nullptr) *options.agreed = true;
  WSYNC_ASSIGN_OR_RETURN(TransferStats stats,
                         executor_internal::RunWork(job, all, *work, *quant, buffers, transport,
                                                    options, std::move(agreed)));
  stats.segments = work->segments;
  return stats;
}

}  // namespace wsync
