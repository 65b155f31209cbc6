// Host copy kernel benchmarks (Google Benchmark 1.7.1): PackRegion and UnpackRegion against a plain
// memcpy of the same number of bytes, for llama-3-8b-like bf16 regions:
//   tp_column_block   [4096, 2048] of a [4096, 4096] row-major matrix (4 KiB runs)
//   w13_fused_halves  [2, 1792, 4096] of a fused gate/up [2, 3584, 4096] (two 14 MiB runs)
//   narrow_columns    [14336, 64] of a [14336, 4096] row-major matrix (128-byte runs)
//   fully_packed      [4096, 4096] row-major (one memcpy)
//   transpose         [4096, 1024] read column-wise out of a [1024, 4096] matrix (element loop)
//   row_shard_halves  the two column halves [4096, 3584] of a [4096, 7168] down_proj row shard
//                     (megatron tp=2 to vllm tp=4): packed one after the other (two PackRegion
//                     calls, `pack`) and in one pass over the rows (CopyStridedBatch, `batch`)
// Every benchmark reports bytes/s of region bytes (SetBytesProcessed). Buffers are allocated and
// written once before timing, so pages are resident. Run with --benchmark_min_time=0.2 for a run
// well under a minute.

#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "executor/copy.h"
#include "planner/geometry.h"

namespace wsync {
namespace {

constexpr int64_t kBf16 = 2;

// A region of a larger buffer: `shape` at element `offset` with element `strides` in a buffer of
// `buffer_elements` elements.
struct Case {
  const char* name;
  Dims shape;
  Dims strides;
  int64_t offset;
  int64_t buffer_elements;
};

std::vector<Case> Cases() {
  return {
      // Tensor-parallel rank 1 of 2 of a column-parallel split: columns [2048, 4096).
      {"tp_column_block", {4096, 2048}, {4096, 1}, 2048, int64_t{4096} * 4096},
      // The rank-1-of-2 sub-shard of each of the gate and up halves of a fused [2, 3584, 4096]
      // gate_up_proj (llama-3-8b intermediate 14336 at tp=4, resharded to tp=8).
      {"w13_fused_halves",
       {2, 1792, 4096},
       {3584 * 4096, 4096, 1},
       1792 * 4096,
       int64_t{2} * 3584 * 4096},
      // 64 columns of every row of a [14336, 4096] matrix.
      {"narrow_columns", {14336, 64}, {4096, 1}, 0, int64_t{14336} * 4096},
      {"fully_packed", {4096, 4096}, {4096, 1}, 0, int64_t{4096} * 4096},
      // Region axes (column, row) of a [1024, 4096] row-major matrix: a transpose.
      {"transpose", {4096, 1024}, {1, 4096}, 0, int64_t{1024} * 4096},
  };
}

struct Buffers {
  std::vector<std::byte> strided;     // The buffer the region lives in.
  std::vector<std::byte> packed;      // Row-major image of the region.
  std::vector<std::byte> contiguous;  // memcpy's source, as large as the region.
};

Buffers MakeBuffers(const Case& c) {
  const int64_t region_bytes = Volume(c.shape) * kBf16;
  Buffers b;
  b.strided.assign(c.buffer_elements * kBf16, std::byte{1});
  b.packed.assign(region_bytes, std::byte{2});
  b.contiguous.assign(region_bytes, std::byte{3});
  return b;
}

enum class Op { kMemcpy, kPack, kUnpack };

void BM_Copy(benchmark::State& state, const Case& c, Op op) {
  Buffers b = MakeBuffers(c);
  const int64_t region_bytes = Volume(c.shape) * kBf16;
  std::byte* region = b.strided.data() + c.offset * kBf16;
  for (auto _ : state) {
    switch (op) {
      case Op::kMemcpy:
        std::memcpy(b.packed.data(), b.contiguous.data(), region_bytes);
        break;
      case Op::kPack:
        PackRegion(b.packed.data(), region, c.strides, c.shape, kBf16);
        break;
      case Op::kUnpack:
        UnpackRegion(region, c.strides, b.packed.data(), c.shape, kBf16);
        break;
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * region_bytes);
}

// The two column halves of a row shard: memcpy of their bytes, each half packed on its own, or
// both in one CopyStridedBatch.
enum class HalvesOp { kMemcpy, kOneByOne, kBatch };

void BM_RowShardHalves(benchmark::State& state, HalvesOp op) {
  constexpr int64_t kRows = 4096, kColumns = 7168, kHalf = kColumns / 2;
  const int64_t half_bytes = kRows * kHalf * kBf16;
  std::vector<std::byte> shard(kRows * kColumns * kBf16, std::byte{1});
  std::vector<std::byte> contiguous(2 * half_bytes, std::byte{3});
  std::vector<std::byte> left(half_bytes, std::byte{2}), right(half_bytes, std::byte{2});
  const Dims strides = {kColumns, 1};
  const Dims half = {kRows, kHalf};
  const std::byte* right_half = shard.data() + kHalf * kBf16;
  const StridedCopy both[] = {
      {left.data(), RowMajorStrides(half), shard.data(), strides, half, kBf16},
      {right.data(), RowMajorStrides(half), right_half, strides, half, kBf16}};
  for (auto _ : state) {
    switch (op) {
      case HalvesOp::kMemcpy:
        std::memcpy(left.data(), contiguous.data(), half_bytes);
        std::memcpy(right.data(), contiguous.data() + half_bytes, half_bytes);
        break;
      case HalvesOp::kOneByOne:
        PackRegion(left.data(), shard.data(), strides, half, kBf16);
        PackRegion(right.data(), right_half, strides, half, kBf16);
        break;
      case HalvesOp::kBatch:
        CopyStridedBatch(both);
        break;
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 2 * half_bytes);
}

void RegisterAll() {
  for (auto [op, name] :
       {std::pair{HalvesOp::kMemcpy, "memcpy"}, std::pair{HalvesOp::kOneByOne, "pack"},
        std::pair{HalvesOp::kBatch, "batch"}}) {
    benchmark::RegisterBenchmark(absl::StrCat("row_shard_halves/", name).c_str(), BM_RowShardHalves,
                                 op)
        ->Unit(benchmark::kMicrosecond);
  }
  // RegisterBenchmark keeps copies of its extra arguments.
  for (const Case& c : Cases()) {
    for (auto [op, name] : {std::pair{Op::kMemcpy, "memcpy"}, std::pair{Op::kPack, "pack"},
                            std::pair{Op::kUnpack, "unpack"}}) {
      benchmark::RegisterBenchmark(absl::StrCat(c.name, "/", name).c_str(), BM_Copy, c, op)
          ->Unit(benchmark::kMicrosecond);
    }
  }
}

}  // namespace
}  // namespace wsync

int main(int argc, char** argv) {
  wsync::RegisterAll();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
