// The per-chunk digests of verify (executor/verify.h) on host memory, bytes per second of one
// thread: xxh3-64 (VerifyMode::kHash), the keyed chunk MAC that kKeyed uses (GMAC with AES-256
// and a wrapped tag, executor/chunk_mac.h), and HMAC-SHA256, the alternative considered for it.

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/data_key.h"
#include "common/hash.h"
#include "executor/chunk_mac.h"

namespace wsync {
namespace {

std::vector<unsigned char> RandomBytes(int64_t bytes) {
  std::vector<unsigned char> data(bytes);
  std::mt19937_64 rng(1);
  for (unsigned char& byte : data) byte = static_cast<unsigned char>(rng());
  return data;
}

void BM_Xxh3(benchmark::State& state) {
  const std::vector<unsigned char> data = RandomBytes(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(Xxh3(data.data(), data.size()));
  state.SetBytesProcessed(state.iterations() * state.range(0));
}

void BM_ChunkMac(benchmark::State& state) {
  const std::vector<unsigned char> data = RandomBytes(state.range(0));
  const DataKey key = *DeriveDataKey("benchmark secret", "benchmark job");
  const std::unique_ptr<executor_internal::LaneMac> mac =
      *executor_internal::LaneMac::Create(key, executor_internal::MacBinding{1, 0, 1});
  uint64_t position = 0;
  for (auto _ : state) benchmark::DoNotOptimize(*mac->Of(data.data(), data.size(), position++));
  state.SetBytesProcessed(state.iterations() * state.range(0));
}

void BM_HmacSha256(benchmark::State& state) {
  const std::vector<unsigned char> data = RandomBytes(state.range(0));
  const DataKey key = *DeriveDataKey("benchmark secret", "benchmark job");
  unsigned char tag[32];
  unsigned int length = 0;
  for (auto _ : state) {
    HMAC(EVP_sha256(), key.bytes().data(), static_cast<int>(key.bytes().size()), data.data(),
         data.size(), tag, &length);
    benchmark::DoNotOptimize(tag[0]);
  }
  state.SetBytesProcessed(state.iterations() * state.range(0));
}

// Chunks of 4 KiB (small parameters) to 4 MiB.
BENCHMARK(BM_Xxh3)->RangeMultiplier(16)->Range(4 << 10, 4 << 20);
BENCHMARK(BM_ChunkMac)->RangeMultiplier(16)->Range(4 << 10, 4 << 20);
BENCHMARK(BM_HmacSha256)->RangeMultiplier(16)->Range(4 << 10, 4 << 20);

}  // namespace
}  // namespace wsync

BENCHMARK_MAIN();
