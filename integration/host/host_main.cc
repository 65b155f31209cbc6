// wsync_host: one trainer or rollout process of a wsync-bench job (integration/bench, launched by
// harness::RunJob next to `wsync coordinator`), a host as an RL engine is one. It builds its part
// of a named layout, allocates its buffers in host memory, loads libwsync.so with dlopen and syncs
// through the C ABI only (plugin/include/wsync/wsync.h): init, register_buffer,
// declare_parameter / declare_fp8_parameter / declare_piece, connect, one sync(v) per version,
// stats, metrics_text, finalize. So a benchmark measures the library as shipped: its Session, its
// threads and its metrics, as an engine loads them.
//
// Per version: a trainer writes the version's logical values (--check_values), the memory-speed
// pattern (--fill_pattern) or its AdamW step's bf16 weights (--update adamw: adamw_update.h), or
// leaves its constant bytes, and syncs (with the library's delta setting, --delta); a rollout
// syncs, then checks every element's logical value (--check_values) and its FP8 weights and scales
// against the reference quantizer of the trainers' pattern (--verify_quant), and its guard bytes.
// The checks run in the library's wave callback (set_wave_callback: after the bytes landed, before
// the commit vote), so a wrong byte fails the sync on every process, as wsync_test_worker's checks
// did.
//
// Output (standard output), one line per version:
//   STATS version= process= role= rank= library=<libwsync.so as /proc/self/maps shows it mapped>
//         seconds=<the library's transfer seconds>
//         sync_seconds=<the sync call as this host sees it> sent= received= direct= staged=
//         rounds= chunks= arena= verified=<chunk hashes checked> cpu_seconds= cpu_user_seconds=
//         (this process, every thread, during the sync call) quant_verified=<e4m3 elements>
//         wire_sent_<path class>= wire_received_<path class>= (the library's
//         wsync_bytes_{sent,received}_total of this sync, from metrics_text)
//         update_seconds=<the trainer's write of the version before the sync call: fill or
//         AdamW step, with version 1 the AdamW state's initialisation; outside every other figure>
//         predicted_delta_seconds=<process 0, with a calibration and delta on or auto: the cost
//         model's prediction of the next delta sync at this sync's changed fraction>
//         predicted_dense_seconds=<beside it: the same report line's dense prediction>
// Exit status: 0 when every version committed and checked, 1 otherwise (the error on standard
// error), 2 for bad flags. The flags are wsync_test_worker's where the C ABI can express them;
// the worker's --relay, --relay_links, --keep_going, --markers and --pause_before_decide_s are not
// here (the ABI has no relay setting and no test hooks). The library's settings
// (--deadline_seconds, --staging_budget_bytes, --verify, --delta, ...) come from the loaded
// library's table (setting_args.h): `wsync_host --help` lists them.

#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status.h"
#include "integration/fill/fill.h"
#include "integration/fill/pattern.h"
#include "integration/fill/quant_check.h"
#include "integration/host/adamw_update.h"
#include "integration/host/fast_values.h"
#include "integration/host/job_flags.h"
#include "integration/host/plugin_host.h"
#include "integration/host/setting_args.h"
#include "integration/model_config/hf_config.h"
#include "planner/layout.h"
#include "planner/layout_parts.h"
#include "planner/models.h"
#include "planner/named_layouts.h"
#include "plugin/include/wsync/wsync.h"

// The job's flags (job_flags.h), and this program's own.
ABSL_FLAG(int32_t, trainers, 0, "Trainer processes in the job (0: the --from layout's).");
ABSL_FLAG(int32_t, rollouts, 0, "Rollout processes in the job (0: the --to layout's).");
ABSL_FLAG(
    int32_t, corrupt_version, 0,
    "Testing only: trainer rank 0 flips a bit of the first element of each of its pieces "
    "after writing this version (--check_values), so that the rollouts' checks fail its sync.");
ABSL_FLAG(std::string, library, "",
          "Path of libwsync.so; default $WSYNC_LIBRARY, else ../../plugin/libwsync.so relative to "
          "this binary's directory.");
ABSL_FLAG(
    std::string, update, "none",
    "What trainers write before each version: none (--check_values' or --fill_pattern's values), "
    "or adamw: fp32 masters of their pieces initialised as the Qwen2 family initialises them "
    "(linear and embedding weights normal(0, --init_std), norm weights 1, biases 0), one "
    "AdamW step per version (beta1 0.9, beta2 0.999, eps 1e-8, decoupled weight decay "
    "--weight_decay on the linear and embedding weights) on random gradients, normal and "
    "drawn afresh per element and step (Adam normalises them, so the update's size is set "
    "by --lr, as in real post-training), cast to bf16 (nearest even). Deterministic from "
    "--update_seed and each element's logical index, so the shards of any layout agree; "
    "the rollouts cannot recompute them cheaply: with adamw --check_values must be false (use "
    "the library's --verify=hash). Prints update_seconds= per version.");
ABSL_FLAG(double, lr, 1e-6, "--update adamw: the learning rate.");
ABSL_FLAG(double, weight_decay, 0.01,
          "--update adamw: decoupled weight decay of the linear and embedding weights (norm "
          "weights and biases are not decayed).");
ABSL_FLAG(double, init_std, 0.02,
          "--update adamw: standard deviation of the initial linear and embedding weights (the "
          "Qwen2 family's initializer_range, 0.02 in Qwen2.5-0.5B's config.json).");
ABSL_FLAG(uint64_t, update_seed, 1, "--update adamw: the seed of the weights and gradients.");

namespace wsync::host {
namespace {

void Print(const std::string& line) {
  std::fputs(line.c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

// CPU time of this process (every thread), seconds.
struct CpuTimes {
  double user = 0;
  double system = 0;
};

CpuTimes ProcessCpuTimes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec * 1e-6; };
  return {seconds(usage.ru_utime), seconds(usage.ru_stime)};
}

// The plugin's configuration: this process's place in the job, then the settings given as
// arguments (`settings`), then --tls and --net_devices as the path_transports of every peer where
// no --path_transports was given. `config`'s strings point into this object and `settings`: keep
// both alive until init returns.
struct Config {
  std::string job = absl::GetFlag(FLAGS_job);
  std::string path_transports;
  wsync_config_t config;
};

absl::Status FillConfig(const Plugin& plugin, const SettingArgs& settings, bool trainer,
                        int32_t trainers, int32_t rollouts, Config* c) {
  wsync_config_t& config = c->config;
  std::memset(&config, 0, sizeof(config));
  config.struct_size = sizeof(config);
  config.role = trainer ? WSYNC_ROLE_TRAINER : WSYNC_ROLE_ROLLOUT;
  config.rank = absl::GetFlag(FLAGS_rank);
  config.num_trainers = trainers;
  config.num_rollouts = rollouts;
  config.job_id = c->job.c_str();
  WSYNC_RETURN_IF_ERROR(settings.Apply(plugin, &config));
  const std::string tls = absl::GetFlag(FLAGS_tls);
  const std::string devices = absl::GetFlag(FLAGS_net_devices);
  if (config.path_transports == nullptr && (!tls.empty() || !devices.empty())) {
    c->path_transports =
        absl::StrCat("*=ucx", tls.empty() ? "" : ":", tls, devices.empty() ? "" : "@", devices);
    config.path_transports = c->path_transports.c_str();
  }
  return absl::OkStatus();
}

// What one process does around its syncs: its part, its memory and the checks it runs.
struct Process {
  bool trainer = false;
  int32_t process = 0;  // Global: trainers first.
  Layout part;
  Layout source;                      // The whole trainer layout (--verify_quant).
  std::unique_ptr<AdamWShard> adamw;  // A trainer's optimizer state (--update adamw); else null.
};

// A rollout's checks of `version` in `memory` (--check_values, --verify_quant) and of its guard
// bytes; sets *quant_verified to the e4m3 elements checked.
absl::Status CheckRollout(const Process& p, int64_t version, const test::HostBuffers& memory,
                          int64_t* quant_verified) {
  if (absl::GetFlag(FLAGS_check_values)) {
    WSYNC_RETURN_IF_ERROR(CheckLogicalFast(p.part, static_cast<uint64_t>(version), memory));
  }
  *quant_verified = 0;
  if (absl::GetFlag(FLAGS_verify_quant)) {
    WSYNC_ASSIGN_OR_RETURN(*quant_verified,
                           test::CheckQuantizedPattern(p.source, p.part, memory, version));
  }
  return memory.CheckGuards();
}

// What a rollout's wave callback checked. The named layouts put every parameter in wave 0, so the
// callback runs once per sync, after the whole transfer.
struct WaveCheck {
  const Process* process = nullptr;
  const test::HostBuffers* memory = nullptr;
  absl::Status status;  // Of the last call.
  int64_t quant_verified = 0;
  int64_t version = -1;  // Of the last call; -1: none yet.
};

// The wave callback (wsync_wave_fn): the rollout's checks, before its commit vote; a failure fails
// the sync on every process (its message is the host's: the library only gets the code).
wsync_status_t CheckWave(void* user, int64_t version, int32_t /*wave*/) {
  auto* check = static_cast<WaveCheck*>(user);
  check->version = version;
  check->status = CheckRollout(*check->process, version, *check->memory, &check->quant_verified);
  return check->status.ok() ? WSYNC_OK : WSYNC_INTERNAL;
}

// One sync of `version` and this process's checks of it (`check`: the wave callback's, on a
// rollout that checks its bytes; else null); prints its STATS line, whose update_seconds adds
// `init_seconds` (the AdamW state's initialisation, before version 1) to this version's write.
absl::Status RunVersion(const Plugin& plugin, Process& p, int64_t version,
                        test::HostBuffers& memory, const WaveCheck* check, double init_seconds) {
  // Read at every version: the library the process runs, not the one it meant to load.
  WSYNC_ASSIGN_OR_RETURN(const std::string library, MappedFile("libwsync.so"));
  const bool verify = absl::GetFlag(FLAGS_check_values);
  const absl::Time update_start = absl::Now();
  if (p.adamw != nullptr) {
    p.adamw->Step(memory);  // Version v: the masters after v steps.
  } else if (p.trainer && verify) {
    WSYNC_RETURN_IF_ERROR(FillLogicalFast(p.part, static_cast<uint64_t>(version), memory));
    if (absl::GetFlag(FLAGS_rank) == 0 && version == absl::GetFlag(FLAGS_corrupt_version)) {
      CorruptFirstElements(p.part, memory);
    }
  } else if (p.trainer && absl::GetFlag(FLAGS_fill_pattern)) {
    test::FillPattern(static_cast<uint64_t>(version), &memory);
  }
  const double update_seconds = init_seconds + absl::ToDoubleSeconds(absl::Now() - update_start);
  WSYNC_ASSIGN_OR_RETURN(const auto sent_before, PathBytes(plugin, /*sent=*/true));
  WSYNC_ASSIGN_OR_RETURN(const auto received_before, PathBytes(plugin, /*sent=*/false));
  const CpuTimes cpu_start = ProcessCpuTimes();
  const absl::Time start = absl::Now();
  const absl::Status synced = plugin.Call(plugin.api().sync(plugin.session(), version),
                                          absl::StrCat("sync(", version, ")"));
  if (!synced.ok() && check != nullptr && check->version == version && !check->status.ok()) {
    return absl::Status(
        check->status.code(),
        absl::StrCat(synced.message(), ": this rollout's check: ", check->status.message()));
  }
  WSYNC_RETURN_IF_ERROR(synced);
  const double sync_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const CpuTimes cpu_end = ProcessCpuTimes();
  wsync_stats_t stats;
  std::memset(&stats, 0, sizeof(stats));
  stats.struct_size = sizeof(stats);
  WSYNC_RETURN_IF_ERROR(plugin.Call(plugin.api().stats(plugin.session(), &stats), "stats"));
  if (stats.version != version) {
    return absl::InternalError(
        absl::StrCat("stats describe version ", stats.version, ", not ", version));
  }
  int64_t quant_verified = 0;
  if (check != nullptr) {
    if (check->version != version) {
      return absl::InternalError(absl::StrCat("sync(", version,
                                              ") committed without calling the "
                                              "wave callback that checks this rollout's bytes"));
    }
    quant_verified = check->quant_verified;
  } else if (!p.trainer) {
    WSYNC_RETURN_IF_ERROR(memory.CheckGuards());
  }
  const double user = cpu_end.user - cpu_start.user;
  const double system = cpu_end.system - cpu_start.system;
  std::string line = absl::StrFormat(
      "STATS version=%d process=%d role=%s rank=%d library=%s seconds=%.6f sync_seconds=%.6f "
      "sent=%d received=%d direct=%d staged=%d rounds=%d chunks=%d arena=%d verified=%d "
      "cpu_seconds=%.6f cpu_user_seconds=%.6f quant_verified=%d update_seconds=%.6f",
      version, p.process, p.trainer ? "trainer" : "rollout", absl::GetFlag(FLAGS_rank), library,
      stats.seconds, sync_seconds, stats.sent_bytes, stats.received_bytes, stats.direct_bytes,
      stats.staged_bytes, stats.rounds, stats.chunks, stats.peak_arena_bytes, stats.verified_chunks,
      user + system, user, quant_verified, update_seconds);
  for (const bool sent : {true, false}) {
    WSYNC_ASSIGN_OR_RETURN(const auto after, PathBytes(plugin, sent));
    const auto& before = sent ? sent_before : received_before;
    for (const auto& [path, bytes] : after) {
      const auto it = before.find(path);
      const int64_t delta = bytes - (it == before.end() ? 0 : it->second);
      if (delta > 0)
        absl::StrAppend(&line, sent ? " wire_sent_" : " wire_received_", path, "=", delta);
    }
  }
  // The cost model's prediction of the next delta sync (the schedule report's, with a
  // calibration and delta on or auto: at this sync's changed fraction), on process 0.
  if (p.process == 0) {
    const std::string report = ScheduleReport(plugin);
    const std::string kPredicted = "delta: predicted ";
    const size_t at = report.find(kPredicted);
    absl::string_view figure;
    if (at != std::string::npos) {
      figure = absl::string_view(report).substr(at + kPredicted.size());
      figure = figure.substr(0, figure.find(' '));
    }
    double predicted = 0;
    if (absl::SimpleAtod(figure, &predicted)) {
      absl::StrAppendFormat(&line, " predicted_delta_seconds=%.6f", predicted);
      // The same line's dense prediction: "(dense 0.25 s)".
      const std::string kDense = "(dense ";
      const size_t dense_at = report.find(kDense, at);
      double dense = 0;
      if (dense_at != std::string::npos) {
        absl::string_view text = absl::string_view(report).substr(dense_at + kDense.size());
        if (absl::SimpleAtod(text.substr(0, text.find(' ')), &dense)) {
          absl::StrAppendFormat(&line, " predicted_dense_seconds=%.6f", dense);
        }
      }
    }
  }
  Print(line);
  return absl::OkStatus();
}

absl::Status Run(LoadedHost& loaded) {
  WSYNC_RETURN_IF_ERROR(CheckFastValues());
  Process p;
  p.trainer = absl::GetFlag(FLAGS_role) == "trainer";
  const int32_t rank = absl::GetFlag(FLAGS_rank);
  WSYNC_ASSIGN_OR_RETURN(const ModelSpec model, LoadModel(absl::GetFlag(FLAGS_model)));
  WSYNC_ASSIGN_OR_RETURN(const Layout source, BuildNamedLayout(model, absl::GetFlag(FLAGS_from)));
  WSYNC_ASSIGN_OR_RETURN(const Layout target, BuildNamedLayout(model, absl::GetFlag(FLAGS_to)));
  const int32_t trainers = absl::GetFlag(FLAGS_trainers) > 0
                               ? absl::GetFlag(FLAGS_trainers)
                               : static_cast<int32_t>(source.processes.size());
  const int32_t rollouts = absl::GetFlag(FLAGS_rollouts) > 0
                               ? absl::GetFlag(FLAGS_rollouts)
                               : static_cast<int32_t>(target.processes.size());
  p.part = LayoutPart(p.trainer ? source : target, rank);
  if (p.part.processes.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("the layout has no rank ", rank));
  }
  p.process = p.trainer ? rank : trainers + rank;
  if (absl::GetFlag(FLAGS_verify_quant)) p.source = source;
  test::HostBuffers memory(p.part, test::kPoison);

  Plugin* plugin = loaded.plugin.get();
  {
    Config config;
    WSYNC_RETURN_IF_ERROR(
        FillConfig(*plugin, loaded.settings, p.trainer, trainers, rollouts, &config));
    WSYNC_RETURN_IF_ERROR(plugin->Init(config.config));
  }
  WSYNC_RETURN_IF_ERROR(Declare(*plugin, p.part, memory));
  WaveCheck check;
  check.process = &p;
  check.memory = &memory;
  const bool checks =
      !p.trainer && (absl::GetFlag(FLAGS_check_values) || absl::GetFlag(FLAGS_verify_quant));
  if (checks) {
    WSYNC_RETURN_IF_ERROR(
        plugin->Call(plugin->api().set_wave_callback(plugin->session(), CheckWave, &check),
                     "set_wave_callback"));
  }
  WSYNC_RETURN_IF_ERROR(plugin->Call(plugin->api().connect(plugin->session()), "connect"));
  // After connect, so that the job's rendezvous does not wait for it; version 1's update_seconds
  // includes it.
  const absl::Time init_start = absl::Now();
  if (p.trainer && absl::GetFlag(FLAGS_update) == "adamw") {
    AdamWOptions adamw;
    adamw.lr = absl::GetFlag(FLAGS_lr);
    adamw.weight_decay = absl::GetFlag(FLAGS_weight_decay);
    adamw.init_std = absl::GetFlag(FLAGS_init_std);
    adamw.seed = absl::GetFlag(FLAGS_update_seed);
    WSYNC_ASSIGN_OR_RETURN(p.adamw, AdamWShard::Create(p.part, memory, adamw));
  }
  double init_seconds = absl::ToDoubleSeconds(absl::Now() - init_start);
  for (int64_t version = 1; version <= absl::GetFlag(FLAGS_versions); ++version) {
    WSYNC_RETURN_IF_ERROR(
        RunVersion(*plugin, p, version, memory, checks ? &check : nullptr, init_seconds));
    init_seconds = 0;
  }
  return plugin->Finalize();
}

}  // namespace
}  // namespace wsync::host

int main(int argc, char** argv) {
  absl::StatusOr<wsync::host::LoadedHost> loaded = wsync::host::LoadHostSettings(
      &argc, argv,
      "wsync_host: one trainer or rollout process of a wsync-bench job, through libwsync.so's C "
      "ABI (integration/host/README.md).");
  if (!loaded.ok()) {
    absl::FPrintF(stderr, "wsync_host: %s\n", loaded.status().message());
    return loaded.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  absl::ParseCommandLine(argc, argv);
  const std::string role = absl::GetFlag(FLAGS_role);
  if (role != "trainer" && role != "rollout") {
    absl::FPrintF(stderr, "wsync_host: --role must be trainer or rollout\n");
    return 2;
  }
  const std::string update = absl::GetFlag(FLAGS_update);
  if (update != "none" && update != "adamw") {
    absl::FPrintF(stderr, "wsync_host: --update must be none or adamw, not '%s'\n", update);
    return 2;
  }
  if (update == "adamw" && absl::GetFlag(FLAGS_check_values)) {
    absl::FPrintF(stderr,
                  "wsync_host: --update adamw writes values the rollouts cannot recompute: pass "
                  "--check_values=false (and --verify=hash for the library's chunk digests)\n");
    return 2;
  }
  wsync_config_t probe;  // The settings' arguments refused here are bad flags.
  std::memset(&probe, 0, sizeof(probe));
  probe.struct_size = sizeof(probe);
  if (const absl::Status applied = loaded->settings.Apply(*loaded->plugin, &probe); !applied.ok()) {
    absl::FPrintF(stderr, "wsync_host: %s\n", applied.message());
    return 2;
  }
  const absl::Status status = wsync::host::Run(*loaded);
  if (!status.ok()) {
    absl::FPrintF(stderr, "wsync_host: %s %d: %s\n", role, absl::GetFlag(FLAGS_rank),
                  status.message());
    return 1;
  }
  return 0;
}
