#include "integration/cli/calibrate_job.h"

#include <openssl/rand.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "calibration/link_model/link_model.h"
#include "calibration/probe/probe.h"
#include "common/status.h"
#include "integration/harness/launcher.h"
#include "plugin/runtime.h"
#include "transport/control/auth.h"
#include "transport/selector/selector.h"

ABSL_DECLARE_FLAG(std::string, out);
ABSL_DECLARE_FLAG(std::string, path_transports);

ABSL_FLAG(int32_t, probe_worker, -1,
          "Internal: run as process P of a calibration job (started by `wsync calibrate`).");
ABSL_FLAG(std::string, probe_coordinator, "", "Internal: host:port of the job's coordinator.");
ABSL_FLAG(std::string, probe_job, "wsync-calibrate", "Internal: the job id.");

// Flags shared by the launcher (`wsync calibrate --processes N --out F`) and its workers.
ABSL_FLAG(int32_t, processes, 0, "`wsync calibrate`: processes to probe on this machine.");
ABSL_FLAG(std::string, nodes, "",
          "`wsync calibrate`: node id per process, e.g. 'a,a,b,b' (default: one node).");
ABSL_FLAG(std::string, probe_sizes, "",
          "`wsync calibrate`: message sizes, e.g. '4K,64K,1M,16M' (default 4K..256M, factors of "
          "4, within --probe_memory).");
ABSL_FLAG(int32_t, probe_repeats, 5, "`wsync calibrate`: timed repeats per pattern and size.");
ABSL_FLAG(int32_t, probe_warmup, 1, "`wsync calibrate`: untimed repeats before them.");
ABSL_FLAG(std::string, fan_widths, "",
          "`wsync calibrate`: fan widths, e.g. '1,2,3' (default: powers of two up to the "
          "processes per node minus one).");
ABSL_FLAG(double, probe_memory, static_cast<double>(int64_t{1} << 30),
          "`wsync calibrate`: bytes each process may allocate for probing.");

namespace wsync::cli {
namespace {

constexpr char kSecretEnv[] = "WSYNC_SECRET";

absl::StatusOr<std::string> NewHexSecret() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    return absl::InternalError("cannot draw random bytes for the job secret");
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

absl::StatusOr<std::string> ReadAll(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  return std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
}

std::vector<std::string> Split(const std::string& text) {
  return absl::StrSplit(text, ',', absl::SkipEmpty());
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> ParseSizes(const std::string& text) {
  std::vector<int64_t> sizes;
  for (absl::string_view entry : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int64_t unit = 1;
    if (!entry.empty()) {
      const char suffix = entry.back();
      if (suffix == 'K' || suffix == 'k') unit = int64_t{1} << 10;
      if (suffix == 'M' || suffix == 'm') unit = int64_t{1} << 20;
      if (suffix == 'G' || suffix == 'g') unit = int64_t{1} << 30;
      if (unit != 1) entry.remove_suffix(1);
    }
    int64_t value = 0;
    if (!absl::SimpleAtoi(entry, &value) || value <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("bad size '", entry, "' in '", text, "'"));
    }
    sizes.push_back(value * unit);
  }
  return sizes;
}

absl::StatusOr<std::vector<int32_t>> ParseWidths(const std::string& text) {
  std::vector<int32_t> widths;
  for (const std::string& entry : Split(text)) {
    int32_t value = 0;
    if (!absl::SimpleAtoi(entry, &value)) {
      return absl::InvalidArgumentError(absl::StrCat("bad fan width '", entry, "'"));
    }
    widths.push_back(value);
  }
  return widths;
}

absl::Status RunCalibrationWorker() {
  const int32_t me = absl::GetFlag(FLAGS_probe_worker);
  const int32_t n = absl::GetFlag(FLAGS_processes);
  const std::vector<std::string> host_port =
      absl::StrSplit(absl::GetFlag(FLAGS_probe_coordinator), ':');
  int port = 0;
  if (host_port.size() != 2 || !absl::SimpleAtoi(host_port[1], &port) || n < 1 || me >= n) {
    return absl::InvalidArgumentError("bad --probe_coordinator, --processes or --probe_worker");
  }
  WSYNC_ASSIGN_OR_RETURN(std::string secret, LoadSecret(SecretSource::Environment(kSecretEnv)));
  std::vector<std::string> nodes = Split(absl::GetFlag(FLAGS_nodes));
  if (nodes.empty()) nodes.assign(n, "local");
  if (static_cast<int32_t>(nodes.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat(nodes.size(), " --nodes for ", n, " processes"));
  }
  // Every process a trainer of one job; process 0 hosts its coordinator (plugin/runtime.h).
  RuntimeConfig config;
  config.role = Role::kTrainer;
  config.rank = me;
  config.num_trainers = n;
  config.job_id = absl::GetFlag(FLAGS_probe_job);
  config.coordinator_host = host_port[0];
  config.coordinator_port = port;
  config.host_coordinator = me == 0;
  config.node_id = nodes[me];
  config.deadline = absl::Seconds(60);
  WSYNC_ASSIGN_OR_RETURN(config.path_transports,
                         ParsePathTransports(absl::GetFlag(FLAGS_path_transports)));
  const PathOf path_of = PathOfNodes(nodes);
  absl::StatusOr<ConnectedMesh> mesh = ConnectMesh(config, secret, path_of);
  WipeSecret(secret);
  WSYNC_RETURN_IF_ERROR(mesh.status());

  ProbeOptions options;
  WSYNC_ASSIGN_OR_RETURN(options.sizes, ParseSizes(absl::GetFlag(FLAGS_probe_sizes)));
  options.repeats = absl::GetFlag(FLAGS_probe_repeats);
  options.warmup = absl::GetFlag(FLAGS_probe_warmup);
  options.path_of = path_of;
  WSYNC_ASSIGN_OR_RETURN(options.fan_widths, ParseWidths(absl::GetFlag(FLAGS_fan_widths)));
  options.nodes = nodes;
  options.memory_budget_bytes = static_cast<int64_t>(absl::GetFlag(FLAGS_probe_memory));
  options.settings["path_transports"] = absl::GetFlag(FLAGS_path_transports);
  options.settings["nodes"] = absl::StrJoin(nodes, ",");
  WSYNC_ASSIGN_OR_RETURN(const proto::Calibration calibration,
                         CalibrateLinks(options, *mesh->transport, *mesh->client));
  if (me == 0) {
    const std::string path = absl::GetFlag(FLAGS_out);
    std::ofstream file(path, std::ios::binary | std::ios::trunc);
    file << SerializeCalibration(calibration);
    if (!file.good()) return absl::InternalError(absl::StrCat("cannot write ", path));
  }
  WSYNC_RETURN_IF_ERROR(mesh->client->Barrier(absl::Now() + absl::Seconds(60)));
  // The coordinator goes with process 0: give the others a moment to read the barrier's result.
  if (mesh->coordinator != nullptr) absl::SleepFor(absl::Milliseconds(300));
  return absl::OkStatus();
}

absl::StatusOr<proto::Calibration> RunCalibrationJob(const CalibrationJob& job,
                                                     const std::string& self) {
  if (job.out.empty() || job.processes < 1 ||
      (job.path_transports.size() > 1 &&
       static_cast<int32_t>(job.path_transports.size()) != job.processes)) {
    return absl::InvalidArgumentError(
        "a calibration job needs processes, an output file and one path transport spec for all "
        "or one per process");
  }
  WSYNC_ASSIGN_OR_RETURN(const int port, harness::PickFreePort("127.0.0.1"));
  WSYNC_ASSIGN_OR_RETURN(const std::string secret, NewHexSecret());
  std::remove(job.out.c_str());
  harness::ProcessesSpec spec;
  spec.processes = job.processes;
  spec.env = {absl::StrCat(kSecretEnv, "=", secret)};
  spec.timeout = job.timeout;
  spec.command = [&](int p) {
    std::vector<std::string> argv;
    if (p < static_cast<int>(job.netns.size()) && !job.netns[p].empty()) {
      argv = {"ip", "netns", "exec", job.netns[p]};
    }
    const std::vector<std::string> flags = {
        self,
        "calibrate",
        absl::StrCat("--probe_worker=", p),
        absl::StrCat("--probe_coordinator=", job.coordinator_address, ":", port),
        absl::StrCat("--probe_job=wsync-calibrate-", getpid()),
        absl::StrCat("--processes=", job.processes),
        absl::StrCat("--nodes=", absl::StrJoin(job.nodes, ",")),
        absl::StrCat("--path_transports=", job.path_transports.empty() ? std::string()
                                           : job.path_transports.size() == 1
                                               ? job.path_transports[0]
                                               : job.path_transports[p]),
        absl::StrCat("--probe_sizes=", absl::StrJoin(job.sizes, ",")),
        absl::StrCat("--probe_repeats=", job.repeats),
        absl::StrCat("--probe_warmup=", job.warmup),
        absl::StrCat("--fan_widths=", absl::StrJoin(job.fan_widths, ",")),
        absl::StrCat("--probe_memory=", job.memory_budget_bytes),
        absl::StrCat("--out=", job.out),
    };
    argv.insert(argv.end(), flags.begin(), flags.end());
    return argv;
  };
  WSYNC_ASSIGN_OR_RETURN(const std::vector<harness::ProcessResult> results,
                         harness::RunProcesses(spec));
  std::string failures;
  for (size_t p = 0; p < results.size(); ++p) {
    if (results[p].exit_code == 0) continue;
    absl::StrAppend(&failures, "\n  process ", p, results[p].killed ? " (killed)" : "", ": ",
                    results[p].stderr_text);
  }
  if (!failures.empty()) {
    return absl::InternalError(absl::StrCat("calibration processes failed:", failures));
  }
  WSYNC_ASSIGN_OR_RETURN(const std::string bytes, ReadAll(job.out));
  return ParseCalibration(bytes);
}

}  // namespace wsync::cli
