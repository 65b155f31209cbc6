#ifndef WSYNC_INTEGRATION_CLI_DEMO_PROGRESS_LINE_H_
#define WSYNC_INTEGRATION_CLI_DEMO_PROGRESS_LINE_H_

// `wsync demo`'s progress line for people: while a step's sync runs longer than a second, the
// job's coordinator is asked where every process stands (QueryJobStatus, as `wsync status`
// asks: the progress each process sends with its heartbeats) about every 250 ms, and one line on
// stderr, rewritten in place, sums the rounds and bytes of that sync over the processes and
// names the one furthest behind. Off when stderr is not a terminal or when asked (--progress).

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "control/control.pb.h"
#include "control/status_client.h"

namespace wsync::cli {

// "step 3/5: 2 transferring, 2 voting; rounds 30/40, 120.0/480.0 MiB; furthest behind: rollout
// rank 1 (round 2 of 10)" over the processes of `body` that report the sync of `version`; empty
// when none does yet. Pure.
std::string DescribeJobProgress(const control::JobStatusBody& body, int64_t version, int64_t steps);

class DemoProgressLine {
 public:
  // `query`: the job's coordinator and secret (its deadline is set per query). `enabled`: the
  // caller's choice (--progress); the line shows only when stderr is also a terminal.
  DemoProgressLine(StatusQuery query, bool enabled);
  ~DemoProgressLine();
  DemoProgressLine(const DemoProgressLine&) = delete;
  DemoProgressLine& operator=(const DemoProgressLine&) = delete;

  // Called on every poll while step `step` (its sync's version) runs, since `started`: once it
  // ran a second, at most every 250 ms, asks the coordinator and rewrites the line. A failed
  // query leaves the line as it was. Blocks at most ~0.5 s.
  void Poll(int64_t step, int64_t steps, absl::Time started);
  // Erases the line, if one is shown (before other output to the terminal).
  void Clear();

 private:
  StatusQuery query_;
  const bool enabled_;
  bool shown_ = false;
  absl::Time next_query_ = absl::InfinitePast();
};

}  // namespace wsync::cli

#endif  // WSYNC_INTEGRATION_CLI_DEMO_PROGRESS_LINE_H_
