#ifndef WSYNC_PLANNER_VALIDATE_H_
#define WSYNC_PLANNER_VALIDATE_H_

// Validation of layouts. Every refusal is InvalidArgument (FailedPrecondition for a source that
// leaves a parameter uncovered) with a message naming the parameter, process, box and reason.

#include "absl/status/status.h"
#include "planner/layout.h"

namespace wsync {

// One layout on its own: ranks 0..n-1 without duplicates; buffer ids unique per process (never
// kRelayArenaBuffer) and owned by a known process; parameter names unique and non-empty, valid
// dtypes, at most kMaxAxes axes, non-negative extents; every piece names a known parameter, process
// and buffer; its box lies in the parameter, its strides are injective, its address span lies in
// the buffer (int64 overflow included); pieces of one buffer do not overlap unless their parameters
// are in different waves; waves lie in [0, kMaxWaves) and are 0 for trainers' parameters and for
// quantized parameters and their scales; holders of overlapping boxes of one parameter hold equal
// boxes (scale parameters excepted); quantized parameters and their scales as ValidateQuantParams
// (quant_layout.h) says.
absl::Status ValidateLayout(const Layout& layout);

// The two sides: the same parameter names with equal dtypes and shapes (a quantized target
// parameter from a bf16 or fp32 source; its scale parameter, computed by the plan, only in the
// target), and every element of every parameter held by at least one source piece.
absl::Status ValidatePair(const Layout& source, const Layout& target);

}  // namespace wsync

#endif  // WSYNC_PLANNER_VALIDATE_H_
