// wsync_test_worker: one trainer or rollout process of a multi-process test or benchmark, on the
// per-process runtime (plugin/runtime.h) that libwsync.so runs: it connects with its part of a
// named layout (coordinator, join, plan, transports) and runs `--versions` sync steps. A trainer
// writes each version's logical values (a function of parameter, index and version) before the
// sync; a rollout checks every element of its pieces after it, so a stale or misplaced byte fails
// the run (--check_values; --fill_pattern with --verify=hash instead fills at memory speed and lets
// wsync's chunk hashes compare every chunk, and --verify_quant has FP8 rollouts check their e4m3
// bytes and scales against the reference quantizer of that pattern). Every process then votes in
// the commit decision.
//
// Prints one line per sync: "STATS key=value ..." (see PrintStats; wire_sent_<path> and
// wire_received_<path> are the bytes posted to the transport per path class, relay forwards
// included; quant_verified the e4m3 elements --verify_quant checked; --relay chooses the relay
// mode). Exit status: 0 when every version committed, 1 otherwise (the error on stderr), 2 for bad
// flags.

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "common/sync_progress.h"
#include "control/auth.h"
#include "control/client.h"
#include "cost/link_model.h"
#include "executor/execute.h"
#include "integration/fill/fill.h"
#include "integration/fill/quant_check.h"
#include "integration/host/job_flags.h"
#include "planner/job.h"
#include "planner/layout_parts.h"
#include "planner/models.h"
#include "planner/named_layouts.h"
#include "planner/plan.h"
#include "planner/relay.h"
#include "plugin/runtime.h"
#include "plugin/settings.h"
#include "tests/testing/reference.h"
#include "transport/forwarding_transport.h"
#include "transport/selector/selector.h"

// The job's flags are integration/host/job_flags.h (shared with wsync_host); the library's
// settings under their names (wsync_host takes them from the library's table: the same names, the
// table's defaults); then its own.
ABSL_FLAG(std::string, coordinator_host, std::string(wsync::kDefaultCoordinatorHost),
          "Coordinator address.");
ABSL_FLAG(int32_t, coordinator_port, 0, "Coordinator port.");
ABSL_FLAG(std::string, secret_env, std::string(wsync::kDefaultSecretEnv),
          "Environment variable holding the secret.");
ABSL_FLAG(std::string, node_id, "", "Node id (default: the host name).");
ABSL_FLAG(std::string, replica_policy, std::string(wsync::kDefaultReplicaPolicy),
          "Replica policy (cost_aware needs --calibration_file).");
ABSL_FLAG(
    std::string, calibration_file, "",
    "A calibration file (wsync calibrate --out) whose fits --replica_policy cost_aware uses.");
ABSL_FLAG(std::string, path_transports, "",
          "Transport per path class, e.g. 'intra_node=ucx:sm,cma,self;inter_node=ucx:tcp@eth0'; "
          "empty: one UCX transport with --tls and --net_devices for every peer.");
ABSL_FLAG(std::string, verify, "off",
          "wsync's end-to-end integrity: off, hash (xxh3 per chunk) or keyed (a MAC per chunk).");
ABSL_FLAG(int64_t, staging_budget_bytes, 0,
          "Staging budget in bytes per peer and direction (0: the default).");
ABSL_FLAG(double, deadline_seconds, wsync::kDefaultDeadlineSeconds,
          "Deadline of each step in seconds.");
ABSL_FLAG(std::string, delta, "off", "Delta sync: off, auto or on (RuntimeConfig::delta).");
ABSL_FLAG(std::string, relay, "auto", "Relay mode: never, always or auto (planner/relay.h).");
ABSL_FLAG(std::string, relay_links, "",
          "Stated links (SyntheticCalibration syntax) for the cost model of --relay=auto; empty: "
          "the bytes rule.");
// Fault tests (tests/fault): failpoints come from WSYNC_FAILPOINTS (common/failpoint.h).
ABSL_FLAG(bool, keep_going, false,
          "After a failed sync, go on with the next version instead of exiting (exit status 1 "
          "when any version failed).");
ABSL_FLAG(int64_t, first_version, 1,
          "The first version this process syncs: a replacement process starts at the version "
          "the running job syncs next.");
ABSL_FLAG(double, await_replacement_s, 0,
          "After the first failed sync, wait up to this long for a replacement process's roster "
          "(a lost process's rank taken again) before the next version, printing 'PHASE "
          "await_replacement version=<next>' first; the next version then takes the replacement "
          "in (without a trigger this is what puts every process's roster update at the same "
          "step). 0: no wait.");
ABSL_FLAG(bool, markers, false,
          "Print 'PID <pid>', 'PHASE <join|transfer|decide> version=<v>' and one 'RESULT "
          "version=<v> ok=<0|1> transfer_s=<s> total_s=<s> error=<text>' line per sync.");
ABSL_FLAG(double, pause_before_decide_s, 0, "Sleep this long before each commit decision.");
// Delta sync (issue 44).
ABSL_FLAG(int32_t, changed_per_mille, 1000,
          "With --check_values: each version after 1 changes about this many elements per 1000 "
          "(test::FillSparseLogical); 1000: every element, every version.");
ABSL_FLAG(int64_t, fail_version, 0,
          "This process votes no in the commit decision of this version (after its transfer and "
          "element checks): an aborted sync. 0: never.");
ABSL_FLAG(int64_t, rebind_version, 0,
          "Before this version's sync, this process moves every buffer to new memory holding the "
          "same bytes and rebinds it (ConnectedJob::RebindBuffer). 0: never.");

namespace wsync {
namespace {

// Passes every call to `inner` and counts the bytes of each send and receive it posts, by peer,
// so a worker reports what crossed each path class on the wire (a relay's forwards included).
class CountingTransport final : public ForwardingTransport {
 public:
  CountingTransport(Transport& inner, int32_t processes)
      : ForwardingTransport(inner), sent_(processes, 0), received_(processes, 0) {}

  absl::StatusOr<RequestId> PostSend(int32_t peer, MessageTag tag, const void* data,
                                     int64_t bytes) override {
    absl::StatusOr<RequestId> request = ForwardingTransport::PostSend(peer, tag, data, bytes);
    if (request.ok() && peer >= 0 && peer < static_cast<int32_t>(sent_.size())) {
      sent_[peer] += bytes;
    }
    return request;
  }
  absl::StatusOr<RequestId> PostReceive(int32_t peer, MessageTag tag, void* data,
                                        int64_t bytes) override {
    absl::StatusOr<RequestId> request = ForwardingTransport::PostReceive(peer, tag, data, bytes);
    if (request.ok() && peer >= 0 && peer < static_cast<int32_t>(received_.size())) {
      received_[peer] += bytes;
    }
    return request;
  }

  void Reset() {
    std::fill(sent_.begin(), sent_.end(), 0);
    std::fill(received_.begin(), received_.end(), 0);
  }

  // Bytes posted to (from) each peer since the last Reset, summed by path class.
  std::map<std::string, int64_t> ByPath(const Job& job, bool sent) const {
    const std::vector<int64_t>& counts = sent ? sent_ : received_;
    std::map<std::string, int64_t> by_path;
    for (int32_t peer = 0; peer < static_cast<int32_t>(counts.size()); ++peer) {
      if (counts[peer] > 0) by_path[std::string(job.PathClass(process(), peer))] += counts[peer];
    }
    return by_path;
  }

 private:
  std::vector<int64_t> sent_;
  std::vector<int64_t> received_;
};

// CPU time of this process (every thread), seconds.
struct CpuTimes {
  double user = 0;
  double system = 0;
  CpuTimes operator-(const CpuTimes& o) const { return {user - o.user, system - o.system}; }
};

CpuTimes ProcessCpuTimes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec * 1e-6; };
  return {seconds(usage.ru_utime), seconds(usage.ru_stime)};
}

// `call_seconds`: the whole ExecuteTransfers call (work building and agreement included);
// `decide_seconds`: the commit decision after it; `cpu_seconds` and `cpu_user_seconds`: CPU time
// of the whole process (every thread; user and system, and user alone) during that call. For
// benchmarks; verification is in none.
// One line on standard output, flushed at once (fault tests read it while the process runs).
void Marker(const std::string& line) {
  if (!absl::GetFlag(FLAGS_markers)) return;
  absl::PrintF("%s\n", line);
  std::fflush(stdout);
}

void PrintStats(int64_t version, const Job& job, int32_t me, const TransferStats& stats,
                double call_seconds, double decide_seconds, const CpuTimes& cpu,
                const std::map<std::string, int64_t>& bytes_by_path, const CountingTransport& wire,
                int64_t quant_verified) {
  std::string line = absl::StrFormat(
      "STATS version=%d process=%d role=%s rank=%d seconds=%.6f sent=%d received=%d direct=%d "
      "staged=%d rounds=%d chunks=%d arena=%d verified=%d call_seconds=%.6f decide_seconds=%.6f "
      "cpu_seconds=%.6f cpu_user_seconds=%.6f",
      version, me, RoleName(job.processes()[me].role), job.processes()[me].rank, stats.seconds,
      stats.sent_bytes, stats.received_bytes, stats.direct_bytes, stats.staged_bytes, stats.rounds,
      stats.chunks, stats.peak_arena_bytes, stats.verified_chunks, call_seconds, decide_seconds,
      cpu.user + cpu.system, cpu.user);
  for (const auto& [path, bytes] : bytes_by_path)
    absl::StrAppend(&line, " path_", path, "=", bytes);
  absl::StrAppend(&line, " forwarded=", stats.forwarded_bytes, " quant_verified=", quant_verified,
                  " delta_messages=", stats.delta_messages,
                  " delta_saved=", stats.delta_saved_bytes);
  for (const bool sent : {true, false}) {
    for (const auto& [path, bytes] : wire.ByPath(job, sent)) {
      absl::StrAppend(&line, sent ? " wire_sent_" : " wire_received_", path, "=", bytes);
    }
  }
  absl::PrintF("%s\n", line);
  std::fflush(stdout);
}

// --delta as the settings table parses WSYNC_DELTA.
absl::StatusOr<DeltaMode> WorkerDeltaMode() {
  const std::string text = absl::GetFlag(FLAGS_delta);
  absl::StatusOr<SettingValue> value = ParseSettingValue(*FindSetting("delta"), text);
  if (!value.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--delta=", text, ": delta ", value.status().message()));
  }
  return static_cast<DeltaMode>(std::get<int64_t>(*value));
}

// The runtime's configuration of this worker (plugin/runtime.h) from the flags; `part` is its part
// of the layout, `memory` its buffers.
absl::StatusOr<RuntimeConfig> WorkerConfig(bool trainer, const Layout& part,
                                           test::HostBuffers& memory) {
  RuntimeConfig config;
  config.role = trainer ? Role::kTrainer : Role::kRollout;
  config.rank = absl::GetFlag(FLAGS_rank);
  config.job_id = absl::GetFlag(FLAGS_job);
  config.coordinator_host = absl::GetFlag(FLAGS_coordinator_host);
  config.coordinator_port = absl::GetFlag(FLAGS_coordinator_port);
  config.node_id = absl::GetFlag(FLAGS_node_id);
  config.part = part;
  for (const BufferInfo& info : part.buffers) {
    config.buffer_addresses.push_back(memory.data(test::BufferKey{config.rank, info.id}));
  }
  const int64_t budget = absl::GetFlag(FLAGS_staging_budget_bytes);
  config.staging_budget_bytes =
      static_cast<double>(budget > 0 ? budget : kDefaultStagingBudgetBytes);
  config.deadline = absl::Seconds(absl::GetFlag(FLAGS_deadline_seconds));
  config.control_connect_timeout = ControlClientOptions{}.connect_timeout;
  config.replica_policy = absl::GetFlag(FLAGS_replica_policy);
  if (absl::GetFlag(FLAGS_path_transports).empty()) {
    config.path_transports.fallback =
        TransportChoice{"ucx", absl::GetFlag(FLAGS_tls), absl::GetFlag(FLAGS_net_devices)};
  } else {
    WSYNC_ASSIGN_OR_RETURN(config.path_transports,
                           ParsePathTransports(absl::GetFlag(FLAGS_path_transports)));
  }
  // Every worker is given the same file; global process 0's copy goes to all (plugin/prediction.h).
  config.calibration_file = absl::GetFlag(FLAGS_calibration_file);
  WSYNC_ASSIGN_OR_RETURN(config.relay_mode, ParseRelayMode(absl::GetFlag(FLAGS_relay)));
  config.relay_fits = nullptr;  // The bytes rule, unless --relay_links states the links.
  if (!absl::GetFlag(FLAGS_relay_links).empty()) {
    WSYNC_ASSIGN_OR_RETURN(const proto::Calibration links,
                           SyntheticCalibration(absl::GetFlag(FLAGS_relay_links)));
    WSYNC_ASSIGN_OR_RETURN(LinkFits relay_fits, FitLinks(links));
    config.relay_fits = std::make_shared<const LinkFits>(std::move(relay_fits));
  }
  WSYNC_ASSIGN_OR_RETURN(config.verify, ParseVerifyMode(absl::GetFlag(FLAGS_verify)));
  WSYNC_ASSIGN_OR_RETURN(config.delta, WorkerDeltaMode());
  return config;
}

// Bytes this process's plan moves to and from its peers, by path class (what a relay of it
// receives included; quantization steps' e4m3 bytes, scales and gathers too).
std::map<std::string, int64_t> PlannedBytesByPath(const ConnectedJob& connected) {
  const Job& job = connected.job();
  const int32_t me = connected.process();
  std::map<std::string, int64_t> bytes_by_path;
  auto add = [&](int32_t from, int32_t to, int64_t bytes) {
    if (from != me && to != me) return;
    bytes_by_path[std::string(job.PathClass(me, from == me ? to : from))] += bytes;
  };
  for (const Segment& s : connected.plan().segments) {
    add(s.from.process, s.to.process, Volume(s.box) * job.ElementSize(s.param));
  }
  const QuantPlan& quant = connected.plan().quant;
  for (const QuantTransform& step : quant.transforms) {
    if (step.side != QuantSide::kSender) continue;
    add(step.from.process, step.to.process, Volume(step.box) * DTypeSize(DType::kFloat8E4M3));
    add(step.from.process, step.scale_to.process,
        Volume(step.scale_box) * DTypeSize(DType::kFloat32));
  }
  for (const Segment& gather : quant.gathers) {
    add(gather.from.process, gather.to.process,
        Volume(gather.box) * DTypeSize(job.source().params[job.SourceParamOf(gather.param)].dtype));
  }
  return bytes_by_path;
}

// Moves every buffer of this process to new memory holding the same bytes, rebinds it, and keeps
// the new memory in `memory` (the old is freed).
// --await_replacement_s: waits for a replacement's roster, or until the flag's time passed.
void AwaitReplacement(ControlClient& client, int64_t next_version) {
  const double wait_s = absl::GetFlag(FLAGS_await_replacement_s);
  if (wait_s <= 0) return;
  Marker(absl::StrCat("PHASE await_replacement version=", next_version));
  const absl::Time until = absl::Now() + absl::Seconds(wait_s);
  while (!client.HasRosterUpdate() && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
}

absl::Status RebindAll(ConnectedJob& connected, const Layout& part, test::HostBuffers& memory) {
  test::HostBuffers moved = memory;  // A deep copy at new addresses.
  const int32_t rank = absl::GetFlag(FLAGS_rank);
  for (const BufferInfo& info : part.buffers) {
    WSYNC_RETURN_IF_ERROR(
        connected.RebindBuffer(info.id, moved.data(test::BufferKey{rank, info.id})));
  }
  memory = std::move(moved);  // The map's nodes, and so the addresses, move with it.
  return absl::OkStatus();
}

absl::Status Run() {
  const bool trainer = absl::GetFlag(FLAGS_role) == "trainer";
  if (!trainer && absl::GetFlag(FLAGS_role) != "rollout") {
    return absl::InvalidArgumentError("--role must be trainer or rollout");
  }
  const int32_t rank = absl::GetFlag(FLAGS_rank);
  const absl::Duration step_deadline = absl::Seconds(absl::GetFlag(FLAGS_deadline_seconds));
  WSYNC_ASSIGN_OR_RETURN(std::string secret,
                         LoadSecret(SecretSource::Environment(absl::GetFlag(FLAGS_secret_env))));

  // This process's part of its side's layout.
  WSYNC_ASSIGN_OR_RETURN(ModelSpec model, GetModel(absl::GetFlag(FLAGS_model)));
  WSYNC_ASSIGN_OR_RETURN(Layout side, BuildNamedLayout(model, trainer ? absl::GetFlag(FLAGS_from)
                                                                      : absl::GetFlag(FLAGS_to)));
  Layout part = LayoutPart(side, rank);
  if (part.processes.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("the layout has no rank ", rank));
  }
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  part.processes[0].node_id =
      absl::GetFlag(FLAGS_node_id).empty() ? std::string(host) : absl::GetFlag(FLAGS_node_id);
  test::HostBuffers memory(part, test::kPoison);
  WSYNC_ASSIGN_OR_RETURN(RuntimeConfig config, WorkerConfig(trainer, part, memory));
  // Sent with every heartbeat (`wsync status`); kept current by the runtime; outlives the job.
  SyncProgress progress;
  config.progress = &progress;

  Marker(absl::StrCat("PID ", getpid()));
  ConnectHooks hooks;
  hooks.before_join = [] { Marker("PHASE join version=0"); };
  WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<ConnectedJob> connected,
                         ConnectedJob::Connect(std::move(config), secret, hooks));
  WipeSecret(secret);
  const Job& job = connected->job();
  const int32_t me = connected->process();
  const std::map<std::string, int64_t> bytes_by_path = PlannedBytesByPath(*connected);
  CountingTransport wire(*connected->transport(), job.num_processes());

  const bool verify = absl::GetFlag(FLAGS_check_values);
  const bool verify_quant = !trainer && absl::GetFlag(FLAGS_verify_quant);
  Layout source;  // The whole trainer layout, for --verify_quant.
  if (verify_quant) {
    WSYNC_ASSIGN_OR_RETURN(source, BuildNamedLayout(model, absl::GetFlag(FLAGS_from)));
  }
  const bool keep_going = absl::GetFlag(FLAGS_keep_going);
  int64_t failed_versions = 0;
  const int64_t first_version = absl::GetFlag(FLAGS_first_version);
  for (int64_t version = first_version; version <= absl::GetFlag(FLAGS_versions); ++version) {
    if (version == absl::GetFlag(FLAGS_rebind_version)) {
      WSYNC_RETURN_IF_ERROR(RebindAll(*connected, part, memory));
    }
    const int32_t per_mille = absl::GetFlag(FLAGS_changed_per_mille);
    if (trainer && verify) {
      WSYNC_RETURN_IF_ERROR(test::FillSparseLogical(part, version, per_mille, &memory));
    } else if (trainer && absl::GetFlag(FLAGS_fill_pattern)) {
      test::FillPattern(static_cast<uint64_t>(version), &memory);
    }
    StepOptions step;
    step.version = version;
    step.transport = &wire;
    // The element checks, test steps outside wsync's protocol, get a deadline of their own.
    int64_t quant_verified = 0;
    step.check = [&]() -> absl::Status {
      if (!trainer && verify) {
        WSYNC_RETURN_IF_ERROR(test::CheckSparseLogical(part, memory, version, per_mille));
      }
      if (verify_quant) {
        WSYNC_ASSIGN_OR_RETURN(quant_verified,
                               test::CheckQuantizedPattern(source, part, memory, version));
      }
      WSYNC_RETURN_IF_ERROR(memory.CheckGuards());
      if (version != absl::GetFlag(FLAGS_fail_version)) return absl::OkStatus();
      return absl::AbortedError(absl::StrCat("--fail_version ", version));
    };
    step.check_time = verify || verify_quant ? step_deadline : absl::ZeroDuration();
    step.pause_before_decide = absl::Seconds(absl::GetFlag(FLAGS_pause_before_decide_s));
    absl::Time call_start, decide_start;
    CpuTimes cpu_start, cpu;
    double call_seconds = 0, transfer_seconds = 0;
    step.on_phase = [&](StepPhase phase) {
      switch (phase) {
        case StepPhase::kTransfer:
          call_start = absl::Now();
          cpu_start = ProcessCpuTimes();
          wire.Reset();
          Marker(absl::StrCat("PHASE transfer version=", version));
          break;
        case StepPhase::kTransferred:
          call_seconds = absl::ToDoubleSeconds(absl::Now() - call_start);
          cpu = ProcessCpuTimes() - cpu_start;
          break;
        case StepPhase::kDecide:
          transfer_seconds = absl::ToDoubleSeconds(absl::Now() - call_start);
          if (step.pause_before_decide > absl::ZeroDuration()) {
            Marker(absl::StrCat("PHASE decide version=", version));
          }
          break;
        case StepPhase::kVote:
          decide_start = absl::Now();
          break;
      }
    };
    const StepResult result = connected->RunStep(step);
    const absl::Status& outcome = result.outcome;
    const absl::Status& decision = result.decision;
    Marker(absl::StrFormat(
        "RESULT version=%d ok=%d transfer_s=%.3f total_s=%.3f error=%s%s%s", version,
        outcome.ok() && decision.ok() ? 1 : 0, transfer_seconds,
        absl::ToDoubleSeconds(absl::Now() - call_start), outcome.ToString(),
        decision.ok() ? "" : " | decide: ", decision.ok() ? "" : decision.ToString()));
    if (!decision.ok() || !outcome.ok()) {
      if (!keep_going) return decision.ok() ? outcome : decision;
      if (++failed_versions == 1) AwaitReplacement(connected->client(), version + 1);
      continue;
    }
    PrintStats(version, job, me, *result.stats, call_seconds,
               absl::ToDoubleSeconds(absl::Now() - decide_start), cpu, bytes_by_path, wire,
               quant_verified);
  }
  if (failed_versions > 0) {
    return absl::AbortedError(absl::StrCat(failed_versions, " of ",
                                           absl::GetFlag(FLAGS_versions) - first_version + 1,
                                           " versions failed"));
  }
  return connected->client().Barrier(absl::Now() + step_deadline);
}

}  // namespace
}  // namespace wsync

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  absl::Status status = wsync::Run();
  if (!status.ok()) {
    absl::FPrintF(stderr, "wsync_test_worker: %s\n", status.ToString());
    return 1;
  }
  return 0;
}
