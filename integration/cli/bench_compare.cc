#include "integration/cli/bench_compare.h"

#include <stdlib.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "common/status.h"
#include "integration/cli/bench_report.h"
#include "integration/cli/bench_sync.h"
#include "integration/cli/perftest.h"
#include "integration/harness/launcher.h"
#include "planner/layout.h"
#include "planner/models.h"
#include "planner/named_layouts.h"

ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, from);
ABSL_DECLARE_FLAG(std::string, to);
ABSL_DECLARE_FLAG(std::string, out);
ABSL_DECLARE_FLAG(int32_t, repeats);
ABSL_DECLARE_FLAG(double, budget);
ABSL_DECLARE_FLAG(std::string, sync_shm_tls);
ABSL_DECLARE_FLAG(std::string, sync_tcp_tls);
ABSL_DECLARE_FLAG(std::string, sync_tcp_devices);
ABSL_DECLARE_FLAG(std::string, sync_perftest);

#ifndef WSYNC_BENCH_SCRIPT_DIR
#define WSYNC_BENCH_SCRIPT_DIR "integration/bench"
#endif

ABSL_FLAG(int32_t, compare_syncs, 3, "Timed syncs per contestant run (after the warm-up syncs).");
ABSL_FLAG(int32_t, compare_warmup, 1, "Untimed syncs at the start of every contestant run.");
ABSL_FLAG(int64_t, compare_bucket_bytes, int64_t{1} << 30,
          "Bucket size of the bucketed broadcast, bytes.");
ABSL_FLAG(std::string, compare_python, "/usr/bin/python3",
          "Python with torch (Debian's python3-torch) for the broadcast contestants and the plot.");
ABSL_FLAG(std::string, compare_scripts, WSYNC_BENCH_SCRIPT_DIR,
          "Folder of broadcast_sync.py and plot_compare.py.");
ABSL_FLAG(double, compare_timeout_s, 600, "Limit of each contestant run, seconds.");
ABSL_FLAG(bool, compare_plot, true, "Write compare.png next to compare.json.");
ABSL_FLAG(int64_t, compare_memcpy_bytes, 0, "wsync bench memcpy: bytes to copy.");
ABSL_FLAG(int32_t, compare_memcpy_pattern, 0x5a, "wsync bench memcpy: the source's byte value.");

namespace wsync::cli {
namespace {

constexpr char kDefaultModels[] = "qwen2.5-0.5b,llama-3.2-1b";
constexpr char kDefaultFrom[] = "megatron(tp=2)";
constexpr char kDefaultTo[] = "vllm(tp=2);vllm(tp=1,dp=2)";
constexpr char kGlooTransport[] = "gloo tcp (lo)";

std::string ProcessName(int32_t process, int32_t trainers) {
  return process < trainers ? absl::StrCat("trainer ", process)
                            : absl::StrCat("rollout ", process - trainers);
}

// Keeps the largest peak RSS seen per process over the runs of one result.
void KeepPeaks(const std::vector<int64_t>& peaks, int32_t trainers, Measured* m) {
  for (int32_t p = 0; p < static_cast<int32_t>(peaks.size()); ++p) {
    int64_t& kept = m->peak_rss_bytes[ProcessName(p, trainers)];
    kept = std::max(kept, peaks[p]);
  }
}

// ---------------------------------------------------------------------------------------------
// The layout spec broadcast_sync.py reads: parameters in the trainer layout's order, and per
// process its buffers and pieces (parameter index, box, buffer offset and strides in elements).

std::string DimsJson(const Dims& dims) { return absl::StrCat("[", absl::StrJoin(dims, ","), "]"); }

absl::StatusOr<std::string> LayoutSpecJson(const std::string& model_name, const Layout& trainers,
                                           const Layout& rollouts) {
  std::map<std::string, int32_t> index_by_name;
  int64_t element_bytes = 0;
  std::string params;
  for (int32_t i = 0; i < static_cast<int32_t>(trainers.params.size()); ++i) {
    const ParamInfo& p = trainers.params[i];
    const int64_t size = DTypeSize(p.dtype);
    if (element_bytes != 0 && size != element_bytes) {
      return absl::UnimplementedError(
          absl::StrCat("the broadcast contestants need one element size; ", p.name, " has ", size,
                       " bytes, others ", element_bytes));
    }
    element_bytes = size;
    index_by_name[p.name] = i;
    absl::StrAppend(&params, i == 0 ? "" : ",\n  ", "{\"name\": ", JsonString(p.name),
                    ", \"shape\": ", DimsJson(p.shape), "}");
  }
  // Rollout pieces name the trainer layout's parameter index (the layouts may order them apart).
  std::vector<int32_t> rollout_to_trainer(rollouts.params.size());
  for (size_t i = 0; i < rollouts.params.size(); ++i) {
    auto it = index_by_name.find(rollouts.params[i].name);
    if (it == index_by_name.end() ||
        trainers.params[it->second].shape != rollouts.params[i].shape) {
      return absl::InvalidArgumentError(absl::StrCat("rollout parameter ", rollouts.params[i].name,
                                                     " has no equal trainer parameter"));
    }
    rollout_to_trainer[i] = it->second;
  }
  auto side = [](const Layout& layout, const std::vector<int32_t>* param_map) {
    std::string out;
    for (size_t rank = 0; rank < layout.processes.size(); ++rank) {
      std::vector<std::string> buffers, pieces;
      for (const BufferInfo& b : layout.buffers) {
        if (b.process != static_cast<int32_t>(rank)) continue;
        buffers.push_back(absl::StrFormat("{\"id\": %d, \"bytes\": %d}", b.id, b.bytes));
      }
      for (const Piece& p : layout.pieces) {
        if (p.process != static_cast<int32_t>(rank)) continue;
        pieces.push_back(absl::StrFormat(
            "{\"param\": %d, \"buffer\": %d, \"origin\": %s, \"extent\": %s, \"offset\": %d, "
            "\"strides\": %s}",
            param_map == nullptr ? p.param : (*param_map)[p.param], p.buffer,
            DimsJson(p.box.origin), DimsJson(p.box.extent), p.offset, DimsJson(p.strides)));
      }
      absl::StrAppend(&out, rank == 0 ? "" : ",\n  ", "{\"buffers\": [",
                      absl::StrJoin(buffers, ", "), "],\n   \"pieces\": [",
                      absl::StrJoin(pieces, ",\n     "), "]}");
    }
    return out;
  };
  return absl::StrCat("{\"model\": ", JsonString(model_name),
                      ", \"element_bytes\": ", element_bytes, ",\n \"params\": [", params,
                      "],\n \"trainers\": [", side(trainers, nullptr), "],\n \"rollouts\": [",
                      side(rollouts, &rollout_to_trainer), "]}\n");
}

// ---------------------------------------------------------------------------------------------
// The broadcast contestants: one broadcast_sync.py process per trainer and rollout rank.

struct BroadcastRun {
  std::vector<double> seconds;  // Per timed sync: the slowest process.
  std::vector<int64_t> peak_rss_bytes;
  std::string buckets_line;  // Rank 0's "BUCKETS count=N largest_bytes=B".
};

struct Tools {
  std::string cli, worker, perftest, python, scripts;
};

absl::StatusOr<BroadcastRun> RunBroadcast(const Tools& tools, const std::string& spec_path,
                                          const std::string& mode, int32_t trainers,
                                          int32_t rollouts, int32_t warmup, int32_t syncs) {
  WSYNC_ASSIGN_OR_RETURN(const int port, harness::PickFreePort());
  harness::ProcessesSpec spec;
  spec.processes = trainers + rollouts;
  spec.command = [&](int p) {
    return std::vector<std::string>{
        tools.python,     tools.scripts + "/broadcast_sync.py",
        "--spec",         spec_path,
        "--rank",         absl::StrCat(p),
        "--mode",         mode,
        "--master_port",  absl::StrCat(port),
        "--bucket_bytes", absl::StrCat(absl::GetFlag(FLAGS_compare_bucket_bytes)),
        "--warmup",       absl::StrCat(warmup),
        "--syncs",        absl::StrCat(syncs),
        "--timeout_s",    absl::StrCat(absl::GetFlag(FLAGS_compare_timeout_s))};
  };
  spec.env = {"GLOO_SOCKET_IFNAME=lo", "OMP_NUM_THREADS=1", "PYTHONDONTWRITEBYTECODE=1"};
  spec.timeout = absl::Seconds(absl::GetFlag(FLAGS_compare_timeout_s));
  WSYNC_ASSIGN_OR_RETURN(std::vector<harness::ProcessResult> results, harness::RunProcesses(spec));
  BroadcastRun run;
  std::map<int64_t, double> slowest;  // version -> seconds
  for (int32_t p = 0; p < spec.processes; ++p) {
    const harness::ProcessResult& r = results[p];
    if (r.exit_code != 0) {
      return absl::InternalError(absl::StrFormat(
          "%s broadcast: %s exited %d%s: %s", mode, ProcessName(p, trainers), r.exit_code,
          r.killed ? " (killed at the limit)" : "", TailOf(r.stderr_text)));
    }
    run.peak_rss_bytes.push_back(r.peak_rss_bytes);
    int32_t verified = 0;
    for (absl::string_view line : absl::StrSplit(r.stdout_text, '\n', absl::SkipEmpty())) {
      std::map<std::string, std::string> fields;
      for (absl::string_view word : absl::StrSplit(line, ' ')) {
        const std::pair<std::string, std::string> kv = absl::StrSplit(word, '=');
        fields[kv.first] = kv.second;
      }
      int64_t version = 0;
      double seconds = 0;
      if (absl::StartsWith(line, "SYNC ") && absl::SimpleAtoi(fields["version"], &version) &&
          absl::SimpleAtod(fields["seconds"], &seconds)) {
        slowest[version] = std::max(slowest[version], seconds);
      } else if (absl::StartsWith(line, "VERIFIED ")) {
        ++verified;
      } else if (absl::StartsWith(line, "BUCKETS ")) {
        run.buckets_line = std::string(line);
      }
    }
    if (p >= trainers && verified != warmup + syncs) {
      return absl::InternalError(absl::StrFormat("%s broadcast: %s verified %d of %d versions",
                                                 mode, ProcessName(p, trainers), verified,
                                                 warmup + syncs));
    }
  }
  for (const auto& [version, seconds] : slowest) run.seconds.push_back(seconds);
  if (static_cast<int32_t>(run.seconds.size()) != syncs) {
    return absl::InternalError(absl::StrFormat("%s broadcast: %d of %d timed syncs reported", mode,
                                               run.seconds.size(), syncs));
  }
  return run;
}

// ---------------------------------------------------------------------------------------------
// memcpy of the bytes one rollout process must receive, in a child process (`wsync bench memcpy`):
// the launcher's own peak RSS is handed down to every child it spawns (posix_spawn shares its
// memory until exec), so the launcher itself never touches buffers of that size.

absl::StatusOr<double> RunMemcpyChild(const Tools& tools, int64_t bytes, int32_t round) {
  harness::ProcessesSpec spec;
  spec.processes = 1;
  spec.command = [&](int) {
    return std::vector<std::string>{tools.cli, "bench", "memcpy",
                                    absl::StrCat("--compare_memcpy_bytes=", bytes),
                                    absl::StrCat("--compare_memcpy_pattern=", 0x5a ^ round)};
  };
  spec.timeout = absl::Seconds(absl::GetFlag(FLAGS_compare_timeout_s));
  WSYNC_ASSIGN_OR_RETURN(std::vector<harness::ProcessResult> r, harness::RunProcesses(spec));
  double seconds = 0;
  if (r[0].exit_code != 0 ||
      sscanf(r[0].stdout_text.c_str(), "MEMCPY seconds=%lf", &seconds) != 1) {
    return absl::InternalError(
        absl::StrCat("wsync bench memcpy failed: ", r[0].stdout_text, TailOf(r[0].stderr_text)));
  }
  return seconds;
}

// ---------------------------------------------------------------------------------------------

std::string MachineDescription() {
  std::string cpu;
  for (absl::string_view line : absl::StrSplit(ReadWholeFile("/proc/cpuinfo"), '\n')) {
    if (absl::StartsWith(line, "model name")) {
      cpu = std::string(absl::StripAsciiWhitespace(line.substr(line.find(':') + 1)));
      break;
    }
  }
  double mem_gib = 0;
  for (absl::string_view line : absl::StrSplit(ReadWholeFile("/proc/meminfo"), '\n')) {
    if (absl::ConsumePrefix(&line, "MemTotal:")) {
      int64_t kib = 0;
      if (absl::SimpleAtoi(absl::StripSuffix(absl::StripAsciiWhitespace(line), " kB"), &kib)) {
        mem_gib = kib / 1048576.0;
      }
    }
  }
  utsname name = {};
  uname(&name);
  std::string load = std::string(absl::StripAsciiWhitespace(ReadWholeFile("/proc/loadavg")));
  return absl::StrFormat("%d cores (%s), %.0f GiB, Linux %s; load average at start %s",
                         sysconf(_SC_NPROCESSORS_ONLN), cpu, mem_gib, name.release,
                         load.substr(0, load.find(' ', load.find(' ', load.find(' ') + 1) + 1)));
}

Measured Result(std::string id, std::string description, std::string transport,
                std::string link_limit, std::string verification) {
  Measured m;
  m.id = std::move(id);
  m.description = std::move(description);
  m.transport = std::move(transport);
  m.link_limit = std::move(link_limit);
  m.verification = std::move(verification);
  return m;
}

Measured Limit(std::string id, std::string description, std::string transport,
               std::string verification) {
  Measured m = Result(std::move(id), std::move(description), std::move(transport), "",
                      std::move(verification));
  m.limit = true;
  return m;
}

// The goals, evaluated on this scenario's summaries; empty for every scenario but the one
// they are stated for (qwen2.5-0.5b megatron(tp=2) -> vllm(tp=2)).
std::vector<std::string> GoalLines(const Scenario& scenario) {
  if (scenario.model != "qwen2.5-0.5b" || scenario.from != "megatron(tp=2)" ||
      scenario.to != "vllm(tp=2)") {
    return {};
  }
  auto speedup = [&](const std::string& of, const std::string& over) -> std::optional<double> {
    std::optional<Summary> s = Summarize(scenario, of);
    if (!s.has_value() || !s->speedup.count(over)) return std::nullopt;
    return s->speedup.at(over);
  };
  auto line = [](const std::string& what, std::optional<double> value, double goal) {
    if (!value.has_value()) return absl::StrCat("  ", what, ": not measured");
    return absl::StrFormat("  %s: %.2f (goal >= %.2f: %s)", what, *value, goal,
                           *value >= goal ? "met" : "missed");
  };
  std::vector<std::string> lines = {
      "goals of the issue (stated for qwen2.5-0.5b megatron(tp=2) -> vllm(tp=2)):"};
  lines.push_back(
      line("wsync-tcp speed-up over per-param (both TCP)", speedup("wsync-tcp", "per-param"), 8));
  lines.push_back(
      line("wsync-tcp speed-up over bucketed (both TCP)", speedup("wsync-tcp", "bucketed"), 4));
  lines.push_back(line("wsync-shm speed-up over per-param", speedup("wsync-shm", "per-param"), 8));
  lines.push_back(line("wsync-shm speed-up over bucketed", speedup("wsync-shm", "bucketed"), 4));
  for (const char* id : {"wsync-shm", "wsync-tcp"}) {
    std::optional<Summary> s = Summarize(scenario, id);
    lines.push_back(line(absl::StrCat(id, " fraction of its ucx_perftest limit"),
                         s.has_value() ? s->fraction_of_link : std::nullopt, 0.85));
  }
  return lines;
}

absl::StatusOr<Scenario> RunScenario(const Tools& tools, const std::string& model_name,
                                     const std::string& from, const std::string& to,
                                     const std::string& work_dir, int32_t index, std::FILE* out) {
  const int32_t repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  const int32_t syncs = std::max(1, absl::GetFlag(FLAGS_compare_syncs));
  const int32_t warmup = std::max(0, absl::GetFlag(FLAGS_compare_warmup));
  WSYNC_ASSIGN_OR_RETURN(const ModelSpec model, GetModel(model_name));
  WSYNC_ASSIGN_OR_RETURN(const ScheduleFacts facts,
                         ScheduleFactsFor(model, from, to, absl::GetFlag(FLAGS_budget)));
  WSYNC_ASSIGN_OR_RETURN(const Layout trainers, BuildNamedLayout(model, from));
  WSYNC_ASSIGN_OR_RETURN(const Layout rollouts, BuildNamedLayout(model, to));
  WSYNC_ASSIGN_OR_RETURN(const std::string spec_json,
                         LayoutSpecJson(model_name, trainers, rollouts));
  const std::string spec_path = absl::StrCat(work_dir, "/layout", index, ".json");
  {
    std::ofstream file(spec_path);
    file << spec_json;
    if (!file.good()) return absl::InternalError(absl::StrCat("cannot write ", spec_path));
  }

  Scenario scenario;
  scenario.model = model_name;
  scenario.from = from;
  scenario.to = to;
  scenario.trainers = facts.trainers;
  scenario.rollouts = facts.rollouts;
  scenario.rollout_bytes = facts.bytes_per_rollout;
  const int64_t message = facts.largest_message;
  const int32_t iters = PerftestIterations(facts, message);
  const Transports shm{"shm", absl::GetFlag(FLAGS_sync_shm_tls), ""};
  const Transports tcp{"tcp", absl::GetFlag(FLAGS_sync_tcp_tls),
                       absl::GetFlag(FLAGS_sync_tcp_devices)};
  const std::string rollout_check = "every element of every rollout piece, every sync";
  const std::string wsync_check =
      "a verified job first (every element of every rollout piece); timed jobs: bytes and rounds "
      "each rollout received equal the schedule";
  const std::string perftest =
      absl::StrFormat("ucx_perftest tag_bw, one pair, %d x %d B", iters, message);
  const std::string tcp_name = absl::StrCat("UCX tcp (", tcp.devices, ")");
  scenario.results = {
      Result("wsync-shm", absl::StrCat("wsync over UCX shared memory (UCX_TLS=", shm.tls, ")"),
             "UCX shm", "perftest-shm", wsync_check),
      Result("wsync-tcp",
             absl::StrCat("wsync over UCX TCP (UCX_TLS=", tcp.tls, ", devices ", tcp.devices, ")"),
             tcp_name, "perftest-tcp", wsync_check),
      Result("per-param",
             "per-parameter broadcast: trainer 0 gathers each parameter and broadcasts it "
             "(torch.distributed gloo)",
             kGlooTransport, "perftest-tcp", rollout_check),
      Result("bucketed",
             absl::StrFormat("bucketed broadcast: whole parameters in %.0f MiB buckets "
                             "(torch.distributed gloo)",
                             absl::GetFlag(FLAGS_compare_bucket_bytes) / 1048576.0),
             kGlooTransport, "perftest-tcp", rollout_check),
      Limit("perftest-shm", perftest, "UCX shm", "not applicable: moves no weights"),
      Limit("perftest-tcp", perftest, tcp_name, "not applicable: moves no weights"),
      Limit("memcpy", "memcpy of the bytes one rollout process must receive, one thread", "memory",
            "memcmp of the copy against its source"),
  };

  absl::FPrintF(out,
                "\n[%d] %s, %s -> %s: %d trainers, %d rollouts; busiest rollout receives %.2f MiB "
                "per sync; largest message %d B\n",
                index, model_name, from, to, facts.trainers, facts.rollouts,
                facts.bytes_per_rollout / 1048576.0, message);
  std::fflush(out);

  // wsync's rollouts check every element with the test reference's logical values (an xxh3 per
  // element, tens of seconds per version for these models on a small machine), so each transport
  // gets one verified job first (one version: every rollout element starts poisoned and must hold
  // its value); the timed jobs then check the bytes and rounds every rollout received against the
  // schedule. The broadcast rollouts check every element after every sync (vectorized torch).
  const absl::Duration limit = absl::Seconds(absl::GetFlag(FLAGS_compare_timeout_s));
  std::map<std::string, bool> ok;
  for (Measured& m : scenario.results) {
    if (m.id != "wsync-shm" && m.id != "wsync-tcp") continue;
    const absl::Time start = absl::Now();
    WSYNC_RETURN_IF_ERROR(RunWsync(facts, model_name, from, to, m.id == "wsync-shm" ? shm : tcp,
                                   /*warmup=*/0, /*syncs=*/1,
                                   /*verify=*/true, /*hashes=*/false, tools.worker, tools.cli, limit)
                              .status());
    ok[m.id] = true;
    absl::FPrintF(out,
                  "  verified %s: every rollout element of one version (%.1f s with fill "
                  "and check)\n",
                  m.id, absl::ToDoubleSeconds(absl::Now() - start));
    std::fflush(out);
  }

  std::string buckets_line;
  const int n = static_cast<int>(scenario.results.size());
  for (int32_t round = 0; round < repeats; ++round) {
    for (int k = 0; k < n; ++k) {
      // The starting contestant rotates, so that slow phases of the machine hit each in turn.
      Measured& m = scenario.results[(k + round) % n];
      const absl::Time start = absl::Now();
      std::vector<double> samples;
      if (m.id == "wsync-shm" || m.id == "wsync-tcp") {
        std::vector<int64_t> peaks;
        WSYNC_ASSIGN_OR_RETURN(
            std::vector<SyncSample> s,
            RunWsync(facts, model_name, from, to, m.id == "wsync-shm" ? shm : tcp, warmup, syncs,
                     /*verify=*/false, /*hashes=*/false, tools.worker, tools.cli, limit,
                     &peaks));
        for (const SyncSample& sample : s) samples.push_back(sample.seconds);
        KeepPeaks(peaks, facts.trainers, &m);
      } else if (m.id == "per-param" || m.id == "bucketed") {
        WSYNC_ASSIGN_OR_RETURN(
            BroadcastRun run,
            RunBroadcast(tools, spec_path, m.id == "per-param" ? "param" : "bucket", facts.trainers,
                         facts.rollouts, warmup, syncs));
        samples = run.seconds;
        KeepPeaks(run.peak_rss_bytes, facts.trainers, &m);
        if (m.id == "bucketed") buckets_line = run.buckets_line;
        ok[m.id] = true;
      } else if (m.id == "memcpy") {
        WSYNC_ASSIGN_OR_RETURN(const double seconds,
                               RunMemcpyChild(tools, facts.bytes_per_rollout, round));
        samples.push_back(seconds);
        ok[m.id] = true;
      } else {
        WSYNC_ASSIGN_OR_RETURN(
            PerftestResult r,
            RunPerftest(tools.perftest, work_dir, m.id == "perftest-shm" ? shm.tls : tcp.tls,
                        m.id == "perftest-shm" ? shm.devices : tcp.devices, message, iters, 1,
                        absl::Seconds(absl::GetFlag(FLAGS_compare_timeout_s))));
        if (r.bytes_per_second.empty() || r.bytes_per_second[0] <= 0) {
          return absl::InternalError(absl::StrCat(m.id, " reported no bandwidth"));
        }
        samples.push_back(facts.bytes_per_rollout / r.bytes_per_second[0]);
      }
      m.seconds.insert(m.seconds.end(), samples.begin(), samples.end());
      std::vector<std::string> cells;
      for (double s : samples) cells.push_back(absl::StrFormat("%.4f", s));
      absl::FPrintF(out, "  round %d/%d %-12s %s s (%.1f s wall)\n", round + 1, repeats, m.id,
                    absl::StrJoin(cells, " "), absl::ToDoubleSeconds(absl::Now() - start));
      std::fflush(out);
    }
  }
  for (Measured& m : scenario.results) m.verified = ok[m.id];

  scenario.notes.push_back(
      "broadcast contestants (per-param, bucketed): torch.distributed over gloo, i.e. TCP over "
      "loopback (GLOO_SOCKET_IFNAME=lo); compare them with wsync-tcp (TCP too) and with "
      "wsync-shm.");
  int64_t bucket_count = 0, largest_bucket = 0;
  if (sscanf(buckets_line.c_str(), "BUCKETS count=%ld largest_bytes=%ld", &bucket_count,
             &largest_bucket) == 2) {
    scenario.notes.push_back(absl::StrFormat(
        "bucketed: %d bucket(s) of at most %.0f MiB; the largest holds %.2f MiB%s.", bucket_count,
        absl::GetFlag(FLAGS_compare_bucket_bytes) / 1048576.0, largest_bucket / 1048576.0,
        bucket_count == 1 ? " (the whole model fits in one bucket)" : ""));
  }
  scenario.notes.push_back(absl::StrFormat(
      "s/sync: wsync: transfer of the slowest process after the plan-digest agreement (commit "
      "decision excluded); broadcasts: from a barrier until the slowest process is done; limits: "
      "the busiest rollout's bytes at the measured rate. %d round(s), %d timed sync(s) per run "
      "after %d warm-up.",
      repeats, syncs, warmup));
  scenario.notes.push_back(absl::StrFormat(
      "GB/s/roll: the busiest rollout's %d B / median s/sync, for every row (a broadcast moves "
      "more than that: every rollout receives whole parameters). x ID: that contestant's median "
      "s/sync / this one's. of link: GB/s/roll / that of ucx_perftest on its transport (gloo: "
      "tcp); of mcpy: / memcpy's.",
      facts.bytes_per_rollout));
  rusage self = {};
  getrusage(RUSAGE_SELF, &self);
  scenario.notes.push_back(absl::StrFormat(
      "peak RSS: wait4's ru_maxrss of each process, which includes the launcher's own peak (%.0f "
      "MiB here) since posix_spawn shares its memory until exec.",
      self.ru_maxrss / 1024.0));
  for (const std::string& line : GoalLines(scenario)) scenario.notes.push_back(line);
  absl::FPrintF(out, "\n%s", FormatTable(scenario));
  std::fflush(out);
  return scenario;
}

// Writes compare.json (and compare.png with --compare_plot) for the scenarios so far.
absl::Status WriteResults(const Tools& tools, const std::vector<Scenario>& scenarios,
                          const std::string& out_dir, const std::string& date,
                          const std::string& machine, const std::string& command, std::FILE* out) {
  const std::string json_path = out_dir + "/compare.json";
  {
    std::ofstream file(json_path);
    file << ToJson(scenarios, date, machine, command);
    if (!file.good()) return absl::InternalError(absl::StrCat("cannot write ", json_path));
  }
  absl::FPrintF(out, "\nwrote %s\n", json_path);
  if (absl::GetFlag(FLAGS_compare_plot)) {
    const std::string png_path = out_dir + "/compare.png";
    harness::ProcessesSpec plot;
    plot.processes = 1;
    plot.command = [&](int) {
      return std::vector<std::string>{tools.python, tools.scripts + "/plot_compare.py", json_path,
                                      png_path};
    };
    plot.timeout = absl::Seconds(120);
    WSYNC_ASSIGN_OR_RETURN(std::vector<harness::ProcessResult> r, harness::RunProcesses(plot));
    if (r[0].exit_code != 0) {
      return absl::InternalError(absl::StrCat(
          "plot_compare.py failed (python3-matplotlib installed?): ", TailOf(r[0].stderr_text)));
    }
    absl::FPrintF(out, "wrote %s\n", png_path);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunMemcpyProbe(std::FILE* out) {
  const int64_t bytes = absl::GetFlag(FLAGS_compare_memcpy_bytes);
  if (bytes <= 0) return absl::InvalidArgumentError("--compare_memcpy_bytes must be positive");
  const auto pattern = static_cast<unsigned char>(absl::GetFlag(FLAGS_compare_memcpy_pattern));
  std::vector<unsigned char> from(bytes, pattern), to(bytes, static_cast<unsigned char>(~pattern));
  const absl::Time start = absl::Now();
  std::memcpy(to.data(), from.data(), bytes);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (std::memcmp(to.data(), from.data(), bytes) != 0) {
    return absl::DataLossError("memcpy produced different bytes");
  }
  absl::FPrintF(out, "MEMCPY seconds=%.9f bytes=%d\n", seconds, bytes);
  return absl::OkStatus();
}

std::string CompareBenchUsage() {
  return "wsync bench compare [--model M,M] [--from L;L] [--to L;L] [--repeats R] [--out DIR]\n"
         "                    [--compare_syncs K] [--compare_warmup W] [--compare_bucket_bytes B]\n"
         "                    [--compare_python PATH] [--compare_scripts DIR] [--compare_plot]\n"
         "                    [--compare_timeout_s S] [--budget B] [--policy P]\n"
         "  Every scenario of the models (default qwen2.5-0.5b,llama-3.2-1b), trainer layouts\n"
         "  (';'-separated, default megatron(tp=2)) and rollout layouts (default vllm(tp=2);\n"
         "  vllm(tp=1,dp=2)): wsync over UCX shm and TCP, the per-parameter and the bucketed\n"
         "  broadcast over gloo, ucx_perftest and memcpy, in turn R times (default 5), K timed\n"
         "  syncs per run (default 3), every rollout element checked after every sync. Prints a\n"
         "  table per scenario and writes compare.json and compare.png to DIR (default\n"
         "  bench-results/compare). `wsync bench memcpy --compare_memcpy_bytes N` is its memcpy\n"
         "  limit, run as a child process.\n";
}

absl::Status RunCompareBench(std::FILE* out, const std::string& command) {
  const absl::Time bench_start = absl::Now();
  const std::string models =
      absl::GetFlag(FLAGS_model).empty() ? kDefaultModels : absl::GetFlag(FLAGS_model);
  const std::string froms =
      absl::GetFlag(FLAGS_from).empty() ? kDefaultFrom : absl::GetFlag(FLAGS_from);
  const std::string tos = absl::GetFlag(FLAGS_to).empty() ? kDefaultTo : absl::GetFlag(FLAGS_to);
  const std::string out_dir =
      absl::GetFlag(FLAGS_out).empty() ? "bench-results/compare" : absl::GetFlag(FLAGS_out);

  Tools tools;
  WSYNC_ASSIGN_OR_RETURN(tools.cli, SelfPath());
  WSYNC_ASSIGN_OR_RETURN(tools.worker, FindWorker(tools.cli));
  WSYNC_ASSIGN_OR_RETURN(tools.perftest, FindInPath(absl::GetFlag(FLAGS_sync_perftest)));
  WSYNC_ASSIGN_OR_RETURN(tools.python, FindInPath(absl::GetFlag(FLAGS_compare_python)));
  tools.scripts = absl::GetFlag(FLAGS_compare_scripts);
  if (access((tools.scripts + "/broadcast_sync.py").c_str(), R_OK) != 0) {
    return absl::NotFoundError(
        absl::StrCat(tools.scripts, "/broadcast_sync.py not found; pass --compare_scripts"));
  }
  std::error_code error;
  std::filesystem::create_directories(out_dir, error);
  if (error)
    return absl::InternalError(absl::StrCat("cannot create ", out_dir, ": ", error.message()));
  char dir_template[] = "/tmp/wsync-bench-compare-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) return absl::InternalError("mkdtemp failed");
  const std::string work_dir = dir_template;

  const std::string machine = MachineDescription();
  const std::string date = absl::FormatTime("%Y-%m-%d %H:%M UTC", bench_start, absl::UTCTimeZone());
  absl::FPrintF(out, "wsync bench compare, %s\n  machine: %s\n  command: %s\n", date, machine,
                command);
  std::vector<Scenario> scenarios;
  absl::Status status;
  int32_t index = 0;
  for (absl::string_view model : absl::StrSplit(models, ',', absl::SkipWhitespace())) {
    for (absl::string_view from : absl::StrSplit(froms, ';', absl::SkipWhitespace())) {
      for (absl::string_view to : absl::StrSplit(tos, ';', absl::SkipWhitespace())) {
        if (!status.ok()) break;
        absl::StatusOr<Scenario> scenario =
            RunScenario(tools, std::string(absl::StripAsciiWhitespace(model)),
                        std::string(absl::StripAsciiWhitespace(from)),
                        std::string(absl::StripAsciiWhitespace(to)), work_dir, ++index, out);
        if (scenario.ok()) {
          scenarios.push_back(*std::move(scenario));
          // After every scenario, so that a later failure keeps the finished ones.
          status = WriteResults(tools, scenarios, out_dir, date, machine, command, out);
        } else {
          status = absl::Status(
              scenario.status().code(),
              absl::StrCat(model, " ", from, " -> ", to, ": ", scenario.status().message()));
        }
      }
    }
  }
  std::filesystem::remove_all(work_dir, error);
  WSYNC_RETURN_IF_ERROR(status);

  absl::FPrintF(out, "total %.1f s\n", absl::ToDoubleSeconds(absl::Now() - bench_start));
  return absl::OkStatus();
}

}  // namespace wsync::cli
