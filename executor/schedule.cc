#include "executor/schedule.h"

#include "common/status.h"
#include "executor/quant_work.h"
#include "executor/work.h"

namespace wsync {

absl::StatusOr<ProcessSchedule> ScheduleTransfers(const Job& job,
                                                  absl::Span<const Segment> segments,
                                                  const Endpoints& endpoints,
                                                  const StagingBudget& budget, int32_t process) {
  WSYNC_ASSIGN_OR_RETURN(executor_internal::Work work,
                         executor_internal::BuildWork(job, segments, endpoints, budget, process));
  return executor_internal::Summarize(job, work, segments);
}

absl::StatusOr<ProcessSchedule> ScheduleTransfers(const Job& job,
                                                  absl::Span<const Segment> segments,
                                                  const QuantPlan& quant,
                                                  const Endpoints& endpoints,
                                                  const StagingBudget& budget, int32_t process) {
  WSYNC_ASSIGN_OR_RETURN(executor_internal::QuantWork quant_work,
                         executor_internal::BuildQuantWork(job, segments, quant, process));
  WSYNC_ASSIGN_OR_RETURN(
      executor_internal::Work work,
      executor_internal::BuildWorkWithQuant(job, segments, quant_work, endpoints, budget, process));
  return executor_internal::Summarize(
      job, work,
      job.HasQuantizedParams() ? absl::Span<const Segment>(quant_work.segments) : segments);
}

int64_t RelayArenaLimit(const StagingBudget& budget) {
  return executor_internal::IntegerBudgetBytes(budget).value_or(0);
}

absl::StatusOr<std::vector<ProcessSchedule>> ScheduleTransfers(const Job& job,
                                                               absl::Span<const Segment> segments,
                                                               const Endpoints& endpoints,
                                                               const StagingBudget& budget) {
  // An empty endpoint list still validates the budget, as execution would.
  WSYNC_RETURN_IF_ERROR(executor_internal::ValidateBudget(job, budget).status());
  std::vector<ProcessSchedule> schedules;
  schedules.reserve(endpoints.processes.size());
  for (int32_t process : endpoints.processes) {
    WSYNC_ASSIGN_OR_RETURN(ProcessSchedule schedule,
                           ScheduleTransfers(job, segments, endpoints, budget, process));
    schedules.push_back(std::move(schedule));
  }
  return schedules;
}

}  // namespace wsync
