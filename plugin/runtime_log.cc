#include "plugin/runtime_log.h"

#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "control/protocol.h"
#include "plugin/runtime.h"

namespace wsync {
namespace {

std::string ChoiceName(const TransportChoice& choice) {
  std::string name = choice.backend;
  if (!choice.transports.empty()) absl::StrAppend(&name, ":", choice.transports);
  if (!choice.net_devices.empty()) absl::StrAppend(&name, " (devices ", choice.net_devices, ")");
  return name;
}

}  // namespace

std::string RuntimeWho(Role role, int32_t rank, int32_t process) {
  return absl::StrCat(RoleName(role), " ", rank, " (process ", process, ")");
}

void LogJoined(absl::string_view who, absl::string_view job_id, const Roster& roster) {
  if (!log::Enabled(log::Category::kConnect, log::Level::kInfo)) return;
  std::set<std::string> nodes;
  for (const RosterEntry& entry : roster.processes) nodes.insert(entry.node_id);
  WSYNC_LOG(kConnect, kInfo, who, ": joined job ", job_id, ": ",
            log::Count(roster.size(), "process"), " (", log::Count(roster.num_trainers, "trainer"),
            ", ", log::Count(roster.num_rollouts, "rollout"), ") on ",
            log::Count(std::ssize(nodes), "node"), ", roster epoch ", roster.epoch);
  if (!log::Enabled(log::Category::kConnect, log::Level::kDebug)) return;
  for (const RosterEntry& entry : roster.processes) {
    WSYNC_LOG(kConnect, kDebug, who, ": process ", entry.process, " is ",
              ControlRoleName(entry.role), " ", entry.rank, " on node ", entry.node_id);
  }
}

void LogRoutes(absl::string_view who, const Job& job, int32_t process,
               const std::vector<TransportChoice>& routes) {
  if (!log::Enabled(log::Category::kConnect, log::Level::kInfo)) return;
  // Path class -> (transport -> peers).
  std::map<std::string, std::map<std::string, int32_t>> classes;
  for (int32_t peer = 0; peer < static_cast<int32_t>(routes.size()); ++peer) {
    if (peer == process || peer >= job.num_processes()) continue;
    ++classes[std::string(job.PathClass(process, peer))][ChoiceName(routes[peer])];
  }
  std::vector<std::string> parts;
  for (const auto& [path_class, choices] : classes) {
    for (const auto& [choice, peers] : choices) {
      parts.push_back(
          absl::StrCat(path_class, " -> ", choice, " (", log::Count(peers, "peer"), ")"));
    }
  }
  WSYNC_LOG(kConnect, kInfo, who, ": transports ",
            parts.empty() ? std::string("none (no peer)") : absl::StrJoin(parts, "; "));
}

void LogPlan(absl::string_view who, const Plan& plan, const ProcessSchedule& schedule,
             int64_t waves) {
  if (!log::Enabled(log::Category::kPlan, log::Level::kInfo)) return;
  WSYNC_LOG(kPlan, kInfo, who, ": plan ", absl::StrFormat("%016x", plan.digest), " (policy ",
            plan.policy, "): ", log::Count(schedule.segments, "segment"), ", ",
            log::Count(schedule.chunks, "chunk"), " in ", log::Count(schedule.rounds, "round"),
            " over ", log::Count(std::ssize(schedule.peers), "peer direction"), ", ",
            log::Count(waves, "wave"), "; sends ", log::Bytes(schedule.sent_bytes), ", receives ",
            log::Bytes(schedule.received_bytes), ", copies ", log::Bytes(schedule.local_copy_bytes),
            " locally (direct ", log::Bytes(schedule.direct_bytes), ", staged ",
            log::Bytes(schedule.staged_bytes), "); arenas ", log::Bytes(schedule.arena_bytes));
}

void LogStepStart(absl::string_view who, int64_t version) {
  WSYNC_LOG(kSync, kInfo, who, ": sync ", version, " starts");
}

void LogWorkersRenewed(absl::string_view who, int32_t workers) {
  WSYNC_LOG(kConnect, kInfo, who, ": moved to ", log::Count(workers, "fresh UCX worker"),
            " after a replacement joined");
}

void LogStepEnd(absl::string_view who, int64_t version, const StepResult& result) {
  if (!result.outcome.ok()) {
    WSYNC_LOG(kFault, kError, who, ": sync ", version, " failed here: ", result.outcome.ToString());
  }
  const absl::Status status = result.status();
  if (status.ok() && result.stats.ok()) {
    WSYNC_LOG(kSync, kInfo, who, ": sync ", version,
              " committed: ", log::Count(result.stats->rounds, "round"), ", sent ",
              log::Bytes(result.stats->sent_bytes), ", received ",
              log::Bytes(result.stats->received_bytes), " in ",
              absl::StrFormat("%.3f", result.stats->seconds), " s");
  } else if (status.ok()) {
    WSYNC_LOG(kSync, kInfo, who, ": sync ", version, " committed");
  } else {
    WSYNC_LOG(kSync, kWarn, who, ": sync ", version, " aborted: ", status.ToString());
  }
}

}  // namespace wsync
