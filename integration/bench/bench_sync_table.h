#ifndef WSYNC_INTEGRATION_BENCH_BENCH_SYNC_TABLE_H_
#define WSYNC_INTEGRATION_BENCH_BENCH_SYNC_TABLE_H_

// `wsync-bench sync`'s contestants and what it prints once the rounds ran: the table of every
// contestant, the ratios of wsync to ucx_perftest per transport, and the costs outside the
// transfer, with the same figures as JSON. Private to bench_sync.cc.

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "integration/bench/bench_jobs.h"
#include "integration/bench/bench_report.h"
#include "integration/bench/bench_sync.h"

namespace wsync::bench {

// A layout pair the benchmark runs, with its schedule.
struct SyncScenario {
  std::string from;
  std::string to;
  ScheduleFacts facts;
};

// One contestant on one transport, with its samples of every round.
struct SyncRow {
  // "wsync", "wsync+verify", "wsync+keyed", "wsync 1->1", "wsync fp8" (into FP8 rollouts),
  // "wsync bf16" (the FP8 scenario's layouts into bf16, unless they are main's),
  // "ucx_perftest", "ucx_perftest xN" or "ucx_perftest 1->1" (one pair at the 1->1 schedule's
  // largest message, where it differs).
  std::string contestant;
  const SyncScenario* scenario = nullptr;  // wsync.
  Transports transports;
  int32_t pairs = 1;                   // ucx_perftest: concurrent sender/receiver pairs.
  std::vector<SyncSample> syncs;       // wsync.
  std::vector<double> per_pair_rates;  // ucx_perftest: mean bytes/s of a pair, one per run.
  std::vector<double> total_rates;     // ucx_perftest: summed over the pairs, one per run.
  int64_t message_bytes = 0;           // ucx_perftest.
  int32_t iters = 0;                   // ucx_perftest.

  bool wsync() const { return absl::StartsWith(contestant, "wsync"); }
  // Timed with verify: xxh3 hashes ("wsync+verify") or keyed MACs ("wsync+keyed").
  bool hashes() const { return contestant == "wsync+verify"; }
  bool keyed() const { return contestant == "wsync+keyed"; }
  int runs() const { return wsync() ? syncs.size() : per_pair_rates.size(); }
  std::vector<double> Seconds() const {
    std::vector<double> v;
    for (const SyncSample& s : syncs) v.push_back(s.seconds);
    return v;
  }
  // Per-receiver bytes per second: wsync's busiest rollout at the median sync; ucx_perftest's
  // median run.
  double Rate() const {
    if (!wsync()) return Median(per_pair_rates);
    const double seconds = Median(Seconds());
    return seconds > 0 ? syncs[0].rollout_bytes / seconds : 0;
  }
  double TotalRate() const {
    if (!wsync()) return Median(total_rates);
    const double seconds = Median(Seconds());
    return seconds > 0 ? syncs[0].total_bytes / seconds : 0;
  }
};

// One run of the benchmark: its settings, binaries and scenarios. Rows point at `main` and
// `single`, so a SyncBench stays where it was made.
struct SyncBench {
  SyncBenchOptions options;  // As given, with options.job's binaries resolved.
  std::string model_name;
  double budget = 0;
  int32_t syncs = 0;
  int32_t warmup = 0;
  int32_t rounds = 0;
  std::string perftest;
  SyncScenario main;
  std::optional<SyncScenario> single;  // The 1->1 contestant, unless options.single_from is empty.
  // The FP8 scenario (options.quant_from -> quant_to, the rollouts quantized), unless
  // options.quant is empty, and its bf16 baseline (the same layouts unquantized) where main's
  // layouts are others; on the transport named kFp8Transport only.
  std::optional<SyncScenario> fp8;
  std::optional<SyncScenario> fp8_base;
  std::vector<Transports> transports;
  int64_t message_bytes = 0;  // ucx_perftest's message for the main scenario, and its count.
  int32_t iters = 0;
  int32_t pairs = 1;        // Concurrent ucx_perftest pairs.
  bool concurrent = false;  // Whether they run (more than one).
};

// The transport of the FP8 scenario (issue 22: over UCX TCP).
inline constexpr char kFp8Transport[] = "tcp";

// Prints the table, one line per row (per-receiver throughput against one ucx_perftest pair, the
// goal, and against the concurrent pairs; a 1->1 row against one pair at its own message size),
// and its legend. Returns the JSON document's head and rows, up to the "ratios" object.
std::string PrintTable(const SyncBench& b, const std::vector<SyncRow>& rows, std::FILE* out);

// Prints the ratios per transport, the like-for-like ones next to the literal goal, and appends
// them to `json` as its "ratios" object; with an FP8 scenario, prints its comparison with the sync
// into bf16 (FormatQuantComparison) and appends it as "fp8"; closes the document.
void PrintRatios(const SyncBench& b, const std::vector<SyncRow>& rows, std::FILE* out,
                 std::string* json);

// Per wsync row, what the sync costs outside the transfer and in CPU time; per wsync+verify row,
// the cost of verify=true against the wsync row of its transport.
void PrintCosts(const std::vector<SyncRow>& rows, std::FILE* out);

}  // namespace wsync::bench

#endif  // WSYNC_INTEGRATION_BENCH_BENCH_SYNC_TABLE_H_
