#include "integration/bench/bench_executor.h"

#include <sched.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/cpu_time.h"
#include "common/status.h"
#include "executor/execute.h"
#include "executor/executor.h"
#include "executor/schedule.h"
#include "integration/bench/bench_quant.h"
#include "integration/bench/bench_report.h"
#include "integration/bench/machine.h"
#include "integration/model_config/hf_config.h"
#include "planner/models.h"
#include "planner/named_layouts.h"
#include "planner/plan.h"
#include "planner/policy.h"
#include "transport/loopback/loopback.h"

namespace wsync::bench {
namespace {

// Page-aligned host memory, touched once so that page faults stay out of the timed runs.
class HostMemory {
 public:
  explicit HostMemory(int64_t bytes) : bytes_(bytes) {
    void* data = nullptr;
    if (posix_memalign(&data, 4096, std::max<int64_t>(bytes, 1)) != 0) data = nullptr;
    data_.reset(static_cast<char*>(data));
    if (data_ != nullptr) std::memset(data_.get(), 0, bytes);
  }
  char* data() const { return data_.get(); }
  int64_t bytes() const { return bytes_; }

 private:
  struct Free {
    void operator()(char* p) const { free(p); }
  };
  int64_t bytes_;
  std::unique_ptr<char, Free> data_;
};

struct ProcessMemory {
  LocalBuffers buffers;
  std::vector<std::unique_ptr<HostMemory>> owned;
};

absl::StatusOr<std::vector<ProcessMemory>> Allocate(const Job& job) {
  std::vector<ProcessMemory> memory(job.num_processes());
  for (int32_t p = 0; p < job.num_processes(); ++p) {
    const Layout& layout = job.IsSource(p) ? job.source() : job.target();
    const int32_t rank = job.processes()[p].rank;
    for (const BufferInfo& info : layout.buffers) {
      if (info.process != rank) continue;
      auto host = std::make_unique<HostMemory>(info.bytes);
      if (host->data() == nullptr) {
        return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", info.bytes, " bytes"));
      }
      if (job.IsSource(p)) {
        for (int64_t i = 0; i < info.bytes; ++i) host->data()[i] = static_cast<char>(i * 131 + p);
      }
      memory[p].buffers[info.id] = host->data();
      memory[p].owned.push_back(std::move(host));
    }
  }
  return memory;
}

struct SyncResult {
  double seconds = 0;          // Slowest process.
  TransferStats total;         // Summed over processes.
  int64_t packed_bytes = 0;    // Staged by trainers (they only send): packed into arenas.
  int64_t unpacked_bytes = 0;  // Staged by rollouts (they only receive): unpacked from arenas.
};

// Every process of a scenario over one loopback fabric, each with its Executor built once (as a
// connected job builds its own) and Run once per sync, reusing its arenas. Destroy before the
// memory its executors read.
struct Processes {
  explicit Processes(int32_t n) : fabric(n) {}
  LoopbackFabric fabric;
  Endpoints endpoints;
  std::vector<std::unique_ptr<Transport>> transports;
  std::vector<std::unique_ptr<Group>> groups;
  std::vector<std::unique_ptr<wsync::Executor>> executors;
};

absl::StatusOr<std::unique_ptr<Processes>> ConnectProcesses(const Job& job, const Plan& plan,
                                                            const StagingBudget& budget,
                                                            std::vector<ProcessMemory>& memory) {
  auto processes = std::make_unique<Processes>(job.num_processes());
  for (int32_t p = 0; p < job.num_processes(); ++p) processes->endpoints.processes.push_back(p);
  for (int32_t p = 0; p < job.num_processes(); ++p) {
    WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<Transport> transport, processes->fabric.Connect(p));
    WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<Group> group, processes->fabric.MakeGroup(p));
    processes->executors.push_back(std::make_unique<wsync::Executor>(
        job, plan.segments, /*quant=*/nullptr, processes->endpoints, budget, p, memory[p].buffers,
        *transport, *group));
    processes->transports.push_back(std::move(transport));
    processes->groups.push_back(std::move(group));
  }
  return processes;
}

absl::StatusOr<SyncResult> RunSync(const Job& job, const Plan& plan, Processes& processes,
                                   uint64_t sync_id) {
  std::vector<absl::StatusOr<TransferStats>> results(job.num_processes(),
                                                     absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int32_t p = 0; p < job.num_processes(); ++p) {
    threads.emplace_back([&, p] {
      SyncRequest sync;
      sync.sync_id = sync_id;
      sync.plan_digest = plan.digest;
      sync.deadline = absl::Now() + absl::Minutes(5);
      results[p] = processes.executors[p]->Run(sync);
    });
  }
  for (std::thread& thread : threads) thread.join();
  SyncResult result;
  for (int32_t p = 0; p < job.num_processes(); ++p) {
    WSYNC_RETURN_IF_ERROR(results[p].status());
    const TransferStats& s = *results[p];
    result.seconds = std::max(result.seconds, s.seconds);
    result.total.sent_bytes += s.sent_bytes;
    result.total.received_bytes += s.received_bytes;
    result.total.direct_bytes += s.direct_bytes;
    result.total.staged_bytes += s.staged_bytes;
    result.total.peak_arena_bytes += s.peak_arena_bytes;
    result.total.rounds = std::max(result.total.rounds, s.rounds);
    result.total.chunks += s.chunks;
    result.total.pack_cpu_seconds += s.pack_cpu_seconds;
    result.total.unpack_cpu_seconds += s.unpack_cpu_seconds;
    result.total.packed_ahead_messages += s.packed_ahead_messages;
    (job.IsSource(p) ? result.packed_bytes : result.unpacked_bytes) += s.staged_bytes;
  }
  return result;
}

// Thread CPU seconds to memcpy `bytes` once between two touched buffers of that size (so that no
// byte is served from a cache warmed by an earlier pass).
double TimeMemcpy(int64_t bytes) {
  HostMemory from(bytes), to(bytes);
  std::memset(from.data(), 7, bytes);
  const double start = ThreadCpuSeconds();
  std::memcpy(to.data(), from.data(), bytes);
  const double seconds = ThreadCpuSeconds() - start;
  if (to.data()[bytes - 1] != 7) std::abort();  // Keeps the copy observable.
  return seconds;
}

std::string GiB(double bytes) { return absl::StrFormat("%.2f GiB", bytes / (1 << 30)); }
std::string Rate(double bytes, double seconds) {
  return seconds > 0 ? absl::StrFormat("%.2f GB/s", bytes / seconds / 1e9) : "n/a";
}

// One scenario: the model from `from` to `to`, `repeats` syncs, pack/unpack against memcpy.
absl::Status RunScenario(const ModelSpec& model, const std::string& from, const std::string& to,
                         const ExecutorBenchOptions& options, std::FILE* out) {
  const int32_t repeats = options.repeats;
  WSYNC_ASSIGN_OR_RETURN(Layout source, BuildNamedLayout(model, from));
  WSYNC_ASSIGN_OR_RETURN(Layout target, BuildNamedLayout(model, to));
  WSYNC_ASSIGN_OR_RETURN(Job job, Job::Create(std::move(source), std::move(target)));
  WSYNC_ASSIGN_OR_RETURN(auto policy, MakeReplicaPolicy(options.policy));
  WSYNC_ASSIGN_OR_RETURN(Plan plan, MakePlan(job, *policy));
  const StagingBudget budget{options.budget};
  absl::FPrintF(out,
                "\n%s -> %s: %d processes, %d segments, budget %.0f bytes per peer "
                "direction\n",
                from, to, job.num_processes(), plan.segments.size(), budget.bytes);
  WSYNC_ASSIGN_OR_RETURN(std::vector<ProcessMemory> memory, Allocate(job));
  WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<Processes> processes,
                         ConnectProcesses(job, plan, budget, memory));

  std::vector<double> sync_seconds, pack_rates, unpack_rates, memcpy_rates, staged_rates;
  SyncResult last;
  // One untimed warm-up sync fills the arena caches.
  WSYNC_RETURN_IF_ERROR(RunSync(job, plan, *processes, 0).status());
  for (int32_t r = 0; r < repeats; ++r) {
    WSYNC_ASSIGN_OR_RETURN(last, RunSync(job, plan, *processes, r + 1));
    const double packed = last.total.pack_cpu_seconds;
    const double unpacked = last.total.unpack_cpu_seconds;
    sync_seconds.push_back(last.seconds);
    pack_rates.push_back(packed > 0 ? last.packed_bytes / packed : 0);
    unpack_rates.push_back(unpacked > 0 ? last.unpacked_bytes / unpacked : 0);
    staged_rates.push_back(packed + unpacked > 0 ? last.total.staged_bytes / (packed + unpacked)
                                                 : 0);
    if (last.total.staged_bytes > 0) {
      memcpy_rates.push_back(last.total.staged_bytes / TimeMemcpy(last.total.staged_bytes));
    }
  }
  absl::FPrintF(out,
                "  per sync: sent %s; direct %s, staged %s (both sides summed); %d rounds, "
                "%d chunks; arenas %s (all processes)\n",
                GiB(last.total.sent_bytes), GiB(last.total.direct_bytes),
                GiB(last.total.staged_bytes), last.total.rounds, last.total.chunks,
                GiB(last.total.peak_arena_bytes));
  absl::FPrintF(out, "  sync (median of %d): %.3f s, %s\n", repeats, Median(sync_seconds),
                Rate(last.total.sent_bytes, Median(sync_seconds)));
  absl::FPrintF(out, "  direct: %s sent from and received into the weights, no pack or unpack\n",
                GiB(last.total.direct_bytes));
  if (memcpy_rates.empty()) {
    absl::FPrintF(out, "  staged: none in this scenario\n");
    return absl::OkStatus();
  }
  const double staged = Median(staged_rates);
  const double memcpy_rate = Median(memcpy_rates);
  absl::FPrintF(
      out,
      "  staged, per CPU second: pack %.2f GB/s, unpack %.2f GB/s, pack+unpack %.2f GB/s; "
      "memcpy of the same bytes %.2f GB/s\n",
      Median(pack_rates) / 1e9, Median(unpack_rates) / 1e9, staged / 1e9, memcpy_rate / 1e9);
  absl::FPrintF(out, "  ratio pack+unpack / memcpy: %.2f (goal >= 0.70)\n", staged / memcpy_rate);
  absl::FPrintF(out,
                "  staged sends packed ahead of their round, with a sibling of another peer: %d "
                "per sync\n",
                last.total.packed_ahead_messages);
  return absl::OkStatus();
}

}  // namespace

absl::Status RunExecutorBench(const ExecutorBenchOptions& options, std::FILE* out) {
  if (options.repeats < 1 || options.layers < 1) {
    return absl::InvalidArgumentError("--repeats and --layers must be positive");
  }
  WSYNC_ASSIGN_OR_RETURN(ModelSpec model, LoadModel(options.model));
  if (options.layers < model.num_layers) {
    WSYNC_ASSIGN_OR_RETURN(model, TruncateLayers(model, options.layers));
  }
  absl::FPrintF(out,
                "wsync-bench executor: %s, loopback transport (threads), host memory\n"
                "  machine: %s\n  CPU flags: %s; %s\n",
                model.name, MachineDescription(), CpuVectorFlags(), Fp8KernelDescription());
  if (options.one_core) {
    // Threads started from here on inherit the mask.
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu() >= 0 ? sched_getcpu() : 0, &one);
    if (sched_setaffinity(0, sizeof(one), &one) == 0) {
      absl::FPrintF(out, "all threads pinned to one core (--one_core=false to lift)\n");
    }
  }
  std::vector<std::pair<std::string, std::string>> scenarios;
  if (!options.from.empty() || !options.to.empty()) {
    scenarios.emplace_back(options.from.empty() ? "megatron(tp=2)" : options.from,
                           options.to.empty() ? "vllm(tp=2)" : options.to);
  } else {
    // The same TP degree lands every chunk in place; a change of degree stages the row-parallel
    // (column-block) chunks on the side that holds them strided.
    scenarios = {{"megatron(tp=2)", "vllm(tp=2)"},
                 {"megatron(tp=4)", "vllm(tp=2)"},
                 {"megatron(tp=2)", "vllm(tp=4)"}};
  }
  for (const auto& [from, to] : scenarios) {
    WSYNC_RETURN_IF_ERROR(RunScenario(model, from, to, options, out));
  }
  return RunQuantizeScenario(model, options.repeats, out);
}

std::string ExecutorBenchUsage() {
  return "wsync-bench executor [--model M] [--layers N] [--from L] [--to L]\n"
         "                     [--staging_budget_bytes B] [--repeats K] [--replica_policy P]\n"
         "                     [--one_core]\n"
         "  Runs M (default llama-3-8b cut to 2 layers) between two layouts (default: tp=2 to\n"
         "  tp=2, 4 to 2 and 2 to 4) over the loopback transport and prints the direct and\n"
         "  staged bytes and pack+unpack throughput against memcpy of the same bytes; then\n"
         "  quantizes M's FP8 weights from bf16 (block, channel, tensor scales) with every FP8\n"
         "  kernel the CPU runs (portable, avx2, avx512) against memcpy, side by side.\n";
}

}  // namespace wsync::bench
