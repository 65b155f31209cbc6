#include "metrics/metrics.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <limits>
#include <string>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "metrics/descriptors.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace wsync {
namespace {

constexpr absl::string_view kStates[] = {"consistent", "updating", "dirty"};

absl::string_view DirectionName(MetricDirection direction) {
  return direction == MetricDirection::kSend ? "send" : "receive";
}

int DirectionIndex(MetricDirection direction) {
  return direction == MetricDirection::kSend ? 0 : 1;
}

// Whether `host` resolves (IPv4, as the exporter binds it) to the wildcard address.
bool ResolvesToAnyAddress(const std::string& host) {
  if (host.empty()) return true;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return false;
  bool any = false;
  for (const addrinfo* at = found; at != nullptr; at = at->ai_next) {
    any = any || reinterpret_cast<const sockaddr_in*>(at->ai_addr)->sin_addr.s_addr == INADDR_ANY;
  }
  freeaddrinfo(found);
  return any;
}

// Opens and closes a TCP connection to host:port (IPv4 literal or name; a wildcard address is
// reached on loopback). Best effort: errors are ignored.
void Knock(const std::string& host, int32_t port) {
  const std::string target = host == "0.0.0.0" || host.empty() ? "127.0.0.1" : host;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(target.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return;
  const int fd = socket(found->ai_family, found->ai_socktype | SOCK_CLOEXEC, found->ai_protocol);
  if (fd >= 0) {
    connect(fd, found->ai_addr, found->ai_addrlen);
    close(fd);
  }
  freeaddrinfo(found);
}

// The labels of a wsync_bytes_{sent,received}_total series (both rows have the same two).
prometheus::Labels PathLabels(const std::string& path_class, const std::string& transport) {
  const MetricDescriptor& row = *FindMetricDescriptor("wsync_bytes_sent_total");
  return {{std::string(row.label), path_class}, {std::string(row.second_label), transport}};
}

// Every family of kMetricDescriptors, registered once in `registry` with the labels `base`; the
// lookups below name a family by its row. Naming a family that has no row, or one of another
// type, is a programming error: the process aborts with the name (every test constructs
// SessionMetrics, so such an error cannot pass the suite).
class RegisteredFamilies {
 public:
  RegisteredFamilies(prometheus::Registry& registry, const prometheus::Labels& base) {
    for (const MetricDescriptor& row : kMetricDescriptors) {
      const std::string name(row.name);
      const std::string help(row.help);
      switch (row.type) {
        case MetricType::kCounter:
          counters_[row.name] =
              &prometheus::BuildCounter().Name(name).Help(help).Labels(base).Register(registry);
          break;
        case MetricType::kGauge:
          gauges_[row.name] =
              &prometheus::BuildGauge().Name(name).Help(help).Labels(base).Register(registry);
          break;
        case MetricType::kHistogram:
          histograms_[row.name] =
              &prometheus::BuildHistogram().Name(name).Help(help).Labels(base).Register(registry);
          break;
      }
    }
  }

  prometheus::Family<prometheus::Counter>& Counters(absl::string_view name) const {
    return *Find(counters_, name);
  }
  prometheus::Family<prometheus::Gauge>& Gauges(absl::string_view name) const {
    return *Find(gauges_, name);
  }
  prometheus::Family<prometheus::Histogram>& Histograms(absl::string_view name) const {
    return *Find(histograms_, name);
  }
  // The series of family `name` whose row label has `value` (no label when the row has none).
  prometheus::Counter& AddCounter(absl::string_view name, absl::string_view value = {}) const {
    return Counters(name).Add(SeriesLabels(name, value));
  }
  prometheus::Gauge& AddGauge(absl::string_view name, absl::string_view value = {}) const {
    return Gauges(name).Add(SeriesLabels(name, value));
  }

 private:
  static prometheus::Labels SeriesLabels(absl::string_view name, absl::string_view value) {
    const MetricDescriptor* row = FindMetricDescriptor(name);
    if (row == nullptr || row->label.empty() != value.empty() || !row->second_label.empty()) {
      Die(name, "is bound with labels its row does not have");
    }
    if (row->label.empty()) return {};
    return {{std::string(row->label), std::string(value)}};
  }

  template <typename Map>
  static typename Map::mapped_type Find(const Map& families, absl::string_view name) {
    const auto it = families.find(name);
    if (it == families.end()) Die(name, "has no row of this type in kMetricDescriptors");
    return it->second;
  }

  [[noreturn]] static void Die(absl::string_view name, absl::string_view what) {
    log::Fatal(log::Category::kFault, absl::StrCat("metrics: family ", name, " ", what));
  }

  absl::flat_hash_map<absl::string_view, prometheus::Family<prometheus::Counter>*> counters_;
  absl::flat_hash_map<absl::string_view, prometheus::Family<prometheus::Gauge>*> gauges_;
  absl::flat_hash_map<absl::string_view, prometheus::Family<prometheus::Histogram>*> histograms_;
};

}  // namespace

absl::string_view MetricErrorKind(const absl::Status& status) {
  return ErrorClassName(ClassifyError(status));
}

std::vector<double> SyncDurationBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
          1,     2.5,    5,     10,   30,    60,   120, 300,  600};
}

absl::StatusOr<MetricsAddress> ParseMetricsAddress(absl::string_view text) {
  MetricsAddress address;
  absl::string_view host = text;
  absl::string_view port;
  if (const size_t colon = text.rfind(':'); colon != absl::string_view::npos) {
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  } else if (!text.empty() && text.find_first_not_of("0123456789") == absl::string_view::npos) {
    host = "";
    port = text;
  }
  if (!host.empty()) address.host = std::string(host);
  if (!port.empty()) {
    if (!absl::SimpleAtoi(port, &address.port) || address.port < 0 || address.port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("metrics address '", text, "': the port must be in 0..65535"));
    }
  }
  if (address.host.find_first_of(" /[]") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address '", text, "': expected HOST:PORT (IPv4 or a name)"));
  }
  return address;
}

// What the exporter collects: the registry, after refreshing the gauges computed at exposition.
// Also the exception firewall of the exporter's server threads, which call Collect: a refresh that
// throws (a coordinator source, memory) is counted in wsync_errors_total{kind="internal"} and the
// families are served as they stood; a collection that throws serves none.
class SessionMetrics::Exposition : public prometheus::Collectable {
 public:
  explicit Exposition(const SessionMetrics* owner) : owner_(owner) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    try {
      owner_->Refresh();
    } catch (...) {
      owner_->errors_.back()->Increment();  // "internal" (RecordError).
    }
    try {
      return owner_->registry_->Collect();
    } catch (...) {
      return {};
    }
  }

 private:
  const SessionMetrics* owner_;
};

SessionMetrics::SessionMetrics(absl::string_view role)
    : role_(role), registry_(std::make_shared<prometheus::Registry>()) {
  const RegisteredFamilies f(*registry_, {{"role", role_}});
  syncs_ok_ = &f.AddCounter("wsync_syncs_total", "ok");
  syncs_failed_ = &f.AddCounter("wsync_syncs_total", "failed");
  duration_ = &f.Histograms("wsync_sync_duration_seconds").Add({}, SyncDurationBuckets());
  last_duration_ = &f.AddGauge("wsync_last_sync_duration_seconds");
  predicted_ = &f.AddGauge("wsync_sync_predicted_seconds");
  predicted_->Set(std::numeric_limits<double>::quiet_NaN());
  unpriced_ = &f.AddGauge("wsync_sync_unpriced_bytes");
  unpriced_->Set(std::numeric_limits<double>::quiet_NaN());
  rounds_ = &f.AddGauge("wsync_rounds");
  rounds_total_ = &f.AddCounter("wsync_rounds_total");
  bytes_sent_ = &f.Counters("wsync_bytes_sent_total");
  bytes_received_ = &f.Counters("wsync_bytes_received_total");
  for (MetricDirection d : {MetricDirection::kSend, MetricDirection::kReceive}) {
    direct_[DirectionIndex(d)] = &f.AddCounter("wsync_direct_bytes_total", DirectionName(d));
    staged_[DirectionIndex(d)] = &f.AddCounter("wsync_staged_bytes_total", DirectionName(d));
  }
  local_copy_ = &f.AddCounter("wsync_local_copy_bytes_total");
  delta_compared_ = &f.AddCounter("wsync_delta_compared_elements_total");
  delta_changed_ = &f.AddCounter("wsync_delta_changed_elements_total");
  delta_fraction_ = &f.AddGauge("wsync_delta_changed_fraction");
  delta_fraction_->Set(std::numeric_limits<double>::quiet_NaN());
  delta_saved_ = &f.AddCounter("wsync_delta_saved_bytes_total");
  delta_encode_ = &f.AddCounter("wsync_delta_encode_seconds_total");
  delta_apply_ = &f.AddCounter("wsync_delta_apply_seconds_total");
  arena_ = &f.AddGauge("wsync_arena_bytes");
  arena_peak_ = &f.AddGauge("wsync_arena_peak_bytes");
  inter_node_with_relay_ = &f.AddGauge("wsync_plan_inter_node_bytes", "with");
  inter_node_without_relay_ = &f.AddGauge("wsync_plan_inter_node_bytes", "without");
  version_ = &f.AddGauge("wsync_version");
  version_->Set(-1);
  for (int s = 0; s < 3; ++s) state_[s] = &f.AddGauge("wsync_state", kStates[s]);
  for (absl::string_view kind : kMetricErrorKinds) {
    errors_.push_back(&f.AddCounter("wsync_errors_total", kind));
  }
  for (absl::string_view reason : kRejectedMessageReasons) {
    rejected_.push_back(&f.AddCounter("wsync_rejected_messages_total", reason));
  }
  plan_info_ = &f.Gauges("wsync_plan_info");
  calibration_age_family_ = &f.Gauges("wsync_calibration_age_seconds");
  coordinator_processes_ = &f.Gauges("wsync_coordinator_processes");
  coordinator_phases_ = &f.Gauges("wsync_coordinator_sync_processes");
  coordinator_bytes_ = &f.Gauges("wsync_coordinator_sync_bytes");
  exposition_ = std::make_shared<Exposition>(this);
}

SessionMetrics::~SessionMetrics() { StopExporter(); }

absl::Status SessionMetrics::StartExporter(const MetricsAddress& address) {
  const auto already_running = [] {
    return absl::FailedPreconditionError("the metrics exporter is already running");
  };
  if (!address.allow_any_address && ResolvesToAnyAddress(address.host)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the metrics exporter refuses to listen on the wildcard address '", address.host,
        "' (every interface) unless allowed explicitly (metrics_allow_any_address, "
        "--allow_any_address)"));
  }
  {
    absl::MutexLock lock(&mu_);
    if (exposer_ != nullptr) return already_running();
  }
  // The exposer is created and given the exposition outside mu_: its server threads hold the
  // exposer's own lock while they collect, and collecting takes mu_ (Refresh), so taking the
  // exposer's lock under mu_ would invert the order.
  const std::string bind = absl::StrCat(address.host, ":", address.port);
  std::unique_ptr<prometheus::Exposer> exposer;
  int32_t port = 0;
  try {
    exposer = std::make_unique<prometheus::Exposer>(bind, /*num_threads=*/1);
    const std::vector<int> ports = exposer->GetListeningPorts();
    if (ports.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the metrics exporter cannot listen on ", bind));
    }
    exposer->RegisterCollectable(exposition_);
    port = ports.front();
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("the metrics exporter cannot listen on ", bind, ": ", e.what()));
  }
  {
    absl::MutexLock lock(&mu_);
    if (exposer_ == nullptr) {
      exporter_port_ = port;
      exporter_host_ = address.host;
      exposer_ = std::move(exposer);
      return absl::OkStatus();
    }
  }
  return already_running();  // A concurrent start won; this exposer stops here, outside mu_.
}

void SessionMetrics::StopExporter() {
  std::unique_ptr<prometheus::Exposer> exposer;
  std::string exporter_host;
  int32_t port = 0;
  {
    absl::MutexLock lock(&mu_);
    exposer = std::move(exposer_);
    exporter_host = exporter_host_;
    port = exporter_port_;
    exporter_port_ = 0;
  }
  if (exposer == nullptr) return;
  // The server's listening thread looks at its stop flag only between polls of its socket, which
  // wait up to 2 s (civetweb's SOCKET_TIMEOUT_QUANTUM): knock until it has seen the flag, so that
  // finalize takes milliseconds. Outside mu_: a scrape in flight takes it in Refresh.
  const std::string host = exporter_host;
  // Knocking is best effort and has its own exception firewall: without it (no thread, or a knock
  // that threw) the exporter still stops, within 2 s.
  std::atomic<bool> stopped{false};
  std::thread knocker;
  try {
    knocker = std::thread([&] {
      try {
        while (!stopped) {
          Knock(host, port);
          absl::SleepFor(absl::Milliseconds(20));
        }
      } catch (...) {
      }
    });
  } catch (...) {
  }
  exposer.reset();
  stopped = true;
  if (knocker.joinable()) knocker.join();
}

int32_t SessionMetrics::exporter_port() const {
  absl::MutexLock lock(&mu_);
  return exporter_port_;
}

std::string SessionMetrics::exporter_url() const {
  absl::MutexLock lock(&mu_);
  if (exposer_ == nullptr) return "";
  return absl::StrCat("http://", exporter_host_, ":", exporter_port_, "/metrics");
}

void SessionMetrics::Refresh() const {
  absl::MutexLock lock(&mu_);
  if (calibration_age_ != nullptr) {
    calibration_age_->Set(absl::ToDoubleSeconds(absl::Now() - calibration_time_));
  }
  RefreshCoordinator();
}

std::string SessionMetrics::Text() const {
  prometheus::TextSerializer serializer;
  return serializer.Serialize(exposition_->Collect());
}

void SessionMetrics::BindPaths(const std::vector<PathBytes>& paths) {
  std::vector<std::pair<prometheus::Counter*, double>> bound;
  const auto bind = [&](prometheus::Family<prometheus::Counter>& family, const PathBytes& path,
                        double bytes) {
    prometheus::Counter* counter = &family.Add(PathLabels(path.path_class, path.transport));
    auto same = std::find_if(bound.begin(), bound.end(),
                             [&](const auto& entry) { return entry.first == counter; });
    if (same != bound.end()) {
      same->second += bytes;
    } else {
      bound.emplace_back(counter, bytes);
    }
  };
  for (const PathBytes& path : paths) {
    // Both directions of every path get a series (a rollout shows 0 bytes sent on its paths).
    const bool send = path.direction == MetricDirection::kSend;
    bind(send ? *bytes_sent_ : *bytes_received_, path, static_cast<double>(path.bytes));
    bind(send ? *bytes_received_ : *bytes_sent_, path, 0);
  }
  absl::MutexLock lock(&mu_);
  path_bytes_ = std::move(bound);
}

void SessionMetrics::RecordPathBytes(absl::Span<const PathBytes> saved) {
  absl::flat_hash_map<prometheus::Counter*, double> less;
  for (const PathBytes& path : saved) {
    auto& family = path.direction == MetricDirection::kSend ? *bytes_sent_ : *bytes_received_;
    less[&family.Add(PathLabels(path.path_class, path.transport))] +=
        static_cast<double>(path.bytes);
  }
  absl::MutexLock lock(&mu_);
  for (const auto& [counter, bytes] : path_bytes_) {
    const auto it = less.find(counter);
    counter->Increment(std::max(0.0, bytes - (it == less.end() ? 0.0 : it->second)));
  }
}

void SessionMetrics::RecordSync(SyncResult result, double seconds,
                                std::optional<double> predicted_seconds) {
  (result == SyncResult::kOk ? syncs_ok_ : syncs_failed_)->Increment();
  duration_->Observe(seconds);
  last_duration_->Set(seconds);
  predicted_->Set(predicted_seconds.value_or(std::numeric_limits<double>::quiet_NaN()));
}

void SessionMetrics::RecordRounds(int64_t rounds) {
  rounds_->Set(static_cast<double>(rounds));
  rounds_total_->Increment(static_cast<double>(rounds));
}

void SessionMetrics::RecordBytes(const std::string& path_class, const std::string& transport,
                                 MetricDirection direction, int64_t bytes) {
  auto& family = direction == MetricDirection::kSend ? *bytes_sent_ : *bytes_received_;
  family.Add(PathLabels(path_class, transport)).Increment(static_cast<double>(bytes));
}

void SessionMetrics::RecordDirectStaged(MetricDirection direction, int64_t direct_bytes,
                                        int64_t staged_bytes) {
  direct_[DirectionIndex(direction)]->Increment(static_cast<double>(direct_bytes));
  staged_[DirectionIndex(direction)]->Increment(static_cast<double>(staged_bytes));
}

void SessionMetrics::RecordLocalCopy(int64_t bytes) {
  local_copy_->Increment(static_cast<double>(bytes));
}

void SessionMetrics::RecordDelta(const DeltaFigures& figures) {
  delta_compared_->Increment(static_cast<double>(figures.compared_elements));
  delta_changed_->Increment(static_cast<double>(figures.changed_elements));
  delta_fraction_->Set(figures.compared_elements > 0
                           ? static_cast<double>(figures.changed_elements) /
                                 static_cast<double>(figures.compared_elements)
                           : std::numeric_limits<double>::quiet_NaN());
  delta_saved_->Increment(static_cast<double>(figures.saved_bytes));
  delta_encode_->Increment(figures.encode_seconds);
  delta_apply_->Increment(figures.apply_seconds);
}

void SessionMetrics::SetArenaBytes(int64_t in_use, int64_t peak) {
  arena_->Set(static_cast<double>(in_use));
  arena_peak_->Set(static_cast<double>(peak));
}

void SessionMetrics::SetVersion(int64_t version, VersionState state) {
  version_->Set(static_cast<double>(version));
  const int current = state == VersionState::kConsistent ? 0
                      : state == VersionState::kUpdating ? 1
                      : state == VersionState::kDirty    ? 2
                                                         : -1;
  for (int s = 0; s < 3; ++s) state_[s]->Set(s == current ? 1 : 0);
}

void SessionMetrics::RecordError(const absl::Status& status) {
  if (status.ok()) return;
  RecordError(MetricErrorKind(status));
}

void SessionMetrics::RecordError(absl::string_view kind) {
  size_t index = 0;
  for (; index < errors_.size(); ++index) {
    if (kMetricErrorKinds[index] == kind) break;
  }
  if (index == errors_.size()) index = errors_.size() - 1;  // "internal".
  errors_[index]->Increment();
}

size_t SessionMetrics::RejectedIndex(absl::string_view reason) {
  constexpr size_t kReasons = std::size(kRejectedMessageReasons);
  for (size_t index = 0; index < kReasons; ++index) {
    if (kRejectedMessageReasons[index] == reason) return index;
  }
  return kReasons - 1;  // "other".
}

void SessionMetrics::RecordRejected(absl::string_view reason, int64_t count) {
  if (count <= 0) return;
  rejected_[RejectedIndex(reason)]->Increment(static_cast<double>(count));
}

void SessionMetrics::SetUnpricedBytes(std::optional<int64_t> bytes) {
  unpriced_->Set(bytes.has_value() ? static_cast<double>(*bytes)
                                   : std::numeric_limits<double>::quiet_NaN());
}

void SessionMetrics::SetPlanInterNodeBytes(int64_t with_relay, int64_t without_relay) {
  inter_node_with_relay_->Set(static_cast<double>(with_relay));
  inter_node_without_relay_->Set(static_cast<double>(without_relay));
}

void SessionMetrics::SetPlanDigest(const std::string& hex) {
  absl::MutexLock lock(&mu_);
  if (plan_info_child_ != nullptr) plan_info_->Remove(plan_info_child_);
  plan_info_child_ =
      &plan_info_->Add({{std::string(FindMetricDescriptor("wsync_plan_info")->label), hex}});
  plan_info_child_->Set(1);
}

void SessionMetrics::SetCalibrationTime(absl::Time time) {
  absl::MutexLock lock(&mu_);
  calibration_time_ = time;
  if (time == absl::InfinitePast()) {
    if (calibration_age_ != nullptr) calibration_age_family_->Remove(calibration_age_);
    calibration_age_ = nullptr;
    return;
  }
  if (calibration_age_ == nullptr) calibration_age_ = &calibration_age_family_->Add({});
}

}  // namespace wsync
