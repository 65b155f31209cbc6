#ifndef WSYNC_INTEGRATION_BENCH_BENCH_QUANT_H_
#define WSYNC_INTEGRATION_BENCH_BENCH_QUANT_H_

#include <cstdint>
#include <cstdio>

#include "absl/status/status.h"
#include "planner/models.h"

namespace wsync::bench {

// The quantizing scenario of `wsync-bench executor`: every parameter of `model` that an FP8
// rollout stores in FP8 (IsQuantizedParameter) is quantized from bf16 by the host kernels
// (quant/fp8.h) in each of the three scalings, `repeats` times, on the calling thread; the median
// thread-CPU throughput in bf16 bytes per second is printed next to memcpy of the same bf16 bytes
// (same buffers, same thread, in the same run) and their ratio (issue 22's goal: >= 0.5).
absl::Status RunQuantizeScenario(const ModelSpec& model, int32_t repeats, std::FILE* out);

}  // namespace wsync::bench

#endif  // WSYNC_INTEGRATION_BENCH_BENCH_QUANT_H_
