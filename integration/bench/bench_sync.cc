#include "integration/bench/bench_sync.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status.h"
#include "integration/bench/bench_report.h"
#include "integration/bench/bench_sync_table.h"
#include "integration/bench/machine.h"
#include "integration/bench/perftest.h"
#include "integration/model_config/hf_config.h"
#include "planner/models.h"

namespace wsync::bench {
namespace {

// ---------------------------------------------------------------------------------------------
// Small helpers.

std::string MiB(double bytes) { return absl::StrFormat("%.2f MiB", bytes / (1 << 20)); }

std::string Join(const std::vector<double>& values, int digits) {
  return absl::StrJoin(values, " ", [digits](std::string* out, double v) {
    absl::StrAppendFormat(out, "%.*f", digits, v);
  });
}

}  // namespace

std::string SyncBenchUsage() {
  return "wsync-bench sync [--model M] [--from L] [--to L] [--staging_budget_bytes B]\n"
         "                 [--replica_policy P] [--sync_syncs K] [--sync_warmup W]\n"
         "                 [--sync_rounds R] [--sync_verify] [--verify_elements] [--verify_costs]\n"
         "                 [--sync_shm_tls T] [--sync_tcp_tls T]\n"
         "                 [--sync_tcp_devices D] [--sync_worker PATH] [--wsync PATH]\n"
         "                 [--sync_perftest PATH]\n"
         "                 [--sync_perftest_iters N] [--sync_perftest_size B]\n"
         "                 [--sync_perftest_concurrent] [--sync_perftest_pairs N]\n"
         "                 [--sync_single_from L] [--sync_single_to L]\n"
         "                 [--sync_perftest_wsync_settings]\n"
         "                 [--sync_timeout_s S] [--sync_json PATH] [--sync_quant Q]\n"
         "                 [--sync_quant_from L] [--sync_quant_to L]\n"
         "  Runs M (default qwen2.5-0.5b) from L (megatron(tp=2)) to L (vllm(tp=2)) as real\n"
         "  processes (coordinator, trainers, rollouts of wsync_host: libwsync.so through its C\n"
         "  ABI) over UCX shared memory and over UCX TCP, and a 1->1 job (megatron(tp=1) ->\n"
         "  vllm(tp=1)): one verified\n"
         "  job per scenario and transport (every chunk's xxh3 compared between sender and\n"
         "  receiver; --verify_elements: every rollout element against its logical value, about\n"
         "  a minute per GB per version), then R (default 4) rounds of K (default 5) timed syncs\n"
         "  each, alternating with ucx_perftest tag_bw between two processes (and as many\n"
         "  concurrent pairs as the schedule has busy sender -> receiver pairs) at the largest\n"
         "  message the schedule sends. Prints seconds per sync, GB/s per rollout and in total,\n"
         "  and per transport the ratios of wsync to ucx_perftest: per receiver against one pair\n"
         "  and against the concurrent pairs, in aggregate, and 1->1 against one pair.\n"
         "  --verify_costs"
         "  adds wsync+verify (xxh3 per chunk) and wsync+keyed (a MAC per chunk) to the same "
         "rounds and\n"
         "  prints its cost as a ratio. Each wsync job's limit is S (default 60) seconds plus,\n"
         "  per version, 10 s per GB its busiest process holds (160 with --verify_elements).\n"
         "  The FP8 scenario (--sync_quant Q, default fp8_block; empty: none): F -> T with\n"
         "  quant=Q (--sync_quant_from F, default megatron(tp=2); --sync_quant_to T, default\n"
         "  vllm(tp=1)) over TCP, its verification job also checking every e4m3 byte and scale\n"
         "  against the reference quantizer, timed in the same rounds as F -> T into bf16 (the\n"
         "  main row when F -> T is L -> L, else a 'wsync bf16' row); prints both syncs' bytes\n"
         "  on the wire (measured and planned), the ratios of bytes (goal <= 0.52) for the whole\n"
         "  sync and for the quantized parameters alone, the floor the parameters kept in bf16\n"
         "  set, and the ratio of seconds.\n" +
         CudaSyncBenchUsage();
}

namespace {

void PrintSchedule(std::FILE* out, const SyncScenario& scenario, double budget) {
  const ScheduleFacts& facts = scenario.facts;
  absl::FPrintF(out,
                "schedule %s -> %s (budget %.0f B per peer direction): the busiest rollout\n"
                "  receives %s in %d messages (%d direct) over %d rounds; largest message %d B\n"
                "  (%s, %s); bytes-weighted median message %s; all rollouts %s per sync;\n"
                "  %d sender -> receiver pairs carry bytes (%s MiB), %d of them busy\n",
                scenario.from, scenario.to, budget, MiB(facts.bytes_per_rollout), facts.messages,
                facts.direct_messages, facts.rounds, facts.largest_message,
                MiB(facts.largest_message), facts.largest_direct ? "direct" : "staged",
                MiB(facts.median_message), MiB(facts.bytes_total), facts.pair_bytes.size(),
                absl::StrJoin(facts.pair_bytes, " ",
                              [](std::string* o, int64_t b) {
                                absl::StrAppendFormat(o, "%.1f", b / 1048576.0);
                              }),
                facts.busy_pairs);
}

// The message size of ucx_perftest for a schedule: options.perftest_size or its largest; and the
// messages per run: options.perftest_iters or two syncs' bytes.
int64_t PerftestSize(const SyncBenchOptions& o, const ScheduleFacts& f) {
  return o.perftest_size > 0 ? o.perftest_size : f.largest_message;
}
int32_t PerftestIters(const SyncBenchOptions& o, const ScheduleFacts& f, int64_t size) {
  return o.perftest_iters > 0 ? o.perftest_iters : PerftestIterations(f, size);
}

// Fills `b` from `options`: binaries, both scenarios' schedules and the ucx_perftest settings.
absl::Status SetUp(const SyncBenchOptions& options, SyncBench* b) {
  b->options = options;
  const SyncBenchOptions& o = b->options;
  b->model_name = o.model;
  b->main.from = o.from;
  b->main.to = o.to;
  b->syncs = std::max(1, o.syncs);
  b->warmup = std::max(0, o.warmup);
  b->rounds = std::max(1, o.rounds);
  b->budget = o.job.budget;
  WSYNC_ASSIGN_OR_RETURN(const std::string self, SelfPath());
  WSYNC_RETURN_IF_ERROR(ResolveBinaries(self, &b->options.job));
  WSYNC_ASSIGN_OR_RETURN(b->perftest, FindInPath(o.perftest, "sync_perftest"));
  WSYNC_ASSIGN_OR_RETURN(const ModelSpec model, LoadModel(b->model_name));
  WSYNC_ASSIGN_OR_RETURN(
      b->main.facts, ScheduleFactsFor(model, b->main.from, b->main.to, b->budget, o.job.policy));
  if (!o.single_from.empty()) {
    b->single = SyncScenario{o.single_from, o.single_to, {}};
    WSYNC_ASSIGN_OR_RETURN(b->single->facts, ScheduleFactsFor(model, b->single->from, b->single->to,
                                                              b->budget, o.job.policy));
    if (b->single->facts.trainers != 1 || b->single->facts.rollouts != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--sync_single_from/--sync_single_to must have one process each; ",
                       b->single->from, " -> ", b->single->to, " has ", b->single->facts.trainers,
                       " and ", b->single->facts.rollouts));
    }
  }
  if (!o.quant.empty()) {
    WSYNC_ASSIGN_OR_RETURN(const std::string to, QuantizedSpec(o.quant_to, o.quant));
    b->fp8 = SyncScenario{o.quant_from, to, {}};
    WSYNC_ASSIGN_OR_RETURN(b->fp8->facts,
                           ScheduleFactsFor(model, b->fp8->from, to, b->budget, o.job.policy));
    if (b->fp8->facts.fp8_elements == 0) {
      return absl::InvalidArgumentError(absl::StrCat(to, " quantizes no parameter of ", o.model));
    }
    if (o.quant_from != b->main.from || o.quant_to != b->main.to) {
      b->fp8_base = SyncScenario{o.quant_from, o.quant_to, {}};
      WSYNC_ASSIGN_OR_RETURN(b->fp8_base->facts, ScheduleFactsFor(model, o.quant_from, o.quant_to,
                                                                  b->budget, o.job.policy));
    }
  }
  b->transports = {{"shm", o.shm_tls, ""}, {kFp8Transport, o.tcp_tls, o.tcp_devices}};
  b->message_bytes = PerftestSize(o, b->main.facts);
  b->iters = PerftestIters(o, b->main.facts, b->message_bytes);
  b->pairs = o.perftest_pairs > 0 ? o.perftest_pairs : std::max(1, b->main.facts.busy_pairs);
  b->concurrent = o.perftest_concurrent && b->pairs > 1;
  return absl::OkStatus();
}

// One verification job of 2 versions per scenario and transport (VerificationCheck).
absl::Status RunVerificationJobs(const SyncBench& b, std::FILE* out) {
  std::vector<const SyncScenario*> scenarios = {&b.main};
  if (b.single.has_value()) scenarios.push_back(&*b.single);
  const JobCheck check = VerificationCheck(b.options.job.verify_elements);
  for (const Transports& t : b.transports) {
    std::vector<const SyncScenario*> here = scenarios;
    if (b.fp8_base.has_value() && t.name == kFp8Transport) here.push_back(&*b.fp8_base);
    if (b.fp8.has_value() && t.name == kFp8Transport) here.push_back(&*b.fp8);
    for (const SyncScenario* scenario : here) {
      const absl::Time start = absl::Now();
      // FP8 rollouts are checked against the trainers' pattern (logical values are no finite
      // floats, and an FP8 element is no copy of one).
      const JobCheck used =
          scenario == (b.fp8 ? &*b.fp8 : nullptr) ? JobCheck::kChunkHashes : check;
      WSYNC_RETURN_IF_ERROR(RunWsync(scenario->facts, b.model_name, scenario->from, scenario->to, t,
                                     /*warmup=*/0, /*syncs=*/2, used, b.options.job)
                                .status());
      absl::FPrintF(out, "verified %s -> %s over %s (UCX_TLS=%s): 2 versions, %s%s (%.1f s)\n",
                    scenario->from, scenario->to, t.name, t.tls, VerificationText(used),
                    scenario->facts.fp8_elements > 0 && used == JobCheck::kChunkHashes
                        ? absl::StrFormat("; all %d e4m3 elements and their scales equal to the "
                                          "reference quantizer's of the trainers' bytes",
                                          scenario->facts.fp8_elements)
                        : std::string(),
                    absl::ToDoubleSeconds(absl::Now() - start));
      std::fflush(out);
    }
  }
  return absl::OkStatus();
}

// Per transport: wsync, wsync 1->1, one ucx_perftest pair (and one at the 1->1 schedule's
// largest message where that differs), and as many concurrent pairs as wsync has busy
// sender -> receiver pairs (on the same cores).
std::vector<SyncRow> MakeRows(const SyncBench& b) {
  std::vector<SyncRow> rows;
  for (const Transports& t : b.transports) {
    SyncRow row;
    row.contestant = "wsync";
    row.scenario = &b.main;
    row.transports = t;
    rows.push_back(row);
    if (b.fp8.has_value() && t.name == kFp8Transport) {
      if (b.fp8_base.has_value()) {
        row.contestant = "wsync bf16";
        row.scenario = &*b.fp8_base;
        rows.push_back(row);
      }
      row.contestant = "wsync fp8";
      row.scenario = &*b.fp8;
      rows.push_back(row);
      row.contestant = "wsync";
      row.scenario = &b.main;
    }
    if (b.options.verify) {
      row.contestant = "wsync+verify";
      rows.push_back(row);
      row.contestant = "wsync+keyed";
      rows.push_back(row);
    }
    if (b.single.has_value()) {
      row.contestant = "wsync 1->1";
      row.scenario = &*b.single;
      rows.push_back(row);
    }
    row.scenario = nullptr;
    row.contestant = "ucx_perftest";
    row.message_bytes = b.message_bytes;
    row.iters = b.iters;
    rows.push_back(row);
    if (b.single.has_value() && PerftestSize(b.options, b.single->facts) != b.message_bytes) {
      row.contestant = "ucx_perftest 1->1";
      row.message_bytes = PerftestSize(b.options, b.single->facts);
      row.iters = PerftestIters(b.options, b.single->facts, row.message_bytes);
      rows.push_back(row);
    }
    if (b.concurrent) {
      row.contestant = absl::StrCat("ucx_perftest x", b.pairs);
      row.message_bytes = b.message_bytes;
      row.iters = b.iters;
      row.pairs = b.pairs;
      rows.push_back(row);
    }
  }
  return rows;
}

// Runs every row once per round, in turn, adding its samples; ucx_perftest's logs go to a
// temporary folder, removed at the end.
absl::Status RunRounds(const SyncBench& b, std::vector<SyncRow>* rows, std::FILE* out) {
  char dir_template[] = "/tmp/wsync-bench-sync-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) return absl::InternalError("mkdtemp failed");
  const std::string dir = dir_template;
  absl::Status status;
  for (int32_t round = 1; round <= b.rounds && status.ok(); ++round) {
    for (size_t i = 0; i < rows->size() && status.ok(); ++i) {
      SyncRow& row = (*rows)[i];
      const std::string label = absl::StrFormat("round %d/%d  %-17s %-3s", round, b.rounds,
                                                row.contestant, row.transports.name);
      if (row.wsync()) {
        const SyncScenario& sc = *row.scenario;
        absl::StatusOr<std::vector<SyncSample>> samples =
            RunWsync(sc.facts, b.model_name, sc.from, sc.to, row.transports, b.warmup, b.syncs,
                     row.hashes()  ? JobCheck::kTimedHashes
                     : row.keyed() ? JobCheck::kTimedKeyed
                                   : JobCheck::kNone,
                     b.options.job);
        if (!samples.ok()) {
          status = samples.status();
          break;
        }
        std::vector<double> seconds;
        for (const SyncSample& s : *samples) seconds.push_back(s.seconds);
        absl::FPrintF(out, "%s  %d syncs: %s s; %.2f GB/s per rollout at the median\n", label,
                      b.syncs, Join(seconds, 4),
                      samples->front().rollout_bytes / Median(seconds) / 1e9);
        row.syncs.insert(row.syncs.end(), samples->begin(), samples->end());
      } else {
        absl::StatusOr<PerftestResult> result =
            RunPerftest(b.perftest, dir, row.transports.tls, row.transports.devices,
                        row.message_bytes, row.iters, row.pairs,
                        absl::Seconds(b.options.job.timeout_s), b.options.perftest_wsync_settings);
        if (!result.ok()) {
          status = result.status();
          break;
        }
        double sum = 0;
        for (double rate : result->bytes_per_second) sum += rate;
        std::vector<double> gb;
        for (double rate : result->bytes_per_second) gb.push_back(rate / 1e9);
        absl::FPrintF(out, "%s  %d x %d B: %s GB/s (%.2f s)\n", label, row.iters, row.message_bytes,
                      Join(gb, 2), result->seconds);
        row.per_pair_rates.push_back(sum / row.pairs);
        row.total_rates.push_back(sum);
      }
      std::fflush(out);
    }
  }
  for (const char* kind : {"server", "client"}) {
    for (int32_t i = 0; i < std::max(1, b.pairs); ++i) {
      unlink(absl::StrCat(dir, "/perftest-", kind, i, ".log").c_str());
    }
  }
  rmdir(dir.c_str());
  return status;
}

}  // namespace

absl::Status RunSyncBench(const SyncBenchOptions& options, std::FILE* out) {
  if (options.memory == "cuda") return RunCudaSyncBench(options, out);
  if (options.memory != "host") {
    return absl::InvalidArgumentError(
        absl::StrCat("--memory is host or cuda, not '", options.memory, "'"));
  }
  const absl::Time bench_start = absl::Now();
  SyncBench b;
  WSYNC_RETURN_IF_ERROR(SetUp(options, &b));
  const ScheduleFacts& facts = b.main.facts;
  absl::FPrintF(out, "wsync-bench sync: %s, %s -> %s, %d trainer + %d rollout processes\n",
                b.model_name, b.main.from, b.main.to, facts.trainers, facts.rollouts);
  absl::FPrintF(out, "  machine: %s\n  CPU flags: %s; %s\n", MachineDescription(), CpuVectorFlags(),
                Fp8KernelDescription());
  absl::FPrintF(out, "  processes %s\n  wsync %s\n  ucx_perftest %s\n", b.options.job.host,
                b.options.job.wsync, b.perftest);
  absl::FPrintF(out, "  UCX settings of wsync's processes%s: %s\n",
                b.options.perftest_wsync_settings ? " and of ucx_perftest" : "",
                absl::StrJoin(WsyncUcxEnvironment(), " "));
  PrintSchedule(out, b.main, b.budget);
  if (b.single.has_value()) PrintSchedule(out, *b.single, b.budget);
  if (b.fp8_base.has_value()) PrintSchedule(out, *b.fp8_base, b.budget);
  if (b.fp8.has_value()) PrintSchedule(out, *b.fp8, b.budget);
  std::fflush(out);

  if (b.options.verify_first) WSYNC_RETURN_IF_ERROR(RunVerificationJobs(b, out));
  std::vector<SyncRow> rows = MakeRows(b);
  WSYNC_RETURN_IF_ERROR(RunRounds(b, &rows, out));
  for (const SyncRow& row : rows) {
    if (!row.wsync() || row.syncs.empty()) continue;
    absl::FPrintF(out, "libwsync.so mapped in every process (checked in every job): %s\n",
                  row.syncs.front().library);
    break;
  }
  std::string json = PrintTable(b, rows, out);
  PrintRatios(b, rows, out, &json);
  PrintCosts(rows, out);
  absl::FPrintF(out, "total %.1f s\n", absl::ToDoubleSeconds(absl::Now() - bench_start));

  const std::string& json_path = b.options.json;
  if (!json_path.empty()) {
    std::ofstream file(json_path);
    file << json;
    if (!file.good()) return absl::InternalError(absl::StrCat("cannot write ", json_path));
  }
  return absl::OkStatus();
}

}  // namespace wsync::bench
