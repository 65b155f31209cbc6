#ifndef WSYNC_EXECUTOR_AGREEMENT_H_
#define WSYNC_EXECUTOR_AGREEMENT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "transport/transport.h"

namespace wsync {

// A collective over `group`: every process contributes its local verdict, plan digest, budget and
// verify mode (VerifyMode's value). Returns OK only when every process is OK and all digests,
// budgets and verify modes are equal. Otherwise a process that rejected returns its own `local`
// error, and the others FailedPrecondition naming the processes that rejected and why, or the
// differing digests, budgets or verify modes (error kind ranks_disagree). Group errors (e.g. the
// deadline) are returned as they are.
absl::Status AgreeOnBatch(Group& group, const absl::Status& local, uint64_t plan_digest,
                          double budget_bytes, int32_t verify_mode, absl::Time deadline);

}  // namespace wsync

#endif  // WSYNC_EXECUTOR_AGREEMENT_H_
