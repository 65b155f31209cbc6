#ifndef WSYNC_TESTS_TESTING_RANDOM_NAMED_LAYOUTS_H_
#define WSYNC_TESTS_TESTING_RANDOM_NAMED_LAYOUTS_H_

// Random (trainer, rollout) pairs of named layouts (planner/named_layouts.h) of small random
// mixture-of-experts models, for property tests of the named layouts' sharding rules: vLLM
// rollouts with experts TP-split (ep=1), per replica (ep=tp) and wide over all DP replicas
// (ep=tp*dp), against megatron(tp, pp, ep, dp) or fsdp(n) trainers. A function of the generator
// state only (no std distributions), like random_layouts.h.

#include <cstdint>
#include <random>
#include <string>

#include "absl/status/statusor.h"
#include "planner/models.h"
#include "tests/testing/random_layouts.h"

namespace wsync::test {

struct NamedLayoutPair {
  ModelSpec model;
  std::string from;  // The trainer's spec, e.g. "megatron(tp=2,pp=1,ep=2,dp=2)".
  std::string to;    // The rollout's spec, e.g. "vllm(tp=2,dp=3,ep=6)".
  int32_t rollout_tp = 1;
  int32_t rollout_dp = 1;
  int32_t rollout_ep = 1;
  LayoutPair pair;

  bool wide_ep() const { return rollout_ep > 1 && rollout_ep == rollout_tp * rollout_dp; }
  // "model <summary>: <from> -> <to>", for failure messages.
  std::string Describe() const;
};

// A small random MoE model (bf16, an fp32 router bias in some; 1-3 layers, some dense; GQA
// attention with fused qkv; routed experts fused as w13 / w2; shared experts in some; tied or
// separate head; a vocabulary that is no multiple of the padding) and a random pair of named
// layouts of it that BuildNamedLayout accepts, with 1-16 processes per side placed 1-8 to a node
// (both sides on the same nodes in some pairs). Over half of the rollouts use wide EP.
// InternalError only if no drawn configuration builds (a generator bug).
absl::StatusOr<NamedLayoutPair> RandomNamedLayoutPair(std::mt19937_64& rng);

}  // namespace wsync::test

#endif  // WSYNC_TESTS_TESTING_RANDOM_NAMED_LAYOUTS_H_
