#include "integration/bench/bench_jobs.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/status.h"
#include "executor/schedule.h"
#include "integration/bench/bench_report.h"
#include "integration/bench/perftest.h"
#include "integration/harness/launcher.h"
#include "planner/job.h"
#include "planner/models.h"
#include "planner/named_layouts.h"
#include "planner/plan.h"
#include "planner/policy.h"
#include "planner/quant_plan.h"

namespace wsync::bench {
namespace {

bool Executable(const std::string& path) {
  return !path.empty() && access(path.c_str(), X_OK) == 0;
}

std::string Dirname(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

}  // namespace

absl::StatusOr<std::string> SelfPath() {
  char buffer[4096];
  const ssize_t n = readlink("/proc/self/exe", buffer, sizeof(buffer) - 1);
  if (n <= 0) return absl::InternalError("cannot read /proc/self/exe");
  return std::string(buffer, n);
}

absl::StatusOr<std::string> FindSibling(const std::string& self, const std::string& given,
                                        const std::vector<std::string>& relative_paths,
                                        const std::string& flag) {
  if (!given.empty()) {
    if (Executable(given)) return given;
    return absl::NotFoundError(absl::StrCat("--", flag, " ", given, " is not an executable file"));
  }
  const std::string dir = Dirname(self);
  std::vector<std::string> candidates;
  for (const std::string& relative : relative_paths) {
    candidates.push_back(
        std::filesystem::path(absl::StrCat(dir, "/", relative)).lexically_normal().string());
    if (Executable(candidates.back())) return candidates.back();
  }
  return absl::NotFoundError(absl::StrCat(
      relative_paths.front(), " not found (looked for ", absl::StrJoin(candidates, " and "),
      "); build the target ", relative_paths.front(), " or pass --", flag));
}

absl::Status ResolveBinaries(const std::string& self, JobOptions* options) {
  WSYNC_ASSIGN_OR_RETURN(
      options->host,
      FindSibling(self, options->host, {"wsync_host", "../host/wsync_host"}, "sync_worker"));
  WSYNC_ASSIGN_OR_RETURN(options->wsync,
                         FindSibling(self, options->wsync, {"wsync", "../cli/wsync"}, "wsync"));
  return absl::OkStatus();
}

absl::StatusOr<std::string> FindInPath(const std::string& name, const std::string& flag) {
  if (absl::StrContains(name, "/")) {
    if (Executable(name)) return name;
    return absl::NotFoundError(absl::StrCat(name, " is not an executable file"));
  }
  const char* path = getenv("PATH");
  for (absl::string_view dir :
       absl::StrSplit(path != nullptr ? path : "", ':', absl::SkipEmpty())) {
    const std::string candidate = absl::StrCat(dir, "/", name);
    if (Executable(candidate)) return candidate;
  }
  return absl::NotFoundError(absl::StrCat(name, " not found in PATH (Debian: apt-get install ",
                                          name == "ucx_perftest" ? "ucx-utils" : "it",
                                          "); or pass --", flag));
}

// ---------------------------------------------------------------------------------------------
// What the schedule sends to a rollout process.

absl::StatusOr<ScheduleFacts> ScheduleFactsFor(const ModelSpec& model, const std::string& from,
                                               const std::string& to, double budget,
                                               const std::string& policy_name) {
  WSYNC_ASSIGN_OR_RETURN(Layout source, BuildNamedLayout(model, from));
  WSYNC_ASSIGN_OR_RETURN(Layout target, BuildNamedLayout(model, to));
  ScheduleFacts facts;
  facts.trainers = static_cast<int32_t>(source.processes.size());
  facts.rollouts = static_cast<int32_t>(target.processes.size());
  for (const Layout* layout : {&source, &target}) {
    std::map<int32_t, int64_t> held;
    for (const BufferInfo& b : layout->buffers) held[b.process] += std::max<int64_t>(0, b.bytes);
    for (const auto& [process, bytes] : held) {
      facts.largest_process_bytes = std::max(facts.largest_process_bytes, bytes);
    }
  }
  // As the jobs run them: every process on node "local" (the replica policy looks at nodes).
  for (ProcessInfo& p : source.processes) p.node_id = "local";
  for (ProcessInfo& p : target.processes) p.node_id = "local";
  WSYNC_ASSIGN_OR_RETURN(Job job, Job::Create(std::move(source), std::move(target)));
  WSYNC_ASSIGN_OR_RETURN(auto policy, MakeReplicaPolicy(policy_name));
  WSYNC_ASSIGN_OR_RETURN(Plan plan, MakePlan(job, *policy));
  Endpoints endpoints;
  for (int32_t p = 0; p < job.num_processes(); ++p) endpoints.processes.push_back(p);
  for (const Piece& piece : job.target().pieces) {
    if (job.target().params[piece.param].quant.quantized()) facts.fp8_elements += Volume(piece.box);
  }
  facts.quant = CountQuantWireBytes(job, plan.quant);
  for (const Segment& segment : plan.segments) {
    if (!job.IsSource(segment.from.process)) continue;  // From trainers (relays forward them).
    facts.plain_bytes += segment.elements() * job.ElementSize(segment.param);
  }
  for (int32_t p = 0; p < job.num_processes(); ++p) {
    if (job.IsSource(p)) continue;
    // With the quantization steps: e4m3 bytes, scales and gathers are received too.
    WSYNC_ASSIGN_OR_RETURN(
        const ProcessSchedule s,
        ScheduleTransfers(job, plan.segments, plan.quant, endpoints, StagingBudget{budget}, p));
    for (const PeerSchedule& peer : s.peers) {
      if (peer.direction != Direction::kReceive) continue;
      int64_t bytes = 0;
      for (const ScheduledRound& round : peer.rounds) bytes += round.bytes;
      if (bytes > 0) facts.pair_bytes.push_back(bytes);
    }
    facts.bytes_total += s.received_bytes;
    facts.rounds = std::max(facts.rounds, s.rounds);
    std::vector<int64_t> sizes;
    int64_t direct = 0;
    for (const PeerSchedule& peer : s.peers) {
      if (peer.direction != Direction::kReceive) continue;
      for (const ScheduledRound& round : peer.rounds) {
        facts.received_chunks += round.chunks;
        sizes.push_back(round.bytes);
        direct += round.direct ? 1 : 0;
        if (round.bytes > facts.largest_message) {
          facts.largest_message = round.bytes;
          facts.largest_direct = round.direct;
        }
      }
    }
    if (s.received_bytes < facts.bytes_per_rollout) continue;
    facts.bytes_per_rollout = s.received_bytes;
    facts.messages = static_cast<int64_t>(sizes.size());
    facts.direct_messages = direct;
    std::sort(sizes.begin(), sizes.end());
    int64_t running = 0;
    for (int64_t size : sizes) {
      running += size;
      if (2 * running >= s.received_bytes) {
        facts.median_message = size;
        break;
      }
    }
  }
  if (facts.largest_message <= 0) {
    return absl::FailedPreconditionError("the plan sends nothing to the rollout processes");
  }
  std::sort(facts.pair_bytes.rbegin(), facts.pair_bytes.rend());
  for (int64_t bytes : facts.pair_bytes) facts.busy_pairs += 4 * bytes >= facts.pair_bytes[0];
  return facts;
}

absl::StatusOr<std::string> QuantizedSpec(const std::string& to, const std::string& quant) {
  const size_t open = to.find('(');
  if (open == std::string::npos || to.empty() || to.back() != ')' || quant.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot add quant=", quant, " to '", to,
                     "': a named layout KIND(KEY=VALUE,...) is needed"));
  }
  if (absl::StrContains(to, "quant=")) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", to, "' already names a quant; the FP8 scenario adds quant=", quant));
  }
  const bool empty = open + 2 == to.size();
  return absl::StrCat(to.substr(0, to.size() - 1), empty ? "" : ",", "quant=", quant, ")");
}

int32_t PerftestIterations(const ScheduleFacts& facts, int64_t message_bytes) {
  return static_cast<int32_t>(
      std::max<int64_t>(10, (facts.bytes_per_rollout * 2 + message_bytes - 1) / message_bytes));
}

absl::Duration WsyncJobLimit(const ScheduleFacts& facts, int32_t versions, JobCheck check,
                             double timeout_s) {
  const bool element_check =
      check == JobCheck::kElements || (check == JobCheck::kChunkHashes && facts.fp8_elements > 0);
  return absl::Seconds(
      JobLimitSeconds(timeout_s, versions, facts.largest_process_bytes, element_check));
}

JobCheck VerificationCheck(bool verify_elements) {
  return verify_elements ? JobCheck::kElements : JobCheck::kChunkHashes;
}

std::string VerificationText(JobCheck check) {
  switch (check) {
    case JobCheck::kElements:
      return "every rollout element equal to its logical value";
    case JobCheck::kChunkHashes:
      return "every chunk's xxh3 equal on sender and receiver (verify=true), trainers' bytes a "
             "pseudo-random pattern of the version";
    case JobCheck::kTimedHashes:
      return "verify=true on constant bytes";
    case JobCheck::kTimedKeyed:
      return "keyed verify (a MAC per chunk) on constant bytes";
    case JobCheck::kNone:
      break;
  }
  return "bytes and rounds each rollout received equal the schedule";
}

// ---------------------------------------------------------------------------------------------
// wsync jobs.

double StatsFigure(const std::map<std::string, std::string>& stats, const std::string& key) {
  double value = 0;
  auto it = stats.find(key);
  // A malformed figure reads as 0, as an absent one does.
  if (it != stats.end() && !absl::SimpleAtod(it->second, &value)) value = 0;
  return value;
}

int64_t SumStatsFigures(const std::map<std::string, std::string>& stats,
                        const std::string& prefix) {
  int64_t sum = 0;
  for (auto it = stats.lower_bound(prefix); it != stats.end(); ++it) {
    if (!absl::StartsWith(it->first, prefix)) break;
    sum += static_cast<int64_t>(StatsFigure(stats, it->first));
  }
  return sum;
}

absl::StatusOr<std::optional<harness::NetnsPair>> ShapedNetnsPair(const std::string& rate,
                                                                  std::string* reason) {
  std::optional<harness::NetnsPair> pair = harness::NetnsPair::Create(reason);
  if (!pair) return pair;
  for (int side = 0; side < 2; ++side) {
    const std::string command =
        absl::StrCat("ip netns exec ", pair->ns(side), " tc qdisc add dev ", pair->device(side),
                     " root tbf rate ", rate, " burst 1mb latency 100ms");
    if (std::system(command.c_str()) != 0) {
      return absl::InternalError(absl::StrCat("'", command, "' failed"));
    }
  }
  return pair;
}

absl::StatusOr<std::vector<SyncSample>> RunWsync(const ScheduleFacts& facts,
                                                 const std::string& model, const std::string& from,
                                                 const std::string& to, const Transports& t,
                                                 int32_t warmup, int32_t syncs, JobCheck check,
                                                 const JobOptions& options,
                                                 std::vector<int64_t>* peak_rss_bytes) {
  const bool elements = check == JobCheck::kElements;
  const bool hashes = check == JobCheck::kChunkHashes || check == JobCheck::kTimedHashes;
  const bool verify_quant = check == JobCheck::kChunkHashes && facts.fp8_elements > 0;
  const absl::Duration limit = WsyncJobLimit(facts, warmup + syncs, check, options.timeout_s);
  harness::JobSpec spec;
  spec.model = model;
  spec.from = from;
  spec.to = to;
  spec.trainers = facts.trainers;
  spec.rollouts = facts.rollouts;
  spec.tls = t.tls;
  spec.versions = warmup + syncs;
  spec.budget = options.budget;
  spec.timeout = limit;
  spec.rendezvous_timeout = absl::Seconds(30);
  if (!t.devices.empty()) {
    spec.placement.assign(facts.trainers + facts.rollouts,
                          harness::ProcessPlacement{"", "local", t.devices, {}});
  }
  spec.extra_worker_flags = {
      "--trainers",
      absl::StrCat(facts.trainers),
      "--rollouts",
      absl::StrCat(facts.rollouts),
      "--replica_policy",
      options.policy,
      absl::StrCat("--check_values=", elements ? "true" : "false"),
      absl::StrCat("--fill_pattern=", check == JobCheck::kChunkHashes ? "true" : "false"),
      absl::StrCat("--verify=", check == JobCheck::kTimedKeyed ? "keyed"
                                : hashes                       ? "hash"
                                                               : "off"),
      absl::StrCat("--verify_quant=", verify_quant ? "true" : "false"),
      absl::StrCat("--deadline_seconds=", absl::ToDoubleSeconds(limit))};
  // The settings given to wsync-bench first: the job's own of the same name win (the last counts).
  spec.extra_worker_flags.insert(spec.extra_worker_flags.begin(), options.settings.begin(),
                                 options.settings.end());
  WSYNC_ASSIGN_OR_RETURN(harness::JobResult result,
                         harness::RunJob(spec, options.host, options.wsync));
  const int total = facts.trainers + facts.rollouts;
  for (int p = 0; p < total; ++p) {
    const harness::WorkerResult& w = result.workers[p];
    if (w.exit_code != 0 || static_cast<int>(w.stats.size()) != spec.versions) {
      return absl::InternalError(absl::StrFormat(
          "wsync job over UCX_TLS=%s: process %d exited %d%s with %d of %d STATS lines: %s", t.tls,
          p, w.exit_code, w.exit_code == -1 ? " (killed at the limit)" : "", w.stats.size(),
          spec.versions, TailOf(w.stderr_text)));
    }
  }
  if (peak_rss_bytes != nullptr) {
    peak_rss_bytes->clear();
    for (const harness::WorkerResult& w : result.workers)
      peak_rss_bytes->push_back(w.peak_rss_bytes);
  }
  std::vector<SyncSample> samples;
  for (int v = 0; v < spec.versions; ++v) {
    SyncSample s;
    int32_t rounds = 0;
    int64_t verified = 0, quant_verified = 0;
    for (int p = 0; p < total; ++p) {
      const auto& stats = result.workers[p].stats[v];
      const auto library = stats.find("library");
      if (library == stats.end() || !absl::EndsWith(library->second, "/libwsync.so") ||
          (p > 0 && library->second != s.library)) {
        return absl::InternalError(absl::StrFormat(
            "wsync job: process %d of %s reports no libwsync.so mapped, or another one than "
            "process 0 (%s): not a host of the C ABI (integration/host)",
            p, options.host, s.library));
      }
      s.library = library->second;
      const double seconds = StatsFigure(stats, "seconds");
      const double call = StatsFigure(stats, "sync_seconds");
      s.seconds = std::max(s.seconds, seconds);
      s.sync_seconds = std::max(s.sync_seconds, call);
      s.cpu_seconds += StatsFigure(stats, "cpu_seconds");
      s.cpu_user_seconds += StatsFigure(stats, "cpu_user_seconds");
      s.wire_bytes += SumStatsFigures(stats, "wire_sent_");
      if (p >= facts.trainers) {
        const auto received = static_cast<int64_t>(StatsFigure(stats, "received"));
        s.rollout_bytes = std::max(s.rollout_bytes, received);
        rounds = std::max(rounds, static_cast<int32_t>(StatsFigure(stats, "rounds")));
        s.total_bytes += received;
        verified += static_cast<int64_t>(StatsFigure(stats, "verified"));
        quant_verified += static_cast<int64_t>(StatsFigure(stats, "quant_verified"));
      }
    }
    if (verify_quant && quant_verified != facts.fp8_elements) {
      return absl::InternalError(absl::StrFormat(
          "wsync job over UCX_TLS=%s: the rollouts checked %d e4m3 elements against the reference "
          "quantizer in sync %d; they hold %d",
          t.tls, quant_verified, v + 1, facts.fp8_elements));
    }
    if (hashes && verified != facts.received_chunks) {
      return absl::InternalError(absl::StrFormat(
          "wsync job with verify=true over UCX_TLS=%s: the rollouts checked %d chunk hashes in "
          "sync %d; the schedule sends them %d chunks",
          t.tls, verified, v + 1, facts.received_chunks));
    }
    if (s.total_bytes != facts.bytes_total || rounds != facts.rounds) {
      return absl::InternalError(absl::StrFormat(
          "wsync job over UCX_TLS=%s: the rollouts received %d bytes in %d rounds in sync %d; "
          "the schedule computed here says %d bytes in %d rounds",
          t.tls, s.total_bytes, rounds, v + 1, facts.bytes_total, facts.rounds));
    }
    s.outside_seconds = s.sync_seconds - s.seconds;
    if (v >= warmup) samples.push_back(s);
  }
  return samples;
}

}  // namespace wsync::bench
