// Delta sync's chunk encoding (executor/delta_codec.h) and a sender's bases (delta_base.h) on host
// memory, bytes of the dense chunk per second of one thread (GB/s of input):
//   BM_EncodeDelta / BM_ApplyDelta: EncodeDelta (compare against the base, choose, write) and
//     ApplyDelta (patch a target holding the base).
//   BM_SenderChunk: what a sender does per chunk of a sync: the sampled check, the encoding
//     against its base and the base's update to what it sent (DeltaBaseStore).
//   BM_RecordFirst: a sync's Record of a chunk the store has never held (allocation, page faults).
// Updates: "adamw" is issue 44's realistic one (N(0, 0.02) fp32 masters cast to bf16 before and
// after one AdamW step at lr 1e-6 with normal gradients: Adam's normalized step is about +-lr per
// element whatever the gradients, so about 4 % of the bf16 elements move by an ulp, spread
// uniformly); "0" and "100" change no element and every element (the low byte flipped). These are
// the throughputs delta=auto weighs against a link's bandwidth (calibration measures them too).

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "executor/delta_base.h"
#include "executor/delta_codec.h"

namespace wsync {
namespace {

constexpr int64_t kChunkBytes = 4 << 20;
constexpr int kBf16Bytes = 2;

enum Update : int64_t { kNone = 0, kAll = 100, kAdamW = -1 };

struct Chunks {
  std::vector<uint8_t> base;
  std::vector<uint8_t> current;
};

uint16_t Bf16Of(float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  return static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

// One AdamW step (beta1 0.9, beta2 0.999, eps 1e-8, weight decay 0.01, first step: the bias-
// corrected update is g / (|g| + eps), about +-1) of fp32 masters at lr 1e-6, both sides in bf16.
Chunks AdamWStep(std::mt19937_64& random) {
  const int64_t elements = kChunkBytes / kBf16Bytes;
  std::normal_distribution<float> init(0.0f, 0.02f);
  std::normal_distribution<float> gradient(0.0f, 1.0f);
  Chunks chunks{std::vector<uint8_t>(kChunkBytes), std::vector<uint8_t>(kChunkBytes)};
  constexpr float kLr = 1e-6f, kDecay = 0.01f, kEps = 1e-8f;
  for (int64_t i = 0; i < elements; ++i) {
    const float master = init(random);
    const float g = gradient(random);
    const float m = 0.1f * g / 0.1f, v = 0.001f * g * g / 0.001f;  // Bias-corrected moments.
    const float next = master * (1 - kLr * kDecay) - kLr * m / (std::sqrt(v) + kEps);
    const uint16_t before = Bf16Of(master), after = Bf16Of(next);
    std::memcpy(chunks.base.data() + i * kBf16Bytes, &before, kBf16Bytes);
    std::memcpy(chunks.current.data() + i * kBf16Bytes, &after, kBf16Bytes);
  }
  return chunks;
}

Chunks MakeChunks(int64_t update) {
  std::mt19937_64 random(44);
  if (update == kAdamW) return AdamWStep(random);
  Chunks chunks{std::vector<uint8_t>(kChunkBytes), {}};
  for (uint8_t& byte : chunks.base) byte = static_cast<uint8_t>(random());
  chunks.current = chunks.base;
  std::bernoulli_distribution change(static_cast<double>(update) / 100.0);
  for (int64_t byte = 0; byte < kChunkBytes; byte += kBf16Bytes) {
    if (change(random)) chunks.current[byte] ^= 1;
  }
  return chunks;
}

void Label(benchmark::State& state, const Chunks& chunks, int64_t encoded_bytes) {
  state.SetBytesProcessed(state.iterations() * kChunkBytes);
  int64_t changed = 0;
  for (int64_t at = 0; at < kChunkBytes; at += kBf16Bytes) {
    changed += std::memcmp(&chunks.base[at], &chunks.current[at], kBf16Bytes) != 0;
  }
  state.counters["changed"] = static_cast<double>(changed) / (kChunkBytes / kBf16Bytes);
  state.counters["encoded/dense"] = static_cast<double>(encoded_bytes) / kChunkBytes;
}

void BM_EncodeDelta(benchmark::State& state) {
  const Chunks chunks = MakeChunks(state.range(0));
  std::vector<uint8_t> encoded;
  for (auto _ : state) {
    benchmark::DoNotOptimize(EncodeDelta(chunks.base, chunks.current, kBf16Bytes, &encoded));
  }
  Label(state, chunks, static_cast<int64_t>(encoded.size()));
}

void BM_ApplyDelta(benchmark::State& state) {
  const Chunks chunks = MakeChunks(state.range(0));
  std::vector<uint8_t> encoded;
  if (!EncodeDelta(chunks.base, chunks.current, kBf16Bytes, &encoded).ok()) {
    state.SkipWithError("EncodeDelta failed");
    return;
  }
  std::vector<uint8_t> target = chunks.base;
  for (auto _ : state) {
    state.PauseTiming();
    std::memcpy(target.data(), chunks.base.data(), kChunkBytes);  // The base again.
    state.ResumeTiming();
    benchmark::DoNotOptimize(ApplyDelta(encoded, kBf16Bytes, absl::MakeSpan(target)));
  }
  Label(state, chunks, static_cast<int64_t>(encoded.size()));
}

// The sender's work per chunk of a sync as delta_run.cc does it, against a store holding the
// base (advanced in place while encoding): every iteration starts from the base again (restored
// untimed).
void BM_SenderChunk(benchmark::State& state) {
  const Chunks chunks = MakeChunks(state.range(0));
  DeltaBaseStore store(int64_t{1} << 30);
  std::vector<uint8_t> encoded;
  for (auto _ : state) {
    state.PauseTiming();
    store.Record(1, chunks.base);
    store.Commit(1);
    encoded.clear();
    state.ResumeTiming();
    const absl::Span<uint8_t> base = *store.Advance(1, 1);
    if (SampledMostlyChanged(base, chunks.current, kBf16Bytes)) {
      store.Record(1, chunks.current);
      AppendDenseDelta(chunks.current, kBf16Bytes, &encoded);
    } else {
      benchmark::DoNotOptimize(
          AppendDeltaAdvancingBase(base, chunks.current, kBf16Bytes, &encoded));
    }
  }
  Label(state, chunks, static_cast<int64_t>(encoded.size()));
}

void BM_RecordFirst(benchmark::State& state) {
  const Chunks chunks = MakeChunks(kNone);
  for (auto _ : state) {
    DeltaBaseStore store(int64_t{1} << 30);
    for (uint64_t chunk = 0; chunk < 16; ++chunk) store.Record(chunk, chunks.current);
    state.PauseTiming();
    store = DeltaBaseStore(0);  // Freed untimed.
    state.ResumeTiming();
  }
  state.SetBytesProcessed(state.iterations() * kChunkBytes * 16);
}

BENCHMARK(BM_EncodeDelta)->Arg(kAdamW)->Arg(kNone)->Arg(kAll);
BENCHMARK(BM_ApplyDelta)->Arg(kAdamW)->Arg(kNone)->Arg(kAll);
BENCHMARK(BM_SenderChunk)->Arg(kAdamW)->Arg(kNone)->Arg(kAll);
BENCHMARK(BM_RecordFirst);

}  // namespace
}  // namespace wsync

BENCHMARK_MAIN();
