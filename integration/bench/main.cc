// wsync-bench, the benchmarks of wsync: `wsync-bench <benchmark> [flags]`. The benchmark is
// argv[1] (dispatched as the CLI dispatches its commands, integration/cli/subcommands.h); flags
// are parsed once and read into the benchmark's options struct (flags.h), which is all the
// benchmark sees. Exit status: 0 on success, 1 when the benchmark fails, 2 for a usage error.

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "integration/bench/bench_compare.h"
#include "integration/bench/bench_delta.h"
#include "integration/bench/bench_executor.h"
#include "integration/bench/bench_predict.h"
#include "integration/bench/bench_relay.h"
#include "integration/bench/bench_sync.h"
#include "integration/bench/flags.h"
#include "integration/cli/subcommands.h"

namespace wsync::bench {
namespace {

std::string MemcpyUsage() {
  return "wsync-bench memcpy --compare_memcpy_bytes N [--compare_memcpy_pattern P]\n"
         "  Internal: compare's memcpy limit, run as its child process so that the launcher's\n"
         "  memory does not count in the children's peak RSS. Prints \"MEMCPY seconds=S "
         "bytes=N\".\n";
}

std::string CommonUsage() {
  return "flags of every benchmark that launches wsync jobs (sync, compare, predict, relay, "
         "delta):\n"
         "  --sync_worker PATH  the jobs' host program, wsync_host (libwsync.so through its\n"
         "                      C ABI; default: next to wsync-bench, else integration/host/\n"
         "                      of its build tree)\n"
         "  --wsync PATH        the wsync CLI, for `wsync coordinator` and `wsync calibrate`\n"
         "                      (default: next to wsync-bench, else integration/cli/ of its\n"
         "                      build tree)\n"
         "  --sync_timeout_s S, --verify_elements: see each benchmark\n"
         "  --<setting>=VALUE   any session setting (`wsync settings` lists them), handed to\n"
         "                      every wsync_host; --replica_policy and --staging_budget_bytes\n"
         "                      also set the plans the benchmarks make themselves\n";
}

// The command line as one string (words with spaces or shell characters quoted), for the JSON;
// argv[0] is the benchmark.
std::string CommandLine(int argc, char** argv) {
  std::vector<std::string> words = {"wsync-bench"};
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    words.push_back(arg.find_first_of(" ();,'") == std::string::npos ? arg : "'" + arg + "'");
  }
  return absl::StrJoin(words, " ");
}

// Parses the flags (argv[0], the benchmark, stands in for the program name), runs the benchmark
// with its options, and turns its status into the exit status.
template <absl::Status (*Run)(int argc, char** argv)>
int Main(int argc, char** argv) {
  if (const absl::Status taken = TakeSettingFlags(&argc, argv); !taken.ok()) {
    absl::FPrintF(stderr, "wsync-bench %s: %s\n", argv[0], taken.message());
    return 2;
  }
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = Run(argc, argv);
  if (!status.ok()) {
    absl::FPrintF(stderr, "wsync-bench %s: %s\n", argv[0], status.ToString());
    return 1;
  }
  return 0;
}

absl::Status Executor(int, char**) { return RunExecutorBench(ExecutorOptionsFromFlags(), stdout); }
absl::Status Sync(int, char**) { return RunSyncBench(SyncOptionsFromFlags(), stdout); }
absl::Status Compare(int argc, char** argv) {
  return RunCompareBench(CompareOptionsFromFlags(CommandLine(argc, argv)), stdout);
}
absl::Status Predict(int, char**) { return RunPredictBench(PredictOptionsFromFlags(), stdout); }
absl::Status Relay(int, char**) { return RunRelayBench(RelayOptionsFromFlags(), stdout); }
absl::Status Delta(int, char**) { return RunDeltaBench(DeltaOptionsFromFlags(), stdout); }
absl::Status Memcpy(int, char**) {
  const MemcpyOptions options = MemcpyOptionsFromFlags();
  return RunMemcpyProbe(options.bytes, options.pattern, stdout);
}

// A benchmark's help: "usage: " and its usage, then the flags the job-launching ones share.
template <std::string (*Usage)()>
std::string Help() {
  return absl::StrCat("usage: ", Usage(), "\n", CommonUsage());
}

constexpr cli::Subcommand kBenchmarks[] = {
    {"executor", Help<ExecutorBenchUsage>, Main<Executor>},
    {"sync", Help<SyncBenchUsage>, Main<Sync>},
    {"compare", Help<CompareBenchUsage>, Main<Compare>},
    {"predict", Help<PredictBenchUsage>, Main<Predict>},
    {"relay", Help<RelayBenchUsage>, Main<Relay>},
    {"delta", Help<DeltaBenchUsage>, Main<Delta>},
    {"memcpy", Help<MemcpyUsage>, Main<Memcpy>},
};

std::string Usage() {
  std::string text = absl::StrCat(
      "usage: wsync-bench <benchmark> [flags]\n\nbenchmarks:\n"
      "  executor  the executor's pack and unpack on the loopback transport, and FP8\n"
      "            quantization, against memcpy\n"
      "  sync      real processes over UCX shared memory and TCP against ucx_perftest\n"
      "  compare   wsync against the per-parameter and bucketed broadcasts and the link limits\n"
      "  predict   the cost model's predictions against measured syncs, per scenario\n"
      "  relay     relay never against auto across two tc-shaped network namespaces (root;\n"
      "            refused for now: the C ABI has no relay setting)\n"
      "  delta     issue 44's scenario: AdamW updates synced dense against delta=on and auto\n"
      "            over TCP, shared memory and a tc-shaped 1 Gbit/s link (root)\n"
      "  memcpy    internal: compare's memcpy limit, run as its child\n"
      "  help      print this message; `wsync-bench help BENCHMARK` or `wsync-bench BENCHMARK\n"
      "            --help`: its usage\n\n",
      CommonUsage());
  for (std::string (*usage)() :
       {ExecutorBenchUsage, SyncBenchUsage, CompareBenchUsage, PredictBenchUsage, RelayBenchUsage,
        DeltaBenchUsage, MemcpyUsage}) {
    absl::StrAppend(&text, "\n", usage());
  }
  return text;
}

}  // namespace
}  // namespace wsync::bench

int main(int argc, char** argv) {
  return wsync::cli::RunSubcommand("wsync-bench", "benchmark", wsync::bench::kBenchmarks,
                                   wsync::bench::Usage(), argc, argv);
}
