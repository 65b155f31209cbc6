#include "integration/bench/bench_sync_table.h"

#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "integration/bench/bench_report.h"

namespace wsync::bench {
namespace {

// The ratios of wsync to ucx_perftest on one transport (0 where a contestant did not run).
struct Ratios {
  double per_receiver_vs_pair = 0;        // wsync GB/s per receiver / one pair's GB/s.
  double per_receiver_vs_concurrent = 0;  // ... / the mean pair's of the concurrent pairs.
  double aggregate_vs_concurrent = 0;     // wsync GB/s of all receivers / all concurrent pairs'.
  double aggregate_vs_pair = 0;           // wsync GB/s of all receivers / one pair's.
  double single_vs_pair = 0;              // wsync 1->1 GB/s / one pair's at its message size.
};

double Ratio(double a, double b) { return b > 0 ? a / b : 0; }

// The ucx_perftest rows each wsync row is compared with, by transport name: one pair at the
// main message size, one pair at the 1->1 size (the main one where they agree), and the
// concurrent pairs.
struct References {
  std::map<std::string, const SyncRow*> single_pair, single_pair_1to1, multi;

  explicit References(const std::vector<SyncRow>& rows) {
    for (const SyncRow& row : rows) {
      const std::string& name = row.transports.name;
      if (row.contestant == "ucx_perftest") {
        single_pair[name] = &row;
        if (!single_pair_1to1.contains(name)) single_pair_1to1[name] = &row;
      }
      if (row.contestant == "ucx_perftest 1->1") single_pair_1to1[name] = &row;
      if (!row.wsync() && row.pairs > 1) multi[name] = &row;
    }
  }
  // The per-receiver rate of the reference in `refs` on `row`'s transport; 0 without one.
  static double Rate(const std::map<std::string, const SyncRow*>& refs, const SyncRow& row) {
    auto it = refs.find(row.transports.name);
    return it == refs.end() ? 0.0 : it->second->Rate();
  }
};

}  // namespace

std::string PrintTable(const SyncBench& b, const std::vector<SyncRow>& rows, std::FILE* out) {
  const ScheduleFacts& facts = b.main.facts;
  const References refs(rows);
  const std::string multi_header = absl::StrCat("vs x", b.pairs);
  absl::FPrintF(out, "\n%-17s %-3s %-12s %4s %8s %8s %8s %9s %8s %7s %7s\n", "contestant", "",
                "UCX_TLS", "runs", "s/sync", "min", "max", "GB/s/recv", "GB/s all", "vs perf",
                b.concurrent ? multi_header : "");
  std::string json = absl::StrFormat(
      "{\n  \"model\": %s, \"from\": %s, \"to\": %s, \"trainers\": %d, \"rollouts\": %d,\n"
      "  \"budget_bytes\": %.0f, \"largest_message_bytes\": %d, \"perftest_message_bytes\": "
      "%d, \"rollout_bytes\": %d, "
      "\"total_bytes\": %d,\n  \"messages_per_rollout\": %d, \"rounds\": %d, \"syncs_per_job\": "
      "%d, \"warmup_syncs\": %d, \"alternations\": %d, \"busy_pairs\": %d, "
      "\"concurrent_perftest_pairs\": %d,\n  \"rows\": [",
      JsonString(b.model_name), JsonString(b.main.from), JsonString(b.main.to), facts.trainers,
      facts.rollouts, b.budget, facts.largest_message, b.message_bytes, facts.bytes_per_rollout,
      facts.bytes_total, facts.messages, facts.rounds, b.syncs, b.warmup, b.rounds,
      facts.busy_pairs, b.pairs);
  for (size_t i = 0; i < rows.size(); ++i) {
    const SyncRow& row = rows[i];
    const bool one_to_one = absl::EndsWith(row.contestant, "1->1");
    const double ratio = Ratio(
        row.Rate(), References::Rate(one_to_one ? refs.single_pair_1to1 : refs.single_pair, row));
    const double ratio_multi = Ratio(row.Rate(), References::Rate(refs.multi, row));
    const std::string multi_cell = b.concurrent && !one_to_one
                                       ? absl::StrFormat("%.2f", ratio_multi)
                                       : std::string(b.concurrent ? "-" : "");
    std::string seconds_cells = absl::StrFormat("%8s %8s %8s", "-", "-", "-");
    std::string json_extra;
    if (row.wsync()) {
      const std::vector<double> seconds = row.Seconds();
      seconds_cells =
          absl::StrFormat("%8.4f %8.4f %8.4f", Median(seconds), Min(seconds), Max(seconds));
      std::vector<double> call, outside, cpu;
      for (const SyncSample& s : row.syncs) {
        call.push_back(s.sync_seconds);
        outside.push_back(s.outside_seconds);
        cpu.push_back(s.cpu_seconds);
      }
      json_extra = absl::StrFormat(
          ", \"from\": %s, \"to\": %s, \"seconds_median\": %.6f, \"seconds_min\": %.6f, "
          "\"seconds_max\": %.6f, \"sync_call_seconds_median\": %.6f, "
          "\"outside_transfer_seconds_median\": %.6f, \"cpu_seconds_median\": %.6f, "
          "\"seconds\": [%s]",
          JsonString(row.scenario->from), JsonString(row.scenario->to), Median(seconds),
          Min(seconds), Max(seconds), Median(call), Median(outside), Median(cpu),
          absl::StrJoin(seconds, ", ",
                        [](std::string* o, double v) { absl::StrAppendFormat(o, "%.6f", v); }));
    } else {
      json_extra = absl::StrFormat(
          ", \"pairs\": %d, \"message_bytes\": %d, \"iterations\": %d, \"gbps_per_pair_runs\": "
          "[%s]",
          row.pairs, row.message_bytes, row.iters,
          absl::StrJoin(row.per_pair_rates, ", ", [](std::string* o, double r) {
            absl::StrAppendFormat(o, "%.4f", r / 1e9);
          }));
    }
    absl::FPrintF(out, "%-17s %-3s %-12s %4d %s %9.2f %8.2f %7.2f %7s\n", row.contestant,
                  row.transports.name, row.transports.tls, row.runs(), seconds_cells,
                  row.Rate() / 1e9, row.TotalRate() / 1e9, ratio, multi_cell);
    absl::StrAppendFormat(&json,
                          "%s\n    {\"contestant\": %s, \"transport\": %s, \"tls\": %s, "
                          "\"runs\": %d, \"gbps_per_receiver\": %.4f, \"gbps_total\": %.4f, "
                          "\"ratio_to_perftest\": %.4f, \"ratio_to_concurrent_perftest\": %.4f%s}",
                          i == 0 ? "" : ",", JsonString(row.contestant),
                          JsonString(row.transports.name), JsonString(row.transports.tls),
                          row.runs(), row.Rate() / 1e9, row.TotalRate() / 1e9, ratio, ratio_multi,
                          json_extra);
  }
  absl::FPrintF(out,
                "GB/s = 1e9 B/s. s/sync: transfer time of the slowest process (agreement, commit\n"
                "  decision and verification excluded), median/min/max over %d rounds x %d syncs.\n"
                "  GB/s/recv: the busiest rollout's %d B / median s/sync; ucx_perftest: tag_bw,\n"
                "  %d x %d B per run, median run, mean of its pairs. vs perf: GB/s/recv / one\n"
                "  ucx_perftest pair's (goal >= 0.85; 1->1 rows: the pair at their own size).\n",
                b.rounds, b.syncs, facts.bytes_per_rollout, b.iters, b.message_bytes);
  if (b.concurrent) {
    absl::FPrintF(out,
                  "  %s: GB/s/recv / the mean pair's of %d concurrent ucx_perftest pairs (as many\n"
                  "  as wsync's busy sender -> receiver pairs, on the same cores; ucx_perftest's\n"
                  "  processes busy-poll).\n",
                  multi_header, b.pairs);
  }
  return json;
}

namespace {

// The FP8 row against the bf16 "wsync" row of its transport; nullopt when either did not run.
std::optional<QuantComparison> CompareQuant(const SyncBench& b, const std::vector<SyncRow>& rows) {
  const SyncRow *bf16 = nullptr, *fp8 = nullptr;
  const char* base = b.fp8_base.has_value() ? "wsync bf16" : "wsync";
  for (const SyncRow& row : rows) {
    if (row.transports.name != kFp8Transport || row.syncs.empty()) continue;
    if (row.contestant == base) bf16 = &row;
    if (row.contestant == "wsync fp8") fp8 = &row;
  }
  if (!b.fp8.has_value() || bf16 == nullptr || fp8 == nullptr) return std::nullopt;
  auto wire = [](const SyncRow& row) {
    std::vector<double> bytes;
    for (const SyncSample& s : row.syncs) bytes.push_back(static_cast<double>(s.wire_bytes));
    return Median(bytes);
  };
  QuantComparison c;
  c.transport = kFp8Transport;
  c.bf16_wire_bytes = wire(*bf16);
  c.fp8_wire_bytes = wire(*fp8);
  c.bf16_plan_bytes = (b.fp8_base.has_value() ? *b.fp8_base : b.main).facts.bytes_total;
  c.fp8_plan_bytes = b.fp8->facts.bytes_total;
  c.plain_bytes = b.fp8->facts.plain_bytes;
  c.fp8_bytes = b.fp8->facts.quant.fp8;
  c.scale_bytes = b.fp8->facts.quant.scales;
  c.gathered_bytes = b.fp8->facts.quant.gathered;
  c.quantized_bf16_bytes = b.fp8->facts.quant.unquantized;
  c.bf16_seconds = Median(bf16->Seconds());
  c.fp8_seconds = Median(fp8->Seconds());
  return c;
}

}  // namespace

void PrintRatios(const SyncBench& b, const std::vector<SyncRow>& rows, std::FILE* out,
                 std::string* json) {
  const References refs(rows);
  *json += "\n  ],\n  \"ratios\": {";
  absl::FPrintF(out,
                "\nwsync / ucx_perftest (medians of the same alternating rounds; goal >= 0.85)\n"
                "%-4s %12s %14s %14s %12s %12s\n",
                "", "recv/1 pair", absl::StrCat("recv/pair of x", b.pairs),
                absl::StrCat("all/all of x", b.pairs), "all/1 pair", "1->1/1 pair");
  for (size_t t = 0; t < b.transports.size(); ++t) {
    Ratios r;
    for (const SyncRow& row : rows) {
      if (row.transports.name != b.transports[t].name) continue;
      if (row.contestant == "wsync") {
        r.per_receiver_vs_pair = Ratio(row.Rate(), References::Rate(refs.single_pair, row));
        r.per_receiver_vs_concurrent = Ratio(row.Rate(), References::Rate(refs.multi, row));
        r.aggregate_vs_pair = Ratio(row.TotalRate(), References::Rate(refs.single_pair, row));
        auto it = refs.multi.find(row.transports.name);
        if (it != refs.multi.end()) {
          r.aggregate_vs_concurrent = Ratio(row.TotalRate(), it->second->TotalRate());
        }
      } else if (row.contestant == "wsync 1->1") {
        r.single_vs_pair = Ratio(row.Rate(), References::Rate(refs.single_pair_1to1, row));
      }
    }
    auto cell = [](double v) { return v > 0 ? absl::StrFormat("%.2f", v) : std::string("-"); };
    absl::FPrintF(out, "%-4s %12s %14s %14s %12s %12s\n", b.transports[t].name,
                  cell(r.per_receiver_vs_pair), cell(r.per_receiver_vs_concurrent),
                  cell(r.aggregate_vs_concurrent), cell(r.aggregate_vs_pair),
                  cell(r.single_vs_pair));
    absl::StrAppendFormat(
        json,
        "%s\n    %s: {\"per_receiver_vs_pair\": %.4f, \"per_receiver_vs_concurrent_pair\": %.4f, "
        "\"aggregate_vs_concurrent\": %.4f, \"aggregate_vs_pair\": %.4f, "
        "\"one_to_one_vs_pair\": %.4f}",
        t == 0 ? "" : ",", JsonString(b.transports[t].name), r.per_receiver_vs_pair,
        r.per_receiver_vs_concurrent, r.aggregate_vs_concurrent, r.aggregate_vs_pair,
        r.single_vs_pair);
  }
  *json += "\n  }";
  if (const std::optional<QuantComparison> quant = CompareQuant(b, rows); quant.has_value()) {
    const SyncScenario& base = b.fp8_base.has_value() ? *b.fp8_base : b.main;
    absl::FPrintF(out, "\n%s -> %s against %s -> %s\n%s", b.fp8->from, b.fp8->to, base.from,
                  base.to, FormatQuantComparison(*quant));
    absl::StrAppend(json, ",\n  \"fp8\": ", QuantComparisonJson(*quant));
  }
  *json += "\n}\n";
}

void PrintCosts(const std::vector<SyncRow>& rows, std::FILE* out) {
  for (const SyncRow& row : rows) {
    if (!row.wsync()) continue;
    std::vector<double> outside, call, cpu, user;
    for (const SyncSample& s : row.syncs) {
      outside.push_back(s.outside_seconds);
      call.push_back(s.sync_seconds);
      cpu.push_back(s.cpu_seconds);
      user.push_back(s.cpu_user_seconds);
    }
    absl::FPrintF(out,
                  "%s %s outside the transfer (medians): %.4f s (the slowest sync call less the\n"
                  "  slowest transfer, by the library's seconds: trigger, agreement and commit\n"
                  "  decision); the sync call as the host sees it (slowest process)\n"
                  "  %.4f s = %.2f GB/s per rollout; CPU of all processes during the sync call\n"
                  "  %.4f s per sync = %.3f s per GB received (user space %.4f s, kernel %.4f s)\n",
                  row.contestant, row.transports.name, Median(outside), Median(call),
                  row.syncs[0].rollout_bytes / Median(call) / 1e9, Median(cpu),
                  Median(cpu) / (row.syncs[0].total_bytes / 1e9), Median(user),
                  Median(cpu) - Median(user));
  }
  for (const SyncRow& without : rows) {
    if (without.contestant != "wsync") continue;
    const double off = Median(without.Seconds());
    std::string line;
    for (const SyncRow& with : rows) {
      if ((!with.hashes() && !with.keyed()) || with.transports.name != without.transports.name) {
        continue;
      }
      const double on = Median(with.Seconds());
      absl::StrAppendFormat(&line, ", %s %.4f s (ratio %.3f)", with.keyed() ? "keyed" : "xxh3", on,
                            off > 0 ? on / off : 0);
    }
    if (line.empty()) continue;
    absl::FPrintF(out, "verify cost %s (s/sync, same rounds, alternating): unverified %.4f s%s\n",
                  without.transports.name, off, line);
  }
}

}  // namespace wsync::bench
