#include "integration/bench/perftest.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "integration/harness/launcher.h"
#include "transport/ucx/ucx_transport.h"

extern char** environ;

namespace wsync::bench {

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string TailOf(const std::string& text, size_t chars) {
  return text.size() <= chars ? text : "..." + text.substr(text.size() - chars);
}

namespace {

// Child processes for ucx_perftest: started with extra environment, bounded by a deadline.

class Child {
 public:
  Child() = default;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() { Kill(); }

  // Starts argv with stdout and stderr into `log`; `env` entries (NAME=VALUE) replace the
  // variables of the same name, and `unset` names are removed.
  absl::Status Start(const std::vector<std::string>& argv, const std::string& log,
                     const std::vector<std::string>& env, const std::vector<std::string>& unset) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    std::vector<std::string> storage(env);
    for (char** e = environ; *e != nullptr; ++e) {
      const absl::string_view entry = *e;
      const absl::string_view name = entry.substr(0, entry.find('='));
      bool drop = std::find(unset.begin(), unset.end(), name) != unset.end();
      for (const std::string& mine : env) drop |= absl::StartsWith(mine, absl::StrCat(name, "="));
      if (!drop) storage.emplace_back(entry);
    }
    std::vector<char*> envp;
    for (std::string& e : storage) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::vector<char*> args;
    for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
    args.push_back(nullptr);
    const int error = posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    if (error != 0) {
      pid_ = -1;
      return absl::InternalError(absl::StrCat("cannot start ", argv[0], ": errno ", error));
    }
    return absl::OkStatus();
  }

  bool Exited() {
    if (pid_ <= 0) return true;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) != pid_) return false;
    pid_ = -1;
    code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return true;
  }

  // The exit code, or -1 when it was killed at `deadline` or by a signal.
  int Wait(absl::Time deadline) {
    while (!Exited()) {
      if (absl::Now() > deadline) {
        Kill();
        return -1;
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    return code_;
  }

  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
    code_ = -1;
  }

 private:
  pid_t pid_ = -1;
  int code_ = -1;
};

// Whether some socket listens on `port` (from /proc/net/tcp and tcp6; state 0A is LISTEN).
// Probing by connecting would be taken by ucx_perftest's server as its client.
bool Listening(int port) {
  const std::string needle = absl::StrFormat(":%04X", port);
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    for (absl::string_view line : absl::StrSplit(ReadWholeFile(table), '\n')) {
      std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (fields.size() > 3 && absl::EndsWith(fields[1], needle) && fields[3] == "0A") return true;
    }
  }
  return false;
}

// The bandwidth of one ucx_perftest -f output: its final line holds iterations, overhead
// p50/average/overall (usec), bandwidth average/overall (MB/s, MB = 2^20 bytes) and message rate
// average/overall.
std::optional<double> PerftestBandwidth(const std::string& output, int32_t iters) {
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t n = 0;
    double mb_per_second = 0;
    if (fields.size() >= 8 && absl::SimpleAtoi(fields[0], &n) && n == iters &&
        absl::SimpleAtod(fields[5], &mb_per_second) && mb_per_second > 0) {
      return mb_per_second * (1 << 20);
    }
  }
  return std::nullopt;
}

}  // namespace

std::vector<std::string> WsyncUcxEnvironment() {
  std::vector<std::string> env;
  for (const UcxDefaultSetting& d : UcxDefaultSettings()) {
    if (getenv(d.environment.c_str()) == nullptr) env.push_back(d.environment + "=" + d.value);
  }
  return env;
}

// One ucx_perftest tag_bw run: `pairs` server and client processes on this machine, the clients
// started together.
absl::StatusOr<PerftestResult> RunPerftest(const std::string& binary, const std::string& dir,
                                           const std::string& tls, const std::string& devices,
                                           int64_t size, int32_t iters, int32_t pairs,
                                           absl::Duration limit, bool wsync_settings) {
  std::vector<std::string> env = {absl::StrCat("UCX_TLS=", tls)};
  if (wsync_settings) {
    for (std::string& setting : WsyncUcxEnvironment()) env.push_back(std::move(setting));
  }
  std::vector<std::string> unset;
  if (devices.empty()) {
    unset.push_back("UCX_NET_DEVICES");
  } else {
    env.push_back(absl::StrCat("UCX_NET_DEVICES=", devices));
  }
  const std::vector<std::string> common = {"-t", "tag_bw",
                                           "-s", absl::StrCat(size),
                                           "-n", absl::StrCat(iters),
                                           "-w", absl::StrCat(std::max(2, iters / 10)),
                                           "-f"};
  std::vector<Child> servers(pairs), clients(pairs);
  std::vector<int> ports(pairs);
  for (int32_t i = 0; i < pairs; ++i) {
    const std::string log = absl::StrCat(dir, "/perftest-server", i, ".log");
    std::string failure;
    for (int attempt = 0; attempt < 3 && (attempt == 0 || !failure.empty()); ++attempt) {
      failure.clear();
      WSYNC_ASSIGN_OR_RETURN(ports[i], harness::PickFreePort());
      std::vector<std::string> argv = {binary, "-p", absl::StrCat(ports[i])};
      argv.insert(argv.end(), common.begin(), common.end());
      WSYNC_RETURN_IF_ERROR(servers[i].Start(argv, log, env, unset));
      const absl::Time listen_deadline = absl::Now() + absl::Seconds(10);
      while (!Listening(ports[i]) && !servers[i].Exited() && absl::Now() < listen_deadline) {
        absl::SleepFor(absl::Milliseconds(5));
      }
      if (!Listening(ports[i])) {  // Most likely the port was taken in between; try another.
        servers[i].Kill();
        failure = absl::StrCat("the ucx_perftest server did not listen on port ", ports[i], ": ",
                               TailOf(ReadWholeFile(log)));
      }
    }
    if (!failure.empty()) return absl::UnavailableError(failure);
  }
  const absl::Time start = absl::Now();
  for (int32_t i = 0; i < pairs; ++i) {
    std::vector<std::string> argv = {binary, "127.0.0.1", "-p", absl::StrCat(ports[i])};
    argv.insert(argv.end(), common.begin(), common.end());
    WSYNC_RETURN_IF_ERROR(
        clients[i].Start(argv, absl::StrCat(dir, "/perftest-client", i, ".log"), env, unset));
  }
  const absl::Time deadline = start + limit;
  PerftestResult result;
  for (int32_t i = 0; i < pairs; ++i) {
    const int client_code = clients[i].Wait(deadline);
    result.seconds = std::max(result.seconds, absl::ToDoubleSeconds(absl::Now() - start));
    const int server_code = servers[i].Wait(std::max(deadline, absl::Now() + absl::Seconds(5)));
    const std::string output = ReadWholeFile(absl::StrCat(dir, "/perftest-client", i, ".log")) +
                               "\n" +
                               ReadWholeFile(absl::StrCat(dir, "/perftest-server", i, ".log"));
    if (client_code != 0 || server_code != 0) {
      return absl::InternalError(
          absl::StrFormat("ucx_perftest (UCX_TLS=%s) failed: client exit %d, server exit %d%s: %s",
                          tls, client_code, server_code,
                          client_code == -1 ? " (killed at the limit)" : "", TailOf(output)));
    }
    const std::optional<double> rate = PerftestBandwidth(output, iters);
    if (!rate.has_value()) {
      return absl::InternalError(
          absl::StrCat("cannot read ucx_perftest's result: ", TailOf(output)));
    }
    result.bytes_per_second.push_back(*rate);
  }
  return result;
}

}  // namespace wsync::bench
