#ifndef WSYNC_PLUGIN_PREDICTION_H_
#define WSYNC_PLUGIN_PREDICTION_H_

// The session's calibration and its prediction of every sync.
//
// Distribution: global process 0 (trainer rank 0, the process that hosts the coordinator when
// one is hosted) reads SessionConfig::calibration_file and sends its bytes as the metadata of its
// Join at connect; the roster carries them to every process (a replacement admitted later gets
// the same roster), which parses and fits the same bytes, so the cost_aware policy gives the same
// answers everywhere. The other processes' calibration_file is not read.
//
// Prediction: the traffic of the whole sync (every process's segments, whatever this process
// plans) priced by the link model (cost/ Predict): seconds and binding resource.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "cost/link_model.h"
#include "executor/schedule.h"
#include "planner/job.h"
#include "planner/plan.h"
#include "planner/relay.h"

namespace wsync {

struct Roster;

struct SharedCalibration {
  std::optional<LinkFits> fits;                // nullopt: no calibration configured on process 0.
  std::string transport;                       // What it measured, for reports.
  absl::Time measured = absl::InfinitePast();  // The file's modification time on process 0.
};

// What `process` puts in its Join metadata: on process 0 the payload of `file` (empty: none), or,
// when it cannot read the file, a marker that makes every process's CalibrationFromRoster fail
// (so that the others fail with it at once); on other processes nothing. `read_error` is set to
// process 0's NotFound then (process 0 still joins, and reports it).
std::string CalibrationMetadata(int32_t process, const std::string& file, absl::Status* read_error);

// The calibration process 0 sent with its Join. Unavailable when process 0 could not read its
// file; InvalidArgument when the payload does not parse or fit.
absl::StatusOr<SharedCalibration> CalibrationFromRoster(const Roster& roster);

// The replica policies a session can run: planner/policy.h's by name, and "cost_aware", which
// needs fits (FailedPrecondition without them). NotFound for an unknown name.
absl::StatusOr<std::unique_ptr<ReplicaPolicy>> MakeSessionPolicy(absl::string_view name,
                                                                 const LinkFits* fits);
// The names MakeSessionPolicy knows; NotFound for others (checked before connecting).
absl::Status CheckSessionPolicyName(absl::string_view name);

// The link-model traffic of `plan`'s segments: bytes and segment count per ordered pair with its
// path class; rounds = the largest segment count of a pair.
Traffic PlanTraffic(const Job& job, const Plan& plan);

// The stand-in throughput at which a process quantizes host memory (bytes of bf16 or fp32 input
// per second) in predictions whose calibration measured none (LinkFits::quantize_bytes_per_second
// is 0: files before schema 3, synthetic calibrations). The host kernels (quant/fp8.h) run one
// thread: `quant_bench` and `quant_sync_bench` measured 5.5 GB/s of bf16 input on this project's
// 2-core AVX-512 VM (2026-12-02, under load; memcpy 11 GB/s). The rate depends on the CPU's
// kernel (quant/fp8.h: avx512, avx2 or portable) and on the values, which is why `wsync calibrate`
// measures the machine's own rate.
inline constexpr double kQuantizeInputBytesPerSecond = 5.5e9;

// The rate a prediction prices quantizing at, and whether it is the stand-in constant.
struct QuantizeRate {
  double bytes_per_second = kQuantizeInputBytesPerSecond;
  bool stand_in = true;
};
// `stated` when > 0 (a cluster file's `quantize:`, its GPUs' own rate), else the calibration's
// measured rate (LinkFits::quantize_bytes_per_second) when it has one, else the stand-in
// kQuantizeInputBytesPerSecond.
QuantizeRate QuantizeRateOf(const LinkFits& fits, double stated = 0);

// The seconds of the plan's quantization: the busiest quantizing process's input bytes (its
// sender-side blocks, once per receiving piece as the executor quantizes them, and its
// receiver-side blocks) at `input_bytes_per_second` (> 0), as if quantizing did not overlap the
// transfer.
double QuantizeSeconds(const Job& job, const QuantPlan& plan,
                       double input_bytes_per_second = kQuantizeInputBytesPerSecond);

// The prediction of the whole sync: plans every process's segments with `policy` and `relay` (as
// the session plans them) and prices them (quantization steps' bytes included, and
// QuantizeSeconds at QuantizeRateOf(fits) added to seconds and kept in quantize_seconds, the rate
// and whether it is the stand-in in quantize_bytes_per_second and quantize_stand_in when anything
// is quantized), with the rounds of the busiest
// process's schedule under `budget` (the quantization steps' segments included, as they run) for
// the latency term. Pairs on a path class the calibration has no fit for are
// left out and named (PredictPriced, Prediction::unpriced_bytes).
absl::StatusOr<Prediction> PredictSync(const Job& job, const ReplicaPolicy& policy,
                                       const LinkFits& fits, StagingBudget budget,
                                       const RelayOptions& relay = RelayOptions{});

// Delta sync (issue 44) in the cost model. Bytes an encoding takes per dense byte per changed
// fraction, before any sync measured it: a bf16 element moved by an ulp or two costs at most a gap
// byte and a difference byte (kDiffs), two bytes where dense takes two (delta_codec.h); other
// updates take up to 1.5 (kIndices). Runs of changed elements cost less (ConnectedJob::
// delta_encoded_per_changed measures it).
inline constexpr double kDeltaEncodedPerChanged = 1.0;
// The changed fraction a prediction assumes before any sync measured one: issue 44's bf16 cast
// of fp32 masters after an AdamW step at lr 1e-6 (about 4 % of the elements).
inline constexpr double kAssumedDeltaFraction = 0.04;

// delta=auto's rule (executor/execute.h DeltaOptions::pays_below), from the calibration alone (the
// same bytes on every process: every process decides alike): per path class with a fit other
// than "local", the changed fraction below which a delta sync is predicted faster than dense. With
// B the class's bandwidth and E, A the calibrated encode and apply rates (bytes of the dense
// chunk per second, LinkFits::delta_encode/apply_bytes_per_second), delta costs 1/E + 1/A +
// kDeltaEncodedPerChanged x f / B seconds per dense byte where dense costs 1/B: it pays below
// f = (1 - B/E - B/A) / kDeltaEncodedPerChanged. A class where that is not above 0 (a link at
// least as fast as encoding and patching together: shared memory) is left out, so it stays
// dense and records no bases. Empty without measured rates: auto then stays dense everywhere.
std::map<std::string, double> DeltaPaysBelow(const LinkFits& fits);

// The prediction of a delta sync (PredictDeltaSync).
struct DeltaPrediction {
  double seconds = 0;              // The whole sync with delta.
  double dense_seconds = 0;        // The same sync dense (the dense prediction's seconds).
  double changed_fraction = 0;     // The input.
  double encoded_per_changed = 0;  // The input.
  int64_t dense_bytes = 0;         // What the pairs that run delta carry dense.
  int64_t saved_bytes = 0;         // Of dense_bytes, not on the wire.
  double encode_seconds = 0;       // The busiest sender's encoding, before its rounds.
  double apply_seconds = 0;        // The busiest receiver's patching, after them.
};

// The prediction of a sync of `plan` with delta at `changed_fraction` (in [0, 1]): the pairs
// between two processes that run delta (with `pays_below`, delta=auto: those of a class that pays
// at that fraction; null: all, delta=on) carry `encoded_per_changed` (> 0; the last sync's
// measure, or kDeltaEncodedPerChanged) x the fraction of their dense bytes (at most all of them);
// `dense`'s transfer term shrinks by the bytes saved (its busiest resource assumed to carry them in
// proportion), and the busiest sender's encoding and the busiest receiver's patching at the
// calibrated rates are added (not overlapped: the executor encodes before its rounds and patches
// after them). FailedPrecondition without measured rates.
absl::StatusOr<DeltaPrediction> PredictDeltaSync(const Job& job, const Plan& plan,
                                                 const Prediction& dense, const LinkFits& fits,
                                                 double changed_fraction,
                                                 double encoded_per_changed,
                                                 const std::map<std::string, double>* pays_below);

// "delta: predicted 0.0123 s (dense 0.25 s) at 4.20 % changed and 0.56 encoded bytes per changed
// byte (the last sync's), 473.0 MB of 494.0 MB saved, encode 0.05 s, apply 0.04 s" or why not.
std::string DeltaPredictionLine(const absl::StatusOr<DeltaPrediction>& prediction,
                                absl::string_view fraction_source);

// The `wsync calibrate` command, writing `out`, that measures every path class in `unpriced` on
// one machine ("local", "intra_node", "inter_node"; "same_device" through intra_node's fit, its
// stand-in, LinkFits::stand_ins); empty when some class is none of these (no command measures
// it; `wsync calibrate --synthetic` can state it).
std::string CalibrateCommandFor(const std::map<std::string, int64_t>& unpriced,
                                absl::string_view out = "FILE");

// "" when the prediction priced everything, else "not priced: inter_node 942.38 MiB (no fit in
// the calibration); measure it with: wsync calibrate ...".
std::string UnpricedNote(const Prediction& prediction);

// "predicted 0.0123 s (transfer ..., latency ...[, quantize ... at its rate]), binding: ..." or,
// without one, why not; a prediction that used a stand-in fit or quantize rate says so
// (StandInNote); a partial prediction says so and ends with UnpricedNote.
std::string PredictionLine(const std::optional<Prediction>& prediction,
                           const SharedCalibration& calibration);

}  // namespace wsync

#endif  // WSYNC_PLUGIN_PREDICTION_H_
