#ifndef WSYNC_PLUGIN_RUNTIME_LOG_H_
#define WSYNC_PLUGIN_RUNTIME_LOG_H_

// The lines the runtime tells an operator (common/log.h) at connect and at each sync step: who
// joined, the transport of each path class, the plan, and each step's start and decision. Each
// function checks its category first: nothing is formatted when the line is filtered out.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "control/client.h"
#include "executor/schedule.h"
#include "planner/job.h"
#include "planner/layout.h"
#include "planner/plan.h"
#include "transport/selector/selector.h"

namespace wsync {

struct StepResult;

// "trainer 0 (process 0)", the prefix of every runtime line.
std::string RuntimeWho(Role role, int32_t rank, int32_t process);

// connect, info: the job joined (processes by role, nodes, roster epoch); debug: each process.
void LogJoined(absl::string_view who, absl::string_view job_id, const Roster& roster);
// connect, info: the transport chosen for each path class of this process's peers (`routes`
// indexed by process), with the number of peers it carries.
void LogRoutes(absl::string_view who, const Job& job, int32_t process,
               const std::vector<TransportChoice>& routes);
// plan, info: the digest, policy, segments, chunks, rounds, bytes and arenas of this process.
void LogPlan(absl::string_view who, const Plan& plan, const ProcessSchedule& schedule,
             int64_t waves);
// sync, info: a step starts; then its decision: committed (info) or aborted (warn), and, when
// this process's own part failed, fault (error) with its reason.
void LogStepStart(absl::string_view who, int64_t version);
// connect, info: this process moved to fresh UCX workers (a replacement joined).
void LogWorkersRenewed(absl::string_view who, int32_t workers);
void LogStepEnd(absl::string_view who, int64_t version, const StepResult& result);

}  // namespace wsync

#endif  // WSYNC_PLUGIN_RUNTIME_LOG_H_
