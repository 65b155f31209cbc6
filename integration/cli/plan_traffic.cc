#include "integration/cli/plan_traffic.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "integration/cli/plan_pricing.h"
#include "planner/job.h"
#include "planner/layout.h"

namespace wsync::cli {

TrafficTally Tally(const Job& job, const Plan& plan, std::optional<int32_t> process) {
  TrafficTally traffic;
  traffic.sent.resize(job.num_processes());
  traffic.received.resize(job.num_processes());
  for (const Segment& segment : plan.segments) {
    const int64_t bytes = SegmentBytes(job, segment);
    const int32_t from = segment.from.process;
    const int32_t to = segment.to.process;
    if (process && *process != from && *process != to) continue;
    traffic.all.Add(bytes);
    traffic.pairs[{from, to}].Add(bytes);
    traffic.paths[std::string(job.PathClass(from, to))].Add(bytes);
    traffic.sent[from].Add(bytes);
    traffic.received[to].Add(bytes);
  }
  return traffic;
}

std::string ProcessName(const Job& job, int32_t id) {
  const JobProcess& process = job.processes()[id];
  return absl::StrFormat("p%d (%s %d)", id, RoleName(process.role), process.rank);
}

namespace {

struct PairTotals {
  int32_t from;
  int32_t to;
  Totals totals;
};

// All pairs, the largest first; ties by (from, to) so the listing is deterministic.
std::vector<PairTotals> SortedPairs(const TrafficTally& traffic) {
  std::vector<PairTotals> pairs;
  pairs.reserve(traffic.pairs.size());
  for (const auto& [key, totals] : traffic.pairs) pairs.push_back({key.first, key.second, totals});
  std::sort(pairs.begin(), pairs.end(), [](const PairTotals& a, const PairTotals& b) {
    if (a.totals.bytes != b.totals.bytes) return a.totals.bytes > b.totals.bytes;
    return std::pair(a.from, a.to) < std::pair(b.from, b.to);
  });
  return pairs;
}

void PrintPairRow(std::FILE* out, const Job& job, const PairTotals& pair) {
  absl::FPrintF(out, "  %-22s -> %-22s %-11s %7d segments %12s\n", ProcessName(job, pair.from),
                ProcessName(job, pair.to), job.PathClass(pair.from, pair.to), pair.totals.segments,
                HumanBytes(pair.totals.bytes));
}

}  // namespace

void PrintPairsOfProcess(std::FILE* out, const Job& job, const TrafficTally& traffic,
                         int32_t process) {
  const std::vector<PairTotals> pairs = SortedPairs(traffic);
  absl::FPrintF(out, "\nbytes per (from, to) pair involving %s: %d pairs\n",
                ProcessName(job, process), pairs.size());
  for (const PairTotals& pair : pairs) PrintPairRow(out, job, pair);
  const Totals& sent = traffic.sent[process];
  const Totals& received = traffic.received[process];
  absl::FPrintF(out, "  sent %s in %d segments; received %s in %d segments\n",
                HumanBytes(sent.bytes), sent.segments, HumanBytes(received.bytes),
                received.segments);
}

void PrintPairSummary(std::FILE* out, const Job& job, const TrafficTally& traffic) {
  constexpr size_t kTop = 10;
  const std::vector<PairTotals> pairs = SortedPairs(traffic);
  absl::FPrintF(out, "\nbytes per (from, to) pair: %d pairs; the %d largest:\n", pairs.size(),
                std::min(kTop, pairs.size()));
  for (size_t i = 0; i < std::min(kTop, pairs.size()); ++i) PrintPairRow(out, job, pairs[i]);
  // Ties go to the lowest id, as max_element keeps the first maximum.
  const auto by_bytes = [](const Totals& a, const Totals& b) { return a.bytes < b.bytes; };
  const auto busiest_sender = std::max_element(traffic.sent.begin(), traffic.sent.end(), by_bytes);
  const auto busiest_receiver =
      std::max_element(traffic.received.begin(), traffic.received.end(), by_bytes);
  if (busiest_sender == traffic.sent.end() || busiest_sender->bytes == 0) return;
  absl::FPrintF(out, "  busiest sender %s: %s; busiest receiver %s: %s\n",
                ProcessName(job, busiest_sender - traffic.sent.begin()),
                HumanBytes(busiest_sender->bytes),
                ProcessName(job, busiest_receiver - traffic.received.begin()),
                HumanBytes(busiest_receiver->bytes));
}

void PrintPaths(std::FILE* out, const TrafficTally& traffic) {
  absl::FPrintF(out, "\nbytes per path class:\n");
  for (const auto& [path, totals] : traffic.paths) {
    absl::FPrintF(out, "  %-12s %9d segments %12s (%d B)\n", path, totals.segments,
                  HumanBytes(totals.bytes), totals.bytes);
  }
  const auto local = traffic.paths.find(std::string(kPathLocal));
  const int64_t local_bytes = local == traffic.paths.end() ? 0 : local->second.bytes;
  absl::FPrintF(out, "local bytes: %s (%d B)\n", HumanBytes(local_bytes), local_bytes);
}

}  // namespace wsync::cli
