#include "planner/plan.h"

#include <algorithm>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "planner/param_index.h"
#include "planner/policy.h"
#include "planner/quant_plan.h"
#include "planner/relay_pass.h"

namespace wsync {
namespace {

Segment MakeSegment(const Job& job, int32_t source_piece, int32_t target_piece, const Box& box) {
  const Piece& from = job.source().pieces[source_piece];
  const Piece& to = job.target().pieces[target_piece];
  Segment segment;
  segment.param = to.param;
  segment.box = box;
  segment.from = Endpoint{job.SourceId(from.process), from.buffer,
                          SubRegionOffset(from.box, from.offset, from.strides, box), from.strides};
  segment.to = Endpoint{job.TargetId(to.process), to.buffer,
                        SubRegionOffset(to.box, to.offset, to.strides, box), to.strides};
  return segment;
}

// Orders segments so that those that may continue each other along `axis` are adjacent: equal in
// everything but their box on `axis`, then by origin on `axis`. Compares in place.
int CompareForMerge(const Segment& a, const Segment& b, int axis) {
  auto cmp = [](const auto& x, const auto& y) { return x < y ? -1 : (y < x ? 1 : 0); };
  if (int c = cmp(std::tie(a.param, a.from.process, a.to.process, a.from.buffer, a.to.buffer),
                  std::tie(b.param, b.from.process, b.to.process, b.from.buffer, b.to.buffer))) {
    return c;
  }
  if (int c = cmp(a.from.strides, b.from.strides)) return c;
  if (int c = cmp(a.to.strides, b.to.strides)) return c;
  for (int d = 0; d < a.box.rank(); ++d) {
    if (d == axis) continue;
    if (int c = cmp(a.box.origin[d], b.box.origin[d])) return c;
    if (int c = cmp(a.box.extent[d], b.box.extent[d])) return c;
  }
  return cmp(a.box.origin[axis], b.box.origin[axis]);
}

// True when `next` continues `last` along `axis` in the box and in both buffers.
bool Continues(const Segment& last, const Segment& next, int axis) {
  const int64_t step = last.box.extent[axis];
  Segment moved = last;
  moved.box.origin[axis] += step;
  moved.box.extent[axis] = next.box.extent[axis];
  moved.from.offset += step * last.from.strides[axis];
  moved.to.offset += step * last.to.strides[axis];
  return moved == next;
}

// Merges segments that continue each other along an axis in the box and in both buffers.
void Coalesce(std::vector<Segment>& segments) {
  int max_rank = 0;
  for (const Segment& s : segments) max_rank = std::max(max_rank, s.box.rank());
  for (int axis = max_rank - 1; axis >= 0; --axis) {
    auto has_axis = [axis](const Segment& s) { return s.box.rank() > axis; };
    auto middle = std::stable_partition(segments.begin(), segments.end(), has_axis);
    std::sort(segments.begin(), middle, [axis](const Segment& a, const Segment& b) {
      return CompareForMerge(a, b, axis) < 0;
    });
    std::vector<Segment> merged;
    merged.reserve(segments.size());
    for (auto it = segments.begin(); it != middle; ++it) {
      if (!merged.empty() && Continues(merged.back(), *it, axis)) {
        merged.back().box.extent[axis] += it->box.extent[axis];
        continue;
      }
      merged.push_back(std::move(*it));
    }
    for (auto it = middle; it != segments.end(); ++it) merged.push_back(std::move(*it));
    segments = std::move(merged);
  }
}

// A total order, so that a one-process plan lists its segments as the full plan does.
void SortCanonically(std::vector<Segment>& segments) {
  std::sort(segments.begin(), segments.end(), [](const Segment& a, const Segment& b) {
    return std::tie(a.from.process, a.to.process, a.param, a.box.origin, a.box.extent,
                    a.from.buffer, a.from.offset, a.to.buffer, a.to.offset) <
           std::tie(b.from.process, b.to.process, b.param, b.box.origin, b.box.extent,
                    b.from.buffer, b.from.offset, b.to.buffer, b.to.offset);
  });
}

std::string DescribeRequest(const Job& job, const ReplicaRequest& request) {
  return absl::StrCat("replica request for parameter '", job.target().params[request.param].name,
                      "' box ", BoxToString(request.region), " to process ",
                      request.target_process);
}

}  // namespace

absl::StatusOr<Plan> MakePlan(const Job& job, const ReplicaPolicy& policy,
                              const PlanOptions& options) {
  if (options.process && (*options.process < 0 || *options.process >= job.num_processes())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "process ", *options.process, " is not in the job (", job.num_processes(), " processes)"));
  }
  // Relaying decides on every process's segments; a process's own are picked after it.
  const bool relaying = options.relay.mode != RelayMode::kNever;
  auto relevant = [&](int32_t from, int32_t to) {
    return relaying || !options.process || *options.process == from || *options.process == to;
  };
  const Layout& source = job.source();
  const Layout& target = job.target();
  const std::vector<ParamIndex> index = BuildIndex(source);

  Plan plan;
  plan.policy = policy.name();
  // Every pair's fixed traffic, whatever options.process is: the policy's input is the same on
  // every process.
  absl::flat_hash_map<std::pair<int32_t, int32_t>, FixedPairTraffic> fixed;
  for (int32_t t = 0; t < static_cast<int32_t>(target.pieces.size()); ++t) {
    const Piece& piece = target.pieces[t];
    if (Volume(piece.box) == 0) continue;
    // Quantized parameters and their scales are written by quantization steps (quant_plan.h).
    if (job.quant_links().scale_of[piece.param] >= 0 ||
        job.quant_links().quantized_of[piece.param] >= 0) {
      continue;
    }
    const int32_t receiver = job.TargetId(piece.process);
    const int64_t element_size = job.ElementSize(piece.param);
    index[job.SourceParamOf(piece.param)].ForEachIntersecting(
        piece.box, [&](const HolderGroup& group, const Box& region) {
          if (group.pieces.size() == 1) {
            const int32_t sender = job.SourceId(source.pieces[group.pieces[0]].process);
            FixedPairTraffic& pair = fixed[{sender, receiver}];
            pair.bytes += Volume(region) * element_size;
            ++pair.regions;
            if (relevant(sender, receiver)) {
              plan.segments.push_back(MakeSegment(job, group.pieces[0], t, region));
            }
            return;
          }
          plan.requests.push_back(ReplicaRequest{piece.param, region, receiver, t, group.pieces,
                                                 Volume(region) * element_size});
        });
  }

  plan.fixed_traffic.reserve(fixed.size());
  for (const auto& [pair, traffic] : fixed) {
    plan.fixed_traffic.push_back(traffic);
    plan.fixed_traffic.back().from = pair.first;
    plan.fixed_traffic.back().to = pair.second;
  }
  std::sort(plan.fixed_traffic.begin(), plan.fixed_traffic.end(),
            [](const FixedPairTraffic& a, const FixedPairTraffic& b) {
              return std::tie(a.from, a.to) < std::tie(b.from, b.to);
            });
  WSYNC_ASSIGN_OR_RETURN(plan.answers, policy.Choose(job, plan.requests, plan.fixed_traffic));
  if (plan.answers.size() != plan.requests.size()) {
    return absl::InvalidArgumentError(absl::StrCat("replica policy '", plan.policy, "' answered ",
                                                   plan.answers.size(), " of ",
                                                   plan.requests.size(), " requests"));
  }
  for (size_t i = 0; i < plan.requests.size(); ++i) {
    const ReplicaRequest& request = plan.requests[i];
    absl::Status answer_ok = CheckAnswer(request, plan.answers[i]);
    if (!answer_ok.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("replica policy '", plan.policy, "' answered the ",
                       DescribeRequest(job, request), " wrongly: ", answer_ok.message()));
    }
  }
  for (size_t i = 0; i < plan.requests.size(); ++i) {
    const ReplicaRequest& request = plan.requests[i];
    for (const ReplicaPart& part : plan.answers[i].parts) {
      const int32_t holder = request.holder_pieces[part.holder];
      if (!relevant(job.SourceId(source.pieces[holder].process), request.target_process)) continue;
      Box box = request.region;
      if (box.rank() > 0) {
        box.origin[0] = part.begin;
        box.extent[0] = part.end - part.begin;
      }
      plan.segments.push_back(MakeSegment(job, holder, request.target_piece, box));
    }
  }

  if (options.coalesce) Coalesce(plan.segments);
  SortCanonically(plan.segments);
  plan.inter_node_bytes_without_relay = planner_internal::InterNodeBytes(job, plan.segments);
  plan.relays = planner_internal::ApplyRelays(job, options.relay, plan.segments);
  plan.inter_node_bytes = planner_internal::InterNodeBytes(job, plan.segments);
  if (relaying && options.process) {
    plan.segments = planner_internal::SegmentsForProcess(plan.segments, job, *options.process);
  }
  SortCanonically(plan.segments);

  absl::Status exact = ProveExact(job, plan.segments, options.process);
  if (!exact.ok()) {
    return absl::InternalError(absl::StrCat("plan failed its exactness proof: ", exact.message()));
  }
  if (job.HasQuantizedParams()) {
    WSYNC_ASSIGN_OR_RETURN(plan.quant, planner_internal::PlanQuant(job, index));
    if (options.process) {
      plan.quant = planner_internal::QuantForProcess(plan.quant, *options.process);
    }
    exact = ProveQuantExact(job, plan.quant, options.process);
    if (!exact.ok()) {
      return absl::InternalError(
          absl::StrCat("plan failed its exactness proof: ", exact.message()));
    }
  }
  plan.digest = PlanDigest(job, plan);
  plan.segments_digest = SegmentsDigest(plan.segments);
  return plan;
}

}  // namespace wsync
