#include "calibration/probe.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "cost/link_model.h"

namespace wsync {
namespace {

// The kernels a probe times alone on each process, as patterns.
constexpr const char* kKernelPatterns[] = {"quantize", "delta_encode", "delta_apply"};

// The probe of a kernel pattern; nullptr for a link pattern.
const QuantizeProbe* KernelOf(const ProbeOptions& options, absl::string_view pattern) {
  if (pattern == "quantize") return &options.quantize;
  if (pattern == "delta_encode") return &options.delta_encode;
  if (pattern == "delta_apply") return &options.delta_apply;
  return nullptr;
}

// Tags of probe messages: their own sync id, so that they never match a sync's messages.
constexpr uint64_t kProbeSyncId = 0xCA11B;
constexpr uint64_t kProbeTokenSyncId = 0xCA11C;

// One pattern instance: who sends to whom, and how its samples are labelled.
struct Step {
  std::string pattern;
  int32_t from = 0;
  int32_t to = 0;
  std::vector<int32_t> peers;  // Fans, ascending.
  std::string path;
  std::string send_path;
  std::vector<std::pair<int32_t, int32_t>> messages;  // (sender, receiver); empty for local.
  std::string from_node;                              // node_link only.
  std::string to_node;
  // Messages of `bytes` each sender sends to its receiver back to back, with one tag (they match
  // in order).
  int32_t stream = 1;
};

// One step at one size: what a pass runs in turn.
struct Cell {
  const Step* step = nullptr;
  int64_t bytes = 0;
};

// The distinct paths in alphabetical order, joined by '+'.
std::string JoinedPaths(const std::vector<std::string>& paths) {
  return absl::StrJoin(std::set<std::string>(paths.begin(), paths.end()), "+");
}

absl::StatusOr<std::vector<Step>> BuildSteps(const ProbeOptions& options,
                                             const std::vector<std::string>& nodes,
                                             const std::vector<int32_t>& widths,
                                             const FanPeers& fan_peers) {
  const int32_t n = static_cast<int32_t>(nodes.size());
  std::vector<Step> steps;
  for (int32_t p = 0; p < n; ++p) {
    steps.push_back(Step{"local", p, p, {}, options.path_of(p, p), "", {}, "", ""});
  }
  for (int32_t a = 0; a < n; ++a) {
    for (int32_t b = 0; b < n; ++b) {
      if (a != b)
        steps.push_back(Step{"peer", a, b, {}, options.path_of(a, b), "", {{a, b}}, "", ""});
    }
  }
  for (int32_t a = 0; a < n; ++a) {
    for (int32_t b = a + 1; b < n; ++b) {
      steps.push_back(
          Step{"both_ways", a, b, {}, options.path_of(a, b), "", {{a, b}, {b, a}}, "", ""});
    }
  }
  for (const bool out : {true, false}) {
    for (int32_t root = 0; root < n; ++root) {
      for (const int32_t width : widths) {
        std::vector<int32_t> peers = fan_peers(root, width);
        std::sort(peers.begin(), peers.end());
        const bool distinct = std::adjacent_find(peers.begin(), peers.end()) == peers.end();
        if (static_cast<int32_t>(peers.size()) != width || !distinct || peers.front() < 0 ||
            peers.back() >= n || std::binary_search(peers.begin(), peers.end(), root)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "fan_peers(", root, ", ", width, ") returned [", absl::StrJoin(peers, ","),
              "]: want ", width, " distinct processes other than the root"));
        }
        Step step{out ? "fan_out" : "fan_in", root, -1, peers, "", "", {}, "", ""};
        std::vector<std::string> paths;
        for (const int32_t peer : peers) {
          paths.push_back(out ? options.path_of(root, peer) : options.path_of(peer, root));
          step.messages.push_back(out ? std::pair{root, peer} : std::pair{peer, root});
        }
        step.path = JoinedPaths(paths);
        steps.push_back(std::move(step));
      }
    }
  }
  if (n >= 2 && options.relay_shift % n != 0) {
    Step relay{"relay", -1, -1, {}, "", "", {}, "", ""};
    const int32_t shift = ((options.relay_shift % n) + n) % n;
    for (int32_t p = 0; p < n; ++p) relay.messages.push_back({p, (p + shift) % n});
    steps.push_back(std::move(relay));
  }
  std::map<std::string, std::vector<int32_t>> members;  // Ascending processes of each node.
  for (int32_t p = 0; p < n; ++p) members[nodes[p]].push_back(p);
  for (const auto& [from_node, node_members] : members) {
    for (const auto& [to_node, other_members] : members) {
      // Inside one node: its first half sends to its second half.
      const bool inside = from_node == to_node;
      const size_t half = node_members.size() / 2;
      if (inside && half == 0) continue;
      const std::vector<int32_t> senders =
          inside ? std::vector<int32_t>(node_members.begin(), node_members.begin() + half)
                 : node_members;
      const std::vector<int32_t> receivers =
          inside ? std::vector<int32_t>(node_members.begin() + half, node_members.end())
                 : other_members;
      Step step{"node_link", -1, -1, {}, "", "", {}, from_node, to_node};
      if (inside) step.stream = options.node_link_messages;
      std::vector<std::string> paths;
      for (size_t i = 0; i < senders.size() && i < receivers.size(); ++i) {
        step.peers.push_back(senders[i]);
        step.messages.push_back({senders[i], receivers[i]});
        paths.push_back(options.path_of(senders[i], receivers[i]));
      }
      step.path = JoinedPaths(paths);
      steps.push_back(std::move(step));
    }
  }
  return steps;
}

absl::Status CheckOptions(const ProbeOptions& options, int32_t n,
                          const std::vector<int32_t>& widths) {
  if (!options.path_of) return absl::InvalidArgumentError("ProbeOptions.path_of is required");
  if (options.repeats < 1 || options.warmup < 0 || options.node_link_messages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("repeats and node_link_messages must be >= 1 and warmup >= 0, not ",
                     options.repeats, ", ", options.node_link_messages, " and ", options.warmup));
  }
  for (const int32_t width : widths) {
    if (width < 1 || width > n - 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("fan width ", width, " is outside [1, ", n - 1, "] for ", n, " processes"));
    }
  }
  for (const char* pattern : kKernelPatterns) {
    const QuantizeProbe* kernel = KernelOf(options, pattern);
    if (kernel->run && kernel->input_bytes <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("a ", pattern, " probe of ", kernel->input_bytes, " input bytes"));
    }
  }
  if (!options.nodes.empty() && static_cast<int32_t>(options.nodes.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.nodes.size(), " node ids for ", n, " processes"));
  }
  return absl::OkStatus();
}

// Per-process probe state: the buffers and the numbered repeats.
class Prober {
 public:
  Prober(const ProbeOptions& options, Transport& transport, Group& group, int64_t largest,
         int32_t receive_buffers)
      : options_(options), transport_(transport), group_(group), me_(group.process()) {
    send_.assign(largest, 0x5a);
    receive_.resize(receive_buffers);
    for (std::vector<unsigned char>& buffer : receive_) buffer.assign(largest, 0);
  }

  absl::Status Register() {
    WSYNC_ASSIGN_OR_RETURN(RegistrationId id, transport_.RegisterMemory(send_.data(), send_.size(),
                                                                        MemoryKind::kHost));
    registrations_.push_back(id);
    for (std::vector<unsigned char>& buffer : receive_) {
      WSYNC_ASSIGN_OR_RETURN(
          id, transport_.RegisterMemory(buffer.data(), buffer.size(), MemoryKind::kHost));
      registrations_.push_back(id);
    }
    return absl::OkStatus();
  }

  ~Prober() {
    for (const RegistrationId id : registrations_) transport_.DeregisterMemory(id).IgnoreError();
  }

  // Runs every cell once per pass, warmup + repeats passes, and returns every process's timed
  // spans indexed [cell][process][repeat]; negative for processes that took no part. Passes
  // interleave the patterns (see probe.h).
  absl::StatusOr<std::vector<std::vector<std::vector<double>>>> RunPasses(
      const std::vector<Cell>& plan) {
    const size_t cells = plan.size();
    const size_t repeats = static_cast<size_t>(options_.repeats);
    std::vector<double> spans(cells * repeats);  // [cell][repeat]
    for (int32_t pass = 0; pass < options_.warmup + options_.repeats; ++pass) {
      for (size_t cell = 0; cell < cells; ++cell) {
        WSYNC_RETURN_IF_ERROR(group_.AllGather("", absl::Now() + options_.step_timeout).status());
        const int64_t round = next_round_++ % kMaxRounds;
        WSYNC_ASSIGN_OR_RETURN(const double span,
                               RunOnce(*plan[cell].step, plan[cell].bytes, round));
        if (pass >= options_.warmup) spans[cell * repeats + (pass - options_.warmup)] = span;
      }
    }
    const std::string mine(reinterpret_cast<const char*>(spans.data()),
                           spans.size() * sizeof(double));
    WSYNC_ASSIGN_OR_RETURN(const std::vector<std::string> all,
                           group_.AllGather(mine, absl::Now() + options_.step_timeout));
    std::vector<std::vector<std::vector<double>>> result(
        cells, std::vector<std::vector<double>>(all.size(), std::vector<double>(repeats)));
    for (size_t p = 0; p < all.size(); ++p) {
      if (all[p].size() != mine.size()) {
        return absl::InternalError(absl::StrCat("process ", p, " sent ", all[p].size(),
                                                " bytes of timings; probe options differ?"));
      }
      std::vector<double> theirs(spans.size());
      std::memcpy(theirs.data(), all[p].data(), all[p].size());
      for (size_t cell = 0; cell < cells; ++cell) {
        std::copy(theirs.begin() + cell * repeats, theirs.begin() + (cell + 1) * repeats,
                  result[cell][p].begin());
      }
    }
    return result;
  }

 private:
  // The span of this process's part in one repeat: -1 when it takes no part.
  absl::StatusOr<double> RunOnce(const Step& step, int64_t bytes, int64_t round) {
    if (step.pattern == "local") {
      if (step.from != me_) return -1.0;
      const absl::Time start = absl::Now();
      std::memcpy(receive_[0].data(), send_.data(), bytes);
      return absl::ToDoubleSeconds(absl::Now() - start);
    }
    if (const QuantizeProbe* kernel = KernelOf(options_, step.pattern)) {
      if (step.from != me_) return -1.0;
      const absl::Time start = absl::Now();
      WSYNC_RETURN_IF_ERROR(kernel->run());
      return absl::ToDoubleSeconds(absl::Now() - start);
    }
    bool takes_part = false;
    for (const auto& [sender, receiver] : step.messages) {
      takes_part = takes_part || sender == me_ || receiver == me_;
    }
    if (!takes_part) return -1.0;
    const absl::Time deadline = absl::Now() + options_.step_timeout;
    std::vector<RequestId> requests;
    size_t next_receive = 0;
    for (const auto& [sender, receiver] : step.messages) {
      if (receiver != me_) continue;
      for (int32_t m = 0; m < step.stream; ++m) {
        // A stream lands in the receive buffers in turn (a stream's receiver has no other sender).
        unsigned char* buffer = receive_[next_receive++ % receive_.size()].data();
        WSYNC_ASSIGN_OR_RETURN(
            RequestId id,
            transport_.PostReceive(sender, MakeTag(kProbeSyncId, round, sender), buffer, bytes));
        requests.push_back(id);
      }
    }
    // Readiness: every receiver, its receives posted, sends an empty token to each of its
    // senders, and a sender starts once its receivers' tokens arrived. The timed span so excludes
    // the skew with which the barrier released the processes.
    std::vector<RequestId> tokens_in;
    for (const auto& [sender, receiver] : step.messages) {
      if (sender != me_) continue;
      WSYNC_ASSIGN_OR_RETURN(
          RequestId id, transport_.PostReceive(
                            receiver, MakeTag(kProbeTokenSyncId, round, receiver), nullptr, 0));
      tokens_in.push_back(id);
    }
    const absl::Time receiver_start = absl::Now();
    for (const auto& [sender, receiver] : step.messages) {
      if (receiver != me_) continue;
      WSYNC_ASSIGN_OR_RETURN(
          RequestId id,
          transport_.PostSend(sender, MakeTag(kProbeTokenSyncId, round, me_), nullptr, 0));
      requests.push_back(id);
    }
    WSYNC_RETURN_IF_ERROR(transport_.WaitAll(tokens_in, deadline));
    const absl::Time start = tokens_in.empty() ? receiver_start : absl::Now();
    for (const auto& [sender, receiver] : step.messages) {
      if (sender != me_) continue;
      for (int32_t m = 0; m < step.stream; ++m) {
        WSYNC_ASSIGN_OR_RETURN(
            RequestId id,
            transport_.PostSend(receiver, MakeTag(kProbeSyncId, round, me_), send_.data(), bytes));
        requests.push_back(id);
      }
    }
    WSYNC_RETURN_IF_ERROR(transport_.WaitAll(requests, deadline));
    return absl::ToDoubleSeconds(absl::Now() - start);
  }

  const ProbeOptions& options_;
  Transport& transport_;
  Group& group_;
  const int32_t me_;
  std::vector<unsigned char> send_;
  std::vector<std::vector<unsigned char>> receive_;
  std::vector<RegistrationId> registrations_;
  int64_t next_round_ = 0;
};

proto::CalibrationSample* NewSample(proto::Calibration* calibration, const Step& step,
                                    int64_t bytes) {
  proto::CalibrationSample* sample = calibration->add_samples();
  sample->set_pattern(step.pattern);
  sample->set_from(step.from);
  sample->set_to(step.to);
  for (const int32_t peer : step.peers) sample->add_peers(peer);
  sample->set_path(step.path);
  sample->set_send_path(step.send_path);
  sample->set_bytes(bytes);
  sample->set_from_node(step.from_node);
  sample->set_to_node(step.to_node);
  if (step.pattern == "node_link") sample->set_messages(step.stream);
  return sample;
}

}  // namespace

int64_t ProbeMemoryNeed(const std::vector<int64_t>& sizes, int32_t widest_fan) {
  const int64_t largest = sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end());
  return largest * (1 + std::max(1, widest_fan));
}

std::vector<int64_t> DefaultProbeSizes(int32_t widest_fan, int64_t memory_budget_bytes) {
  std::vector<int64_t> sizes;
  for (int64_t size = int64_t{4} << 10; size <= int64_t{256} << 20; size *= 4) {
    if (ProbeMemoryNeed({size}, widest_fan) <= memory_budget_bytes) sizes.push_back(size);
  }
  return sizes;
}

FanPeers DefaultFanPeers(std::vector<std::string> nodes) {
  return [nodes = std::move(nodes)](int32_t root, int32_t width) {
    const int32_t n = static_cast<int32_t>(nodes.size());
    std::vector<std::pair<std::pair<bool, int32_t>, int32_t>> order;  // ((other node, distance), q)
    for (int32_t q = 0; q < n; ++q) {
      if (q != root) order.push_back({{nodes[q] != nodes[root], (q - root + n) % n}, q});
    }
    std::sort(order.begin(), order.end());
    std::vector<int32_t> peers;
    for (int32_t i = 0; i < width && i < static_cast<int32_t>(order.size()); ++i) {
      peers.push_back(order[i].second);
    }
    return peers;
  };
}

std::vector<int32_t> DefaultFanWidths(const std::vector<std::string>& nodes) {
  const int32_t n = static_cast<int32_t>(nodes.size());
  if (n < 2) return {};
  std::map<std::string, int32_t> per_node;
  for (const std::string& node : nodes) ++per_node[node];
  int32_t fullest = 0;
  for (const auto& [node, count] : per_node) fullest = std::max(fullest, count);
  const int32_t cap = std::clamp(fullest - 1, 1, n - 1);
  std::vector<int32_t> widths;
  for (int32_t width = 1; width < cap; width *= 2) widths.push_back(width);
  widths.push_back(cap);
  return widths;
}

PathOf PathOfNodes(std::vector<std::string> nodes) {
  return [nodes = std::move(nodes)](int32_t from, int32_t to) -> std::string {
    if (from == to) return "local";
    return nodes[from] == nodes[to] ? "intra_node" : "inter_node";
  };
}

absl::StatusOr<proto::Calibration> CalibrateLinks(const ProbeOptions& options, Transport& transport,
                                                  Group& group) {
  const int32_t n = group.size();
  if (transport.process() != group.process()) {
    return absl::InvalidArgumentError(absl::StrCat("the transport is process ", transport.process(),
                                                   ", the group process ", group.process()));
  }
  const std::vector<std::string> nodes =
      options.nodes.empty() ? std::vector<std::string>(n, "node") : options.nodes;
  const std::vector<int32_t> widths =
      options.fan_widths.empty() ? DefaultFanWidths(nodes) : options.fan_widths;
  WSYNC_RETURN_IF_ERROR(CheckOptions(options, n, widths));
  const int32_t widest = widths.empty() ? 0 : *std::max_element(widths.begin(), widths.end());
  const std::vector<int64_t> sizes = options.sizes.empty()
                                         ? DefaultProbeSizes(widest, options.memory_budget_bytes)
                                         : options.sizes;
  if (sizes.empty() || *std::min_element(sizes.begin(), sizes.end()) <= 0) {
    return absl::InvalidArgumentError(
        "no probe sizes (each must be > 0; the default sizes need 8 x 4 KiB at least)");
  }
  const int64_t need = ProbeMemoryNeed(sizes, widest);
  if (need > options.memory_budget_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("probing needs ", need, " bytes per process (largest size x (1 + widest fan ",
                     widest, ")), above the budget of ", options.memory_budget_bytes, " bytes"));
  }
  const FanPeers fan_peers = options.fan_peers ? options.fan_peers : DefaultFanPeers(nodes);
  WSYNC_ASSIGN_OR_RETURN(const std::vector<Step> steps,
                         BuildSteps(options, nodes, widths, fan_peers));

  Prober prober(options, transport, group, *std::max_element(sizes.begin(), sizes.end()),
                std::max(1, widest));
  WSYNC_RETURN_IF_ERROR(prober.Register());
  proto::Calibration calibration;
  calibration.set_schema_version(kCalibrationSchemaVersion);
  calibration.set_processes(n);
  calibration.set_transport(transport.name());
  for (const std::string& node : nodes) calibration.add_nodes(node);
  for (const auto& [key, value] : options.settings) (*calibration.mutable_settings())[key] = value;
  (*calibration.mutable_settings())["probe.repeats"] = absl::StrCat(options.repeats);
  (*calibration.mutable_settings())["probe.warmup"] = absl::StrCat(options.warmup);
  (*calibration.mutable_settings())["probe.node_link_messages"] =
      absl::StrCat(options.node_link_messages);
  for (const char* pattern : kKernelPatterns) {
    const QuantizeProbe* kernel = KernelOf(options, pattern);
    if (kernel->run) {
      (*calibration.mutable_settings())[absl::StrCat("probe.", pattern)] = kernel->description;
    }
  }

  // Every link step at every size, then (with kernel probes: quantize, delta encode and apply)
  // each process's kernel at its input size.
  std::vector<Cell> plan;
  for (const Step& step : steps) {
    for (const int64_t bytes : sizes) plan.push_back(Cell{&step, bytes});
  }
  std::vector<Step> kernel_steps;
  for (const char* pattern : kKernelPatterns) {
    for (int32_t p = 0; KernelOf(options, pattern)->run && p < n; ++p) {
      kernel_steps.push_back(Step{pattern, p, p, {}, options.path_of(p, p), "", {}, nodes[p], ""});
    }
  }
  for (const Step& step : kernel_steps) {
    plan.push_back(Cell{&step, KernelOf(options, step.pattern)->input_bytes});
  }
  WSYNC_ASSIGN_OR_RETURN(const std::vector<std::vector<std::vector<double>>> cells,
                         prober.RunPasses(plan));
  for (size_t i = 0; i < plan.size(); ++i) {
    const Step& step = *plan[i].step;
    const std::vector<std::vector<double>>& spans = cells[i];
    if (step.pattern == "relay") {
      for (int32_t p = 0; p < n; ++p) {
        Step labelled = step;
        labelled.from = p;
        for (const auto& [sender, receiver] : step.messages) {
          if (receiver == p) labelled.path = options.path_of(sender, p);
          if (sender == p) labelled.send_path = options.path_of(p, receiver);
        }
        proto::CalibrationSample* sample = NewSample(&calibration, labelled, plan[i].bytes);
        for (const double span : spans[p]) sample->add_seconds(span);
      }
      continue;
    }
    proto::CalibrationSample* sample = NewSample(&calibration, step, plan[i].bytes);
    for (int32_t r = 0; r < options.repeats; ++r) {
      double slowest = 0;
      for (int32_t p = 0; p < n; ++p) slowest = std::max(slowest, spans[p][r]);
      sample->add_seconds(slowest);
    }
  }
  return calibration;
}

}  // namespace wsync
