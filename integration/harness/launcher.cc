#include "integration/harness/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/random/random.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

extern char** environ;

namespace wsync::harness {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Starts argv with stdout and stderr redirected to files and `extra_env` added to the environment.
absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const std::string& out_path,
                            const std::string& err_path,
                            const std::vector<std::string>& extra_env) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0600);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0600);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_storage(extra_env);
  for (char** e = environ; *e != nullptr; ++e) env_storage.emplace_back(*e);
  std::vector<char*> env;
  for (std::string& e : env_storage) env.push_back(e.data());
  env.push_back(nullptr);
  pid_t pid = 0;
  const int error = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), env.data());
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0) {
    return absl::InternalError(absl::StrCat("cannot start ", argv[0], ": errno ", error));
  }
  return pid;
}

// Peak resident set of a reaped child, from wait4's rusage (ru_maxrss is in KiB on Linux).
int64_t PeakRssBytes(const rusage& usage) { return static_cast<int64_t>(usage.ru_maxrss) * 1024; }

// Waits for `pid` until `deadline`; kills it then. Returns the exit code, or -1 when killed or
// signalled; sets *peak_rss_bytes (when not null) to the child's peak resident set.
int WaitFor(pid_t pid, absl::Time deadline, int64_t* peak_rss_bytes = nullptr) {
  int status = 0;
  rusage usage = {};
  while (true) {
    const pid_t done = wait4(pid, &status, WNOHANG, &usage);
    if (done == pid) break;
    if (absl::Now() > deadline) {
      kill(pid, SIGKILL);
      wait4(pid, &status, 0, &usage);
      if (peak_rss_bytes != nullptr) *peak_rss_bytes = PeakRssBytes(usage);
      return -1;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (peak_rss_bytes != nullptr) *peak_rss_bytes = PeakRssBytes(usage);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::vector<std::string> InNamespace(const std::string& netns, std::vector<std::string> argv) {
  if (netns.empty()) return argv;
  std::vector<std::string> wrapped = {"ip", "netns", "exec", netns};
  wrapped.insert(wrapped.end(), argv.begin(), argv.end());
  return wrapped;
}

std::vector<std::map<std::string, std::string>> ParseStats(const std::string& text) {
  std::vector<std::map<std::string, std::string>> stats;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, "STATS ")) continue;
    std::map<std::string, std::string>& fields = stats.emplace_back();
    for (absl::string_view field : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
      std::pair<std::string, std::string> kv = absl::StrSplit(field, absl::MaxSplits('=', 1));
      fields[kv.first] = kv.second;
    }
  }
  return stats;
}

int Run(const std::string& command) { return std::system(command.c_str()); }

}  // namespace

absl::StatusOr<JobResult> RunJob(const JobSpec& spec, const std::string& worker_binary,
                                 const std::string& cli_binary) {
  char dir_template[] = "/tmp/wsync-job-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) return absl::InternalError("mkdtemp failed");
  const std::string dir = dir_template;
  const std::string secret_env = absl::StrCat("WSYNC_SECRET=test-secret-0123456789-", getpid(), "-",
                                              absl::ToUnixNanos(absl::Now()));
  const std::vector<std::string> env = {secret_env};
  const std::string port_file = dir + "/port";
  const std::string job_id = absl::StrCat("job-", getpid());

  absl::StatusOr<pid_t> coordinator =
      Spawn(InNamespace(spec.coordinator_netns,
                        {cli_binary, "coordinator", "--job", job_id, "--trainers",
                         absl::StrCat(spec.trainers), "--rollouts", absl::StrCat(spec.rollouts),
                         "--secret_env", "WSYNC_SECRET", "--address", spec.coordinator_address,
                         "--port_file", port_file, "--rendezvous_timeout_s",
                         absl::StrCat(absl::ToDoubleSeconds(spec.rendezvous_timeout))}),
            dir + "/coordinator.out", dir + "/coordinator.err", env);
  if (!coordinator.ok()) return coordinator.status();
  int port = 0;
  const absl::Time port_deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < port_deadline) {
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(ReadFile(port_file)), &port) && port > 0) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (port <= 0) {
    kill(*coordinator, SIGKILL);
    waitpid(*coordinator, nullptr, 0);
    return absl::UnavailableError(
        absl::StrCat("the coordinator did not start: ", ReadFile(dir + "/coordinator.err")));
  }

  const int total = spec.trainers + spec.rollouts;
  std::vector<pid_t> pids(total, -1);
  for (int p = 0; p < total; ++p) {
    const bool trainer = p < spec.trainers;
    const ProcessPlacement placement =
        p < static_cast<int>(spec.placement.size()) ? spec.placement[p] : ProcessPlacement{};
    std::vector<std::string> argv = {worker_binary,
                                     "--coordinator_host",
                                     spec.coordinator_address,
                                     "--coordinator_port",
                                     absl::StrCat(port),
                                     "--job",
                                     job_id,
                                     "--role",
                                     trainer ? "trainer" : "rollout",
                                     "--rank",
                                     absl::StrCat(trainer ? p : p - spec.trainers),
                                     "--node_id",
                                     placement.node_id.empty() ? "local" : placement.node_id,
                                     "--model",
                                     spec.model,
                                     "--from",
                                     spec.from,
                                     "--to",
                                     spec.to,
                                     "--tls",
                                     spec.tls,
                                     "--net_devices",
                                     placement.net_devices,
                                     "--versions",
                                     absl::StrCat(spec.versions),
                                     "--staging_budget_bytes",
                                     absl::StrCat(static_cast<int64_t>(spec.budget))};
    argv.insert(argv.end(), spec.extra_worker_flags.begin(), spec.extra_worker_flags.end());
    argv.insert(argv.end(), placement.extra_flags.begin(), placement.extra_flags.end());
    absl::StatusOr<pid_t> pid =
        Spawn(InNamespace(placement.netns, argv), absl::StrCat(dir, "/worker", p, ".out"),
              absl::StrCat(dir, "/worker", p, ".err"), env);
    if (!pid.ok()) {
      for (pid_t started : pids) {
        if (started > 0) kill(started, SIGKILL);
      }
      kill(*coordinator, SIGKILL);
      return pid.status();
    }
    pids[p] = *pid;
  }

  JobResult result;
  result.secret = secret_env.substr(secret_env.find('=') + 1);
  result.workers.resize(total);
  const absl::Time deadline = absl::Now() + spec.timeout;
  for (int p = 0; p < total; ++p) {
    WorkerResult& worker = result.workers[p];
    worker.exit_code = WaitFor(pids[p], deadline, &worker.peak_rss_bytes);
    worker.stats = ParseStats(ReadFile(absl::StrCat(dir, "/worker", p, ".out")));
    worker.stderr_text = ReadFile(absl::StrCat(dir, "/worker", p, ".err"));
  }
  kill(*coordinator, SIGTERM);
  WaitFor(*coordinator, absl::Now() + absl::Seconds(10));
  result.coordinator_output =
      ReadFile(dir + "/coordinator.out") + ReadFile(dir + "/coordinator.err");
  Run(absl::StrCat("rm -rf '", dir, "'"));
  return result;
}

absl::StatusOr<std::vector<ProcessResult>> RunProcesses(const ProcessesSpec& spec) {
  if (spec.processes < 0 || !spec.command) {
    return absl::InvalidArgumentError("RunProcesses needs a process count and a command");
  }
  char dir_template[] = "/tmp/wsync-processes-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) return absl::InternalError("mkdtemp failed");
  const std::string dir = dir_template;
  auto out_path = [&](int p) { return absl::StrCat(dir, "/process", p, ".out"); };
  auto err_path = [&](int p) { return absl::StrCat(dir, "/process", p, ".err"); };

  std::vector<pid_t> pids(spec.processes, -1);
  for (int p = 0; p < spec.processes; ++p) {
    absl::StatusOr<pid_t> pid = Spawn(spec.command(p), out_path(p), err_path(p), spec.env);
    if (!pid.ok()) {
      for (pid_t started : pids) {
        if (started > 0) {
          kill(started, SIGKILL);
          waitpid(started, nullptr, 0);
        }
      }
      Run(absl::StrCat("rm -rf '", dir, "'"));
      return pid.status();
    }
    pids[p] = *pid;
  }

  std::vector<ProcessResult> results(spec.processes);
  std::vector<bool> running(spec.processes, true);
  int remaining = spec.processes;
  const absl::Time deadline = absl::Now() + spec.timeout;
  std::optional<absl::Time> kill_at;  // Set by the first failure.
  auto outputs = [&] {
    std::vector<std::string> texts;
    for (int p = 0; p < spec.processes; ++p) texts.push_back(ReadFile(out_path(p)));
    return texts;
  };
  std::vector<size_t> stderr_forwarded(spec.processes, 0);
  // Hands on_stderr the new whole lines of each process (`last`: everything new).
  auto forward_stderr = [&](bool last) {
    if (!spec.on_stderr) return;
    std::vector<std::string> lines(spec.processes);
    for (int p = 0; p < spec.processes; ++p) {
      const std::string text = ReadFile(err_path(p));
      const size_t end = last ? text.size() : text.rfind('\n') + 1;  // npos + 1 == 0.
      if (end <= stderr_forwarded[p]) continue;
      lines[p] = text.substr(stderr_forwarded[p], end - stderr_forwarded[p]);
      stderr_forwarded[p] = end;
    }
    spec.on_stderr(lines);
  };
  while (remaining > 0) {
    for (int p = 0; p < spec.processes; ++p) {
      if (!running[p]) continue;
      int status = 0;
      rusage usage = {};
      if (wait4(pids[p], &status, WNOHANG, &usage) != pids[p]) continue;
      results[p].peak_rss_bytes = PeakRssBytes(usage);
      running[p] = false;
      --remaining;
      results[p].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      results[p].term_signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      if (results[p].exit_code != 0 && !kill_at.has_value()) {
        kill_at = absl::Now() + spec.failure_grace;
      }
    }
    if (remaining == 0) break;
    const absl::Time now = absl::Now();
    if (now > deadline || (kill_at.has_value() && now > *kill_at)) {
      for (int p = 0; p < spec.processes; ++p) {
        if (!running[p]) continue;
        kill(pids[p], SIGKILL);
        rusage usage = {};
        wait4(pids[p], nullptr, 0, &usage);
        results[p].peak_rss_bytes = PeakRssBytes(usage);
        running[p] = false;
        results[p].killed = true;
        results[p].exit_code = -1;
        results[p].term_signal = SIGKILL;
      }
      break;
    }
    if (spec.on_poll) spec.on_poll(outputs());
    forward_stderr(false);
    absl::SleepFor(spec.poll_interval);
  }
  if (spec.on_poll) spec.on_poll(outputs());
  forward_stderr(true);
  for (int p = 0; p < spec.processes; ++p) {
    results[p].stdout_text = ReadFile(out_path(p));
    results[p].stderr_text = ReadFile(err_path(p));
  }
  Run(absl::StrCat("rm -rf '", dir, "'"));
  return results;
}

namespace {

// Binds a TCP socket to `address`:`port` (0: the kernel picks) and releases it; returns the
// port that was bound, or the errno of the failure as a negative number.
int BindAndRelease(in_addr address, int port) {
  sockaddr_in socket_address = {};
  socket_address.sin_family = AF_INET;
  socket_address.sin_port = htons(static_cast<uint16_t>(port));
  socket_address.sin_addr = address;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  socklen_t length = sizeof(socket_address);
  const bool bound =
      bind(fd, reinterpret_cast<sockaddr*>(&socket_address), sizeof(socket_address)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&socket_address), &length) == 0;
  const int error = errno;
  close(fd);
  return bound ? static_cast<int>(ntohs(socket_address.sin_port)) : -error;
}

// The lowest port of the kernel's ephemeral range, or 0 when it cannot be read.
int EphemeralRangeStart() {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  int high = 0;
  if (!(range >> low >> high)) return 0;
  return low;
}

}  // namespace

absl::StatusOr<int> PickFreePort(const std::string& address) {
  in_addr parsed = {};
  if (inet_pton(AF_INET, address.c_str(), &parsed) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("'", address, "' is not an IPv4 address"));
  }
  constexpr int kLowestPort = 10000;
  constexpr int kAttempts = 64;
  const int ephemeral_start = EphemeralRangeStart();
  if (ephemeral_start > kLowestPort + kAttempts) {
    static absl::Mutex mutex(absl::kConstInit);
    static absl::BitGen* generator = nullptr;
    for (int attempt = 0; attempt < kAttempts; ++attempt) {
      int candidate = 0;
      {
        absl::MutexLock lock(&mutex);
        if (generator == nullptr) generator = new absl::BitGen();
        candidate = absl::Uniform(*generator, kLowestPort, ephemeral_start);
      }
      if (BindAndRelease(parsed, candidate) == candidate) return candidate;
    }
  }
  const int port = BindAndRelease(parsed, 0);
  if (port <= 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot bind a port on ", address, ": errno ", -port));
  }
  return port;
}

std::optional<NetnsPair> NetnsPair::Create(std::string* reason) {
  if (geteuid() != 0) {
    *reason = "network namespaces need root";
    return std::nullopt;
  }
  // Names unique per process and pair: tests that make pairs run concurrently (ctest -j). The veth
  // ends are created in the root namespace, so their names must not collide there; interface
  // names hold 15 characters ("wv" + a 7-digit pid + "_" + the pair's number + the side).
  static std::atomic<int> counter{0};
  const int pair_number = counter.fetch_add(1) % 100;
  const int n = (getpid() + pair_number) % 200 + 20;
  NetnsPair pair;
  for (int side = 0; side < 2; ++side) {
    pair.ns_[side] = absl::StrCat("wsync", getpid(), "_", pair_number, side == 0 ? "a" : "b");
    pair.device_[side] = absl::StrCat("wv", getpid(), "_", pair_number, side == 0 ? "a" : "b");
    pair.address_[side] = absl::StrCat("10.231.", n, ".", side + 1);
  }
  const std::vector<std::string> commands = {
      absl::StrCat("ip netns add ", pair.ns_[0]),
      absl::StrCat("ip netns add ", pair.ns_[1]),
      absl::StrCat("ip link add ", pair.device_[0], " type veth peer name ", pair.device_[1]),
      absl::StrCat("ip link set ", pair.device_[0], " netns ", pair.ns_[0]),
      absl::StrCat("ip link set ", pair.device_[1], " netns ", pair.ns_[1]),
      absl::StrCat("ip -n ", pair.ns_[0], " addr add ", pair.address_[0], "/24 dev ",
                   pair.device_[0]),
      absl::StrCat("ip -n ", pair.ns_[1], " addr add ", pair.address_[1], "/24 dev ",
                   pair.device_[1]),
      absl::StrCat("ip -n ", pair.ns_[0], " link set ", pair.device_[0], " up"),
      absl::StrCat("ip -n ", pair.ns_[1], " link set ", pair.device_[1], " up"),
      absl::StrCat("ip -n ", pair.ns_[0], " link set lo up"),
      absl::StrCat("ip -n ", pair.ns_[1], " link set lo up"),
  };
  pair.owned_ = true;  // Cleans up whatever the commands below created.
  for (const std::string& command : commands) {
    if (Run(command + " 2>/dev/null") != 0) {
      *reason = absl::StrCat("'", command, "' failed");
      return std::nullopt;
    }
  }
  return pair;
}

ProcessPlacement TwoNodePlacement(const NetnsPair& net, int side) {
  ProcessPlacement placement{net.ns(side), side == 0 ? "node-a" : "node-b", "", {}};
  placement.extra_flags = {
      "--path_transports",
      absl::StrCat("intra_node=ucx:sm,cma,self;inter_node=ucx:tcp@", net.device(side))};
  return placement;
}

NetnsPair::NetnsPair(NetnsPair&& other) noexcept {
  for (int side = 0; side < 2; ++side) {
    ns_[side] = std::move(other.ns_[side]);
    device_[side] = std::move(other.device_[side]);
    address_[side] = std::move(other.address_[side]);
  }
  owned_ = other.owned_;
  other.owned_ = false;
}

NetnsPair::~NetnsPair() {
  if (!owned_) return;
  for (int side = 0; side < 2; ++side) {
    Run(absl::StrCat("ip netns del ", ns_[side], " 2>/dev/null"));
  }
}

}  // namespace wsync::harness
