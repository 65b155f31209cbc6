#include "integration/bench/bench_quant.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/cpu_time.h"
#include "common/status.h"
#include "integration/bench/bench_report.h"
#include "integration/bench/machine.h"
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

// bf16 weights as the Llama and Qwen families initialise their linear layers: normal with mean 0
// and standard deviation 0.02 (their configs' initializer_range), rounded to bf16 to nearest even,
// from a fixed seed. The kernels' speed depends on the values: the AVX2 kernel takes a longer path
// for 32 elements holding a quotient below 2^-6 (quant/fp8_avx2.cc), which such weights rarely do.
void FillWeights(std::vector<uint16_t>& bits) {
  std::mt19937_64 rng(0x9e3779b97f4a7c15ull);
  std::normal_distribution<float> weight(0.0f, 0.02f);
  for (uint16_t& b : bits) {
    const float value = weight(rng);
    uint32_t u;
    std::memcpy(&u, &value, sizeof u);
    b = static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
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
                "%.2f GiB of bf16 per pass (normal weights, std 0.02), median of %d passes; every "
                "kernel this CPU runs, side by side (%s; CPU flags: %s)\n",
                matrices.size(), total_bytes / static_cast<double>(1 << 30), repeats,
                Fp8KernelDescription(), CpuVectorFlags());
  const Scaling scalings[] = {{"fp8_block 128x128", quant::Fp8Blocking::Block()},
                              {"fp8_channel", quant::Fp8Blocking::PerChannel()},
                              {"fp8_tensor", quant::Fp8Blocking::PerTensor()}};
  const std::vector<quant::Fp8Kernel> kernels = quant::RunnableFp8Kernels();
  for (const Scaling& scaling : scalings) {
    // Per kernel its quantize seconds of each pass; the memcpy of the same bytes once per pass and
    // kernel, alternating with it.
    std::vector<std::vector<double>> quantize_seconds(kernels.size());
    std::vector<double> memcpy_seconds;
    for (int32_t r = 0; r < repeats; ++r) {
      for (size_t k = 0; k < kernels.size(); ++k) {
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
              WSYNC_RETURN_IF_ERROR(quant::QuantizeFp8WithKernel(
                  kernels[k], scaling.blocking, DType::kBFloat16, in, q, s, m.name));
              quantize += ThreadCpuSeconds() - start;
            }
          }
        }
        if (copy[largest - 1] != input[largest - 1]) std::abort();  // Keeps the copies observable.
        quantize_seconds[k].push_back(quantize);
        memcpy_seconds.push_back(copied);
      }
    }
    const double memcpy_rate = total_bytes / Median(memcpy_seconds);
    for (size_t k = 0; k < kernels.size(); ++k) {
      const double quantize_rate = total_bytes / Median(quantize_seconds[k]);
      absl::FPrintF(out,
                    "  %-18s %-8s quantize %.2f GB/s of bf16, memcpy of the same bytes %.2f "
                    "GB/s: ratio %.2f (goal >= 0.50)%s\n",
                    scaling.name, quant::Fp8KernelName(kernels[k]), quantize_rate / 1e9,
                    memcpy_rate / 1e9, quantize_rate / memcpy_rate,
                    kernels[k] == quant::SelectedFp8Kernel() ? "  <- runs in syncs" : "");
    }
  }
  return absl::OkStatus();
}

}  // namespace wsync::bench
