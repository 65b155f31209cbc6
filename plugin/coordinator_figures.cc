#include "plugin/coordinator_figures.h"

#include <string>

namespace wsync {

CoordinatorFigures FiguresOf(const CoordinatorCounters& counters, int32_t world) {
  CoordinatorFigures figures;
  figures.expected = world;
  figures.joined = counters.joined - counters.lost;
  figures.lost = counters.lost - counters.replaced;
  figures.in_phase = counters.in_phase;
  figures.sync_bytes_done = counters.sync_bytes_done;
  figures.sync_bytes_total = counters.sync_bytes_total;
  for (int r = 0; r < kNumRefusalReasons; ++r) {
    figures.refused.emplace_back(std::string(RefusalReasonName(static_cast<RefusalReason>(r))),
                                 counters.refused[r]);
  }
  return figures;
}

}  // namespace wsync
