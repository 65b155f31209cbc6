#include "integration/cli/demo_report.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace wsync::cli {

ProcessReport ParseOutput(absl::string_view text) {
  ProcessReport report;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::ConsumePrefix(&line, "CONNECTED seconds=")) {
      double seconds = 0;
      if (absl::SimpleAtod(line, &seconds)) report.connect_seconds = seconds;
      continue;
    }
    if (absl::ConsumePrefix(&line, "SCHEDULE ")) {
      report.schedule.emplace_back(line);
      // "... predicted time 0.123456 s (transfer ...": the plugin's prediction of every sync.
      constexpr absl::string_view kPredicted = "predicted time ";
      if (const size_t at = line.find(kPredicted); at != absl::string_view::npos) {
        absl::string_view number = line.substr(at + kPredicted.size());
        number = number.substr(0, number.find(' '));
        double seconds = 0;
        if (absl::SimpleAtod(number, &seconds)) report.predicted_seconds = seconds;
      }
      if (const size_t at = line.find("not priced: "); at != absl::string_view::npos) {
        report.unpriced = std::string(line.substr(at));
      }
      continue;
    }
    if (!absl::ConsumePrefix(&line, "STEP ")) continue;
    // `verified` is last and may contain spaces; a line still being written has none yet.
    const size_t verified_at = line.find(" verified=");
    if (verified_at == absl::string_view::npos) continue;
    StepReport step;
    step.verified = std::string(line.substr(verified_at + 10));
    int64_t version = -1;
    for (absl::string_view field : absl::StrSplit(line.substr(0, verified_at), ' ')) {
      const std::pair<absl::string_view, absl::string_view> kv =
          absl::StrSplit(field, absl::MaxSplits('=', 1));
      // A malformed field reads as 0.
      const auto integer = [&](int64_t* out) {
        if (!absl::SimpleAtoi(kv.second, out)) *out = 0;
      };
      const auto real = [&](double* out) {
        if (!absl::SimpleAtod(kv.second, out)) *out = 0;
      };
      if (kv.first == "v") integer(&version);
      if (kv.first == "seconds") real(&step.seconds);
      if (kv.first == "sent") integer(&step.sent);
      if (kv.first == "received") integer(&step.received);
      if (kv.first == "direct") integer(&step.direct);
      if (kv.first == "staged") integer(&step.staged);
      if (kv.first == "rounds") integer(&step.rounds);
      if (kv.first == "arena") integer(&step.arena);
      if (kv.first == "sync_seconds") real(&step.sync_seconds);
      if (kv.first == "work_seconds") real(&step.work_seconds);
    }
    if (version >= 0) report.steps[version] = std::move(step);
  }
  return report;
}

StepSummary Summarize(const std::vector<ProcessReport>& reports, int32_t trainers,
                      int64_t version) {
  StepSummary s;
  std::string missing;  // A process that did not report a step others reported.
  for (int p = 0; p < static_cast<int>(reports.size()); ++p) {
    auto it = reports[p].steps.find(version);
    if (it == reports[p].steps.end()) {
      if (missing.empty()) {
        missing = absl::StrCat(p < trainers ? "trainer " : "rollout ",
                               p < trainers ? p : p - trainers, " did not report it");
      }
      continue;
    }
    const StepReport& r = it->second;
    const bool rollout = p >= trainers;
    ++s.reported;
    s.seconds = std::max(s.seconds, r.seconds);
    s.sync_seconds = std::max(s.sync_seconds, r.sync_seconds);
    s.rounds = std::max(s.rounds, r.rounds);
    s.arena = std::max(s.arena, r.arena);
    s.sent += r.sent;
    if (rollout) {
      s.check_seconds = std::max(s.check_seconds, r.work_seconds);
      s.received += r.received;
      s.direct += r.direct;
      s.staged += r.staged;
      if (r.verified == "ok") ++s.verified;
    } else {
      s.fill_seconds = std::max(s.fill_seconds, r.work_seconds);
    }
    if (r.verified != "ok" && s.first_error.empty()) {
      s.first_error = absl::StrCat(rollout ? "rollout " : "trainer ", rollout ? p - trainers : p,
                                   ": ", r.verified);
    }
  }
  if (s.first_error.empty() && s.reported > 0) s.first_error = missing;
  return s;
}

std::string DemoBytes(double bytes) {
  if (bytes >= 1e9) return absl::StrFormat("%.2f GB", bytes / 1e9);
  if (bytes >= 1e6) return absl::StrFormat("%.1f MB", bytes / 1e6);
  if (bytes >= 1e3) return absl::StrFormat("%.1f kB", bytes / 1e3);
  return absl::StrFormat("%.0f B", bytes);
}

std::vector<std::string> MergeTraceLines(const std::vector<std::string>& texts) {
  std::vector<std::pair<std::string, std::string>> keyed;  // (time stamp, line)
  for (const std::string& text : texts) {
    std::string stamp;
    for (absl::string_view piece : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
      if (absl::StartsWith(piece, "[wsync ")) stamp = std::string(piece.substr(7, 15));
      keyed.emplace_back(stamp, std::string(piece));
    }
  }
  std::stable_sort(keyed.begin(), keyed.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> lines;
  for (auto& [stamp, line] : keyed) lines.push_back(std::move(line));
  return lines;
}

}  // namespace wsync::cli
