#ifndef WSYNC_INTEGRATION_CLI_DEMO_REPORT_H_
#define WSYNC_INTEGRATION_CLI_DEMO_REPORT_H_

// What `wsync demo` reads from its processes' output (the CONNECTED, SCHEDULE and STEP lines of
// integration/demo/demo_process.cc) and how it sums one step over every process. Pure functions
// of text; thread-compatible.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace wsync::cli {

// One STEP line of a process (see integration/demo/demo_process.cc).
struct StepReport {
  double seconds = 0;
  int64_t sent = 0;
  int64_t received = 0;
  int64_t direct = 0;
  int64_t staged = 0;
  int64_t rounds = 0;
  int64_t arena = 0;
  double sync_seconds = 0;
  double work_seconds = 0;
  std::string verified;  // "ok" or the error.
};

struct ProcessReport {
  std::optional<double> connect_seconds;
  std::map<int64_t, StepReport> steps;  // By version.
  std::vector<std::string> schedule;
  std::optional<double> predicted_seconds;  // From the schedule report, with a calibration.
  std::string unpriced;  // The report's "not priced: ..." note: the prediction is partial.
};

// The reports in `text` (a process's stdout so far). Lines still being written and malformed
// fields are skipped; a STEP line without its version is ignored.
ProcessReport ParseOutput(absl::string_view text);

// One step over every process.
struct StepSummary {
  int reported = 0;    // Processes with a STEP line for it.
  int verified = 0;    // Rollouts that verified it.
  double seconds = 0;  // Slowest process's transfer.
  double sync_seconds = 0;
  double fill_seconds = 0;   // Slowest trainer.
  double check_seconds = 0;  // Slowest rollout.
  int64_t rounds = 0;
  int64_t sent = 0;
  int64_t received = 0;  // By all rollouts.
  int64_t direct = 0;    // As the rollouts received them.
  int64_t staged = 0;
  int64_t arena = 0;  // Largest process.
  std::string first_error;

  double GigabytesPerSecond() const { return seconds > 0 ? received / seconds / 1e9 : 0; }
};

// Step `version` over `reports` (process p < trainers is trainer p, the others rollouts in
// order). first_error names the first process that failed it, else one that did not report it
// while others did.
StepSummary Summarize(const std::vector<ProcessReport>& reports, int32_t trainers, int64_t version);

// "1.23 GB", "4.5 MB", "6.7 kB" or "89 B" (decimal units).
std::string DemoBytes(double bytes);

// The lines of the processes' texts (one text per process), the trace's lines ("[wsync
// HH:MM:SS.uuuuuu ...", common/log.h) in the order of their time stamps: a stable sort, so one
// process's lines keep their order and another line stays after the trace line before it (lines
// before a process's first trace line come first).
std::vector<std::string> MergeTraceLines(const std::vector<std::string>& texts);

}  // namespace wsync::cli

#endif  // WSYNC_INTEGRATION_CLI_DEMO_REPORT_H_
