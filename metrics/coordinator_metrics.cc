// SessionMetrics' coordinator figures (metrics.h: SetCoordinatorSource): the wsync_coordinator_*
// gauges and the refusals added to wsync_rejected_messages_total, read at each exposition.

#include <algorithm>
#include <string>
#include <utility>

#include "common/sync_progress.h"
#include "metrics/metrics.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"

namespace wsync {

void SessionMetrics::SetCoordinatorSource(std::function<CoordinatorFigures()> source) {
  absl::MutexLock lock(&mu_);
  RefreshCoordinator();  // The previous source's last figures (its refusals since the last read).
  coordinator_source_ = std::move(source);
  coordinator_refused_.clear();  // Another coordinator's totals start from zero.
}

void SessionMetrics::RefreshCoordinator() const {
  if (!coordinator_source_) return;
  const CoordinatorFigures figures = coordinator_source_();
  if (coordinator_gauges_.empty()) {
    for (const char* state : {"expected", "joined", "lost"}) {
      coordinator_gauges_.push_back(&coordinator_processes_->Add({{"state", state}}));
    }
    for (int32_t phase = 0; phase < kSyncPhaseCount; ++phase) {
      coordinator_gauges_.push_back(
          &coordinator_phases_->Add({{"phase", std::string(SyncPhaseName(phase))}}));
    }
    for (const char* progress : {"done", "total"}) {
      coordinator_gauges_.push_back(&coordinator_bytes_->Add({{"progress", progress}}));
    }
  }
  std::vector<double> values = {static_cast<double>(figures.expected),
                                static_cast<double>(figures.joined),
                                static_cast<double>(figures.lost)};
  for (int64_t count : figures.in_phase) values.push_back(static_cast<double>(count));
  values.push_back(static_cast<double>(figures.sync_bytes_done));
  values.push_back(static_cast<double>(figures.sync_bytes_total));
  for (size_t i = 0; i < values.size() && i < coordinator_gauges_.size(); ++i) {
    coordinator_gauges_[i]->Set(values[i]);
  }
  for (const auto& [reason, total] : figures.refused) {
    int64_t* recorded = nullptr;
    for (auto& [known, count] : coordinator_refused_) {
      if (known == reason) recorded = &count;
    }
    if (recorded == nullptr) recorded = &coordinator_refused_.emplace_back(reason, 0).second;
    if (total > *recorded) {
      rejected_[RejectedIndex(reason)]->Increment(static_cast<double>(total - *recorded));
    }
    *recorded = std::max(*recorded, total);
  }
}

}  // namespace wsync
