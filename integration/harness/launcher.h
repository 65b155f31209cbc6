#ifndef WSYNC_INTEGRATION_HARNESS_LAUNCHER_H_
#define WSYNC_INTEGRATION_HARNESS_LAUNCHER_H_

// Runs a whole wsync job on this machine for tests and benchmarks: a coordinator (`wsync
// coordinator`) and one wsync_test_worker per trainer and rollout process, each optionally inside
// a network namespace, then collects exit codes and the workers' STATS lines. RunProcesses is the
// generic form: the caller builds every process's command line (`wsync demo` launches plugin hosts
// whose trainer rank 0 runs the coordinator itself).

#include <sys/types.h>

#include <cstdint>
#include <functional>
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
  int64_t peak_rss_bytes = 0;  // Peak resident set (wait4's ru_maxrss).
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

// A set of processes whose command lines the caller builds, started together and watched until
// all have exited.
struct ProcessesSpec {
  int processes = 0;
  // The argv of process p, 0 <= p < processes (argv[0] is looked up in PATH when it has no '/').
  std::function<std::vector<std::string>(int process)> command;
  // "NAME=value" entries added to every process's environment (e.g. the job secret, which thus
  // never appears on a command line).
  std::vector<std::string> env;
  // Every process still running then is killed (SIGKILL).
  absl::Duration timeout = absl::Seconds(120);
  // Once a process exits with a non-zero status or a signal, the others get this long to end
  // (they usually fail on their own once a peer is gone) before they are killed.
  absl::Duration failure_grace = absl::Seconds(15);
  absl::Duration poll_interval = absl::Milliseconds(100);
  // Called every poll_interval while processes run, and once after all ended, with every
  // process's standard output so far (by process); for progress displays.
  std::function<void(const std::vector<std::string>& outputs)> on_poll;
  // Called on every poll with the whole lines each process wrote to its standard error since the
  // last call (by process; each line ends in '\n'), and once after all ended with whatever is
  // left; for forwarding the processes' logs (`WSYNC_LOG=all wsync demo`). Null: not read.
  std::function<void(const std::vector<std::string>& new_lines)> on_stderr;
};

struct ProcessResult {
  int exit_code = -1;          // -1 when killed or ended by a signal.
  int term_signal = 0;         // The signal that ended it, if one did.
  bool killed = false;         // Killed at the timeout or after failure_grace.
  int64_t peak_rss_bytes = 0;  // Peak resident set (wait4's ru_maxrss).
  std::string stdout_text;
  std::string stderr_text;
};

// Runs the processes; fails only when they could not be started (temp files, a binary that
// cannot be spawned: the ones already started are killed). Process failures are in the result,
// by process.
absl::StatusOr<std::vector<ProcessResult>> RunProcesses(const ProcessesSpec& spec);

// A TCP port on `address` (a literal IPv4 address) that was free a moment ago (bound and
// released), for a process that must listen on a port chosen before it starts. The port is drawn
// at random below the kernel's ephemeral range (net.ipv4.ip_local_port_range), so neither a
// bind to port 0 nor an outgoing connection, of this process or another, can take it between the
// pick and the listen; another explicit bind still can, which that listen then reports. Where the
// range leaves no room below it, the kernel picks (bind to port 0).
absl::StatusOr<int> PickFreePort(const std::string& address = "127.0.0.1");

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

// A process on side `side` of `net`, reporting node "node-a" (side 0) or "node-b" (side 1), with
// UCX shared memory to the processes of its node and TCP over the veth to the other node's.
ProcessPlacement TwoNodePlacement(const NetnsPair& net, int side);

}  // namespace wsync::harness

#endif  // WSYNC_INTEGRATION_HARNESS_LAUNCHER_H_
