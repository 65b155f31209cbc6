#ifndef WSYNC_PLUGIN_COORDINATOR_FIGURES_H_
#define WSYNC_PLUGIN_COORDINATOR_FIGURES_H_

// A coordinator's counters as the metrics' CoordinatorFigures (metrics/metrics.h), for the
// coordinator a session hosts and for `wsync coordinator --metrics_address`. Pure.

#include <cstdint>

#include "control/coordinator.h"
#include "metrics/metrics.h"

namespace wsync {

// `world`: the job's processes. Joined: Joins accepted (replacements included) less processes
// lost; lost: lost less replaced; refused by RefusalReasonName.
CoordinatorFigures FiguresOf(const CoordinatorCounters& counters, int32_t world);

}  // namespace wsync

#endif  // WSYNC_PLUGIN_COORDINATOR_FIGURES_H_
