#ifndef WSYNC_INTEGRATION_BENCH_BENCH_REPORT_H_
#define WSYNC_INTEGRATION_BENCH_BENCH_REPORT_H_

// The pure part of `wsync-bench compare` (and the statistics `wsync-bench sync` shares): per
// scenario, the measured samples of every contestant and link limit, summarized into seconds per
// sync, GB/s per rollout process, speed-ups and fractions of the link limits, and rendered as a
// text table and as JSON. No I/O, no processes: everything here is a function of its inputs.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace wsync::bench {

// Median (the mean of the two middle values for an even count), smallest and largest; 0 for none.
double Median(std::vector<double> values);
double Min(const std::vector<double>& values);
double Max(const std::vector<double>& values);

// The time limit of a benchmark's child wsync job, seconds: `base_seconds` plus, per version,
// 10 s per GB (1e9 B) the busiest process holds (a sync at 0.1 GB/s, with room for filling and
// hashing) and, with `element_check`, another 150 s per GB (filling and checking every element
// logically took about 55 s per GB per version on the 2-core machine of docs/benchmarks.md).
double JobLimitSeconds(double base_seconds, int32_t versions, int64_t process_bytes,
                       bool element_check);

// `wsync-bench sync`'s FP8 scenario (issue 22): the sync into FP8 rollouts against the same sync
// into bf16, over one transport, from the same alternating rounds. Both syncs also send the
// parameters an FP8 rollout keeps in bf16 (embeddings, norms, biases: `plain_bytes`, the same
// bytes in both), so the quantized parameters' own ratio is the wire bytes less those.
struct QuantComparison {
  std::string transport;       // "tcp".
  double bf16_wire_bytes = 0;  // Median per sync of the bytes every process posted to send.
  double fp8_wire_bytes = 0;
  int64_t bf16_plan_bytes = 0;  // What the schedule sends the rollouts (quantization included).
  int64_t fp8_plan_bytes = 0;
  // Of fp8_plan_bytes: parameters sent unquantized (in both syncs); e4m3 bytes and scales that
  // senders quantized; bf16 gathered for receivers to quantize (blocks cut by the trainers'
  // shards). And the bf16 bytes of the quantized parameters (what the bf16 sync sends of them).
  int64_t plain_bytes = 0;
  int64_t fp8_bytes = 0;
  int64_t scale_bytes = 0;
  int64_t gathered_bytes = 0;
  int64_t quantized_bf16_bytes = 0;
  double bf16_seconds = 0;  // Median seconds per sync.
  double fp8_seconds = 0;
};

// Ratios of FP8 to bf16 (0 where the denominator is not positive): the whole syncs' measured
// wire bytes; the quantized parameters' measured wire bytes (each sync's less plain_bytes); the
// plans' bytes; the quantized parameters' planned bytes (fp8 + scales + gathered over
// quantized_bf16_bytes); seconds per sync.
double WireRatio(const QuantComparison& c);
double QuantizedWireRatio(const QuantComparison& c);
double PlanRatio(const QuantComparison& c);
double QuantizedPlanRatio(const QuantComparison& c);
double TimeRatio(const QuantComparison& c);
// The least whole-sync wire ratio the parameters kept in bf16 allow: (plain + quantized / 2) /
// (plain + quantized), every quantized bf16 byte become half an e4m3 byte and nothing else (no
// scales, nothing gathered); 0 without bytes.
double WholeRatioFloor(const QuantComparison& c);

// Goal of the wire-bytes ratio (issue 22: at most 0.52 of the bf16 sync's bytes).
inline constexpr double kQuantWireRatioGoal = 0.52;

// The comparison as text lines: measured wire bytes of both syncs and of the quantized
// parameters, each ratio against the goal ("met" or "NOT met"), the floor WholeRatioFloor, the
// plans' bytes and ratios, seconds per sync and the time ratio.
std::string FormatQuantComparison(const QuantComparison& c);

// The same as a JSON object.
std::string QuantComparisonJson(const QuantComparison& c);

// `text` as a JSON string literal (quotes, backslashes and control characters escaped).
std::string JsonString(absl::string_view text);

// One contestant (a weight sync) or link limit measured in one scenario.
struct Measured {
  std::string id;           // Short, unique in its scenario: "wsync-shm", "per-param", "memcpy".
  std::string description;  // What ran, e.g. "wsync over UCX shared memory (sm,cma,self)".
  std::string transport;    // What carried the bytes, e.g. "UCX tcp (lo)", "gloo tcp (lo)".
  bool limit = false;       // A link limit (moves no weights), not a contestant.
  // Contestants: the id of the limit of the link they use (a ucx_perftest row); limits: empty.
  std::string link_limit;
  bool verified = false;     // Every checked byte was right (contestants: every rollout byte).
  std::string verification;  // How it was checked, or why it cannot be.
  // Seconds per sync, one per timed sync. Limits: the time their measured rate needs for the
  // bytes one rollout process must receive, one per run.
  std::vector<double> seconds;
  // Peak resident set per process (wait4's ru_maxrss, the largest over all runs), keyed by a
  // process name such as "trainer 0"; empty when not measured.
  std::map<std::string, int64_t> peak_rss_bytes;
};

struct Scenario {
  std::string model;
  std::string from;
  std::string to;
  int32_t trainers = 0;
  int32_t rollouts = 0;
  int64_t rollout_bytes = 0;  // Bytes the busiest rollout process must receive per sync.
  std::vector<Measured> results;
  std::vector<std::string> notes;  // Printed under the table and kept in the JSON.
};

// Derived figures of one result within its scenario.
struct Summary {
  double seconds_median = 0, seconds_min = 0, seconds_max = 0;
  double gbps_per_rollout = 0;  // rollout_bytes / median seconds / 1e9.
  // Median seconds of each other contestant / this one's (> 1: this one is faster); contestants
  // only, keyed by id.
  std::map<std::string, double> speedup;
  std::optional<double> fraction_of_link;    // GB/s over that of `link_limit`.
  std::optional<double> fraction_of_memcpy;  // GB/s over that of the result with id "memcpy".
};

// Fails (returns nullopt) for a result without samples or a scenario without it.
std::optional<Summary> Summarize(const Scenario& scenario, const std::string& id);

// The scenario's table: one row per result with runs, s/sync (median, min, max), GB/s per rollout,
// speed-up over each contestant, fraction of the link limit and of memcpy, verification; then the
// peak RSS of each process and the notes.
std::string FormatTable(const Scenario& scenario);

// Every scenario with every result, its samples and its summary, as one JSON document with the
// run's date, machine and command.
std::string ToJson(const std::vector<Scenario>& scenarios, const std::string& date,
                   const std::string& machine, const std::string& command);

}  // namespace wsync::bench

#endif  // WSYNC_INTEGRATION_BENCH_BENCH_REPORT_H_
