// Planner benchmarks (Google Benchmark 1.7.1): building both named layouts, validating them into a
// Job, and planning for one process or for all of them, for the cases of issue 2:
//   kimi-k2     megatron(pp=16,ep=16) -> vllm(tp=8,ep=8,dp=16)   (256 + 128 processes)
//   llama-3-8b  megatron(tp=4,dp=2)   -> vllm(tp=2,dp=4)          (8 + 8 processes)
// The large cases run a small fixed number of iterations so the binary finishes in well under two
// minutes on a 2-core machine. Times are wall-clock (UseRealTime). Counters: pieces of both
// layouts, and the segments, bytes and replica requests of each plan.

#include <benchmark/benchmark.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/status.h"
#include "planner/job.h"
#include "planner/layout.h"
#include "planner/models.h"
#include "planner/named_layouts.h"
#include "planner/plan.h"
#include "planner/policy.h"

namespace wsync {
namespace {

struct Case {
  const char* model;
  const char* from;
  const char* to;
};
constexpr Case kKimi{"kimi-k2", "megatron(pp=16,ep=16)", "vllm(tp=8,ep=8,dp=16)"};
constexpr Case kLlama{"llama-3-8b", "megatron(tp=4,dp=2)", "vllm(tp=2,dp=4)"};

// Which processes a plan is made for.
enum class Scope { kTrainer0, kRollout0, kAll };

constexpr char kPolicy[] = "local_first_least_loaded";

struct Layouts {
  Layout source;
  Layout target;
};

absl::StatusOr<Layouts> BuildLayouts(const Case& c) {
  WSYNC_ASSIGN_OR_RETURN(const ModelSpec model, GetModel(c.model));
  Layouts layouts;
  WSYNC_ASSIGN_OR_RETURN(layouts.source, BuildNamedLayout(model, c.from));
  WSYNC_ASSIGN_OR_RETURN(layouts.target, BuildNamedLayout(model, c.to));
  return layouts;
}

// The layouts and job of a case, built on first use outside any timed region and kept for the life
// of the binary. Benchmarks run one at a time, so the cache needs no lock.
struct Prepared {
  Layouts layouts;
  std::optional<Job> job;
};

absl::StatusOr<const Prepared*> Prepare(const Case& c) {
  static auto* cache = new std::map<const Case*, std::unique_ptr<Prepared>>();
  auto it = cache->find(&c);
  if (it != cache->end()) return it->second.get();
  auto prepared = std::make_unique<Prepared>();
  WSYNC_ASSIGN_OR_RETURN(prepared->layouts, BuildLayouts(c));
  Layouts copy = prepared->layouts;
  WSYNC_ASSIGN_OR_RETURN(Job job, Job::Create(std::move(copy.source), std::move(copy.target)));
  prepared->job.emplace(std::move(job));
  return cache->emplace(&c, std::move(prepared)).first->second.get();
}

void SkipWithError(benchmark::State& state, const absl::Status& status) {
  state.SkipWithError(status.ToString().c_str());
}

benchmark::Counter Bytes(int64_t bytes) {
  return benchmark::Counter(static_cast<double>(bytes), benchmark::Counter::kDefaults,
                            benchmark::Counter::OneK::kIs1024);
}

// GetModel and both BuildNamedLayout calls.
void BM_BuildLayouts(benchmark::State& state, const Case* c) {
  int64_t pieces = 0;
  for (auto _ : state) {
    absl::StatusOr<Layouts> layouts = BuildLayouts(*c);
    if (!layouts.ok()) {
      SkipWithError(state, layouts.status());
      return;
    }
    pieces = static_cast<int64_t>(layouts->source.pieces.size() + layouts->target.pieces.size());
    benchmark::DoNotOptimize(layouts);
  }
  state.counters["pieces"] = static_cast<double>(pieces);
}

// Job::Create: validation of both layouts and of the pair, and canonical ordering. Copying the
// layouts in and destroying the previous job are not timed.
void BM_JobCreate(benchmark::State& state, const Case* c) {
  absl::StatusOr<const Prepared*> prepared = Prepare(*c);
  if (!prepared.ok()) return SkipWithError(state, prepared.status());
  std::optional<Job> job;
  for (auto _ : state) {
    state.PauseTiming();
    job.reset();
    Layouts copy = (*prepared)->layouts;
    state.ResumeTiming();
    absl::StatusOr<Job> created = Job::Create(std::move(copy.source), std::move(copy.target));
    if (!created.ok()) return SkipWithError(state, created.status());
    job.emplace(*std::move(created));
  }
  state.counters["pieces"] =
      static_cast<double>(job->source().pieces.size() + job->target().pieces.size());
}

// MakePlan with the local_first_least_loaded policy, for one process or all.
void BM_Plan(benchmark::State& state, const Case* c, Scope scope) {
  absl::StatusOr<const Prepared*> prepared = Prepare(*c);
  if (!prepared.ok()) return SkipWithError(state, prepared.status());
  const Job& job = *(*prepared)->job;
  absl::StatusOr<std::unique_ptr<ReplicaPolicy>> policy = MakeReplicaPolicy(kPolicy);
  if (!policy.ok()) return SkipWithError(state, policy.status());
  PlanOptions options;
  if (scope == Scope::kTrainer0) options.process = job.SourceId(0);
  if (scope == Scope::kRollout0) options.process = job.TargetId(0);
  Plan plan;
  for (auto _ : state) {
    absl::StatusOr<Plan> made = MakePlan(job, **policy, options);
    if (!made.ok()) return SkipWithError(state, made.status());
    plan = *std::move(made);
  }
  int64_t bytes = 0;
  for (const Segment& segment : plan.segments) {
    bytes += segment.elements() * job.ElementSize(segment.param);
  }
  state.counters["segments"] = static_cast<double>(plan.segments.size());
  state.counters["requests"] = static_cast<double>(plan.requests.size());
  state.counters["bytes"] = Bytes(bytes);
}

// kimi-k2: a fixed, small number of iterations (each is 0.1 s to seconds).
BENCHMARK_CAPTURE(BM_BuildLayouts, kimi_k2, &kKimi)
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_JobCreate, kimi_k2, &kKimi)
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Plan, kimi_k2_trainer0, &kKimi, Scope::kTrainer0)
    ->Iterations(5)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Plan, kimi_k2_rollout0, &kKimi, Scope::kRollout0)
    ->Iterations(5)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Plan, kimi_k2_all, &kKimi, Scope::kAll)
    ->Iterations(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// llama-3-8b: small enough for Google Benchmark's automatic iteration count.
BENCHMARK_CAPTURE(BM_BuildLayouts, llama_3_8b, &kLlama)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_JobCreate, llama_3_8b, &kLlama)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_Plan, llama_3_8b_trainer0, &kLlama, Scope::kTrainer0)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Plan, llama_3_8b_rollout0, &kLlama, Scope::kRollout0)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Plan, llama_3_8b_all, &kLlama, Scope::kAll)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace wsync

BENCHMARK_MAIN();
