#ifndef WSYNC_CALIBRATION_PROBE_PROBE_H_
#define WSYNC_CALIBRATION_PROBE_PROBE_H_

// Link probing: CalibrateLinks times the links of a job's processes over a real Transport and
// returns the raw samples (calibration.proto) that cost/ fits. It is a
// collective: every process of the Group calls it with equal options, and every process returns
// the same Calibration.
//
// Patterns, each at every size (see calibration.proto for the sample fields):
//   local      each process alone copies a buffer (memcpy), labelled path_of(p, p)
//   peer       each ordered pair (a, b) alone: a sends one message to b, all others idle
//   both_ways  each pair a < b alone: a and b send one message to each other at once
//   fan_out    each root and width w: the root sends one message to each of fan_peers(root, w)
//   fan_in     each root and width w: each of fan_peers(root, w) sends one message to the root
//   relay      every process at once receives from p - shift while sending to p + shift; one
//              sample per process, path = path_of(p - shift, p), send_path = path_of(p, p + shift)
//   node_link  each ordered pair of distinct nodes (A, B): the i-th process of A sends one message
//              to the i-th process of B, for i below the smaller node's process count, all at
//              once (the capacity every pair crossing from A to B shares); peers = the senders
//              (the calibration records every process's node); and inside each node of at
//              least two processes (A, A): the i-th of its first half sends to the i-th of its
//              second half, all at once (what concurrent pairs inside a node share: its cores
//              and memory, which a pair alone does not show). Inside a node each sender sends
//              options.node_link_messages messages of the size back to back (all posted at
//              once; the sample records the count as `messages`): concurrent pairs sharing cores
//              reach their steady rate only over volumes like a sync's (hundreds of MiB per
//              pair), which one message of the largest size does not move (TCP over loopback, 2
//              pairs on 2 cores: 1.9-2.0 GB/s in all at 64 MiB, 2.3 GB/s at 4 x 64 MiB or one
//              256 MiB message)
//   quantize   (with options.quantize) each process alone runs options.quantize once, from == to
//              == that process, path "local", from_node its node, bytes its input bytes, at that
//              one size rather than at every size above: the host's FP8 quantize rate
// A fan's path is path_of(root, peer) (fan_out) or path_of(peer, root) (fan_in) when all its
// peers share one, else the distinct ones in alphabetical order joined by '+'.
//
// Timing: the repeats run in passes: each pass runs every pattern at every size once, in the order
// above, and the first `warmup` passes are dropped; so a burst of foreign load lands on one repeat
// of many patterns, which the fits' per-size medians discard, instead of on every repeat of one.
// Every repeat is preceded by a Group barrier, and the timings are gathered once after the last
// pass; the timed spans exclude both. After the
// barrier each receiver posts its receives and sends an empty token to each of its senders; a
// sender posts its sends once its receivers' tokens arrived. A receiver's span runs from its
// tokens to its last completion, a sender's (or a process that is both, once its tokens arrived)
// from then to its last completion; a repeat's time is the largest span of its participants (the
// pattern's completion time).
//
// Memory: each process allocates (1 + max(1, widest fan)) x the largest size (send buffer, one
// receive buffer per fan-in peer); ProbeMemoryNeed states it and CalibrateLinks refuses
// (ResourceExhausted) a plan above options.memory_budget_bytes. A quantize probe's input and
// output are the caller's, outside that need.
//
// Errors: InvalidArgument for bad options (no sizes, no path_of, a width or peer out of range,
// processes of the Group and transport that disagree, a quantize probe of no bytes); the
// Transport's or Group's error (DeadlineExceeded, Unavailable, Aborted) when a step fails, or the
// quantize probe's; a failed step ends the probe on
// that process and its peers then fail at their deadline. Not thread-safe: one call at a time,
// and the caller must not use the transport meanwhile.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cost/calibration.pb.h"
#include "transport/transport.h"

namespace wsync {

// The path class of messages from `from` to `to` (may differ by direction).
using PathOf = std::function<std::string(int32_t from, int32_t to)>;
// The `width` peers of a fan rooted at `root`: distinct, none equal to root, in [0, processes).
using FanPeers = std::function<std::vector<int32_t>(int32_t root, int32_t width)>;

inline constexpr int64_t kDefaultProbeMemoryBudgetBytes = int64_t{1} << 30;

// One quantize of input this process prepared, which the probe times as the "quantize" pattern.
// This folder may not include quant/ (calibration sits beside the transport, below the executor),
// so the caller brings the kernel with its input: `wsync calibrate` passes quant::QuantizeFp8 of a
// bf16 matrix (integration/cli/calibrate_job.h HostQuantizeProbe).
struct QuantizeProbe {
  int64_t input_bytes = 0;            // What one call of `run` quantizes: > 0, equal everywhere.
  std::function<absl::Status()> run;  // Quantizes the input once; its error ends the probe.
  std::string description;            // What `run` does: the setting "probe.quantize".
};

struct ProbeOptions {
  // Message sizes in bytes, each > 0. Empty: DefaultProbeSizes(widest fan, memory budget).
  std::vector<int64_t> sizes;
  int32_t repeats = 5;  // Timed repeats per pattern and size, >= 1.
  int32_t warmup = 1;   // Untimed repeats before them, >= 0.
  PathOf path_of;       // Required.
  // Fan widths, each in [1, processes - 1]. Empty: DefaultFanWidths(nodes).
  std::vector<int32_t> fan_widths;
  // Empty: DefaultFanPeers(nodes).
  FanPeers fan_peers;
  // Node id of every process, for the defaults above; empty: every process on one node.
  std::vector<std::string> nodes;
  int32_t relay_shift = 1;  // Relay is skipped when shift % processes == 0.
  // Messages of each size every sender of a node_link inside a node sends back to back, >= 1
  // (see node_link above).
  int32_t node_link_messages = 4;
  int64_t memory_budget_bytes = kDefaultProbeMemoryBudgetBytes;
  // The quantize pattern, on every process or on none; no `run`: no quantize samples.
  QuantizeProbe quantize;
  // Delta sync's encode and apply (executor/delta_codec.h; patterns "delta_encode" and
  // "delta_apply", bytes: the chunk's dense bytes), timed as quantize is: the rates delta=auto
  // weighs against each path class's bandwidth. No `run`: no samples.
  QuantizeProbe delta_encode;
  QuantizeProbe delta_apply;
  absl::Duration step_timeout = absl::Seconds(60);  // Deadline of every collective and repeat.
  // Recorded in the calibration (e.g. UCX_TLS); the transport's name is recorded as well.
  std::map<std::string, std::string> settings;
};

// Sizes 4 KiB, 16 KiB, ... 256 MiB (factors of 4) whose memory need at `widest_fan` fits
// `memory_budget_bytes`.
std::vector<int64_t> DefaultProbeSizes(int32_t widest_fan, int64_t memory_budget_bytes);
// Bytes one process allocates to probe `sizes` with fans up to `widest_fan`.
int64_t ProbeMemoryNeed(const std::vector<int64_t>& sizes, int32_t widest_fan);

// Same node first (nearest following process ids), then the other nodes' processes.
FanPeers DefaultFanPeers(std::vector<std::string> nodes);
// Powers of two up to the cap, and the cap, where cap = (processes on the fullest node) - 1, at
// least 1 and at most processes - 1. Empty for a single process.
std::vector<int32_t> DefaultFanWidths(const std::vector<std::string>& nodes);
// "local" to itself, "intra_node" within a node, "inter_node" between nodes (planner/job.h).
PathOf PathOfNodes(std::vector<std::string> nodes);

// The collective probe (see above). `transport` and `group` belong to the same process.
absl::StatusOr<proto::Calibration> CalibrateLinks(const ProbeOptions& options, Transport& transport,
                                                  Group& group);

}  // namespace wsync

#endif  // WSYNC_CALIBRATION_PROBE_PROBE_H_
