#include "integration/cli/demo_progress_line.h"

#include <unistd.h>

#include <cstdio>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/sync_progress.h"
#include "control/auth.h"
#include "control/protocol.h"

namespace wsync::cli {

std::string DescribeJobProgress(const control::JobStatusBody& body, int64_t version,
                                int64_t steps) {
  constexpr double kMiB = 1024.0 * 1024.0;
  std::map<int32_t, int> phases;  // Ordered by phase value.
  int64_t rounds_done = 0, rounds_total = 0, bytes_done = 0, bytes_total = 0;
  const control::ProcessStatus* behind = nullptr;
  double behind_fraction = 2;
  for (const control::ProcessStatus& p : body.processes()) {
    if (!p.has_progress() || p.progress().version() != version) continue;
    const control::SyncProgress& s = p.progress();
    ++phases[s.phase()];
    rounds_done += s.rounds_done();
    rounds_total += s.rounds_total();
    bytes_done += s.bytes_done();
    bytes_total += s.bytes_total();
    if (s.phase() != control::SYNC_PHASE_TRANSFERRING) continue;
    const double fraction = s.bytes_total() > 0 ? static_cast<double>(s.bytes_done()) /
                                                      static_cast<double>(s.bytes_total())
                                                : 1.0;
    if (fraction < behind_fraction) {
      behind_fraction = fraction;
      behind = &p;
    }
  }
  if (phases.empty()) return "";
  std::vector<std::string> counts;
  for (const auto& [phase, count] : phases) {
    counts.push_back(absl::StrCat(count, " ", SyncPhaseName(phase)));
  }
  std::string text = absl::StrFormat("step %d/%d: %s; rounds %d/%d, %.1f/%.1f MiB", version, steps,
                                     absl::StrJoin(counts, ", "), rounds_done, rounds_total,
                                     bytes_done / kMiB, bytes_total / kMiB);
  if (behind != nullptr) {
    const std::optional<ControlRole> role = RoleFromProto(behind->role());
    absl::StrAppendFormat(&text, "; furthest behind: %s rank %d (round %d of %d)",
                          role.has_value() ? ControlRoleName(*role) : "unknown", behind->rank(),
                          behind->progress().rounds_done(), behind->progress().rounds_total());
  }
  return text;
}

DemoProgressLine::DemoProgressLine(StatusQuery query, bool enabled)
    : query_(std::move(query)), enabled_(enabled && isatty(STDERR_FILENO) == 1) {}

DemoProgressLine::~DemoProgressLine() {
  Clear();
  WipeSecret(query_.secret);
}

void DemoProgressLine::Poll(int64_t step, int64_t steps, absl::Time started) {
  const absl::Time now = absl::Now();
  if (!enabled_ || now - started < absl::Seconds(1) || now < next_query_) return;
  next_query_ = now + absl::Milliseconds(250);
  query_.deadline = now + absl::Milliseconds(500);
  const absl::StatusOr<control::JobStatusBody> body = QueryJobStatus(query_);
  if (!body.ok()) return;
  const std::string line = DescribeJobProgress(*body, step, steps);
  if (line.empty()) return;
  std::fprintf(stderr, "\r\x1b[K%s", line.c_str());
  std::fflush(stderr);
  shown_ = true;
}

void DemoProgressLine::Clear() {
  if (!shown_) return;
  std::fputs("\r\x1b[K", stderr);
  std::fflush(stderr);
  shown_ = false;
}

}  // namespace wsync::cli
