#include "common/hash.h"
#include "planner/plan.h"
#include "planner/quant_layout.h"
#include "planner/quant_plan.h"

namespace wsync {
namespace {

void AddDims(CanonicalHasher& h, const Dims& dims) {
  h.AddInt(static_cast<int64_t>(dims.size()));
  for (int64_t value : dims) h.AddInt(value);
}

void AddBox(CanonicalHasher& h, const Box& box) {
  AddDims(h, box.origin);
  AddDims(h, box.extent);
}

void AddLayout(CanonicalHasher& h, const Layout& layout) {
  h.AddInt(static_cast<int64_t>(layout.role));
  h.AddInt(static_cast<int64_t>(layout.processes.size()));
  for (const ProcessInfo& process : layout.processes) {
    h.AddInt(process.rank);
    h.AddString(process.node_id);
    h.AddInt(process.device);
  }
  h.AddInt(static_cast<int64_t>(layout.buffers.size()));
  for (const BufferInfo& buffer : layout.buffers) {
    h.AddInt(buffer.process);
    h.AddInt(static_cast<int64_t>(buffer.id));
    h.AddInt(buffer.bytes);
    h.AddInt(static_cast<int64_t>(buffer.kind));
  }
  h.AddInt(static_cast<int64_t>(layout.params.size()));
  for (const ParamInfo& param : layout.params) {
    h.AddString(param.name);
    h.AddInt(static_cast<int64_t>(param.dtype));
    AddDims(h, param.shape);
    // Only for quantized parameters, so that unquantized layouts keep their digests.
    if (param.quant.quantized()) {
      h.AddString(kQuantRule);
      h.AddInt(param.quant.block_rows);
      h.AddInt(param.quant.block_cols);
      h.AddString(param.quant.scale_param);
    }
    // Only for streamed parameters, so that layouts without waves keep their digests.
    if (param.wave != 0) {
      h.AddString("wsync.wave");
      h.AddInt(param.wave);
    }
  }
  h.AddInt(static_cast<int64_t>(layout.pieces.size()));
  for (const Piece& piece : layout.pieces) {
    h.AddInt(piece.param);
    h.AddInt(piece.process);
    h.AddInt(static_cast<int64_t>(piece.buffer));
    AddBox(h, piece.box);
    h.AddInt(piece.offset);
    AddDims(h, piece.strides);
  }
}

void AddEndpoint(CanonicalHasher& h, const Endpoint& endpoint) {
  h.AddInt(endpoint.process);
  h.AddInt(static_cast<int64_t>(endpoint.buffer));
  h.AddInt(endpoint.offset);
  AddDims(h, endpoint.strides);
}

}  // namespace

uint64_t LayoutsDigest(const Layout& source, const Layout& target) {
  CanonicalHasher h;
  h.AddString("wsync.layouts");
  AddLayout(h, source);
  AddLayout(h, target);
  return h.Digest();
}

uint64_t PlanDigest(const Job& job, const Plan& plan) {
  CanonicalHasher h;
  h.AddString("wsync.plan");
  h.AddInt(kPlannerVersion);
  h.AddInt(static_cast<int64_t>(job.layouts_digest()));
  h.AddString(plan.policy);
  h.AddInt(static_cast<int64_t>(plan.requests.size()));
  for (size_t i = 0; i < plan.requests.size(); ++i) {
    const ReplicaRequest& request = plan.requests[i];
    h.AddInt(request.param);
    AddBox(h, request.region);
    h.AddInt(request.target_process);
    h.AddInt(request.target_piece);
    h.AddInt(static_cast<int64_t>(request.holder_pieces.size()));
    for (int32_t holder : request.holder_pieces) h.AddInt(holder);
    const ReplicaAnswer& answer = plan.answers[i];
    h.AddInt(static_cast<int64_t>(answer.parts.size()));
    for (const ReplicaPart& part : answer.parts) {
      h.AddInt(part.holder);
      h.AddInt(part.begin);
      h.AddInt(part.end);
    }
  }
  // Only when the job quantizes: the steps are a pure function of the layouts (which the
  // layouts digest covers with each parameter's quantization) and this version.
  if (job.HasQuantizedParams()) {
    h.AddString("wsync.quant");
    h.AddInt(kQuantPlannerVersion);
  }
  // Only when something is relayed, so that a plan relaying nothing keeps its digest.
  if (!plan.relays.empty()) {
    h.AddString("wsync.relays");
    h.AddInt(static_cast<int64_t>(plan.relays.size()));
    for (const Relay& relay : plan.relays) {
      h.AddInt(relay.param);
      AddBox(h, relay.box);
      h.AddInt(relay.node);
      h.AddInt(relay.sender);
      h.AddInt(relay.relay);
      h.AddInt(static_cast<int64_t>(relay.receivers.size()));
      for (int32_t receiver : relay.receivers) h.AddInt(receiver);
      h.AddInt(relay.in_arena ? 1 : 0);
      h.AddInt(relay.arena_offset_bytes);
    }
  }
  return h.Digest();
}

uint64_t SegmentsDigest(absl::Span<const Segment> segments) {
  CanonicalHasher h;
  h.AddString("wsync.segments");
  h.AddInt(static_cast<int64_t>(segments.size()));
  for (const Segment& segment : segments) {
    h.AddInt(segment.param);
    AddBox(h, segment.box);
    AddEndpoint(h, segment.from);
    AddEndpoint(h, segment.to);
  }
  return h.Digest();
}

}  // namespace wsync
