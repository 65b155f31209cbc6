#ifndef WSYNC_EXECUTOR_AGREEMENT_H_
#define WSYNC_EXECUTOR_AGREEMENT_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "transport/transport.h"

namespace wsync {

// What a process states about delta sync in the agreement (executor/delta_run.h): whether it
// runs it, and as a receiver the version it committed last and still holds unchanged (nullopt
// when dirty, new, rebound or in an aborted sync since).
struct DeltaClaim {
  bool on = false;
  std::optional<uint64_t> held_version;
  // delta=auto: a digest of the rule (DeltaRuleDigest, delta_run.h; 0 without auto), equal on
  // every process or the batch is refused, and what this process saw as a sender.
  uint64_t rule_digest = 0;
  int64_t changed_elements = 0;
  int64_t compared_elements = 0;
};

// A collective over `group`: every process contributes its local verdict, plan digest, budget,
// verify mode (VerifyMode's value) and delta claim. Returns OK only when every process is OK and
// all digests, budgets, verify modes and delta settings are equal; then `held_versions` (when
// given) is set to every process's held version, by process, and `changed_fraction` (when given)
// to every process's changed elements over its compared ones, summed (nullopt when none compared
// any): inputs every process gets alike. Otherwise a process that rejected
// returns its own `local` error, and the others FailedPrecondition naming the processes that
// rejected and why, or the differing digests, budgets or verify modes (error kind ranks_disagree).
// Group errors (e.g. the deadline) are returned as they are.
absl::Status AgreeOnBatch(Group& group, const absl::Status& local, uint64_t plan_digest,
                          double budget_bytes, int32_t verify_mode, absl::Time deadline,
                          const DeltaClaim& delta = {},
                          std::vector<std::optional<uint64_t>>* held_versions = nullptr,
                          std::optional<double>* changed_fraction = nullptr);

}  // namespace wsync

#endif  // WSYNC_EXECUTOR_AGREEMENT_H_
