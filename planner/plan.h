#ifndef WSYNC_PLANNER_PLAN_H_
#define WSYNC_PLANNER_PLAN_H_

// Planning: which region of which source buffer goes to which target buffer.
//
// MakePlan intersects every target piece with the source pieces through a per-parameter index,
// turns regions with several holders into ReplicaRequests and sums the single-holder regions per
// pair (the fixed traffic), asks the replica policy once for all requests, checks every answer,
// emits segments, coalesces segments that continue each other and proves that every target
// element (of the planned processes) is written exactly once. Deterministic: the same job and
// policy give the same plan and digest on every process. Pure; thread-compatible.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "planner/geometry.h"
#include "planner/job.h"
#include "planner/relay.h"

namespace wsync {

// One end of a segment: element `offset` of buffer `buffer` of global process `process`, with the
// strides (elements) of that side's piece.
struct Endpoint {
  int32_t process = 0;
  uint64_t buffer = 0;
  int64_t offset = 0;
  Dims strides;

  friend bool operator==(const Endpoint&, const Endpoint&) = default;
};

// One planned move of `box` (logical coordinates of target parameter `param`).
struct Segment {
  int32_t param = 0;  // Index into the target layout's params.
  Box box;
  Endpoint from;
  Endpoint to;

  int64_t elements() const { return Volume(box); }
  friend bool operator==(const Segment&, const Segment&) = default;
};

// A region of a target piece that several source processes hold (DP replicas).
struct ReplicaRequest {
  int32_t param = 0;                   // Target parameter index.
  Box region;                          // Inside the target piece and inside every holder's box.
  int32_t target_process = 0;          // Global id of the receiver.
  int32_t target_piece = 0;            // Index into target().pieces.
  std::vector<int32_t> holder_pieces;  // Indices into source().pieces, ascending by process.
  int64_t bytes = 0;
};

// A policy's answer for one request: parts that cut the region along axis 0 into consecutive
// ranges [begin, end) (absolute coordinates), tiling it exactly; each names a holder by its index
// in the request's holder_pieces. A single-holder answer is one part covering the whole axis.
struct ReplicaPart {
  int32_t holder = 0;
  int64_t begin = 0;
  int64_t end = 0;
  friend bool operator==(const ReplicaPart&, const ReplicaPart&) = default;
};
struct ReplicaAnswer {
  std::vector<ReplicaPart> parts;
  friend bool operator==(const ReplicaAnswer&, const ReplicaAnswer&) = default;
};

// What one ordered (sender, receiver) pair must carry whatever the policy answers: the regions
// of target pieces that a single source piece holds. Global process ids.
struct FixedPairTraffic {
  int32_t from = 0;
  int32_t to = 0;
  int64_t bytes = 0;
  int64_t regions = 0;  // Single-holder regions: the pair's segments before coalescing.
  friend bool operator==(const FixedPairTraffic&, const FixedPairTraffic&) = default;
};

// Chooses holders for all requests of a sync at once. Implementations must be deterministic and
// use only their arguments (data every process shares). Thread-compatible.
class ReplicaPolicy {
 public:
  virtual ~ReplicaPolicy() = default;
  virtual std::string name() const = 0;
  // Returns one answer per request, in request order. `fixed` is the sync's fixed traffic: every
  // pair with single-holder regions, ascending by (from, to), the same on every process whatever
  // PlanOptions::process is. A policy may ignore it.
  virtual absl::StatusOr<std::vector<ReplicaAnswer>> Choose(
      const Job& job, absl::Span<const ReplicaRequest> requests,
      absl::Span<const FixedPairTraffic> fixed) const = 0;
};

// Quantization steps (issue 22; quant_plan.h): a quantized target parameter is written by
// QuantTransforms, never by Segments. Each quantizes `blocks`, a box of whole scale blocks
// (quant_layout.h WholeBlockBox) of parameter `param` for one receiver's target piece, and writes
// the e4m3 elements of `box` (blocks and the piece's box in common) at `to` and the scales of
// `scale_box` (ScaleBox of blocks) at `scale_to`.
enum class QuantSide : uint8_t {
  // The sender holds `blocks` in one source piece: it quantizes them from `from` (a source
  // endpoint) and sends the e4m3 bytes of `box` and the scales.
  kSender = 1,
  // The blocks span several source pieces (a TP cut inside a block): the QuantPlan::gathers of the
  // receiver's arena region `from` (buffer kQuantArenaBuffer, row-major over blocks, elements of
  // the source dtype) bring the blocks in the source dtype; the receiver quantizes there.
  kReceiver = 2,
};

// Byte alignment of every arena region of a quantization step.
inline constexpr int64_t kQuantArenaAlignment = 64;

struct QuantTransform {
  int32_t param = 0;        // Target parameter (quantized).
  int32_t scale_param = 0;  // Its scale parameter.
  QuantSide side = QuantSide::kSender;
  Box blocks;
  Endpoint from;
  Box box;
  Endpoint to;
  Box scale_box;
  Endpoint scale_to;
  friend bool operator==(const QuantTransform&, const QuantTransform&) = default;
};

struct QuantPlan {
  // By receiver piece in the target's canonical order, then as planned.
  std::vector<QuantTransform> transforms;
  // Receiver-side parts: segments of a quantized parameter from a source piece into a receiver's
  // arena (to.buffer kQuantArenaBuffer), in the source dtype.
  std::vector<Segment> gathers;
};

struct PlanOptions {
  // When set, only segments whose sender or receiver is this global process are emitted and only
  // its target pieces are proven (the replica policy still sees every request of the sync).
  // With relaying on (relay.mode other than kNever) the plan of one process also lists every
  // segment that a relay forwarding to it receives from a trainer: its executor needs them to know
  // when the forwarded bytes arrive. Relaying is decided on the segments of every process, so such
  // a plan costs a full plan's time.
  std::optional<int32_t> process;
  bool coalesce = true;
  RelayOptions relay;  // relay.h
};

struct Plan {
  // Canonical total order: by (from.process, to.process, param, box origin, box extent,
  // from.buffer, from.offset, to.buffer, to.offset).
  std::vector<Segment> segments;
  std::vector<ReplicaRequest> requests;
  std::vector<ReplicaAnswer> answers;
  // The fixed traffic the policy was given (ReplicaPolicy::Choose): every pair's, on every
  // process. A pure function of the layouts, so the digest need not cover it.
  std::vector<FixedPairTraffic> fixed_traffic;
  std::string policy;
  // Relayed regions (relay.h), largest first. Their stage-1 and stage-2 segments are in
  // `segments`: a segment whose sender is a target process is a stage-2 forward.
  std::vector<Relay> relays;
  // Bytes crossing a node boundary with this plan and with every relay group sent direct: over
  // every process's segments when relaying is on or no process filter is set, else over the
  // segments of `process`.
  int64_t inter_node_bytes = 0;
  int64_t inter_node_bytes_without_relay = 0;
  // The quantized parameters' steps (of every process, or those of PlanOptions::process: its
  // sender-side transforms and gathers as sender, its transforms and gathers as receiver).
  QuantPlan quant;
  // PlanDigest(job, *this): equal on every process whatever PlanOptions::process is.
  uint64_t digest = 0;
  // SegmentsDigest(segments): the segments this plan emitted (all of them, or one process's).
  uint64_t segments_digest = 0;
};

// Fails with InvalidArgument when a policy answer is malformed (naming the request), or Internal
// when the exactness proof (ProveExact, and ProveQuantExact for quantized parameters) fails
// (which would be a planner bug).
absl::StatusOr<Plan> MakePlan(const Job& job, const ReplicaPolicy& policy,
                              const PlanOptions& options = {});

// Checks that the segments writing into each target piece of `process` (all target processes when
// nullopt) tile the piece's box exactly: inside it, pairwise disjoint, volumes summing to the
// piece's volume, and that every endpoint address matches its piece's affine map. Together with
// validation (pieces of one buffer are disjoint and injective) this proves every target element is
// written exactly once. Relays (relay.h): a segment from a target process (stage 2) must read
// exactly what a listed stage-1 segment (from a trainer) delivers: same parameter and box, its
// `from` equal to that segment's `to`, on another process than its receiver. A segment into a relay
// arena (kRelayArenaBuffer) writes no target piece: it must be row-major packed at a
// non-negative, aligned offset, disjoint from every other arena write of its process, and (in a
// full plan or the relay's own) read by at least one stage-2 segment.
absl::Status ProveExact(const Job& job, absl::Span<const Segment> segments,
                        std::optional<int32_t> process = std::nullopt);

// Version of the planning algorithm. Segments are a pure function of (layouts, policy answers,
// relays, this version), so a digest over those inputs covers the segments on every process,
// including those that plan only their own segments. Bump it whenever the segments a plan emits
// change.
inline constexpr int64_t kPlannerVersion = 1;

// xxh3-64 over a canonical encoding of kPlannerVersion, both layouts (Job::layouts_digest, of the
// job's canonical order), the policy's name, the replica requests and the policy answers, and the
// relays when there are any (a plan that relays nothing keeps the digest it had without relaying).
uint64_t PlanDigest(const Job& job, const Plan& plan);

// xxh3-64 over a canonical encoding of the segments, in the given order.
uint64_t SegmentsDigest(absl::Span<const Segment> segments);

}  // namespace wsync

#endif  // WSYNC_PLANNER_PLAN_H_
