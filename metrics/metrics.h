#ifndef WSYNC_METRICS_METRICS_H_
#define WSYNC_METRICS_METRICS_H_

// The metrics of one session (one process of a job), as semantic calls over one
// prometheus::Registry. This folder is the only one that includes prometheus-cpp.
//
// Every family is registered once, in the constructor; every time series the hot path touches is
// bound once (the constructor for fixed label sets, BindPaths at connect for path classes and
// transports), so a sync only increments pointers it already holds: no Family::Add, no label
// lookup, no allocation. Labels come from bounded sets: role, path class and transport (from the
// job's configuration), direction, result, error kind, state. No per-parameter or per-peer labels.
//
// Families: one row each in kMetricDescriptors (descriptors.h: name, type, help, labels), every
// one with the label `role`. Label values: result ok|failed (ok: committed on every process),
// direction send|receive, state consistent|updating|dirty (all 0 before the first sync), kind
// kMetricErrorKinds, reason kRejectedMessageReasons (stale_sync: data of an earlier sync dropped
// by the transport; the others: control frames the coordinator refused, on the process hosting
// it), path_class and transport from the job's configuration, digest the agreed plan's. Gauges
// without a value yet: wsync_sync_predicted_seconds and wsync_sync_unpriced_bytes NaN (no
// prediction; with unpriced bytes the prediction covers the priced part only), wsync_version -1,
// wsync_calibration_age_seconds absent without a calibration. wsync_plan_inter_node_bytes has
// relay="with" (as planned) and "without" (every relayed region sent direct), the whole job's
// when relaying is on.
//
// Thread safety: every call may come from any thread; the exposition may run concurrently with
// the recording calls (prometheus-cpp's metrics are atomic).

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/status.h"
#include "common/sync_progress.h"

namespace prometheus {
class Counter;
class Exposer;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace wsync {

enum class SyncResult { kOk, kFailed };
enum class MetricDirection { kSend, kReceive };
enum class VersionState { kNone, kConsistent, kUpdating, kDirty };

// The bounded error kinds of wsync_errors_total: the error classes' names (common/status.h).
inline constexpr const auto& kMetricErrorKinds = kErrorClassNames;
// The reason label values of wsync_rejected_messages_total: stale_sync, then the coordinator's
// refusal reasons (control/coordinator.h: RefusalReasonName).
inline constexpr absl::string_view kRejectedMessageReasons[] = {"stale_sync",
                                                                "authentication_failed",
                                                                "unknown_job",
                                                                "rank_out_of_range",
                                                                "duplicate_rank",
                                                                "bad_field",
                                                                "protocol_version",
                                                                "oversized_frame",
                                                                "truncated_frame",
                                                                "malformed_frame",
                                                                "unexpected_frame",
                                                                "handshake_timeout",
                                                                "frame_timeout",
                                                                "too_many_connections",
                                                                "rendezvous_closed",
                                                                "too_far_ahead",
                                                                "other"};

// The error kind label of a failed status: its wsync error kind (common/status.h) when it has a
// known one, else one derived from its code. Always one of kMetricErrorKinds.
absl::string_view MetricErrorKind(const absl::Status& status);

// The bucket bounds of wsync_sync_duration_seconds: 1 ms to 10 min.
std::vector<double> SyncDurationBuckets();

// Where the exporter listens: "HOST:PORT", ":PORT" or "PORT" (host 127.0.0.1), or "HOST" (port 0:
// the kernel picks one). Port 0 always picks one.
// A host that resolves to the wildcard address ("0.0.0.0", "0", every interface) is refused by
// StartExporter unless allow_any_address, as the coordinator refuses one (CoordinatorOptions).
struct MetricsAddress {
  std::string host = "127.0.0.1";
  int32_t port = 0;
  bool allow_any_address = false;  // Not parsed: the host's explicit choice.
};
absl::StatusOr<MetricsAddress> ParseMetricsAddress(absl::string_view text);

// What a coordinator knows, for wsync_coordinator_* and wsync_rejected_messages_total
// (SessionMetrics::SetCoordinatorSource). Phases are SyncPhase values (common/sync_progress.h).
struct CoordinatorFigures {
  int64_t expected = 0;                                // Processes of the job.
  int64_t joined = 0;                                  // Joined and not lost.
  int64_t lost = 0;                                    // Lost and not replaced.
  std::array<int64_t, kSyncPhaseCount> in_phase = {};  // Processes whose latest report is it.
  int64_t sync_bytes_done = 0;                         // Summed over the processes' latest reports.
  int64_t sync_bytes_total = 0;
  // Connections refused so far (totals, not since the last reading), by reason: values of
  // kRejectedMessageReasons (others count as "other").
  std::vector<std::pair<std::string, int64_t>> refused;
};

class SessionMetrics {
 public:
  // `role`: "trainer" or "rollout"; a label of every series.
  explicit SessionMetrics(absl::string_view role);
  ~SessionMetrics();
  SessionMetrics(const SessionMetrics&) = delete;
  SessionMetrics& operator=(const SessionMetrics&) = delete;

  // Starts the HTTP exporter (GET /metrics) on `address`. At most once; fails with
  // InvalidArgument when it cannot listen there (a port in use, an address not of this host) and
  // for a wildcard address without allow_any_address.
  // The exporter stops with this object or StopExporter.
  absl::Status StartExporter(const MetricsAddress& address);
  void StopExporter();
  // The port the exporter listens on; 0 when it does not run.
  int32_t exporter_port() const;
  // "http://HOST:PORT/metrics" of the running exporter; empty when it does not run.
  std::string exporter_url() const;

  // The Prometheus text exposition (format 0.0.4) of every family.
  std::string Text() const;

  // Binds the byte counters of the job's paths: one entry per (path class, transport,
  // direction) with the bytes every sync moves on it. Replaces an earlier binding (the series
  // already exported keep their totals). Called at connect, not on the hot path.
  struct PathBytes {
    std::string path_class;
    std::string transport;
    MetricDirection direction = MetricDirection::kSend;
    int64_t bytes = 0;
  };
  void BindPaths(const std::vector<PathBytes>& paths);
  // Adds the bytes BindPaths bound, once: what one successful sync moved on every path, less
  // `saved` (bytes a delta sync did not send or receive, by path and direction; at most what
  // BindPaths bound on that path).
  void RecordPathBytes(absl::Span<const PathBytes> saved = {});

  // Semantic calls of a sync.
  // `predicted_seconds`: nullopt when there is no prediction (the gauge becomes NaN).
  void RecordSync(SyncResult result, double seconds, std::optional<double> predicted_seconds);
  void RecordRounds(int64_t rounds);
  void RecordBytes(const std::string& path_class, const std::string& transport,
                   MetricDirection direction, int64_t bytes);  // Not for the hot path: looks up.
  void RecordDirectStaged(MetricDirection direction, int64_t direct_bytes, int64_t staged_bytes);
  void RecordLocalCopy(int64_t bytes);
  // Delta sync's figures of one sync (executor TransferStats::delta_*): adds to the
  // wsync_delta_*_total counters and sets wsync_delta_changed_fraction (NaN when nothing was
  // compared).
  struct DeltaFigures {
    int64_t compared_elements = 0;
    int64_t changed_elements = 0;
    int64_t saved_bytes = 0;
    double encode_seconds = 0;
    double apply_seconds = 0;
  };
  void RecordDelta(const DeltaFigures& figures);
  void SetArenaBytes(int64_t in_use, int64_t peak);
  void SetVersion(int64_t version, VersionState state);
  void RecordError(const absl::Status& status);  // No-op for OK.
  void RecordError(absl::string_view kind);      // One of kMetricErrorKinds, else "internal".
  // Adds `count` rejected messages; `reason` is one of kRejectedMessageReasons, else "other".
  void RecordRejected(absl::string_view reason, int64_t count);
  void SetPlanDigest(const std::string& hex);
  // Bytes per sync the prediction leaves out (nullopt: no prediction, the gauge becomes NaN).
  void SetUnpricedBytes(std::optional<int64_t> bytes);
  // Plan::inter_node_bytes and Plan::inter_node_bytes_without_relay (planner/plan.h).
  void SetPlanInterNodeBytes(int64_t with_relay, int64_t without_relay);
  // The calibration's time; the age is computed at each exposition. InfinitePast clears it.
  void SetCalibrationTime(absl::Time time);
  // The coordinator this process runs: `source` is called at each exposition (any thread, under
  // this object's lock: it must not call back into it) and its figures set the
  // wsync_coordinator_* gauges (bound at the first reading) and add the refusals since the last
  // reading to wsync_rejected_messages_total (a new source's totals count from zero). Null: none
  // (the gauges keep their last values). Reads the previous source one last time; returns once no
  // exposition calls it any more.
  void SetCoordinatorSource(std::function<CoordinatorFigures()> source);

 private:
  class Exposition;
  // Updates the gauges computed at exposition time (the calibration age, the coordinator's).
  void Refresh() const;
  // The index of `reason` in kRejectedMessageReasons ("other" when it is none).
  static size_t RejectedIndex(absl::string_view reason);
  // The coordinator's figures from its source (coordinator_metrics.cc); under mu_.
  void RefreshCoordinator() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string role_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<Exposition> exposition_;  // What the exporter collects: Refresh + registry.

  prometheus::Counter* syncs_ok_;
  prometheus::Counter* syncs_failed_;
  prometheus::Histogram* duration_;
  prometheus::Gauge* last_duration_;
  prometheus::Gauge* predicted_;
  prometheus::Gauge* unpriced_;
  prometheus::Gauge* rounds_;
  prometheus::Counter* rounds_total_;
  prometheus::Family<prometheus::Counter>* bytes_sent_;
  prometheus::Family<prometheus::Counter>* bytes_received_;
  prometheus::Counter* direct_[2];  // By MetricDirection.
  prometheus::Counter* staged_[2];
  prometheus::Counter* local_copy_;
  prometheus::Counter* delta_compared_;
  prometheus::Counter* delta_changed_;
  prometheus::Gauge* delta_fraction_;
  prometheus::Counter* delta_saved_;
  prometheus::Counter* delta_encode_;
  prometheus::Counter* delta_apply_;
  prometheus::Gauge* arena_;
  prometheus::Gauge* arena_peak_;
  prometheus::Gauge* inter_node_with_relay_;
  prometheus::Gauge* inter_node_without_relay_;
  prometheus::Gauge* version_;
  prometheus::Gauge* state_[3];                 // consistent, updating, dirty.
  std::vector<prometheus::Counter*> errors_;    // Parallel to kMetricErrorKinds.
  std::vector<prometheus::Counter*> rejected_;  // Parallel to kRejectedMessageReasons.
  prometheus::Family<prometheus::Gauge>* plan_info_;
  prometheus::Family<prometheus::Gauge>* calibration_age_family_;

  mutable absl::Mutex mu_;
  // The bound path counters and what one sync adds to each.
  std::vector<std::pair<prometheus::Counter*, double>> path_bytes_ ABSL_GUARDED_BY(mu_);
  prometheus::Gauge* plan_info_child_ ABSL_GUARDED_BY(mu_) = nullptr;
  prometheus::Gauge* calibration_age_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Time calibration_time_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  prometheus::Family<prometheus::Gauge>* coordinator_processes_;
  prometheus::Family<prometheus::Gauge>* coordinator_phases_;
  prometheus::Family<prometheus::Gauge>* coordinator_bytes_;
  std::function<CoordinatorFigures()> coordinator_source_ ABSL_GUARDED_BY(mu_);
  // Bound at the first reading: expected, joined, lost; by phase; done, total.
  mutable std::vector<prometheus::Gauge*> coordinator_gauges_ ABSL_GUARDED_BY(mu_);
  // Refusals already added to wsync_rejected_messages_total, by reason.
  mutable std::vector<std::pair<std::string, int64_t>> coordinator_refused_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<prometheus::Exposer> exposer_ ABSL_GUARDED_BY(mu_);
  std::string exporter_host_ ABSL_GUARDED_BY(mu_);
  int32_t exporter_port_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace wsync

#endif  // WSYNC_METRICS_METRICS_H_
