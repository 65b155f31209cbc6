#ifndef WSYNC_INTEGRATION_HARNESS_LAUNCHER_H_
#define WSYNC_INTEGRATION_HARNESS_LAUNCHER_H_

// Runs a whole wsync job on this machine for tests and benchmarks: a coordinator (`wsync
// coordinator`) and one wsync_test_worker per trainer and rollout process, each optionally inside
// a network namespace, then collects exit codes and the workers' STATS lines.

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace wsync::harness {

struct ProcessPlacement {
  std::string netns;                     // Run inside this network namespace; empty: this one.
  std::string node_id;                   // Node id the process reports.
  std::string net_devices;               // UCX_NET_DEVICES for it; empty: UCX's default.
  std::vector<std::string> extra_flags;  // Appended to this worker's command line.
};

struct JobSpec {
  std::string model = "qwen2.5-tiny";
  std::string from = "megatron(tp=2)";
  std::string to = "vllm(tp=2)";
  int trainers = 2;
  int rollouts = 2;
  std::string tls;  // UCX_TLS of every worker.
  int versions = 3;
  double budget = 64.0 * (1 << 20);
  std::string coordinator_netns;
  std::string coordinator_address = "127.0.0.1";
  // Per global process id (trainers first); missing entries: this namespace, node "local".
  std::vector<ProcessPlacement> placement;
  std::vector<std::string> extra_worker_flags;
  absl::Duration timeout = absl::Seconds(120);
  absl::Duration rendezvous_timeout = absl::Seconds(60);  // The coordinator's.
};

struct WorkerResult {
  int exit_code = -1;                                     // -1 when killed at the timeout.
  std::vector<std::map<std::string, std::string>> stats;  // One map per STATS line.
  std::string stderr_text;
};

struct JobResult {
  std::vector<WorkerResult> workers;  // By global process id.
  std::string coordinator_output;
  std::string secret;  // The job secret the processes were given, to check it never leaks.
};

// Runs the job; fails only when the job could not be started (binaries, temp files, the
// coordinator's port). Worker failures are reported in the result.
absl::StatusOr<JobResult> RunJob(const JobSpec& spec, const std::string& worker_binary,
                                 const std::string& cli_binary);

// Two network namespaces joined by a veth pair, with addresses 10.231.<n>.1 and .2; removed on
// destruction. Create returns nullopt with `reason` set where namespaces cannot be made (not root,
// no iproute2, no permission).
class NetnsPair {
 public:
  static std::optional<NetnsPair> Create(std::string* reason);
  ~NetnsPair();
  NetnsPair(NetnsPair&& other) noexcept;
  NetnsPair(const NetnsPair&) = delete;
  NetnsPair& operator=(const NetnsPair&) = delete;

  const std::string& ns(int side) const { return ns_[side]; }
  const std::string& device(int side) const { return device_[side]; }
  const std::string& address(int side) const { return address_[side]; }

 private:
  NetnsPair() = default;
  std::string ns_[2];
  std::string device_[2];
  std::string address_[2];
  bool owned_ = false;
};

}  // namespace wsync::harness

#endif  // WSYNC_INTEGRATION_HARNESS_LAUNCHER_H_
