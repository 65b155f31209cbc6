#ifndef WSYNC_PLANNER_NAMED_LAYOUTS_H_
#define WSYNC_PLANNER_NAMED_LAYOUTS_H_

// Named layouts of a ModelSpec per side:
//   megatron(tp=1, pp=1, ep=1, dp=ep)  trainer; tp*pp*dp processes, rank = (pp_rank * dp + dp_rank)
//                                      * tp + tp_rank; one contiguous parameter buffer per process
//                                      and dtype (like Megatron DDP's param buffer), separate q/k/v
//                                      and gate/up; layers split evenly over stages (embedding on
//                                      the first, final norm and head on the last, tied embeddings
//                                      on both); vocabulary padded to a multiple of 128 * tp;
//                                      experts split over ep = dp_rank % ep ranks (whole on each TP
//                                      rank), or TP-split when ep is 1.
//   fsdp(n)                            trainer; n processes, each parameter flattened, padded to a
//                                      multiple of n and cut into n contiguous ranges; one flat
//                                      buffer per process and dtype.
//   vllm(tp=1, ep=1, dp=1)             rollout; tp*dp processes, rank = dp_rank * tp + tp_rank,
//                                      one buffer per module tensor, fused qkv_proj /
//                                      gate_up_proj / w13 / fused_qkv_a_proj; kv heads replicated
//                                      when fewer than tp; vocabulary padded to a multiple of 64.
//                                      Attention, dense MLPs, shared experts and the vocabulary
//                                      are TP-split within each DP replica and repeated in every
//                                      replica. The routed experts by ep:
//                                        1      TP-split along the intermediate axis within
//                                               each replica (dp independent engines; one vLLM
//                                               engine with data parallel and without EP would
//                                               split it over all tp*dp ranks, not described
//                                               here);
//                                        tp     whole, ep_rank = tp_rank: each replica holds
//                                               every expert (dp independent engines with
//                                               --enable-expert-parallel);
//                                        tp*dp  wide EP, one engine with data parallel and
//                                               --enable-expert-parallel: whole, ep_rank = the
//                                               process rank, each process holds the contiguous
//                                               block of vLLM's linear placement: E / ep
//                                               experts, one more on the first E % ep EP ranks
//                                               (determine_expert_map), so w13 is
//                                               [E_local, 2 * I, H] and w2 [E_local, H, I] per
//                                               process, as vLLM's FusedMoE allocates them.
//                                      Any other ep is refused, and so is ep > E.
// Keys may be omitted (megatron's dp defaults to ep, every other key to 1); "fsdp(4)" is
// "fsdp(n=4)"; spaces are ignored. Padded vocabulary rows belong to no parameter but occupy
// buffer space.
//
// Placement, keys every kind takes:
//   ppn=K        processes (GPUs) per node (default NamedLayoutOptions::procs_per_node, 8);
//                rank r is on node r / K.
//   colocated=1  the trainer and rollout sides share nodes, as colocated engines place them:
//                rank r of each side on node "node<r / K>" and GPU r % K there
//                (ProcessInfo::device), so rollout rank r shares trainer rank r's GPU: that
//                pair's path class is same_device. colocated=0 (the default): each side on nodes
//                of its own, "trainer-node<i>" and "rollout-node<i>" (or
//                NamedLayoutOptions::node_prefix), GPUs unknown.
// Colocation is a property of the pair: BuildNamedJobLayouts applies a colocated key or a ppn
// given on one side of a colocated pair to both; BuildNamedLayout places one side as its own
// keys and the options say.
// Refusals are InvalidArgument: a malformed spec, an unknown kind or key, a non-positive size, or
// sizes the model's shapes do not divide.

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner/layout.h"
#include "planner/models.h"

namespace wsync {

// The node ids of colocated layouts: "node0", "node1", ...
inline constexpr absl::string_view kColocatedNodePrefix = "node";

// Defaults of the placement keys, and what the specs do not say.
struct NamedLayoutOptions {
  int32_t procs_per_node = 8;
  std::string node_prefix;  // Default: "trainer-node" or "rollout-node" by role.
  bool colocated = false;   // Nodes "node<i>" on both sides (overrides node_prefix).
  MemoryKind memory = MemoryKind::kHost;
};

// The placement keys a spec gives (nullopt: not given). InvalidArgument as BuildNamedLayout.
struct NamedPlacement {
  std::optional<int32_t> procs_per_node;
  std::optional<bool> colocated;
};
absl::StatusOr<NamedPlacement> ParseNamedPlacement(absl::string_view spec);

absl::StatusOr<Layout> BuildNamedLayout(const ModelSpec& model, absl::string_view spec,
                                        const NamedLayoutOptions& options = {});

struct NamedJobLayouts {
  Layout source;  // The trainer side.
  Layout target;  // The rollout side.
};

// Both sides of a job, placed together: colocated when either spec says colocated=1 (then with
// one ppn, that of the spec that gives it, else options.procs_per_node), each side on its own
// nodes otherwise. InvalidArgument, besides BuildNamedLayout's refusals, when the specs give
// different colocated values, or different ppn for a colocated pair.
absl::StatusOr<NamedJobLayouts> BuildNamedJobLayouts(const ModelSpec& model,
                                                     absl::string_view source_spec,
                                                     absl::string_view target_spec,
                                                     const NamedLayoutOptions& options = {});

}  // namespace wsync

#endif  // WSYNC_PLANNER_NAMED_LAYOUTS_H_
