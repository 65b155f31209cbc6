#ifndef WSYNC_TESTS_TESTING_RANDOM_LAYOUTS_H_
#define WSYNC_TESTS_TESTING_RANDOM_LAYOUTS_H_

// Random (trainer, rollout) layout pairs for property tests, a piece-order shuffler, and a replica
// policy with random (but deterministic) answers. Everything is a function of the given seed or
// generator state: the same std::mt19937_64 state gives the same pair on every platform that
// implements std::mt19937_64 (all do; no std distributions are used, as their output is
// implementation-defined).

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "planner/job.h"
#include "planner/layout.h"
#include "planner/plan.h"

namespace wsync::test {

struct RandomLayoutOptions {
  int32_t max_params = 4;          // 1..max_params parameters.
  int32_t max_rank = 4;            // Ranks 1..max_rank.
  int64_t max_extent = 12;         // Extents 1..max_extent (extent-1 axes are common).
  int64_t max_volume = 1536;       // Elements per parameter, at most.
  int32_t max_processes = 6;       // Per side, DP replicas included: 1..max_processes.
  int32_t max_nodes = 3;           // Node ids are drawn from node0..node{n-1}, n in 1..max_nodes,
                                   // shared by both sides.
  bool allow_fused = true;         // Fused groups of 2-3 parameters in one tensor.
  bool allow_flat = true;          // FSDP flat shards packing several parameters per buffer.
  bool allow_strided = true;       // Pieces with permuted axis order and padded rows.
  double drop_target_piece = 0.1;  // Chance that the target leaves one random piece out.
  double same_process_copy = 0.1;  // Chance that a side holds one piece's box twice on one
                                   // process (in a new buffer).
};

struct LayoutPair {
  Layout source;  // Role::kTrainer; holds every element of every parameter.
  Layout target;  // Role::kRollout; the same parameters (names, dtypes, shapes).
};

// A random pair of valid layouts (ValidateLayout and ValidatePair pass). Each side independently
// chooses its process count, DP replica count, node ids, buffer scheme (one buffer per process,
// one per piece, or mixed, with random padding between pieces), and for each parameter one of:
// replicated on all or some processes; split along an axis (balanced or random cuts), possibly
// with parts replicated; a 2-D grid split; an FSDP flat range (several parameters of one element
// size packed into one flat shard per process); or a fused tensor (a group of 2-3 parameters with
// equal extents except on the fused axis, split along any axis). Occasionally the target leaves a
// piece out, or a side holds one box twice on one process. Piece order is shuffled.
LayoutPair RandomLayoutPair(std::mt19937_64& rng, const RandomLayoutOptions& options = {});

// A copy of `layout` with the same meaning listed in a different order: pieces, buffers, processes
// and parameters are permuted (piece.param is remapped to follow its parameter).
Layout ShuffledCopy(const Layout& layout, std::mt19937_64& rng);

// A readable multi-line description of a layout, for failure messages.
std::string LayoutToString(const Layout& layout);

// A ReplicaPolicy for tests: each request is answered, as a deterministic function of the seed and
// of the request's content (not of its position), with either one random holder or, when the
// region's axis-0 extent is at least 2, a cut of axis 0 into 2-4 consecutive parts with random
// holders (consecutive parts may name the same holder); the fixed traffic is ignored. The answers
// always pass CheckAnswer.
class RandomAnswersPolicy final : public ReplicaPolicy {
 public:
  explicit RandomAnswersPolicy(uint64_t seed) : seed_(seed) {}

  std::string name() const override { return "random_answers"; }
  absl::StatusOr<std::vector<ReplicaAnswer>> Choose(
      const Job& job, absl::Span<const ReplicaRequest> requests,
      absl::Span<const FixedPairTraffic> fixed) const override;

 private:
  uint64_t seed_;
};

// Uniform integer in [lo, hi] (requires lo <= hi), from raw generator output so that it is the
// same on every platform.
int64_t UniformInt(std::mt19937_64& rng, int64_t lo, int64_t hi);

// True with probability `p` (in [0, 1]).
bool Chance(std::mt19937_64& rng, double p);

// A fixed small job: "w" [8, 8] fp32 split by rows over 2 trainer processes (global ids 0, 1) and
// by columns over 4 rollout processes (ids 2..5), one packed buffer each. Every trainer sends each
// rollout one 4x2 block: staged at the sender (strided), direct at the receiver.
Job RowsToColumnsJob();

// A fixed job for relays: "w" (`shape`, fp32) held whole in one packed buffer by one trainer on
// node "a" (global id 0) and by one rollout process per entry of `rollout_nodes` (ids 1, 2, ...),
// each on that node.
Job OneTrainerToWholeCopies(const Dims& shape, const std::vector<std::string>& rollout_nodes);

}  // namespace wsync::test

#endif  // WSYNC_TESTS_TESTING_RANDOM_LAYOUTS_H_
