// The CUDA FP8 quantization kernels (device/cuda_quant_kernel.cu) on GPU 0 (label gpu):
// random shapes, blockings, windows and strides (ragged last blocks, zeros, values at and past
// 448, fp32 input) and every finite bf16 at several scales give bytes and scales identical to the
// reference quantizer, to quant::QuantizeFp8 and to the kernels' host emulation, bit for bit; NaN
// and infinity are reported as the host emulation reports them. Prints the kernels' throughput
// next to a device memcpy of the same bf16 bytes (a measurement, not a check).

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "device/cuda_quant_kernel.h"
#include "gtest/gtest.h"
#include "quant/fp8_device.h"
#include "quant/fp8_device_host.h"
#include "tests/gpu/gpu_count.h"
#include "tests/unit/fp8_device_support.h"

namespace wsync::fp8_test {
namespace {

using Word = unsigned long long;  // NOLINT(runtime/int): the report word.

#define ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call

// The case's buffers in device memory, quantized there, and copied back.
struct DeviceRun {
  std::vector<uint8_t> fp8;
  std::vector<float> scales;
  Word report = 0;
};

void RunOnDevice(const DeviceCase& c, DeviceRun& out) {
  void *in = nullptr, *fp8 = nullptr, *scales = nullptr, *report = nullptr;
  ASSERT_CUDA(cudaMalloc(&in, c.input.size()));
  ASSERT_CUDA(cudaMalloc(&fp8, c.fp8.size() + 1));
  ASSERT_CUDA(cudaMalloc(&scales, c.scales.size() * sizeof(float) + 1));
  ASSERT_CUDA(cudaMalloc(&report, sizeof(Word)));
  ASSERT_CUDA(cudaMemcpy(in, c.input.data(), c.input.size(), cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemcpy(fp8, c.fp8.data(), c.fp8.size(), cudaMemcpyHostToDevice));
  ASSERT_CUDA(
      cudaMemcpy(scales, c.scales.data(), c.scales.size() * sizeof(float), cudaMemcpyHostToDevice));
  cudaStream_t stream;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const quant::Fp8DeviceQuant q = c.Request(
      in, static_cast<uint8_t*>(fp8), static_cast<float*>(scales), static_cast<Word*>(report));
  ASSERT_TRUE(quant::CheckFp8DeviceQuant(q, "w").ok());
  ASSERT_EQ(LaunchQuantizeFp8(q, stream), 0);
  ASSERT_CUDA(cudaStreamSynchronize(stream));
  out.fp8.resize(c.fp8.size());
  out.scales.resize(c.scales.size());
  ASSERT_CUDA(cudaMemcpy(out.fp8.data(), fp8, c.fp8.size(), cudaMemcpyDeviceToHost));
  ASSERT_CUDA(cudaMemcpy(out.scales.data(), scales, c.scales.size() * sizeof(float),
                         cudaMemcpyDeviceToHost));
  ASSERT_CUDA(cudaMemcpy(&out.report, report, sizeof(Word), cudaMemcpyDeviceToHost));
  ASSERT_CUDA(cudaStreamDestroy(stream));
  for (void* p : {in, fp8, scales, report}) ASSERT_CUDA(cudaFree(p));
}

// The host emulation of the same request: byte for byte what the device wrote, padding included.
void ExpectSameAsEmulation(const DeviceCase& c, const DeviceRun& device) {
  std::vector<uint8_t> fp8 = c.fp8;
  std::vector<float> scales = c.scales;
  Word report = 0;
  quant::QuantizeFp8DeviceOnHost(c.Request(c.input.data(), fp8.data(), scales.data(), &report));
  ASSERT_EQ(device.report, report);
  ASSERT_TRUE(device.fp8 == fp8);
  for (size_t i = 0; i < scales.size(); ++i) {
    ASSERT_EQ(Bits(device.scales[i]), Bits(scales[i])) << "scale " << i;
  }
}

// A finite case on the device: no report, and the reference's, the host kernel's and the
// emulation's bytes and scales.
void ExpectDeviceMatches(const DeviceCase& c) {
  DeviceRun run;
  RunOnDevice(c, run);
  if (::testing::Test::HasFatalFailure()) return;
  ASSERT_EQ(run.report, quant::kFp8NoNonFinite);
  ExpectDeviceResult(c, run.fp8, run.scales);
  if (::testing::Test::HasFatalFailure()) return;
  ExpectSameAsEmulation(c, run);
}

class GpuFp8QuantTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_GT(test::GpuCount(), 0) << "no NVIDIA device: this gpu-labelled test needs one";
    ASSERT_CUDA(cudaSetDevice(0));
  }
};

TEST_F(GpuFp8QuantTest, RandomCasesMatchTheReferenceTheHostKernelAndTheEmulation) {
  std::mt19937_64 rng(2222);
  for (int i = 0; i < 300; ++i) {
    const DeviceCase c = RandomDeviceCase(rng, i % 10 == 0 ? 600 : 60);
    SCOPED_TRACE(::testing::Message()
                 << "case " << i << ": " << c.tensor.experts << "x" << c.tensor.rows << "x"
                 << c.tensor.cols << " blocks " << c.blocking.rows << "x" << c.blocking.cols
                 << (c.fp32 ? " fp32" : " bf16"));
    ExpectDeviceMatches(c);
    if (HasFatalFailure()) return;
  }
}

TEST_F(GpuFp8QuantTest, EveryBf16AtSeveralRowScalesMatchesTheReference) {
  for (const Fp8Blocking& blocking : {Fp8Blocking::PerChannel(), Fp8Blocking::Block(1, 2)}) {
    ExpectDeviceMatches(WholeCase(EveryBf16WithPartners(), blocking));
    if (HasFatalFailure()) return;
  }
}

// Several NaNs and infinities: the report names the first in row-major order, as the emulation's.
TEST_F(GpuFp8QuantTest, NonFiniteElementsAreReportedAsOnTheHost) {
  std::mt19937_64 rng(5);
  for (int i = 0; i < 20; ++i) {
    DeviceCase c = RandomDeviceCase(rng, 300);
    for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) {
      const uint16_t bad = rng() % 2 == 0 ? 0x7fc0 : 0xff80;
      c.tensor.bits[rng() % c.tensor.bits.size()] = bad;
    }
    FillBuffers(c);
    DeviceRun run;
    RunOnDevice(c, run);
    if (HasFatalFailure()) return;
    ASSERT_NE(run.report, quant::kFp8NoNonFinite);
    Word report = 0;
    std::vector<uint8_t> fp8 = c.fp8;
    std::vector<float> scales = c.scales;
    quant::QuantizeFp8DeviceOnHost(c.Request(c.input.data(), fp8.data(), scales.data(), &report));
    ASSERT_EQ(run.report, report);
    const quant::Fp8DeviceQuant q = c.Request(nullptr, nullptr, nullptr, nullptr);
    EXPECT_FALSE(quant::Fp8ReportStatus(run.report, q, "w").ok());
  }
}

// Throughput of [4096, 14336] bf16 (one Llama-70B-sized weight shard) per format, against a device
// memcpy of the bf16 bytes.
TEST_F(GpuFp8QuantTest, PrintThroughput) {
  const int64_t rows = 4096, cols = 14336, bytes = rows * cols * 2;
  void *in = nullptr, *fp8 = nullptr, *scales = nullptr, *report = nullptr, *copy = nullptr;
  ASSERT_CUDA(cudaMalloc(&in, bytes));
  ASSERT_CUDA(cudaMalloc(&copy, bytes));
  ASSERT_CUDA(cudaMalloc(&fp8, rows * cols));
  ASSERT_CUDA(cudaMalloc(&scales, rows * sizeof(float)));
  ASSERT_CUDA(cudaMalloc(&report, sizeof(Word)));
  ASSERT_CUDA(cudaMemset(in, 0x3c, bytes));  // bf16 0x3c3c: finite.
  cudaEvent_t start, stop;
  ASSERT_CUDA(cudaEventCreate(&start));
  ASSERT_CUDA(cudaEventCreate(&stop));
  const int kRepeats = 20;
  auto time = [&](auto&& launch) {
    launch();
    cudaEventRecord(start);
    for (int r = 0; r < kRepeats; ++r) launch();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    return bytes * kRepeats / (ms * 1e-3) / 1e9;
  };
  const double memcpy_rate = time([&] { cudaMemcpyAsync(copy, in, bytes, cudaMemcpyDefault); });
  struct Format {
    const char* name;
    Fp8Blocking blocking;
  };
  for (const Format& f :
       {Format{"fp8_block", Fp8Blocking::Block()}, Format{"fp8_channel", Fp8Blocking::PerChannel()},
        Format{"fp8_tensor", Fp8Blocking::PerTensor()}}) {
    quant::Fp8DeviceQuant q;
    q.input = in;
    q.rows = rows;
    q.cols = cols;
    q.input_strides[1] = cols;
    q.block_rows = f.blocking.rows;
    q.block_cols = f.blocking.cols;
    q.fp8 = static_cast<uint8_t*>(fp8);
    q.fp8_strides[1] = cols;
    q.window_extent[0] = 1;
    q.window_extent[1] = rows;
    q.window_extent[2] = cols;
    const quant::Fp8Tiling t = quant::MakeFp8Tiling(q);
    q.scales = static_cast<float*>(scales);
    q.scale_strides[1] = t.scale_cols;
    q.report = static_cast<Word*>(report);
    ASSERT_TRUE(quant::CheckFp8DeviceQuant(q, "w").ok());
    const double rate = time([&] { LaunchQuantizeFp8(q, nullptr); });
    ASSERT_CUDA(cudaGetLastError());
    std::printf(
        "quantize %s [%lld, %lld] bf16: %.1f GB/s of bf16 input; memcpy %.1f GB/s; "
        "ratio %.2f\n",
        f.name, static_cast<long long>(rows), static_cast<long long>(cols),  // NOLINT
        rate, memcpy_rate, rate / memcpy_rate);
  }
  for (void* p : {in, copy, fp8, scales, report}) ASSERT_CUDA(cudaFree(p));
}

}  // namespace
}  // namespace wsync::fp8_test
