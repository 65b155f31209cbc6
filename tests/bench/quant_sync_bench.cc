// Quantizing syncs (Google Benchmark 1.7.1; issue 22): one bf16 [4096, 14336] weight (llama-3-8b's
// gate_proj, 112 MiB) from one trainer to one rollout, both as threads over the loopback
// transport, per iteration a whole ExecuteTransfers on each side (agreement included):
//   copy_bf16    the rollout holds bf16: the plain sync, for comparison
//   fp8_block    the rollout holds block-scaled FP8: the trainer quantizes (sender side) and sends
//                e4m3 bytes and scales
//   fp8_channel  the same with one scale per row
// Counters: bytes on the wire per sync, and the trainer's thread CPU seconds in the quantize step
// and in packing. Wall time is what the loopback run took, a figure to compare on one machine.

#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "executor/execute.h"
#include "planner/builders.h"
#include "planner/job.h"
#include "planner/plan.h"
#include "planner/policy.h"
#include "planner/quant_layout.h"
#include "quant/fp8.h"
#include "tests/testing/loopback_threads.h"

namespace wsync {
namespace {

constexpr int64_t kRows = 4096;
constexpr int64_t kCols = 14336;

// The trainer's bf16 weight and the rollout's weight: bf16 when `quant` is not quantized, else
// FP8 with `quant` and its scales.
absl::StatusOr<Job> MakeJob(const ParamQuant& quant) {
  const Dims shape = {kRows, kCols};
  LayoutBuilder source(Role::kTrainer);
  const int32_t w = source.AddParam("w", DType::kBFloat16, shape);
  const int32_t trainer = source.AddProcess("node");
  source.AddPackedPiece(w, trainer, source.AddBuffer(trainer, kRows * kCols * 2), WholeBox(shape),
                        0);
  LayoutBuilder target(Role::kRollout);
  const bool fp8 = quant.quantized();
  const int32_t t = target.AddParam("w", fp8 ? DType::kFloat8E4M3 : DType::kBFloat16, shape);
  const int32_t rollout = target.AddProcess("node");
  target.AddPackedPiece(t, rollout, target.AddBuffer(rollout, kRows * kCols * (fp8 ? 1 : 2)),
                        WholeBox(shape), 0);
  if (fp8) {
    target.mutable_layout().params[t].quant = quant;
    target.mutable_layout().params[t].quant.scale_param = "w_scale";
    const Dims scale_shape = QuantScaleShape(shape, QuantBlockDims(quant, 2));
    const int32_t s = target.AddParam("w_scale", DType::kFloat32, scale_shape);
    target.AddPackedPiece(s, rollout, target.AddBuffer(rollout, Volume(WholeBox(scale_shape)) * 4),
                          WholeBox(scale_shape), 0);
  }
  return Job::Create(std::move(source).Build(), std::move(target).Build());
}

void BM_Sync(benchmark::State& state, ParamQuant quant) {
  absl::StatusOr<Job> job = MakeJob(quant);
  absl::StatusOr<Plan> plan =
      job.ok() ? MakePlan(*job, *MakeFirstHolderPolicy()) : absl::StatusOr<Plan>(job.status());
  if (!plan.ok()) {
    state.SkipWithError(plan.status().ToString().c_str());
    return;
  }
  std::vector<std::vector<char>> memory;
  std::vector<LocalBuffers> buffers(2);
  for (const bool source : {true, false}) {
    for (const BufferInfo& buffer : source ? job->source().buffers : job->target().buffers) {
      memory.emplace_back(buffer.bytes, 0x3c);  // bf16 0x3c3c: about 0.0115, finite.
      buffers[source ? 0 : 1][buffer.id] = memory.back().data();
    }
  }
  const Endpoints endpoints{{0, 1}};
  ArenaCache arenas[2];
  uint64_t sync = 0;
  std::vector<absl::StatusOr<TransferStats>> results;
  for (auto _ : state) {
    ++sync;
    results = test::RunOnLoopbackThreads<absl::StatusOr<TransferStats>>(
        2, [&](int32_t p, std::unique_ptr<Transport> transport, Group& group) {
          ExecuteOptions options;
          options.sync_id = sync;
          options.plan_digest = plan->digest;
          options.deadline = absl::Now() + absl::Seconds(120);
          options.arenas = &arenas[p];
          options.quant = &plan->quant;
          return ExecuteTransfers(*job, plan->segments, endpoints, StagingBudget{}, p, buffers[p],
                                  *transport, group, options);
        });
    for (const auto& result : results) {
      if (!result.ok()) {
        state.SkipWithError(result.status().ToString().c_str());
        return;
      }
    }
  }
  state.SetBytesProcessed(state.iterations() * kRows * kCols * 2);  // bf16 bytes synced.
  state.counters["wire_bytes"] = static_cast<double>(results[0]->sent_bytes);
  state.counters["quantize_cpu_s"] = results[0]->quantize_cpu_seconds;
  state.counters["pack_cpu_s"] = results[0]->pack_cpu_seconds;
}

BENCHMARK_CAPTURE(BM_Sync, copy_bf16, ParamQuant{})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_Sync, fp8_block, ParamQuant{128, 128, ""})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Sync, fp8_channel, ParamQuant{1, quant::kWholeAxis, ""})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace wsync

BENCHMARK_MAIN();
