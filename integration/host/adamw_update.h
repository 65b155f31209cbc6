#ifndef WSYNC_INTEGRATION_HOST_ADAMW_UPDATE_H_
#define WSYNC_INTEGRATION_HOST_ADAMW_UPDATE_H_

// A realistic weight update for wsync_host's trainers (`--update adamw`, issue 44's benchmark
// scenario): fp32 master weights of this process's pieces, initialised as the Qwen2 family
// initialises them (linear and embedding weights normal with mean 0 and standard deviation
// initializer_range, 0.02 in Qwen2.5's config.json; norm weights 1; biases 0), then one AdamW step
// per version on per-element random gradients, the masters cast to bf16 (round to nearest even)
// into the process's buffers.
//
// Every value is a function of the seed, the parameter's name, the element's logical index (its
// row-major index in the parameter's shape) and the step, never of the layout: the shards of any
// layout, and replicas of one element in several processes, hold the same values. The gradients
// are normal (a piecewise-linear inverse CDF of a 32-bit hash, tails cut at about 4.4 sigma),
// drawn afresh per (element, step); Adam divides the first moment by the root of the second, so
// the update's size is set by the learning rate (about lr per element and step), as in real
// post-training, whatever the gradients' scale. The first and second moments are kept in fp32:
// 12 bytes of state per element (3 GB for each of qwen2.5-0.5b's two megatron(tp=2) trainers).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "integration/fill/fill.h"
#include "planner/layout.h"

namespace wsync::host {

struct AdamWOptions {
  double lr = 1e-6;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  // Decoupled weight decay (torch.optim.AdamW) of the linear and embedding weights; norm weights
  // and biases are not decayed, as the Hugging Face Trainer groups them.
  double weight_decay = 0.01;
  double init_std = 0.02;  // initializer_range of the Qwen2 family's config.json.
  uint64_t seed = 1;
};

// How a parameter is initialised, from its name: "...norm.weight" (layer norms, q/k norms) 1,
// "....bias" 0, everything else normal(0, init_std).
enum class InitKind { kNormal, kOne, kZero };
InitKind InitKindOf(const std::string& param_name);

// The optimizer state of one process's pieces and the step that writes them.
class AdamWShard {
 public:
  // Allocates the state of every piece of `part` (bf16 parameters only: InvalidArgument naming
  // another dtype) and sets the masters to their initial values. OutOfRange when a piece lies
  // outside its buffer in `memory`, InvalidArgument for an unknown buffer.
  static absl::StatusOr<std::unique_ptr<AdamWShard>> Create(const Layout& part,
                                                            const test::HostBuffers& memory,
                                                            const AdamWOptions& options);

  // One AdamW step (steps() + 1) on every master, then every master cast to bf16 into its place
  // in `memory`.
  void Step(test::HostBuffers& memory);

  int64_t steps() const { return steps_; }
  int64_t elements() const { return elements_; }

 private:
  struct PieceState {
    const Piece* piece = nullptr;
    uint64_t param_key = 0;
    InitKind kind = InitKind::kNormal;
    int64_t begin = 0;  // Index of its first element in the state arrays.
  };
  AdamWShard(const Layout& part, const AdamWOptions& options) : part_(part), options_(options) {}
  void Initialize();

  const Layout part_;  // A copy: pieces_ point into it.
  AdamWOptions options_;
  std::vector<PieceState> pieces_;
  int64_t elements_ = 0;
  int64_t steps_ = 0;
  // Each array in 2 MiB-aligned memory advised for transparent huge pages: 3 GB of state faults
  // in 1.5 k pages instead of 786 k.
  struct FreeDeleter {
    void operator()(float* p) const;
  };
  using StateArray = std::unique_ptr<float[], FreeDeleter>;
  static StateArray AllocateState(int64_t elements);  // Null when out of memory.
  StateArray master_, m_, v_;
};

// The bf16 bits nearest to `value` (ties to even); `value` must not be a NaN.
uint16_t Bf16RoundNearestEven(float value);

}  // namespace wsync::host

#endif  // WSYNC_INTEGRATION_HOST_ADAMW_UPDATE_H_
