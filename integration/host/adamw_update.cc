#include "integration/host/adamw_update.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "planner/geometry.h"

namespace wsync::host {
namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;
constexpr int kTableBits = 16;
constexpr int64_t kTableSize = (int64_t{1} << kTableBits) + 1;

// MurmurHash3's 64-bit finalizer: every input bit moves every output bit.
inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

// The standard normal's quantiles at (i + 0.5) / kTableSize, i < kTableSize (bisection on erfc).
std::vector<float> MakeNormalQuantiles() {
  std::vector<float> table(kTableSize);
  for (int64_t i = 0; i < kTableSize; ++i) {
    const double p = (static_cast<double>(i) + 0.5) / static_cast<double>(kTableSize);
    double low = -10, high = 10;
    for (int iteration = 0; iteration < 48; ++iteration) {
      const double mid = 0.5 * (low + high);
      (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? low : high) = mid;
    }
    table[i] = static_cast<float>(0.5 * (low + high));
  }
  return table;
}

const float* NormalQuantiles() {
  static const std::vector<float>* const table = new std::vector<float>(MakeNormalQuantiles());
  return table->data();
}

// A standard normal draw from the high 32 bits of `hash`: the quantile table interpolated
// linearly between its points.
inline float Gaussian(const float* table, uint64_t hash) {
  const uint32_t u = static_cast<uint32_t>(hash >> 32);
  const uint32_t index = u >> (32 - kTableBits);
  const float fraction =
      static_cast<float>(u & ((1u << (32 - kTableBits)) - 1)) * (1.0f / (1u << (32 - kTableBits)));
  return table[index] + fraction * (table[index + 1] - table[index]);
}

// The constants of step t (torch.optim.AdamW's arithmetic, in fp32).
struct StepConstants {
  float beta1, rest1, beta2, rest2;
  float step_size;     // lr / (1 - beta1^t).
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t).
  float eps;
  float decay;  // 1 - lr * weight_decay, or 1 for parameters not decayed.
};

// One AdamW step of `n` consecutive elements whose logical indices start at `flat`, the bf16 of
// each master written `stride` bytes apart from `out`.
void StepRow(const StepConstants& c, const float* table, uint64_t key, int64_t flat, int64_t n,
             float* w, float* m, float* v, unsigned char* out, int64_t stride) {
  for (int64_t j = 0; j < n; ++j) {
    const float g = Gaussian(table, Mix64(key + static_cast<uint64_t>(flat + j) * kGolden));
    const float mj = c.beta1 * m[j] + c.rest1 * g;
    const float vj = c.beta2 * v[j] + c.rest2 * g * g;
    m[j] = mj;
    v[j] = vj;
    const float wj = w[j] * c.decay - c.step_size * mj / (std::sqrt(vj) * c.inv_sqrt_bc2 + c.eps);
    w[j] = wj;
    const uint16_t bits = Bf16RoundNearestEven(wj);
    std::memcpy(out + j * stride, &bits, sizeof(bits));
  }
}

// Calls fn(logical flat index of the row's first element, element address in the buffer (in
// elements), row length, index of the row's first element in the piece's row-major order) for
// every row of `piece` along its last axis.
template <typename Fn>
void ForEachRow(const Piece& piece, const Dims& shape, Fn&& fn) {
  const Box& box = piece.box;
  const int rank = box.rank();
  for (int a = 0; a < rank; ++a) {
    if (box.extent[a] <= 0) return;
  }
  const int64_t row_length = rank == 0 ? 1 : box.extent[rank - 1];
  Dims index = box.origin;
  for (int64_t position = 0;; position += row_length) {
    int64_t address = piece.offset;
    for (int a = 0; a < rank; ++a) address += (index[a] - box.origin[a]) * piece.strides[a];
    fn(test::FlatIndex(shape, index), address, row_length, position);
    int a = rank - 2;  // The odometer over every axis but the last.
    for (; a >= 0; --a) {
      if (++index[a] < box.origin[a] + box.extent[a]) break;
      index[a] = box.origin[a];
    }
    if (a < 0) return;
  }
}

absl::Status CheckPiece(const Layout& part, const Piece& piece, const test::HostBuffers& memory) {
  const ParamInfo& param = part.params[piece.param];
  if (param.dtype != DType::kBFloat16) {
    return absl::InvalidArgumentError(absl::StrCat("--update adamw writes bf16 weights; ",
                                                   param.name, " is ", DTypeName(param.dtype)));
  }
  const int64_t buffer_bytes = memory.bytes({piece.process, piece.buffer});
  if (buffer_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("piece of ", param.name, " names unknown buffer ", piece.buffer));
  }
  int64_t lowest = piece.offset, highest = piece.offset;
  for (int a = 0; a < piece.box.rank(); ++a) {
    if (piece.box.extent[a] <= 0) return absl::OkStatus();
    const int64_t span = (piece.box.extent[a] - 1) * piece.strides[a];
    (span < 0 ? lowest : highest) += span;
  }
  if (lowest < 0 || (highest + 1) * 2 > buffer_bytes) {
    return absl::OutOfRangeError(absl::StrCat("piece of ", param.name, " at ",
                                              DimsToString(piece.box.origin),
                                              " lies outside buffer ", piece.buffer));
  }
  return absl::OkStatus();
}

}  // namespace

uint16_t Bf16RoundNearestEven(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

InitKind InitKindOf(const std::string& param_name) {
  if (absl::EndsWith(param_name, "norm.weight")) return InitKind::kOne;
  if (absl::EndsWith(param_name, "bias")) return InitKind::kZero;
  return InitKind::kNormal;
}

absl::StatusOr<std::unique_ptr<AdamWShard>> AdamWShard::Create(const Layout& part,
                                                               const test::HostBuffers& memory,
                                                               const AdamWOptions& options) {
  for (const Piece& piece : part.pieces) {
    if (absl::Status checked = CheckPiece(part, piece, memory); !checked.ok()) return checked;
  }
  std::unique_ptr<AdamWShard> shard(new AdamWShard(part, options));
  for (const Piece& piece : shard->part_.pieces) {
    const ParamInfo& param = shard->part_.params[piece.param];
    const int64_t elements = Volume(piece.box);
    if (elements <= 0) continue;
    shard->pieces_.push_back(
        {&piece, test::ParamKey(param.name), InitKindOf(param.name), shard->elements_});
    shard->elements_ += elements;
  }
  shard->master_ = AllocateState(shard->elements_);
  shard->m_ = AllocateState(shard->elements_);
  shard->v_ = AllocateState(shard->elements_);
  if (!shard->master_ || !shard->m_ || !shard->v_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate the AdamW state of ", shard->elements_, " elements (12 bytes each)"));
  }
  std::memset(shard->m_.get(), 0, shard->elements_ * sizeof(float));
  std::memset(shard->v_.get(), 0, shard->elements_ * sizeof(float));
  shard->Initialize();
  return shard;
}

void AdamWShard::FreeDeleter::operator()(float* p) const { std::free(p); }

AdamWShard::StateArray AdamWShard::AllocateState(int64_t elements) {
  constexpr size_t kHugePage = size_t{2} << 20;
  const size_t bytes =
      (std::max<size_t>(1, static_cast<size_t>(elements) * sizeof(float)) + kHugePage - 1) /
      kHugePage * kHugePage;
  void* memory = std::aligned_alloc(kHugePage, bytes);
  // Advice only: without huge pages it works as before.
  if (memory != nullptr) madvise(memory, bytes, MADV_HUGEPAGE);
  return StateArray(static_cast<float*>(memory));
}

void AdamWShard::Initialize() {
  const float* table = NormalQuantiles();
  const float std_dev = static_cast<float>(options_.init_std);
  for (const PieceState& state : pieces_) {
    const Piece& piece = *state.piece;
    float* master = master_.get() + state.begin;
    const uint64_t key = Mix64(options_.seed ^ Mix64(state.param_key));
    ForEachRow(piece, part_.params[piece.param].shape,
               [&](int64_t flat, int64_t, int64_t length, int64_t position) {
                 for (int64_t j = 0; j < length; ++j) {
                   master[position + j] =
                       state.kind == InitKind::kOne ? 1.0f
                       : state.kind == InitKind::kZero
                           ? 0.0f
                           : std_dev * Gaussian(table, Mix64(key + static_cast<uint64_t>(flat + j) *
                                                                       kGolden));
                 }
               });
  }
}

void AdamWShard::Step(test::HostBuffers& memory) {
  ++steps_;
  const float* table = NormalQuantiles();
  const double t = static_cast<double>(steps_);
  StepConstants c;
  c.beta1 = static_cast<float>(options_.beta1);
  c.rest1 = static_cast<float>(1 - options_.beta1);
  c.beta2 = static_cast<float>(options_.beta2);
  c.rest2 = static_cast<float>(1 - options_.beta2);
  c.step_size = static_cast<float>(options_.lr / (1 - std::pow(options_.beta1, t)));
  c.inv_sqrt_bc2 = static_cast<float>(1 / std::sqrt(1 - std::pow(options_.beta2, t)));
  c.eps = static_cast<float>(options_.eps);
  const float decay = static_cast<float>(1 - options_.lr * options_.weight_decay);
  for (const PieceState& state : pieces_) {
    const Piece& piece = *state.piece;
    c.decay = state.kind == InitKind::kNormal ? decay : 1.0f;
    // A fresh stream per (parameter, step): the gradient of an element at a step.
    const uint64_t key =
        Mix64(options_.seed ^ Mix64(state.param_key ^ (static_cast<uint64_t>(steps_) * kGolden)));
    unsigned char* data = memory.data({piece.process, piece.buffer});
    const int rank = piece.box.rank();
    const int64_t stride = 2 * (rank == 0 ? 1 : piece.strides[rank - 1]);
    const int64_t begin = state.begin;
    ForEachRow(piece, part_.params[piece.param].shape,
               [&](int64_t flat, int64_t address, int64_t length, int64_t position) {
                 const int64_t k = begin + position;
                 StepRow(c, table, key, flat, length, master_.get() + k, m_.get() + k, v_.get() + k,
                         data + 2 * address, stride);
               });
  }
}

}  // namespace wsync::host
