#ifndef WSYNC_INTEGRATION_CLI_PLAN_TRAFFIC_H_
#define WSYNC_INTEGRATION_CLI_PLAN_TRAFFIC_H_

// `wsync plan`'s tally of what a plan moves (per pair, path class and process) and the report's
// sections that print it.

#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "planner/job.h"
#include "planner/plan.h"

namespace wsync::cli {

struct Totals {
  int64_t bytes = 0;
  int64_t segments = 0;

  void Add(int64_t segment_bytes) {
    bytes += segment_bytes;
    ++segments;
  }
};

struct TrafficTally {
  Totals all;
  absl::flat_hash_map<std::pair<int32_t, int32_t>, Totals> pairs;  // Keyed by (from, to).
  std::map<std::string, Totals> paths;                             // Keyed by path class.
  std::vector<Totals> sent;                                        // Indexed by global id.
  std::vector<Totals> received;                                    // Indexed by global id.
};

// The segments the plan was made for: with a process, those it sends or receives (a relayed plan
// also lists what its relays receive, which it neither sends nor receives).
TrafficTally Tally(const Job& job, const Plan& plan, std::optional<int32_t> process);

// "p3 (trainer 3)": the global id, then the role and rank within its layout.
std::string ProcessName(const Job& job, int32_t id);

// With --process: every pair involving the process, and what it sends and receives in total.
void PrintPairsOfProcess(std::FILE* out, const Job& job, const TrafficTally& traffic,
                         int32_t process);

// Without --process: how many pairs, the ten largest, and the busiest sender and receiver.
void PrintPairSummary(std::FILE* out, const Job& job, const TrafficTally& traffic);

// Bytes and segments per path class, then the local bytes.
void PrintPaths(std::FILE* out, const TrafficTally& traffic);

}  // namespace wsync::cli

#endif  // WSYNC_INTEGRATION_CLI_PLAN_TRAFFIC_H_
