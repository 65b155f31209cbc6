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
