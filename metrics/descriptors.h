#ifndef WSYNC_METRICS_DESCRIPTORS_H_
#define WSYNC_METRICS_DESCRIPTORS_H_

// The metric families of a session, one row each: the only place a family's name, type, help
// and labels are written. SessionMetrics (metrics.h) registers every row and binds its series
// from it; the tests check the exposition against it.

#include <cstddef>

#include "absl/strings/string_view.h"

namespace wsync {

enum class MetricType { kCounter, kGauge, kHistogram };

struct MetricDescriptor {
  absl::string_view name;  // Prefix wsync_, base units, _total for counters.
  MetricType type;
  absl::string_view help;
  // The label besides `role` (every family has `role`), e.g. "result"; empty: none. Its values
  // come from bounded sets (metrics.h): never per parameter or per peer.
  absl::string_view label;
  absl::string_view second_label = {};  // wsync_bytes_*_total: "transport".
};

inline constexpr MetricDescriptor kMetricDescriptors[] = {
    {"wsync_syncs_total", MetricType::kCounter,
     "Syncs by result (ok: committed on every process; failed)", "result"},
    {"wsync_sync_duration_seconds", MetricType::kHistogram,
     "Duration of each sync: transfer, agreement and commit decision", ""},
    {"wsync_last_sync_duration_seconds", MetricType::kGauge, "Duration of the last sync", ""},
    {"wsync_sync_predicted_seconds", MetricType::kGauge,
     "The cost model's prediction for the last sync (NaN: no calibration)", ""},
    {"wsync_sync_unpriced_bytes", MetricType::kGauge,
     "Bytes per sync the prediction leaves out: on path classes the calibration has no fit for "
     "(NaN: no prediction)",
     ""},
    {"wsync_rounds", MetricType::kGauge, "Rounds of the last sync", ""},
    {"wsync_rounds_total", MetricType::kCounter, "Rounds over all syncs", ""},
    {"wsync_bytes_sent_total", MetricType::kCounter,
     "Bytes sent to peers, by path class and transport", "path_class", "transport"},
    {"wsync_bytes_received_total", MetricType::kCounter,
     "Bytes received from peers, by path class and transport", "path_class", "transport"},
    {"wsync_direct_bytes_total", MetricType::kCounter,
     "Bytes sent from or received into the weights in place", "direction"},
    {"wsync_staged_bytes_total", MetricType::kCounter,
     "Bytes packed into or unpacked from a staging arena", "direction"},
    {"wsync_local_copy_bytes_total", MetricType::kCounter,
     "Bytes copied within this process (source and target both local)", ""},
    {"wsync_arena_bytes", MetricType::kGauge, "Staging arena memory held now", ""},
    {"wsync_arena_peak_bytes", MetricType::kGauge, "The most staging arena memory one sync used",
     ""},
    {"wsync_plan_inter_node_bytes", MetricType::kGauge,
     "Bytes the plan carries across node boundaries per sync, with relaying as planned and with "
     "every relayed region sent direct",
     "relay"},
    {"wsync_version", MetricType::kGauge, "The weight version this process holds (-1: none yet)",
     ""},
    {"wsync_state", MetricType::kGauge,
     "1 for the state of this process's weights: consistent, updating, dirty", "state"},
    {"wsync_errors_total", MetricType::kCounter, "Failed calls (connect, sync) by error kind",
     "kind"},
    {"wsync_rejected_messages_total", MetricType::kCounter,
     "Messages rejected unread: of an earlier sync, or refused control frames (another job, a "
     "bad secret...)",
     "reason"},
    {"wsync_plan_info", MetricType::kGauge,
     "1, labelled with the digest of the plan every process agreed on", "digest"},
    {"wsync_calibration_age_seconds", MetricType::kGauge,
     "Age of the link calibration the predictions use", ""},
    // Delta sync (issue 44); zero (the fraction NaN) on a process that runs without it.
    {"wsync_delta_compared_elements_total", MetricType::kCounter,
     "Elements a delta sync compared with the base of their receiver's version (senders)", ""},
    {"wsync_delta_changed_elements_total", MetricType::kCounter,
     "Elements a delta sync found changed among those compared (a chunk sent dense because most "
     "of it changed counts whole)",
     ""},
    {"wsync_delta_changed_fraction", MetricType::kGauge,
     "Elements changed / elements compared by delta sync in the last sync (NaN: none compared)",
     ""},
    {"wsync_delta_saved_bytes_total", MetricType::kCounter,
     "Bytes delta sync kept off the wire: the dense bytes of the messages that travelled encoded "
     "minus their encodings, sent and received",
     ""},
    {"wsync_delta_encode_seconds_total", MetricType::kCounter,
     "Thread CPU seconds senders spent encoding chunks against their bases", ""},
    {"wsync_delta_apply_seconds_total", MetricType::kCounter,
     "Thread CPU seconds receivers spent patching their targets with encodings", ""},
    // A coordinator's (hosted by this process, or `wsync coordinator --metrics_address`); series
    // only where one runs, read from it at each exposition.
    {"wsync_coordinator_processes", MetricType::kGauge,
     "The job's processes: expected, joined (and not lost), lost (and not replaced)", "state"},
    {"wsync_coordinator_sync_processes", MetricType::kGauge,
     "Processes by the sync phase their latest heartbeat reported", "phase"},
    {"wsync_coordinator_sync_bytes", MetricType::kGauge,
     "Bytes of the processes' current or last syncs, done and total, summed over their latest "
     "heartbeats",
     "progress"},
};

inline constexpr size_t kMetricFamilyCount = std::size(kMetricDescriptors);

// The row named `name`; nullptr when there is none.
constexpr const MetricDescriptor* FindMetricDescriptor(absl::string_view name) {
  for (const MetricDescriptor& d : kMetricDescriptors) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

}  // namespace wsync

#endif  // WSYNC_METRICS_DESCRIPTORS_H_
