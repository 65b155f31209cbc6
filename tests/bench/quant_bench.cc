// FP8 quantization kernel benchmarks (Google Benchmark): QuantizeFp8 of a bf16 [4096, 14336]
// matrix (llama-3-8b's gate_proj, 112 MiB of bf16) in each scaling, against memcpy of the same
// bf16 bytes. Every benchmark reports bytes/s of bf16 input (SetBytesProcessed), so the ratio of
// a quantize line to the memcpy line is issue 22's figure (goal >= 0.5). Buffers are written once
// before timing. Run with --benchmark_min_time=0.2 for a run of a few seconds.

#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "quant/fp8.h"

namespace wsync {
namespace {

constexpr int64_t kRows = 4096;
constexpr int64_t kCols = 14336;

std::vector<uint16_t> Weights() {
  std::vector<uint16_t> bits(kRows * kCols);
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (uint16_t& b : bits) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    b = static_cast<uint16_t>(((state >> 20) & 0x8000) | (0x3b80 + (state & 0x07ff)));
  }
  return bits;
}

void BM_Quantize(benchmark::State& state, quant::Fp8Blocking blocking) {
  const std::vector<uint16_t> input = Weights();
  std::vector<uint8_t> fp8(input.size(), 1);
  const int64_t sr = quant::BlockCount(blocking.rows, kRows);
  const int64_t sc = quant::BlockCount(blocking.cols, kCols);
  std::vector<float> scales(sr * sc, 1.0f);
  const quant::ConstRegion in{input.data(), 1, kRows, kCols, 0, kCols, 1};
  const quant::MutableRegion out{fp8.data(), 1, kRows, kCols, 0, kCols, 1};
  const quant::MutableRegion scale_out{scales.data(), 1, sr, sc, 0, sc, 1};
  for (auto _ : state) {
    if (!quant::QuantizeFp8(blocking, DType::kBFloat16, in, out, scale_out, "w").ok()) {
      state.SkipWithError("QuantizeFp8 failed");
      break;
    }
    benchmark::DoNotOptimize(fp8.data());
  }
  state.SetBytesProcessed(state.iterations() * 2 * kRows * kCols);
}

void BM_Memcpy(benchmark::State& state) {
  const std::vector<uint16_t> input = Weights();
  std::vector<uint16_t> copy(input.size(), 1);
  for (auto _ : state) {
    std::memcpy(copy.data(), input.data(), 2 * input.size());
    benchmark::DoNotOptimize(copy.data());
  }
  state.SetBytesProcessed(state.iterations() * 2 * kRows * kCols);
}

BENCHMARK(BM_Memcpy)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Quantize, block_128x128, quant::Fp8Blocking::Block())
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Quantize, per_channel, quant::Fp8Blocking::PerChannel())
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Quantize, per_tensor, quant::Fp8Blocking::PerTensor())
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace wsync

BENCHMARK_MAIN();
