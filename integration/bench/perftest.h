#ifndef WSYNC_INTEGRATION_BENCH_PERFTEST_H_
#define WSYNC_INTEGRATION_BENCH_PERFTEST_H_

// Runs UCX's own benchmark, ucx_perftest, as the link limit that `wsync-bench sync` compares with.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace wsync::bench {

struct PerftestResult {
  std::vector<double> bytes_per_second;  // One per pair (concurrent pairs: each one's share).
  double seconds = 0;                    // Wall time of the slowest client.
};

// One ucx_perftest tag_bw run: `pairs` server and client processes on this machine, the clients
// started together, with UCX_TLS = `tls` (and UCX_NET_DEVICES = `devices` when set), each process
// killed at `limit`. Logs go under `dir`. With `wsync_settings`, the processes also get
// UcxDefaultSettings() (transport/ucx) where the environment does not set them, as wsync's
// processes do, so that both run UCX configured alike.
absl::StatusOr<PerftestResult> RunPerftest(const std::string& binary, const std::string& dir,
                                           const std::string& tls, const std::string& devices,
                                           int64_t size, int32_t iters, int32_t pairs,
                                           absl::Duration limit, bool wsync_settings = true);

// "UCX_NAME=value" for each of UcxDefaultSettings() that the environment does not set.
std::vector<std::string> WsyncUcxEnvironment();

// The whole file at `path` ("" when it cannot be read).
std::string ReadWholeFile(const std::string& path);
// The last `chars` characters of `text`, marked with "..." when cut.
std::string TailOf(const std::string& text, size_t chars = 600);

}  // namespace wsync::bench

#endif  // WSYNC_INTEGRATION_BENCH_PERFTEST_H_
