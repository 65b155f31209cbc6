#ifndef WSYNC_INTEGRATION_BENCH_FLAGS_H_
#define WSYNC_INTEGRATION_BENCH_FLAGS_H_

// wsync-bench's command-line flags (Abseil flags, one registry for the binary) and the one place
// per benchmark where they are read: each function below fills that benchmark's options struct
// from the parsed flags. Nothing else in wsync-bench reads a flag; the benchmarks get their
// options passed down. Call after absl::ParseCommandLine.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "integration/bench/bench_compare.h"
#include "integration/bench/bench_delta.h"
#include "integration/bench/bench_executor.h"
#include "integration/bench/bench_predict.h"
#include "integration/bench/bench_relay.h"
#include "integration/bench/bench_sync.h"

namespace wsync::bench {

// Takes the session settings given as arguments (every --<setting>=<value> or --<setting> <value>
// of the settings table, plugin/settings.h: --replica_policy, --staging_budget_bytes, --verify,
// --delta, ...) out of argv, before absl::ParseCommandLine, and keeps them for the functions
// below: the plans' replica policy and staging budget, and the arguments handed to every
// wsync_host (JobOptions::settings). A later call replaces them (argv with none: none).
// InvalidArgument naming the flag for a value its setting does not take.
absl::Status TakeSettingFlags(int* argc, char** argv);

ExecutorBenchOptions ExecutorOptionsFromFlags();
SyncBenchOptions SyncOptionsFromFlags();
// `command`: the command line, recorded in compare.json.
CompareBenchOptions CompareOptionsFromFlags(const std::string& command);
PredictBenchOptions PredictOptionsFromFlags();
RelayBenchOptions RelayOptionsFromFlags();
DeltaBenchOptions DeltaOptionsFromFlags();

// `wsync-bench memcpy`'s bytes and the source's byte value.
struct MemcpyOptions {
  int64_t bytes = 0;
  int32_t pattern = 0x5a;
};
MemcpyOptions MemcpyOptionsFromFlags();

}  // namespace wsync::bench

#endif  // WSYNC_INTEGRATION_BENCH_FLAGS_H_
