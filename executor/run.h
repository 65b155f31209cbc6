#ifndef WSYNC_EXECUTOR_RUN_H_
#define WSYNC_EXECUTOR_RUN_H_

// Private to the executor: one run of a process's work once every process agreed (execute.h,
// ExecuteTransfers): arenas, local copies, packing (through packing.h's MessagePacker), posting,
// landing and verifying each lane's messages in the order a lane driver (lane_drivers.h) gives,
// and on failure telling the peers, draining what they still send and releasing every request
// within a short grace. Not thread-safe: the calling thread runs it all.

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "executor/delta_run.h"
#include "executor/execute.h"
#include "executor/quant_work.h"
#include "executor/work.h"
#include "planner/job.h"
#include "planner/plan.h"
#include "transport/transport.h"

namespace wsync::executor_internal {

// Runs `work` (BuildWorkWithQuant's for this process over `segments`, which are quant.segments
// for a quantized job) and the quantization steps of `quant` with `buffers` over `transport`:
// sender-side steps are quantized into the staging as quant.layout says (those copied locally
// before the rounds, the others when their lane's first message carrying them is due),
// receiver-side ones after the rounds and the chunk verification (quant_work.h, quant_run.h). The
// stats equal the schedule's for the same inputs; on error the target buffers are partially written
// (dirty) and no request is left posted. `delta`: what the agreement settled for delta sync
// (delta_run.h).
absl::StatusOr<TransferStats> RunWork(const Job& job, absl::Span<const Segment> segments,
                                      Work& work, const QuantWork& quant,
                                      const LocalBuffers& buffers, Transport& transport,
                                      const ExecuteOptions& options, DeltaAgreed delta = {});

}  // namespace wsync::executor_internal

#endif  // WSYNC_EXECUTOR_RUN_H_
