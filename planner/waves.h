#ifndef WSYNC_PLANNER_WAVES_H_
#define WSYNC_PLANNER_WAVES_H_

// Streamed syncs (include/wsync/wsync.h, set_parameter_wave): a rollout puts target parameters in
// waves, and a sync moves the plan's segments wave by wave, each wave a run of its own (with its
// own agreement), so that the rollout can hand one wave's bytes on before the next lands in the
// same memory. The waves are a property of the target layout (ParamInfo::wave, merged and
// validated like the rest of it and covered by the layouts' digest), so every process derives the
// same waves from the same plan.
//
// Pure functions; thread-safe.

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "planner/job.h"
#include "planner/plan.h"

namespace wsync {

struct Wave {
  int32_t wave = 0;               // ParamInfo::wave of every segment's target parameter.
  std::vector<Segment> segments;  // In the plan's order.
};

// Whether any target parameter of `job` is in a wave other than 0.
bool HasWaves(const Job& job);

// The segments by the wave of their target parameter, one Wave per wave of a target parameter
// with at least one element, in ascending order. The waves come from the job alone, so every
// process runs the same waves whichever segments its plan holds (a wave may hold none of them; a
// quantized parameter's steps, which are not segments, run in wave 0). A job without waves (or
// without elements) gives one wave 0 with every segment (also when there are none), so that a
// caller runs it as it always did.
std::vector<Wave> SplitIntoWaves(const Job& job, absl::Span<const Segment> segments);

}  // namespace wsync

#endif  // WSYNC_PLANNER_WAVES_H_
