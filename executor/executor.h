#ifndef WSYNC_EXECUTOR_EXECUTOR_H_
#define WSYNC_EXECUTOR_EXECUTOR_H_

// The executor of one process of a connected job: built once from what the job fixes (the job,
// its waves, the quantization plan, endpoints, budget, this process's buffers, the transport and
// the control group, the device memory, data key and progress sink), then Run once per sync with
// only what that sync brings (SyncRequest). Each Run agrees with every other process and runs the
// waves in order (waves.h states the protocol, execute.h a wave's run); the stats, the agreement
// and the failure semantics are those of ExecuteWaves, which, like ExecuteTransfers, is a thin
// wrapper over this class (one code path).
//
// Ownership: the Executor owns its staging arenas (an ArenaCache reused by every Run, freed with
// the executor); everything else is the caller's and must outlive it: the job, the waves (or
// segments), the quantization plan, the endpoints, the buffers (whose addresses may change
// between runs: each Run reads the map as it is then), the transport, the group and the
// ExecutorDeps. DeviceMemory in particular must outlive the executor (device arenas are freed
// through it).
//
// Thread safety: Run is not reentrant: one Run at a time per executor (and per process, since
// the transport and group are shared), on one thread; it starts no thread and takes no lock.
// Different executors over different transports may run concurrently.

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/data_key.h"
#include "common/sync_progress.h"
#include "executor/execute.h"
#include "executor/schedule.h"
#include "planner/job.h"
#include "planner/plan.h"
#include "planner/waves.h"
#include "transport/device_memory.h"
#include "transport/transport.h"

namespace wsync {

// The long-lived dependencies of an executor, caller-owned and fixed for its life (each as the
// ExecuteOptions field of the same name states). All optional.
struct ExecutorDeps {
  // Copies and arenas for CUDA memory; required when this process holds a CUDA buffer.
  DeviceMemory* device = nullptr;
  // Keyed verification's key; required by a run with VerifyMode::kKeyed.
  const DataKey* data_key = nullptr;
  // Where each run publishes its progress (the caller sets Begin, kVoting and End).
  SyncProgress* progress = nullptr;
};

// Test and simulator hooks: none is set in production (the session's runtime sets none).
struct ExecutorHooks {
  // The clock every run reads (ExecuteOptions::now): a simulated transport's clock, in whose time
  // SyncRequest::deadline is then given. Null: absl::Now.
  std::function<absl::Time()> now;
  // Simulated quantization (ExecuteOptions::simulated_quantize; integration/simulation).
  std::function<absl::Status(int64_t input_bytes)> simulated_quantize;
  // Arenas kept by the caller instead of the executor's own (the ExecuteTransfers and
  // ExecuteWaves wrappers, benchmarks that keep one cache across executors). Null: the executor's.
  ArenaCache* arenas = nullptr;
};

// What one sync brings to Run; everything else is fixed by the executor.
struct SyncRequest {
  uint64_t sync_id = 0;      // Goes into every message tag.
  uint64_t plan_digest = 0;  // Plan::digest; compared across processes before any byte moves.
  absl::Time deadline = absl::InfiniteFuture();  // In ExecutorHooks::now's clock.
  VerifyMode verify = VerifyMode::kOff;          // ExecuteOptions::verify.
  DeltaOptions delta;                            // Delta sync's per-sync state (execute.h).
  // Called with a failure after the last wave's agreement, before the peers are told
  // (ExecuteOptions::before_notices: the caller's early vote). Optional.
  std::function<void(const absl::Status&)> before_notices;
  // Called after each wave this process finished (ExecuteWaves' `after_wave`). Optional.
  std::function<absl::Status(int32_t wave)> after_wave;
  // This run posts through this transport instead of the executor's (a test's wrapper, which must
  // forward to the executor's transport or stand in for it). Null: the executor's.
  Transport* transport = nullptr;
  // Optional out-params, caller-owned: stale messages rejected (added to), and whether any wave's
  // agreement passed (set to true then; left as it was otherwise).
  int64_t* rejected_messages = nullptr;
  bool* agreed = nullptr;
};

class Executor {
 public:
  // Runs `waves` in order, `quant` (Plan::quant, may be null: no quantization steps, which a job
  // with quantized parameters refuses through the agreement) in wave 0.
  Executor(const Job& job, absl::Span<const Wave> waves, const QuantPlan* quant,
           const Endpoints& endpoints, const StagingBudget& budget, int32_t process,
           const LocalBuffers& buffers, Transport& transport, Group& group,
           const ExecutorDeps& deps = {}, ExecutorHooks hooks = {});
  // Runs `segments` as the one wave `wave`, with `quant` whatever its number (ExecuteTransfers).
  Executor(const Job& job, absl::Span<const Segment> segments, const QuantPlan* quant,
           const Endpoints& endpoints, const StagingBudget& budget, int32_t process,
           const LocalBuffers& buffers, Transport& transport, Group& group,
           const ExecutorDeps& deps = {}, ExecutorHooks hooks = {}, int32_t wave = 0);
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // One sync: every process of the group calls it with the same sync id and digest. The result is
  // the failure, or the waves' stats added up (waves.h); each equals the schedule's
  // (ScheduleWaves, or ScheduleTransfers for one wave) for the same inputs. On failure the target
  // buffers are partially written (dirty). Not reentrant.
  absl::StatusOr<TransferStats> Run(const SyncRequest& sync);

  // The arenas every run reuses (the hooks' when they named one).
  const ArenaCache& arenas() const { return *arenas_; }

 private:
  struct WaveSegments {
    int32_t wave = 0;
    absl::Span<const Segment> segments;
    const QuantPlan* quant = nullptr;  // The quantization steps it runs (wave 0's only).
  };

  // One wave: the local checks, the agreement, the transfer (ExecuteTransfers, execute.h).
  absl::StatusOr<TransferStats> RunWave(absl::Span<const Segment> segments, Transport& transport,
                                        const ExecuteOptions& options);

  const Job& job_;
  std::vector<WaveSegments> waves_;
  const Endpoints& endpoints_;
  const StagingBudget budget_;
  const int32_t process_;
  const LocalBuffers& buffers_;
  Transport& transport_;
  Group& group_;
  const ExecutorDeps deps_;
  const ExecutorHooks hooks_;
  ArenaCache own_arenas_;
  ArenaCache* const arenas_;  // hooks_.arenas, or &own_arenas_.
};

namespace executor_internal {

// The parts of `options` an Executor takes (the wrappers ExecuteTransfers and ExecuteWaves).
ExecutorDeps DepsOf(const ExecuteOptions& options);
ExecutorHooks HooksOf(const ExecuteOptions& options);
SyncRequest SyncRequestOf(const ExecuteOptions& options);

}  // namespace executor_internal
}  // namespace wsync

#endif  // WSYNC_EXECUTOR_EXECUTOR_H_
