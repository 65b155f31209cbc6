#include "cost/link_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status.h"

namespace wsync {
namespace {

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// Points of one key, collected while reading samples.
using Points = std::vector<std::pair<int64_t, double>>;

// A key whose line does not fit fails the whole fit, unless `skipped` is given: then it is left
// out and named there.
template <typename Key>
absl::Status FitAll(const std::map<Key, Points>& points, std::map<Key, LinkFit>* out,
                    absl::string_view what, std::vector<std::string>* skipped = nullptr) {
  int index = 0;
  for (const auto& [key, list] : points) {
    absl::StatusOr<LinkFit> fit = FitLine(list);
    ++index;
    if (!fit.ok() && skipped != nullptr) {
      skipped->push_back(
          absl::StrCat(what, " ", index, " of ", points.size(), ": ", fit.status().message()));
      continue;
    }
    if (!fit.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", fit.status().message()));
    }
    (*out)[key] = *fit;
  }
  return absl::OkStatus();
}

// "20us" -> 2e-5 seconds; "25GB/s" -> 2.5e10 bytes per second.
absl::StatusOr<double> ParseQuantity(
    absl::string_view text, const std::vector<std::pair<absl::string_view, double>>& units) {
  text = absl::StripAsciiWhitespace(text);
  for (const auto& [suffix, scale] : units) {
    absl::string_view number = text;
    if (!absl::ConsumeSuffix(&number, suffix)) continue;
    double value = 0;
    if (absl::SimpleAtod(number, &value) && value >= 0 && std::isfinite(value)) {
      return value * scale;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("cannot read '", text, "'"));
}

absl::Status CheckSchemaVersion(const proto::Calibration& calibration) {
  const uint32_t version = calibration.schema_version();
  if (version < kOldestCalibrationSchemaVersion || version > kCalibrationSchemaVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "calibration schema version ", version, " is not supported (this build reads ",
        kOldestCalibrationSchemaVersion, " to ", kCalibrationSchemaVersion, "); calibrate again"));
  }
  return absl::OkStatus();
}

// The smallest bytes_per_second of `fits` (0 when empty).
double SlowestRate(const std::map<int32_t, LinkFit>& fits) {
  double slowest = 0;
  for (const auto& [process, fit] : fits) {
    if (slowest == 0 || fit.bytes_per_second < slowest) slowest = fit.bytes_per_second;
  }
  return slowest;
}

}  // namespace

absl::StatusOr<LinkFit> FitLine(const std::vector<std::pair<int64_t, double>>& points) {
  std::map<int64_t, std::vector<double>> by_size;
  for (const auto& [bytes, seconds] : points) by_size[bytes].push_back(seconds);
  if (by_size.empty()) return absl::InvalidArgumentError("no samples");
  std::vector<double> x, y;
  for (const auto& [bytes, seconds] : by_size) {
    x.push_back(static_cast<double>(bytes));
    y.push_back(Median(seconds));
  }
  LinkFit fit;
  fit.sizes = static_cast<int32_t>(x.size());
  double slope = 0;
  if (x.size() == 1) {
    slope = y[0] / x[0];  // Through the origin: no latency can be told apart.
  } else {
    // Weighted least squares with weights 1 / y^2: minimises relative error, so that the small
    // sizes fix the latency and the large ones the bandwidth, instead of the largest sizes
    // drowning the latency in their noise.
    double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double w = 1.0 / std::max(y[i] * y[i], 1e-30);
      sw += w;
      sx += w * x[i];
      sy += w * y[i];
      sxx += w * x[i] * x[i];
      sxy += w * x[i] * y[i];
    }
    slope = (sw * sxy - sx * sy) / (sw * sxx - sx * sx);
    fit.alpha_seconds = std::max(0.0, (sy - slope * sx) / sw);
  }
  if (!(slope > 0) || !std::isfinite(slope)) {
    return absl::InvalidArgumentError(
        absl::StrCat("time does not grow with size (slope ", slope, " s/B)"));
  }
  fit.bytes_per_second = 1.0 / slope;
  for (size_t i = 0; i < x.size(); ++i) {
    const double predicted = fit.Seconds(x[i]);
    fit.max_relative_error =
        std::max(fit.max_relative_error, std::abs(predicted - y[i]) / std::max(y[i], 1e-12));
  }
  return fit;
}

absl::StatusOr<LinkFits> FitLinks(const proto::Calibration& calibration) {
  WSYNC_RETURN_IF_ERROR(CheckSchemaVersion(calibration));
  std::map<std::string, Points> by_path;
  std::map<std::pair<int32_t, int32_t>, Points> by_pair, both_ways;
  std::map<FanKey, Points> fans, aggregate;
  std::map<std::pair<std::string, std::string>, Points> relay, node_link;
  // Relays whose receive and send share a path: the processes timed, and (bytes, seconds).
  std::map<std::string, std::set<int32_t>> relay_processes;
  std::map<std::string, Points> relay_same_path;
  std::map<std::pair<int32_t, int32_t>, std::string> pair_path;
  std::map<int32_t, Points> quantize;  // By process.
  std::map<int32_t, Points> delta_encode, delta_apply;
  for (int i = 0; i < calibration.samples_size(); ++i) {
    const proto::CalibrationSample& s = calibration.samples(i);
    if (s.seconds_size() == 0 || s.bytes() <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("calibration sample ", i, " (", s.pattern(), ") has no timing or size"));
    }
    for (double seconds : s.seconds()) {
      const std::pair<int64_t, double> point{s.bytes(), seconds};
      if (s.pattern() == "peer" || s.pattern() == "local") {
        by_path[s.path()].push_back(point);
        if (s.pattern() == "peer" && s.from() >= 0 && s.to() >= 0) {
          by_pair[{s.from(), s.to()}].push_back(point);
          pair_path[{s.from(), s.to()}] = s.path();
        }
      } else if (s.pattern() == "both_ways") {
        both_ways[{std::min(s.from(), s.to()), std::max(s.from(), s.to())}].push_back(point);
      } else if (s.pattern() == "fan_out" || s.pattern() == "fan_in") {
        std::vector<int32_t> peers(s.peers().begin(), s.peers().end());
        std::sort(peers.begin(), peers.end());
        const FanKey key{s.pattern(), s.from(), peers};
        fans[key].push_back(point);
        aggregate[key].push_back({s.bytes() * std::max<int64_t>(1, s.peers_size()), seconds});
      } else if (s.pattern() == "relay") {
        relay[{s.path(), s.send_path()}].push_back(point);
        if (s.path() == s.send_path()) {
          relay_processes[s.path()].insert(s.from());
          relay_same_path[s.path()].push_back(point);
        }
      } else if (s.pattern() == "node_link" && calibration.schema_version() >= 2) {
        if (s.from_node().empty() || s.to_node().empty() || s.peers_size() == 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("calibration sample ", i, " (node_link) lacks its nodes or senders"));
        }
        // Every sender moved `messages` x `bytes` at once (files before the field: one message):
        // the node boundary carried senders x that.
        node_link[{s.from_node(), s.to_node()}].push_back(
            {s.bytes() * s.peers_size() * std::max(1, s.messages()), seconds});
      } else if (s.pattern() == "quantize" && calibration.schema_version() >= 3) {
        if (s.from() != s.to()) {
          return absl::InvalidArgumentError(absl::StrCat("calibration sample ", i,
                                                         " (quantize) names two processes, ",
                                                         s.from(), " and ", s.to()));
        }
        quantize[s.from()].push_back(point);
      } else if ((s.pattern() == "delta_encode" || s.pattern() == "delta_apply") &&
                 calibration.schema_version() >= 3) {
        if (s.from() != s.to()) {
          return absl::InvalidArgumentError(
              absl::StrCat("calibration sample ", i, " (", s.pattern(), ") names two processes"));
        }
        (s.pattern() == "delta_encode" ? delta_encode : delta_apply)[s.from()].push_back(point);
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("calibration sample ", i, " has unknown pattern '", s.pattern(),
                         "' for schema ", calibration.schema_version()));
      }
    }
  }
  if (calibration.nodes_size() != 0 && calibration.nodes_size() != calibration.processes()) {
    return absl::InvalidArgumentError(absl::StrCat("the calibration names ",
                                                   calibration.nodes_size(), " nodes for ",
                                                   calibration.processes(), " processes"));
  }
  LinkFits fits;
  fits.nodes.assign(calibration.nodes().begin(), calibration.nodes().end());
  WSYNC_RETURN_IF_ERROR(FitAll(by_path, &fits.by_path, "path fit"));
  WSYNC_RETURN_IF_ERROR(FitAll(by_pair, &fits.by_pair, "pair fit", &fits.skipped));
  for (const auto& [pair, fit] : fits.by_pair) fits.pair_path[pair] = pair_path[pair];
  WSYNC_RETURN_IF_ERROR(FitAll(both_ways, &fits.both_ways, "both-ways fit", &fits.skipped));
  WSYNC_RETURN_IF_ERROR(FitAll(fans, &fits.fans, "fan fit", &fits.skipped));
  WSYNC_RETURN_IF_ERROR(FitAll(aggregate, &fits.fan_aggregate, "fan aggregate fit", &fits.skipped));
  WSYNC_RETURN_IF_ERROR(FitAll(relay, &fits.relay, "relay fit", &fits.skipped));
  // Every relay process moved `bytes` at once: the path carried processes x bytes in that time.
  for (auto& [path, points] : relay_same_path) {
    const int64_t processes = static_cast<int64_t>(relay_processes[path].size());
    for (auto& point : points) point.first *= processes;
  }
  WSYNC_RETURN_IF_ERROR(
      FitAll(relay_same_path, &fits.path_aggregate, "path aggregate fit", &fits.skipped));
  WSYNC_RETURN_IF_ERROR(FitAll(node_link, &fits.node_link, "node link fit", &fits.skipped));
  WSYNC_RETURN_IF_ERROR(FitAll(quantize, &fits.quantize, "quantize fit", &fits.skipped));
  for (const auto& [process, fit] : fits.quantize) {
    if (fits.quantize_bytes_per_second == 0 ||
        fit.bytes_per_second < fits.quantize_bytes_per_second) {
      fits.quantize_bytes_per_second = fit.bytes_per_second;
    }
  }
  WSYNC_RETURN_IF_ERROR(
      FitAll(delta_encode, &fits.delta_encode, "delta encode fit", &fits.skipped));
  WSYNC_RETURN_IF_ERROR(FitAll(delta_apply, &fits.delta_apply, "delta apply fit", &fits.skipped));
  fits.delta_encode_bytes_per_second = SlowestRate(fits.delta_encode);
  fits.delta_apply_bytes_per_second = SlowestRate(fits.delta_apply);
  if (!fits.by_path.contains(kSameDevicePath) && fits.by_path.contains(kIntraNodePath)) {
    fits.by_path[kSameDevicePath] = fits.by_path.at(kIntraNodePath);
    fits.stand_ins[kSameDevicePath] = kIntraNodePath;
  }
  return fits;
}

std::string StandInNote(const LinkFits& fits, const Prediction& prediction) {
  std::vector<std::string> clauses;
  for (const auto& [path, bytes] : prediction.stand_in_bytes) {
    const auto source = fits.stand_ins.find(path);
    clauses.push_back(
        absl::StrCat(path, " ", bytes, " B priced with ",
                     source == fits.stand_ins.end() ? "another class" : source->second,
                     "'s fit (the calibration has none of its own)"));
  }
  if (prediction.quantize_stand_in && prediction.quantize_seconds > 0) {
    clauses.push_back(absl::StrFormat(
        "quantize priced at the stand-in %.2f GB/s of input (the calibration measured no "
        "quantize rate)",
        prediction.quantize_bytes_per_second / 1e9));
  }
  return absl::StrJoin(clauses, "; ");
}

std::string SerializeCalibration(const proto::Calibration& calibration) {
  return calibration.SerializeAsString();
}

absl::StatusOr<proto::Calibration> ParseCalibration(absl::string_view bytes) {
  proto::Calibration calibration;
  if (!calibration.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError("the bytes are not a wsync calibration");
  }
  WSYNC_RETURN_IF_ERROR(CheckSchemaVersion(calibration));
  return calibration;
}

absl::StatusOr<double> ParseStatedSeconds(absl::string_view text) {
  return ParseQuantity(text, {{"us", 1e-6}, {"ms", 1e-3}, {"s", 1.0}});
}

absl::StatusOr<double> ParseStatedBandwidth(absl::string_view text) {
  return ParseQuantity(text, {{"GB/s", 1e9}, {"MB/s", 1e6}});
}

absl::StatusOr<proto::Calibration> SyntheticCalibration(absl::string_view spec) {
  proto::Calibration calibration;
  calibration.set_schema_version(kCalibrationSchemaVersion);
  calibration.set_transport("synthetic");
  calibration.set_processes(2);
  for (absl::string_view entry : absl::StrSplit(spec, ';', absl::SkipWhitespace())) {
    const std::vector<absl::string_view> parts = absl::StrSplit(entry, absl::ByAnyChar("=,"));
    if (parts.size() != 3) {
      return absl::InvalidArgumentError(
          absl::StrCat("link entry '", entry, "' is not <path>=<alpha>,<bandwidth>"));
    }
    WSYNC_ASSIGN_OR_RETURN(const double alpha, ParseStatedSeconds(parts[1]));
    WSYNC_ASSIGN_OR_RETURN(const double bandwidth, ParseStatedBandwidth(parts[2]));
    if (bandwidth <= 0) return absl::InvalidArgumentError("bandwidth must be positive");
    const std::string path(absl::StripAsciiWhitespace(parts[0]));
    for (int64_t bytes : {int64_t{1} << 20, int64_t{1} << 28}) {
      proto::CalibrationSample* sample = calibration.add_samples();
      const bool kernel = path == "quantize" || path == "delta_encode" || path == "delta_apply";
      sample->set_pattern(path == "local" || kernel ? path : "peer");
      sample->set_from(-1);  // Stated for the path class (or a kernel), not measured on a pair.
      sample->set_to(-1);
      sample->set_path(kernel ? "local" : path);
      sample->set_bytes(bytes);
      sample->add_seconds(alpha + static_cast<double>(bytes) / bandwidth);
    }
  }
  if (calibration.samples_size() == 0) return absl::InvalidArgumentError("no links given");
  return calibration;
}

std::string ResourceLoad::Name() const {
  switch (kind) {
    case kLink:
      return absl::StrCat("link ", from, "->", to, " (", label, ")");
    case kEgress:
      return absl::StrCat("egress of process ", from);
    case kIngress:
      return absl::StrCat("ingress of process ", to);
    case kPath:
      return absl::StrCat("all ", label, " traffic at once");
    case kNodeLink:
      return absl::StrCat("node link ", label, " (all its pairs at once)");
    case kNodeInside:
      return absl::StrCat("all pairs inside node ", label, " at once");
  }
  return label;
}

namespace {

// The pair's own fit when it was measured on `path` (or its path is not recorded), else nullptr.
const LinkFit* PairFit(const LinkFits& fits, int32_t from, int32_t to, absl::string_view path) {
  auto pair = fits.by_pair.find({from, to});
  if (pair == fits.by_pair.end()) return nullptr;
  auto measured = fits.pair_path.find({from, to});
  if (measured != fits.pair_path.end() && measured->second != path) return nullptr;
  return &pair->second;
}

}  // namespace

bool CanPrice(const LinkFits& fits, int32_t from, int32_t to, absl::string_view path) {
  return PairFit(fits, from, to, path) != nullptr || fits.by_path.contains(std::string(path));
}

TrafficLoads::TrafficLoads(const LinkFits* fits) : fits_(fits) {}

absl::Status TrafficLoads::Add(int32_t from, int32_t to, absl::string_view path, int64_t bytes) {
  auto it = pairs_.find({from, to});
  if (it == pairs_.end()) {
    const LinkFit* fit = PairFit(*fits_, from, to, path);
    if (auto by_path = fits_->by_path.find(std::string(path));
        fit == nullptr && by_path != fits_->by_path.end()) {
      fit = &by_path->second;
    }
    if (fit == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the calibration has no fit for path '", path, "' (process ", from, " to ", to, ")"));
    }
    it = pairs_.emplace(std::make_pair(from, to), Pair{std::string(path), fit, 0}).first;
  }
  it->second.bytes += bytes;
  const auto settle = [](std::map<int32_t, std::map<int32_t, int64_t>>& sums, int32_t root,
                         int32_t peer, int64_t delta) {
    std::map<int32_t, int64_t>& peers = sums[root];
    if ((peers[peer] += delta) == 0) peers.erase(peer);
    if (peers.empty()) sums.erase(root);
  };
  settle(sent_, from, to, bytes);
  settle(received_, to, from, bytes);
  if (from != to) path_bytes_[std::string(path)] += bytes;
  const std::string* from_node = NodeOf(from);
  const std::string* to_node = NodeOf(to);
  if (from_node != nullptr && to_node != nullptr && from != to) {
    node_bytes_[{*from_node, *to_node}] += bytes;
  }
  return absl::OkStatus();
}

const std::string* TrafficLoads::NodeOf(int32_t process) const {
  if (process < 0 || process >= static_cast<int32_t>(fits_->nodes.size())) return nullptr;
  return &fits_->nodes[process];
}

ResourceLoad TrafficLoads::Link(const std::pair<int32_t, int32_t>& key, const Pair& pair) const {
  return ResourceLoad{ResourceLoad::kLink, key.first, key.second, pair.path,
                      pair.bytes / pair.fit->bytes_per_second};
}

// Measured fans replace the best-link guess of a root's aggregate rate: the fan whose width is
// nearest the number of peers the process moves bytes with (ties to the wider; the best rate
// among equal widths). 0 when the root has no fan of that pattern.
double TrafficLoads::FanRate(absl::string_view pattern, int32_t root, size_t peers) const {
  double rate = 0;
  size_t best_distance = SIZE_MAX, best_width = 0;
  for (auto it = fits_->fan_aggregate.lower_bound(FanKey{std::string(pattern), root, {}});
       it != fits_->fan_aggregate.end() && std::get<0>(it->first) == pattern &&
       std::get<1>(it->first) == root && peers > 0;
       ++it) {
    const size_t width = std::get<2>(it->first).size();
    const size_t distance = width > peers ? width - peers : peers - width;
    if (distance < best_distance || (distance == best_distance && width > best_width)) {
      best_distance = distance;
      best_width = width;
      rate = 0;
    }
    if (distance == best_distance && width == best_width) {
      rate = std::max(rate, it->second.bytes_per_second);
    }
  }
  return rate;
}

// A root's bytes with its peers (sent: its receivers; else its senders) over its fan's
// aggregate rate for that many peers, else over the best link it uses.
ResourceLoad TrafficLoads::Root(int32_t process, bool sent) const {
  int64_t bytes = 0;
  size_t peers = 0;
  double best_link = 0;
  for (const auto& [peer, moved] : (sent ? sent_ : received_).at(process)) {
    bytes += moved;
    if (peer != process) ++peers;
    const auto pair = sent ? std::make_pair(process, peer) : std::make_pair(peer, process);
    best_link = std::max(best_link, pairs_.at(pair).fit->bytes_per_second);
  }
  const double fan = FanRate(sent ? "fan_out" : "fan_in", process, peers);
  const double seconds = bytes / (fan > 0 ? fan : best_link);
  return sent ? ResourceLoad{ResourceLoad::kEgress, process, -1, "", seconds}
              : ResourceLoad{ResourceLoad::kIngress, -1, process, "", seconds};
}

std::vector<ResourceLoad> TrafficLoads::All() const {
  std::vector<ResourceLoad> loads;
  for (const auto& [key, pair] : pairs_) {
    if (pair.bytes != 0) loads.push_back(Link(key, pair));
  }
  for (const auto& [process, receivers] : sent_) loads.push_back(Root(process, /*sent=*/true));
  for (const auto& [process, senders] : received_) loads.push_back(Root(process, /*sent=*/false));
  // All traffic of a path at once, against what the path carried with every process busy.
  for (const auto& [path, bytes] : path_bytes_) {
    auto it = fits_->path_aggregate.find(path);
    if (it == fits_->path_aggregate.end() || bytes == 0) continue;
    loads.push_back(
        ResourceLoad{ResourceLoad::kPath, -1, -1, path, bytes / it->second.bytes_per_second});
  }
  for (const auto& [nodes, bytes] : node_bytes_) {
    if (std::optional<ResourceLoad> load = NodeLoad(nodes, bytes)) loads.push_back(*load);
  }
  return loads;
}

// All traffic from one node to another at once, against what that boundary carried with every
// sender of the node busy; inside one node, all traffic between its distinct processes at once,
// against what half of them carried sending to the other half.
std::optional<ResourceLoad> TrafficLoads::NodeLoad(const std::pair<std::string, std::string>& nodes,
                                                   int64_t bytes) const {
  auto it = fits_->node_link.find(nodes);
  if (it == fits_->node_link.end() || bytes == 0) return std::nullopt;
  const double seconds = bytes / it->second.bytes_per_second;
  if (nodes.first == nodes.second) {
    return ResourceLoad{ResourceLoad::kNodeInside, -1, -1, nodes.first, seconds};
  }
  return ResourceLoad{ResourceLoad::kNodeLink, -1, -1,
                      absl::StrCat(nodes.first, "->", nodes.second), seconds};
}

std::vector<ResourceLoad> TrafficLoads::Touched(int32_t from, int32_t to) const {
  std::vector<ResourceLoad> loads;
  auto pair = pairs_.find({from, to});
  if (pair == pairs_.end()) return loads;
  if (pair->second.bytes != 0) loads.push_back(Link(pair->first, pair->second));
  if (sent_.contains(from)) loads.push_back(Root(from, /*sent=*/true));
  if (received_.contains(to)) loads.push_back(Root(to, /*sent=*/false));
  if (from != to) {
    auto aggregate = fits_->path_aggregate.find(pair->second.path);
    auto bytes = path_bytes_.find(pair->second.path);
    if (aggregate != fits_->path_aggregate.end() && bytes != path_bytes_.end()) {
      loads.push_back(ResourceLoad{ResourceLoad::kPath, -1, -1, pair->second.path,
                                   bytes->second / aggregate->second.bytes_per_second});
    }
  }
  const std::string* from_node = NodeOf(from);
  const std::string* to_node = NodeOf(to);
  if (from_node != nullptr && to_node != nullptr && from != to) {
    if (auto bytes = node_bytes_.find({*from_node, *to_node}); bytes != node_bytes_.end()) {
      if (std::optional<ResourceLoad> load = NodeLoad(bytes->first, bytes->second)) {
        loads.push_back(*load);
      }
    }
  }
  return loads;
}

double TrafficLoads::MaxAlpha() const {
  double alpha = 0;
  for (const auto& [key, pair] : pairs_) {
    if (pair.bytes != 0) alpha = std::max(alpha, pair.fit->alpha_seconds);
  }
  return alpha;
}

absl::StatusOr<std::vector<ResourceLoad>> PriceResources(const LinkFits& fits,
                                                         const Traffic& traffic,
                                                         double* max_alpha) {
  TrafficLoads loads(&fits);
  for (const PairTraffic& pair : traffic.pairs) {
    if (pair.bytes == 0) continue;
    WSYNC_RETURN_IF_ERROR(loads.Add(pair.from, pair.to, pair.path, pair.bytes));
  }
  if (max_alpha != nullptr) *max_alpha = loads.MaxAlpha();
  return loads.All();
}

absl::StatusOr<Prediction> Predict(const LinkFits& fits, const Traffic& traffic) {
  double max_alpha = 0;
  WSYNC_ASSIGN_OR_RETURN(const std::vector<ResourceLoad> loads,
                         PriceResources(fits, traffic, &max_alpha));
  Prediction prediction;
  const ResourceLoad* busiest = nullptr;
  for (const ResourceLoad& load : loads) {
    if (load.seconds > prediction.transfer_seconds) {
      prediction.transfer_seconds = load.seconds;
      busiest = &load;
    }
  }
  if (busiest != nullptr) prediction.binding = busiest->Name();
  // Per-round costs add to the transfer: the executor keeps kRoundsInFlight rounds posted per pair,
  // so the busiest process's rounds cost rounds x alpha / kRoundsInFlight (at least one alpha).
  // They are not hidden behind the bytes: where alpha was measured on the cores that move the
  // bytes (loopback TCP, shared memory) it is their CPU time per message, and where it is a
  // fabric's wire latency (microseconds) the term is small. cost_aware_policy.cc charges each
  // message the same alpha / kRoundsInFlight.
  prediction.latency_seconds = std::max(max_alpha, static_cast<double>(traffic.rounds) * max_alpha /
                                                       static_cast<double>(kRoundsInFlight));
  prediction.seconds = prediction.transfer_seconds + prediction.latency_seconds;
  return prediction;
}

absl::StatusOr<Prediction> PredictPriced(const LinkFits& fits, const Traffic& traffic) {
  Traffic priced;
  priced.rounds = traffic.rounds;
  std::map<std::string, int64_t> unpriced, stand_in;
  for (const PairTraffic& pair : traffic.pairs) {
    if (CanPrice(fits, pair.from, pair.to, pair.path)) {
      priced.pairs.push_back(pair);
      if (fits.stand_ins.contains(pair.path) && pair.bytes != 0) stand_in[pair.path] += pair.bytes;
    } else if (pair.bytes != 0) {
      unpriced[pair.path] += pair.bytes;
    }
  }
  WSYNC_ASSIGN_OR_RETURN(Prediction prediction, Predict(fits, priced));
  prediction.unpriced_bytes = std::move(unpriced);
  prediction.stand_in_bytes = std::move(stand_in);
  return prediction;
}

}  // namespace wsync
