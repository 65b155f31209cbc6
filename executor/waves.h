#ifndef WSYNC_EXECUTOR_WAVES_H_
#define WSYNC_EXECUTOR_WAVES_H_

// A streamed sync (planner/waves.h; include/wsync/wsync.h, set_parameter_wave): the waves of a
// plan run one after another, each an ExecuteTransfers of its own segments with its own agreement,
// so that no byte of wave w + 1 moves on any process before every process finished wave w (and ran
// its callback for it). Every process calls ExecuteWaves with the same waves.
//
// Collectives: each wave's run begins with the agreement (an AllGather of the control group), and
// the caller's commit decision follows the last wave; every process makes the same sequence of
// collective calls, also when one fails:
// - a wave's agreement that fails, fails on every process (they gathered the same verdicts): the
//   later waves do not run;
// - a process that fails after a wave's agreement (its transfer, or `after_wave`) while a wave is
//   left joins the next wave's agreement with its failure, so every process fails there at once
//   naming it (the peers it stopped sending to fail on its notices first), and runs no later wave;
// - in the last wave, ExecuteOptions::before_notices is called as ExecuteTransfers states (the
//   caller's early vote); in the other waves it is not (the next agreement tells the peers).
// ExecuteOptions::agreed is set once any wave's agreement passed. The result is the failure, or
// the waves' stats added up (segments, chunks, rounds, bytes, CPU time, messages, quantized
// elements, seconds; the most arena and quantization staging bytes of any wave).
//
// Thread safety: as ExecuteTransfers (one run at a time per process).
//
// ExecuteWaves is a thin wrapper over Executor (executor.h), which runs the waves (one code path):
// an Executor over `waves` Run once. A caller that syncs repeatedly builds an Executor once.

#include <cstdint>
#include <functional>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "executor/execute.h"
#include "executor/schedule.h"
#include "planner/waves.h"

namespace wsync {

// Runs `waves` in order (see the file comment). `quant` (Plan::quant, as ExecuteOptions::quant)
// runs in wave 0; later waves run without quantization steps. `after_wave` (optional) is called
// with the wave's number after each wave this process finished, on the calling thread; its error
// fails this process's run with InvalidArgument naming the wave ("the host's callback after wave
// 3 failed: ..."), the code kept for Aborted and DeadlineExceeded.
absl::StatusOr<TransferStats> ExecuteWaves(const Job& job, absl::Span<const Wave> waves,
                                           const QuantPlan& quant, const Endpoints& endpoints,
                                           const StagingBudget& budget, int32_t process,
                                           const LocalBuffers& buffers, Transport& transport,
                                           Group& group, const ExecuteOptions& options,
                                           const std::function<absl::Status(int32_t)>& after_wave);

// The schedule of what ExecuteWaves runs on `process`: each wave's (ScheduleTransfers with
// `quant` in wave 0) added up as the stats are (rounds, segments, chunks and bytes add; peers and
// local copies are listed wave after wave; arena and quantization staging and arena bytes are the
// most of any wave: each run reuses the arenas of the one before).
absl::StatusOr<ProcessSchedule> ScheduleWaves(const Job& job, absl::Span<const Wave> waves,
                                              const QuantPlan& quant, const Endpoints& endpoints,
                                              const StagingBudget& budget, int32_t process);

}  // namespace wsync

#endif  // WSYNC_EXECUTOR_WAVES_H_
