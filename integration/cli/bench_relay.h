#ifndef WSYNC_INTEGRATION_CLI_BENCH_RELAY_H_
#define WSYNC_INTEGRATION_CLI_BENCH_RELAY_H_

// `wsync bench relay`: trainers in one network namespace, rollouts (several DP replicas) in
// another, joined by a veth that tc shapes well below shared memory. Runs the same job with relay
// `never` and `auto` (alternating, real wsync_test_worker processes over UCX: TCP across the veth,
// shared memory inside the rollouts' namespace, every byte verified) and prints, per mode, the
// inter-node bytes the transports carried, the measured seconds per sync and the cost model's
// prediction, and the ratio of the two modes. Needs root (ip netns, tc).

#include <cstdio>
#include <string>

#include "absl/status/status.h"

namespace wsync::cli {

// Text describing `wsync bench relay`'s flags, for `wsync help`.
std::string RelayBenchUsage();

// Runs the benchmark (flags already parsed), printing to `out`. Fails when namespaces or tc are
// unavailable, a job fails or a byte differs.
absl::Status RunRelayBench(std::FILE* out);

}  // namespace wsync::cli

#endif  // WSYNC_INTEGRATION_CLI_BENCH_RELAY_H_
