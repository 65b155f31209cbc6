#ifndef WSYNC_PLANNER_QUANT_PLAN_H_
#define WSYNC_PLANNER_QUANT_PLAN_H_

// Planning and proving the quantization steps of quantized target parameters (issue 22;
// QuantTransform and QuantPlan are in plan.h). Pure; deterministic; thread-compatible.
//
// For each target piece of a quantized parameter, the piece's box is widened to whole scale blocks
// W (WholeBlockBox) and W is split by the source holders:
// - the whole blocks inside one holder's box are one sender-side transform (QuantSide::kSender):
//   the holder quantizes them in place and sends e4m3 bytes plus scales;
// - the other blocks of W (those a source boundary cuts) are cut into boxes along the block-aligned
//   boundaries of the sender-side boxes (runs merged along the last axis) and each is a
//   receiver-side transform (kReceiver) with one gather per holder box it meets.
// Replicated holders are taken in turn (a counter over the whole job's steps in this order, so
// every process computes the same choice); the replica policy does not see quantized parameters.
// Elements of W outside the piece's box are quantized (they decide the scale) but not written.

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "planner/job.h"
#include "planner/param_index.h"
#include "planner/plan.h"

namespace wsync {

// Version of the quantization planning; the plan digest covers it when a plan quantizes.
inline constexpr int64_t kQuantPlannerVersion = 1;

// The work of splitting one piece's blocks into cells beyond which planning is refused
// (ResourceExhausted naming the parameter): source boundaries so fine that every block is cut.
inline constexpr int64_t kQuantCellBudget = int64_t{1} << 22;

namespace planner_internal {

// Every process's quantization steps. `index` is BuildIndex(job.source()).
absl::StatusOr<QuantPlan> PlanQuant(const Job& job, const std::vector<ParamIndex>& index);

// The steps `process` takes part in: transforms it sends (sender side) or receives, gathers it
// sends or receives.
QuantPlan QuantForProcess(const QuantPlan& plan, int32_t process);

}  // namespace planner_internal

// Proves the quantization steps exact for `process` (all target processes when nullopt): every
// transform quantizes whole blocks of a quantized parameter (blocks inside the parameter,
// IsWholeBlockBox, scale_box == ScaleBox(blocks), box inside blocks and not empty); a sender-side
// one reads its blocks from source pieces of its sender holding them at `from`; a receiver-side
// one reads an aligned arena region of its receiver, row-major over its blocks, disjoint from the
// receiver's other regions, which its gathers (each reading a source piece holding its box) tile
// exactly; every e4m3 element and every scale of each target piece of a quantized parameter and
// of its scale parameter is written exactly once (the written parts lie in the pieces, are
// disjoint and add up to them). Internal naming the step otherwise.
absl::Status ProveQuantExact(const Job& job, const QuantPlan& plan,
                             std::optional<int32_t> process = std::nullopt);

// Bytes a sync's quantization steps move from senders to receivers.
struct QuantWireBytes {
  int64_t fp8 = 0;          // e4m3 elements of sender-side transforms (1 byte each).
  int64_t scales = 0;       // Their fp32 scales.
  int64_t gathered = 0;     // Source-dtype bytes of the gathers (receiver-side transforms).
  int64_t unquantized = 0;  // Source-dtype bytes of every quantized target piece, as sent
                            // unquantized.
  int64_t without_sender_quant = 0;  // Source-dtype bytes if every transform's blocks were
                                     // gathered and quantized at the receiver.
  int64_t total() const { return fp8 + scales + gathered; }
};
QuantWireBytes CountQuantWireBytes(const Job& job, const QuantPlan& plan);

}  // namespace wsync

#endif  // WSYNC_PLANNER_QUANT_PLAN_H_
