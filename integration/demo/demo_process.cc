// wsync_demo_process: one trainer or rollout process of `wsync demo`, a host as an RL engine would
// be. It builds its part of a named layout of an embedded model, allocates its buffers in host
// memory, loads libwsync.so with dlopen, and drives the plugin only through the C ABI
// (plugin/include/wsync/wsync.h): init, register_buffer, declare_parameter and declare_piece for
// its part, connect, then one sync per step, finalize.
//
// Step v: a trainer writes the logical values of version v into every element it holds (the
// values of integration/fill/fill.h: LogicalValue) and syncs v; a rollout syncs v and then checks
// every element of its pieces against version v (and the guard bytes around its buffers), so a
// stale, shifted or missing byte fails the step.
//
// Output (standard output), for `wsync demo` to parse:
//   CONNECTED seconds=<connect time>
//   SCHEDULE <a line of the plugin's schedule report>
//   STEP v=<v> seconds=<transfer> sent=<B> received=<B> direct=<B> staged=<B> rounds=<n>
//        arena=<B> sync_seconds=<whole sync call> work_seconds=<fill or check> verified=ok|<error>
// (one line each; `verified` is last and its error text may contain spaces).
//   METRICS url=<the exporter's URL>                  (with --metrics_address, after init)
//   LINGER seconds=<s>                                (with --linger_s, after the last step)
// Exit status: 0 when every step committed and, on a rollout, verified; 1 otherwise (the error on
// standard error); 2 for bad flags. The library's settings (--coordinator_host, --deadline_seconds,
// --verify, --delta, --metrics_address, ...) are arguments derived from the loaded library's table
// (integration/host/setting_args.h): `wsync_demo_process --help` lists them.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/dtype.h"
#include "common/status.h"
#include "integration/fill/fill.h"
#include "integration/host/fast_values.h"
#include "integration/host/plugin_host.h"
#include "integration/host/setting_args.h"
#include "integration/model_config/hf_config.h"
#include "planner/geometry.h"
#include "planner/layout.h"
#include "planner/layout_parts.h"
#include "planner/models.h"
#include "planner/named_layouts.h"
#include "plugin/include/wsync/wsync.h"

ABSL_FLAG(std::string, role, "", "trainer or rollout.");
ABSL_FLAG(int32_t, rank, 0, "Rank within the role.");
ABSL_FLAG(int32_t, trainers, 2, "Trainer processes in the job.");
ABSL_FLAG(int32_t, rollouts, 2, "Rollout processes in the job.");
ABSL_FLAG(std::string, job, "wsync-demo", "Job id.");
ABSL_FLAG(bool, host_coordinator, false, "Trainer rank 0 only: run the coordinator in-process.");
ABSL_FLAG(std::string, model, "qwen2.5-0.5b",
          "Built-in model or config.json path (`wsync help` lists them).");
ABSL_FLAG(int32_t, layers, 0, "Keep only the first N transformer layers (0: all).");
ABSL_FLAG(std::string, layout, "",
          "Named layout of this process's side; default megatron(tp=2) for trainers, vllm(tp=2) "
          "for rollouts.");
ABSL_FLAG(std::string, tls, "",
          "UCX transports for every peer (shorthand for --path_transports='*=ucx:<tls>').");
ABSL_FLAG(int32_t, steps, 5, "RL steps (syncs of versions 1..steps).");
ABSL_FLAG(int32_t, corrupt_step, 0,
          "Testing only: at this step trainer rank 0 flips a bit of the first element of each of "
          "its pieces after writing them, so that the rollouts must refuse that version.");
ABSL_FLAG(double, linger_s, 0,
          "Seconds to keep the session (and its metrics exporter) alive after the last step, so "
          "that Prometheus can scrape the final figures.");
ABSL_FLAG(int32_t, device_index, -1,
          "The GPU this process reports (the plugin's device_index; a colocated trainer and "
          "rollout on one GPU are then same_device); -1: unknown.");
ABSL_FLAG(std::string, library, "",
          "Path of libwsync.so; default $WSYNC_LIBRARY, else ../../plugin/libwsync.so relative to "
          "this binary's directory (its place in the build tree).");

namespace wsync::demo {
namespace {

using host::Plugin;

void Print(const std::string& line) {
  std::fputs(line.c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

std::string OneLine(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return text;
}

double SecondsSince(absl::Time start) { return absl::ToDoubleSeconds(absl::Now() - start); }

// This process's part of its side's layout (from the flags), checked against the job's sizes.
absl::StatusOr<Layout> BuildPart(bool trainer, const std::string& role, int32_t rank) {
  std::string layout = absl::GetFlag(FLAGS_layout);
  if (layout.empty()) layout = trainer ? "megatron(tp=2)" : "vllm(tp=2)";
  WSYNC_ASSIGN_OR_RETURN(ModelSpec model, LoadModel(absl::GetFlag(FLAGS_model)));
  if (absl::GetFlag(FLAGS_layers) > 0) {
    WSYNC_ASSIGN_OR_RETURN(model, TruncateLayers(model, absl::GetFlag(FLAGS_layers)));
  }
  WSYNC_ASSIGN_OR_RETURN(Layout side, BuildNamedLayout(model, layout));
  if (side.role != (trainer ? Role::kTrainer : Role::kRollout)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", layout, "' is a ", RoleName(side.role), " layout; this is a ", role));
  }
  const int32_t processes = trainer ? absl::GetFlag(FLAGS_trainers) : absl::GetFlag(FLAGS_rollouts);
  if (static_cast<int32_t>(side.processes.size()) != processes) {
    return absl::InvalidArgumentError(absl::StrCat("'", layout, "' has ", side.processes.size(),
                                                   " processes; the job has ", processes, " ", role,
                                                   "s"));
  }
  Layout part = LayoutPart(side, rank);
  if (part.processes.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("'", layout, "' has no rank ", rank));
  }
  return part;
}

// The plugin's configuration: this process's place in the job, the settings given as arguments
// (`settings`), then --tls as the path_transports of every peer where no --path_transports was
// given. `config`'s strings point into this object and `settings`: keep both alive until init
// returns.
struct ConfigFromFlags {
  std::string job = absl::GetFlag(FLAGS_job);
  std::string path_transports;
  wsync_config_t config;
};

absl::Status FillConfig(const Plugin& plugin, const host::SettingArgs& settings, bool trainer,
                        int32_t rank, ConfigFromFlags* c) {
  wsync_config_t& config = c->config;
  std::memset(&config, 0, sizeof(config));
  config.struct_size = sizeof(config);
  config.role = trainer ? WSYNC_ROLE_TRAINER : WSYNC_ROLE_ROLLOUT;
  config.rank = rank;
  config.num_trainers = absl::GetFlag(FLAGS_trainers);
  config.num_rollouts = absl::GetFlag(FLAGS_rollouts);
  config.job_id = c->job.c_str();
  config.host_coordinator = absl::GetFlag(FLAGS_host_coordinator) ? 1 : 0;
  config.has_device_index = absl::GetFlag(FLAGS_device_index) >= 0 ? 1 : 0;
  config.device_index = std::max(0, absl::GetFlag(FLAGS_device_index));
  WSYNC_RETURN_IF_ERROR(settings.Apply(plugin, &config));
  if (config.path_transports == nullptr && !absl::GetFlag(FLAGS_tls).empty()) {
    c->path_transports = absl::StrCat("*=ucx:", absl::GetFlag(FLAGS_tls));
    config.path_transports = c->path_transports.c_str();
  }
  return absl::OkStatus();
}

// Prints the session's schedule report, one SCHEDULE line per line (nothing when it has none).
void PrintScheduleReport(const Plugin& plugin) {
  for (absl::string_view line :
       absl::StrSplit(host::ScheduleReport(plugin), '\n', absl::SkipEmpty())) {
    Print(absl::StrCat("SCHEDULE ", line));
  }
}

// The outcome of one RL step: the sync call's status and whether this process's part is right.
struct StepOutcome {
  absl::Status synced;
  absl::Status verified;
};

// One RL step: a trainer writes `version` (rank 0 corrupts it at --corrupt_step) and syncs; a
// rollout syncs and checks every byte it holds. Prints the STEP line. An error of the stats call
// is returned as such (the run ends).
absl::StatusOr<StepOutcome> RunStep(const Plugin& plugin, const Layout& part, bool trainer,
                                    int32_t rank, int64_t version, test::HostBuffers& memory) {
  const wsync_plugin_v1_t& api = plugin.api();
  StepOutcome outcome;
  double work_seconds = 0;
  if (trainer) {  // The RL step changes the weights, then they are published.
    const absl::Time fill_start = absl::Now();
    outcome.verified = host::FillLogicalFast(part, static_cast<uint64_t>(version), memory);
    if (rank == 0 && version == absl::GetFlag(FLAGS_corrupt_step)) {
      host::CorruptFirstElements(part, memory);
    }
    work_seconds = SecondsSince(fill_start);
  }
  const absl::Time sync_start = absl::Now();
  outcome.synced = outcome.verified.ok() ? plugin.Call(api.sync(plugin.session(), version),
                                                       absl::StrCat("sync(", version, ")"))
                                         : outcome.verified;
  const double sync_seconds = SecondsSince(sync_start);
  if (!outcome.synced.ok()) {
    outcome.verified = outcome.synced;
  } else if (!trainer) {  // The engine would now serve version v: every byte must be right.
    const absl::Time check_start = absl::Now();
    outcome.verified = host::CheckLogicalFast(part, static_cast<uint64_t>(version), memory);
    work_seconds = SecondsSince(check_start);
  }
  wsync_stats_t stats;
  std::memset(&stats, 0, sizeof(stats));
  stats.struct_size = sizeof(stats);
  if (outcome.synced.ok()) {
    WSYNC_RETURN_IF_ERROR(plugin.Call(api.stats(plugin.session(), &stats), "stats"));
    if (stats.version != version) {
      outcome.verified = absl::InternalError(
          absl::StrCat("stats describe version ", stats.version, ", not ", version));
    }
  }
  Print(absl::StrFormat(
      "STEP v=%d seconds=%.6f sent=%d received=%d direct=%d staged=%d rounds=%d arena=%d "
      "sync_seconds=%.6f work_seconds=%.6f verified=%s",
      version, stats.seconds, stats.sent_bytes, stats.received_bytes, stats.direct_bytes,
      stats.staged_bytes, stats.rounds, stats.peak_arena_bytes, sync_seconds, work_seconds,
      outcome.verified.ok() ? std::string("ok")
                            : OneLine(std::string(outcome.verified.message()))));
  return outcome;
}

absl::Status Run(host::LoadedHost& loaded) {
  WSYNC_RETURN_IF_ERROR(host::CheckFastValues());
  const std::string role = absl::GetFlag(FLAGS_role);
  const bool trainer = role == "trainer";
  const int32_t rank = absl::GetFlag(FLAGS_rank);
  WSYNC_ASSIGN_OR_RETURN(const Layout part, BuildPart(trainer, role, rank));
  test::HostBuffers memory(part, trainer ? test::kSourceFill : test::kPoison);

  Plugin* plugin = loaded.plugin.get();
  {
    ConfigFromFlags flags;
    WSYNC_RETURN_IF_ERROR(FillConfig(*plugin, loaded.settings, trainer, rank, &flags));
    WSYNC_RETURN_IF_ERROR(plugin->Init(flags.config));
    if (flags.config.metrics_address != nullptr) {
      Print(absl::StrCat("METRICS url=http://", flags.config.metrics_address, "/metrics"));
    }
  }
  WSYNC_RETURN_IF_ERROR(host::Declare(*plugin, part, memory));

  const absl::Time connect_start = absl::Now();
  WSYNC_RETURN_IF_ERROR(plugin->Call(plugin->api().connect(plugin->session()), "connect"));
  Print(absl::StrFormat("CONNECTED seconds=%.3f", SecondsSince(connect_start)));
  PrintScheduleReport(*plugin);

  absl::Status failure;
  for (int64_t version = 1; version <= absl::GetFlag(FLAGS_steps); ++version) {
    WSYNC_ASSIGN_OR_RETURN(const StepOutcome step,
                           RunStep(*plugin, part, trainer, rank, version, memory));
    if (!step.verified.ok() && failure.ok()) failure = step.verified;
    // A failed sync (a peer lost, a deadline) ends the run; a rollout's failed check does not:
    // the next version may still be right, and the demo reports every step.
    if (!step.synced.ok()) break;
  }
  if (const double linger = absl::GetFlag(FLAGS_linger_s); linger > 0) {
    Print(absl::StrFormat("LINGER seconds=%.3f", linger));
    absl::SleepFor(absl::Seconds(linger));
  }
  WSYNC_RETURN_IF_ERROR(plugin->Finalize());
  return failure;
}

}  // namespace
}  // namespace wsync::demo

int main(int argc, char** argv) {
  absl::StatusOr<wsync::host::LoadedHost> loaded = wsync::host::LoadHostSettings(
      &argc, argv,
      "wsync_demo_process: one trainer or rollout process of `wsync demo`, through libwsync.so's "
      "C ABI (integration/demo/README.md).");
  if (!loaded.ok()) {
    absl::FPrintF(stderr, "wsync_demo_process: %s\n", loaded.status().message());
    return loaded.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  absl::ParseCommandLine(argc, argv);
  const std::string role = absl::GetFlag(FLAGS_role);
  if (role != "trainer" && role != "rollout") {
    absl::FPrintF(stderr, "wsync_demo_process: --role must be trainer or rollout\n");
    return 2;
  }
  const absl::Status status = wsync::demo::Run(*loaded);
  if (!status.ok()) {
    absl::FPrintF(stderr, "wsync_demo_process: %s %d: %s\n", role, absl::GetFlag(FLAGS_rank),
                  status.message());
    return 1;
  }
  return 0;
}
