#ifndef WSYNC_CALIBRATION_LINK_MODEL_LINK_MODEL_H_
#define WSYNC_CALIBRATION_LINK_MODEL_LINK_MODEL_H_

// Link fits and the cost model. Pure: no I/O, threads or transport; deterministic.
//
// A fit is `seconds = alpha + bytes / bandwidth`, least squares over the per-size medians of the
// raw samples weighted to minimise relative error, with the largest relative error of the fit at
// those sizes. The cost model prices a
// traffic matrix as its busiest resource (a sender's egress, a receiver's ingress, a pair's link,
// everything one node sends another) over that resource's calibrated capacity, plus the per-round
// cost of the slowest path used: rounds x alpha over the rounds the executor keeps in flight (at
// least one alpha), not hidden behind the transfer.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cost/calibration.pb.h"

namespace wsync {

// The version this build writes. It reads every version from kOldestCalibrationSchemaVersion on:
// version 1 (no node ids, no node_link samples) fits as before, without node-link capacities;
// versions 1 and 2 (no quantize samples) fit without a quantize rate.
inline constexpr uint32_t kCalibrationSchemaVersion = 3;
inline constexpr uint32_t kOldestCalibrationSchemaVersion = 1;

struct LinkFit {
  double alpha_seconds = 0;
  double bytes_per_second = 0;
  double max_relative_error = 0;  // Over the sizes fitted.
  int32_t sizes = 0;              // Distinct sizes fitted.

  double Seconds(double bytes) const { return alpha_seconds + bytes / bytes_per_second; }
};

// A fan: pattern ("fan_out" or "fan_in"), root, and its peers in ascending order.
using FanKey = std::tuple<std::string, int32_t, std::vector<int32_t>>;

struct LinkFits {
  std::map<std::string, LinkFit> by_path;  // "peer" and "local" samples by path class.
  std::map<std::pair<int32_t, int32_t>, LinkFit> by_pair;  // "peer", per ordered pair.
  // The path class each by_pair fit was measured on. A traffic pair takes its pair fit only on
  // that path (a calibration's processes need not sit where a job's do); a pair fit without an
  // entry here applies on any path.
  std::map<std::pair<int32_t, int32_t>, std::string> pair_path;
  std::map<std::pair<int32_t, int32_t>, LinkFit> both_ways;  // Per pair, from < to.
  std::map<FanKey, LinkFit> fans;           // Per message: the fan's time against message bytes.
  std::map<FanKey, LinkFit> fan_aggregate;  // The root's rate: time against all the fan's bytes.
  std::map<std::pair<std::string, std::string>, LinkFit> relay;  // (receive path, send path).
  // Per path, from the relays that receive and send on it: what the path carries with all those
  // processes moving bytes at once (time against processes x bytes): a shared capacity (a node's
  // memory bandwidth and cores, a switch) that one pair alone does not show.
  std::map<std::string, LinkFit> path_aggregate;
  // Node of every process (the calibration's, empty for schema 1), and per ordered pair of nodes
  // (from node, to node) what its node_link samples carried with every sender on one node
  // sending to its own receiver on the other at once (time against senders x bytes): the
  // capacity all pairs crossing that node boundary share (one NIC or link per node), which
  // each pair alone does not show. (A, A): what node A carried with its first half of processes
  // sending to its second half at once: the cores and memory concurrent pairs inside a node
  // share (a receiver copying while other processes copy or poll), which a pair alone does not
  // show and the relay aggregate (every process both copying and sending) overstates.
  std::vector<std::string> nodes;
  std::map<std::pair<std::string, std::string>, LinkFit> node_link;
  // Path classes priced with another class's fit, and whose: "same_device" -> "intra_node" when
  // the calibration has no same_device fit of its own (host-memory probes cannot measure one
  // GPU's copy engine; a same-GPU copy is at least as fast as an intra-node one, so the stand-in
  // errs towards longer predictions). Reports that print a prediction state these.
  std::map<std::string, std::string> stand_ins;
  // Per process (schema 3 "quantize" samples): its time to quantize bf16 input to FP8 alone,
  // against input bytes.
  std::map<int32_t, LinkFit> quantize;
  // The rate the cost model prices quantizing at, in bytes of input per second: the slowest
  // process's (smallest bytes_per_second of `quantize`), since a job's busiest quantizing process
  // need not run where the calibration's fastest did. 0: the calibration measured none (files
  // before schema 3, synthetic ones); predictions then use a stand-in constant and say so.
  double quantize_bytes_per_second = 0;
  // Per process ("delta_encode" / "delta_apply" samples, schema 3 files that have them): its time
  // to encode a bf16 chunk against its base (executor/delta_codec.h, the base advanced in place)
  // and to patch one, against the chunk's dense bytes. The rates delta=auto and the prediction of
  // a delta sync price them at: the slowest process's, as quantize's; 0: none measured (delta=auto
  // then stays dense: it never turns on without a measured rate).
  std::map<int32_t, LinkFit> delta_encode;
  std::map<int32_t, LinkFit> delta_apply;
  double delta_encode_bytes_per_second = 0;
  double delta_apply_bytes_per_second = 0;
  // Pair, both-ways, fan and relay fits left out because their line does not fit (noise: time
  // not growing with size); Predict then uses the path fits for them.
  std::vector<std::string> skipped;
};

// Path classes FitLinks knows by name (planner/job.h defines the same strings).
inline constexpr char kIntraNodePath[] = "intra_node";
inline constexpr char kSameDevicePath[] = "same_device";

// Fits everything the calibration has samples for. A calibration with an intra_node fit and no
// same_device one gets intra_node's as same_device's, recorded in `stand_ins`. InvalidArgument for
// a calibration of a schema this build does not read, a sample without timings, a node_link sample
// in a schema-1 file or without both node ids, a quantize sample in a file before schema 3 or with
// from != to, or a path class whose line does not fit (bandwidth <= 0; a single size gives
// bandwidth from the origin and alpha 0); other keys whose line does not fit (a process's
// quantize fit included) are listed in `skipped`.
absl::StatusOr<LinkFits> FitLinks(const proto::Calibration& calibration);

// Least squares of seconds against bytes over the medians per size of (bytes, seconds) points.
absl::StatusOr<LinkFit> FitLine(const std::vector<std::pair<int64_t, double>>& points);

std::string SerializeCalibration(const proto::Calibration& calibration);
// Refuses bytes that do not parse and calibrations of a schema version outside
// [kOldestCalibrationSchemaVersion, kCalibrationSchemaVersion], naming both.
absl::StatusOr<proto::Calibration> ParseCalibration(absl::string_view bytes);

// A calibration made from stated link constants rather than measurement, for projections and
// tests: "intra_node=5us,200GB/s;inter_node=20us,25GB/s" (alpha in s, ms or us; bandwidth in
// GB/s or MB/s, 1e9 and 1e6 bytes). Each class gets peer samples at two sizes between a
// representative pair of processes ("local" between a process and itself); "quantize=0us,3GB/s"
// states a quantize rate (quantize samples of process -1, bytes of input), "delta_encode=0us,2GB/s"
// and "delta_apply=0us,4GB/s" delta sync's rates alike.
absl::StatusOr<proto::Calibration> SyntheticCalibration(absl::string_view spec);
// The stated quantities of SyntheticCalibration: "3us" -> 3e-6 seconds (s, ms or us);
// "450GB/s" -> 4.5e11 bytes per second (GB/s or MB/s). InvalidArgument for another unit, a
// negative or a non-finite number.
absl::StatusOr<double> ParseStatedSeconds(absl::string_view text);
absl::StatusOr<double> ParseStatedBandwidth(absl::string_view text);

// The bytes and messages one ordered pair moves in a sync.
struct PairTraffic {
  int32_t from = 0;
  int32_t to = 0;
  std::string path;
  int64_t bytes = 0;
  int64_t messages = 0;
};

struct Traffic {
  std::vector<PairTraffic> pairs;
  int64_t rounds = 0;  // Rounds of the busiest process.
};

// Messages the executor keeps posted per peer pair (over NCCL: rounds, round r+1 going out before
// round r is waited for), so per-round latencies overlap the transfer of neighbouring rounds.
inline constexpr int64_t kRoundsInFlight = 2;

struct Prediction {
  double seconds = 0;
  double transfer_seconds = 0;  // The busiest resource's bytes over its capacity.
  // max(alpha, rounds x alpha / kRoundsInFlight), alpha the largest of the paths that carry
  // bytes.
  double latency_seconds = 0;
  std::string binding;  // The busiest resource, e.g. "ingress of process 3".
  // Seconds of quantizing FP8 targets included in `seconds` (plugin/prediction.h QuantizeSeconds);
  // 0 when nothing is quantized.
  double quantize_seconds = 0;
  // PredictPriced only: bytes by path class of the pairs left out because neither the pair nor
  // its path class has a fit. Empty when every pair was priced; otherwise the seconds above
  // cover only the rest of the traffic (a lower bound of the whole).
  std::map<std::string, int64_t> unpriced_bytes;
  // PredictPriced only: bytes by path class of the priced pairs whose class's fit is a stand-in
  // (LinkFits::stand_ins); reports name them.
  std::map<std::string, int64_t> stand_in_bytes;
  // The rate quantize_seconds was priced at (bytes of input per second; 0 when nothing is
  // quantized), and whether it is a stand-in: a constant rather than a rate the calibration
  // measured or a cluster file states. Reports name a stand-in (StandInNote).
  double quantize_bytes_per_second = 0;
  bool quantize_stand_in = false;
};

// One resource of the cost model and the seconds the traffic's bytes take at its capacity.
struct ResourceLoad {
  enum Kind { kLink, kEgress, kIngress, kPath, kNodeLink, kNodeInside };
  Kind kind = kLink;
  int32_t from = -1;  // kLink, kEgress: the sender.
  int32_t to = -1;    // kLink, kIngress: the receiver.
  std::string label;  // kLink, kPath: the path class; kNodeLink: "A->B"; kNodeInside: "A".
  double seconds = 0;

  // "link 0->2 (intra_node)", "egress of process 1", "node link a->b (all its pairs at once)",
  // "all pairs inside node a at once".
  std::string Name() const;
  // Identifies the resource (kind, processes, label) whatever its load.
  using Key = std::tuple<int, int32_t, int32_t, std::string>;
  Key key() const { return {static_cast<int>(kind), from, to, label}; }
};

// The traffic of a sync, added (and taken back) pair by pair, priced per resource under the
// capacities Predict describes. Holds only integer sums, so adding and taking back the same
// bytes restores the state exactly and loads are a pure function of the sums. Keeps a pointer
// to `fits`, which must outlive it. Thread-compatible.
class TrafficLoads {
 public:
  explicit TrafficLoads(const LinkFits* fits);

  // Adds `bytes` (negative: takes back what was added) to the pair's. A pair whose bytes are zero
  // loads nothing. FailedPrecondition naming the path when the pair has no fit (nothing changes).
  absl::Status Add(int32_t from, int32_t to, absl::string_view path, int64_t bytes);

  // Every resource with traffic, in a fixed order: pair links (by pair), egresses, ingresses
  // (by process), path aggregates (by path), node links (by node pair).
  std::vector<ResourceLoad> All() const;
  // The resources whose load the pair's bytes change (its link, the sender's egress, the
  // receiver's ingress, its path aggregate and node link or node inside where fitted), with
  // their loads now.
  std::vector<ResourceLoad> Touched(int32_t from, int32_t to) const;
  // The largest alpha of the links with traffic.
  double MaxAlpha() const;

 private:
  struct Pair {
    std::string path;
    const LinkFit* fit = nullptr;
    int64_t bytes = 0;
  };
  ResourceLoad Link(const std::pair<int32_t, int32_t>& key, const Pair& pair) const;
  ResourceLoad Root(int32_t process, bool sent) const;  // Its egress (sent) or ingress.
  double FanRate(absl::string_view pattern, int32_t root, size_t peers) const;
  std::optional<ResourceLoad> NodeLoad(const std::pair<std::string, std::string>& nodes,
                                       int64_t bytes) const;
  const std::string* NodeOf(int32_t process) const;

  const LinkFits* fits_;
  std::map<std::pair<int32_t, int32_t>, Pair> pairs_;
  std::map<int32_t, std::map<int32_t, int64_t>> sent_;      // Sender -> receiver -> bytes.
  std::map<int32_t, std::map<int32_t, int64_t>> received_;  // Receiver -> sender -> bytes.
  std::map<std::string, int64_t> path_bytes_;               // Between distinct processes.
  std::map<std::pair<std::string, std::string>, int64_t> node_bytes_;
};

// Every resource the traffic uses with its load (TrafficLoads::All of its pairs); `max_alpha`
// (when given) is set to the largest alpha of the links used. FailedPrecondition as Predict's.
absl::StatusOr<std::vector<ResourceLoad>> PriceResources(const LinkFits& fits,
                                                         const Traffic& traffic,
                                                         double* max_alpha = nullptr);

// Capacities: a pair's link from its pair fit, else its path's; a process's egress (ingress) from
// its fan_out (fan_in) aggregate fit of the width nearest its number of receivers (senders) when
// it has any, else the best link it uses; all bytes between distinct processes on one path from its
// path_aggregate fit, when it has one; all bytes from processes of node A to processes of node B
// (nodes from fits.nodes) from the node_link fit of (A, B), when it has one, and all bytes
// between distinct processes of node A from the node_link fit of (A, A). FailedPrecondition
// naming the path when a pair's path has no fit.
absl::StatusOr<Prediction> Predict(const LinkFits& fits, const Traffic& traffic);

// Whether Predict can price the pair: it has a pair fit measured on `path`, or `path` has a fit.
bool CanPrice(const LinkFits& fits, int32_t from, int32_t to, absl::string_view path);

// Predict over the pairs CanPrice accepts; the others' bytes go to unpriced_bytes by path class.
// Traffic of no priceable pair predicts 0 s.
absl::StatusOr<Prediction> PredictPriced(const LinkFits& fits, const Traffic& traffic);

// "same_device 12 B priced with intra_node's fit (the calibration has none of its own)", one
// clause per class of prediction.stand_in_bytes, and, when quantize_stand_in and quantize_seconds
// > 0, "quantize priced at the stand-in 5.50 GB/s of input (the calibration measured no quantize
// rate)", joined by "; "; empty when it has none.
std::string StandInNote(const LinkFits& fits, const Prediction& prediction);

}  // namespace wsync

#endif  // WSYNC_CALIBRATION_LINK_MODEL_LINK_MODEL_H_
