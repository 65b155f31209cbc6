#ifndef WSYNC_INTEGRATION_CLI_BENCH_COMMAND_H_
#define WSYNC_INTEGRATION_CLI_BENCH_COMMAND_H_

// `wsync bench executor`: runs a model's resharding on the in-process loopback transport (threads
// stand in for processes, host memory) and measures the executor's pack and unpack throughput
// against memcpy of the same bytes, side by side in one run.

#include <string>

namespace wsync::cli {

// Text describing `wsync bench`'s flags, for `wsync help`.
std::string BenchUsage();

// Entry point: argv[0] is "bench", argv[1] the benchmark ("executor"), the rest its flags.
// Returns 0 on success, 1 when the run fails or a byte differs, 2 for a usage error.
int BenchMain(int argc, char** argv);

}  // namespace wsync::cli

#endif  // WSYNC_INTEGRATION_CLI_BENCH_COMMAND_H_
