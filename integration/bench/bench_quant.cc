#include "integration/bench/bench_quant.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/cpu_time.h"
#include "common/status.h"
#include "planner/geometry.h"
#include "planner/models.h"
#include "quant/fp8.h"

namespace wsync::bench {
namespace {

struct Matrix {
  std::string name;
  int64_t experts = 1, rows = 0, cols = 0;
  int64_t elements() const { return experts * rows * cols; }
};

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// bf16 weights of magnitude 2^-8 .. 2^2 with random signs (an xorshift sequence).
void FillWeights(std::vector<uint16_t>& bits) {
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (uint16_t& b : bits) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    b = static_cast<uint16_t>(((state >> 20) & 0x8000) | (0x3b80 + (state & 0x07ff)));
  }
}

struct Scaling {
  const char* name;
  quant::Fp8Blocking blocking;
};

}  // namespace

absl::Status RunQuantizeScenario(const ModelSpec& model, int32_t repeats, std::FILE* out) {
  std::vector<Matrix> matrices;
  int64_t largest = 0, most_scales = 0, total_bytes = 0;
  for (const TensorSpec& tensor : model.tensors) {
    WSYNC_ASSIGN_OR_RETURN(const bool quantized,
                           IsQuantizedParameter(model, tensor.name, WeightQuant::kFp8Block));
    if (!quantized) continue;
    Matrix m{tensor.name};
    const size_t first = tensor.shape.size() - 2;
    if (first == 1) m.experts = tensor.shape[0];
    m.rows = tensor.shape[first];
    m.cols = tensor.shape[first + 1];
    largest = std::max(largest, m.elements());
    most_scales =
        std::max({most_scales, m.experts * m.rows,
                  m.experts * quant::BlockCount(128, m.rows) * quant::BlockCount(128, m.cols)});
    total_bytes += 2 * m.elements();
    matrices.push_back(std::move(m));
  }
  if (matrices.empty()) return absl::FailedPreconditionError("no parameter is quantized");
  std::vector<uint16_t> input(largest);
  FillWeights(input);
  std::vector<uint16_t> copy(largest, 1);
  std::vector<uint8_t> fp8(largest, 1);
  std::vector<float> scales(most_scales, 1.0f);
  absl::FPrintF(out,
                "\nquantize bf16 -> fp8 e4m3 (quant/fp8.h, host, one thread): %d parameters, "
                "%.2f GiB of bf16 per pass, median of %d passes\n",
                matrices.size(), total_bytes / static_cast<double>(1 << 30), repeats);
  const Scaling scalings[] = {{"fp8_block 128x128", quant::Fp8Blocking::Block()},
                              {"fp8_channel", quant::Fp8Blocking::PerChannel()},
                              {"fp8_tensor", quant::Fp8Blocking::PerTensor()}};
  for (const Scaling& scaling : scalings) {
    std::vector<double> quantize_seconds, memcpy_seconds;
    for (int32_t r = 0; r < repeats; ++r) {
      double quantize = 0, copied = 0;
      for (const Matrix& m : matrices) {
        const int64_t matrix = m.rows * m.cols;
        const quant::ConstRegion in{input.data(), m.experts, m.rows, m.cols, matrix, m.cols, 1};
        const quant::MutableRegion q{fp8.data(), m.experts, m.rows, m.cols, matrix, m.cols, 1};
        const int64_t sr = quant::BlockCount(scaling.blocking.rows, m.rows);
        const int64_t sc = quant::BlockCount(scaling.blocking.cols, m.cols);
        const quant::MutableRegion s{scales.data(), m.experts, sr, sc, sr * sc, sc, 1};
        // Alternate which runs first, so neither gains from the other's cache footprint.
        for (int order = 0; order < 2; ++order) {
          if ((order + r) % 2 == 0) {
            const double start = ThreadCpuSeconds();
            std::memcpy(copy.data(), input.data(), 2 * m.elements());
            copied += ThreadCpuSeconds() - start;
          } else {
            const double start = ThreadCpuSeconds();
            WSYNC_RETURN_IF_ERROR(
                quant::QuantizeFp8(scaling.blocking, DType::kBFloat16, in, q, s, m.name));
            quantize += ThreadCpuSeconds() - start;
          }
        }
      }
      if (copy[largest - 1] != input[largest - 1]) std::abort();  // Keeps the copies observable.
      quantize_seconds.push_back(quantize);
      memcpy_seconds.push_back(copied);
    }
    const double quantize_rate = total_bytes / Median(quantize_seconds);
    const double memcpy_rate = total_bytes / Median(memcpy_seconds);
    absl::FPrintF(out,
                  "  %-18s quantize %.2f GB/s of bf16, memcpy of the same bytes %.2f GB/s: "
                  "ratio %.2f (goal >= 0.50)\n",
                  scaling.name, quantize_rate / 1e9, memcpy_rate / 1e9,
                  quantize_rate / memcpy_rate);
  }
  return absl::OkStatus();
}

}  // namespace wsync::bench
