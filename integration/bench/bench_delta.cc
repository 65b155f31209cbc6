#include "integration/bench/bench_delta.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status.h"
#include "integration/bench/bench_report.h"
#include "integration/bench/machine.h"
#include "integration/bench/perftest.h"
#include "integration/cli/calibrate_job.h"
#include "integration/harness/launcher.h"
#include "integration/model_config/hf_config.h"
#include "planner/models.h"
#include "plugin/prediction.h"

namespace wsync::bench {
namespace {

// A link whose rows run: UCX TCP on loopback, UCX shared memory, or the shaped veth between two
// namespaces (trainers in one, rollouts in the other), and the delta modes it compares.
struct DeltaLink {
  std::string name;
  Transports transports;  // Not for netns: each side's placement names its transports.
  bool netns = false;
  std::vector<std::string> modes;
  // What delta=auto's processes decide with (wsync_config_t.calibration_file): `wsync calibrate`
  // of this link's processes and transports, measured before its rows.
  std::string calibration;
};

// One sync of a job, over all its processes.
struct DeltaSync {
  double seconds = 0;          // The library's transfer seconds, slowest process.
  double call_seconds = 0;     // The sync call, slowest trainer (rollouts wait there for updates).
  double cpu_seconds = 0;      // CPU of all processes during their sync calls.
  double update_seconds = 0;   // The slowest trainer's AdamW step before the call (not timed).
  int64_t wire_bytes = 0;      // wsync_bytes_sent_total of this sync, all processes (wire_sent_*).
  int64_t sent_bytes = 0;      // wsync_stats_t.sent_bytes, all processes: the messages posted.
  int64_t received_bytes = 0;  // wsync_stats_t.received_bytes, all rollouts.
  int64_t verified = 0;        // Chunk digests the rollouts checked.
  // The cost model's prediction of the next delta sync after this one (process 0's schedule
  // report, at this sync's changed fraction), and the one made after the sync before this one
  // (RunDeltaRounds); -1 without one.
  double predicted_next_seconds = -1;
  double predicted_seconds = -1;
  // The dense sync's prediction on the same report line (what the delta one's wire term scales).
  double predicted_dense_seconds = -1;
};

struct DeltaRow {
  double lr = 0;
  const DeltaLink* link = nullptr;
  std::string mode;
  std::vector<DeltaSync> syncs;  // Timed: versions 2..S of every job.
};

struct DeltaBench {
  DeltaBenchOptions options;
  ScheduleFacts facts;
  std::vector<double> lrs;         // Of the timed rows.
  std::vector<double> verify_lrs;  // Of the verified jobs.
  std::vector<DeltaLink> links;
  std::optional<harness::NetnsPair> net;
  std::string scratch_dir;  // The links' calibration files; RunDeltaBench removes it at its end.
};

absl::StatusOr<std::vector<double>> ParseLearningRates(const std::string& text,
                                                       const std::string& flag) {
  std::vector<double> lrs;
  for (const absl::string_view word : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    double lr = 0;
    if (!absl::SimpleAtod(word, &lr) || !(lr > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, " takes positive learning rates, not '", word, "'"));
    }
    lrs.push_back(lr);
  }
  return lrs;
}

absl::Status SetUpDeltaBench(const DeltaBenchOptions& options, std::FILE* out, DeltaBench* b) {
  b->options = options;
  DeltaBenchOptions& o = b->options;
  o.steps = std::max(2, o.steps);
  o.rounds = std::max(1, o.rounds);
  WSYNC_ASSIGN_OR_RETURN(b->lrs, ParseLearningRates(o.lrs, "delta_lrs"));
  WSYNC_ASSIGN_OR_RETURN(b->verify_lrs, ParseLearningRates(o.verify_lrs, "delta_verify_lrs"));
  WSYNC_ASSIGN_OR_RETURN(const std::string self, SelfPath());
  WSYNC_RETURN_IF_ERROR(ResolveBinaries(self, &o.job));
  WSYNC_ASSIGN_OR_RETURN(const ModelSpec model, LoadModel(o.model));
  WSYNC_ASSIGN_OR_RETURN(b->facts,
                         ScheduleFactsFor(model, o.from, o.to, o.job.budget, o.job.policy));
  for (const absl::string_view name : absl::StrSplit(o.links, ',', absl::SkipWhitespace())) {
    if (name == "tcp") {
      b->links.push_back(
          {"tcp", {"tcp", o.tcp_tls, o.tcp_devices}, false, {"off", "on", "auto"}, {}});
    } else if (name == "shm") {
      b->links.push_back({"shm", {"shm", o.shm_tls, ""}, false, {"off", "on", "auto"}, {}});
    } else if (name == "netns") {
      std::string reason;
      WSYNC_ASSIGN_OR_RETURN(std::optional<harness::NetnsPair> shaped,
                             ShapedNetnsPair(absl::StrCat(o.rate_mbit, "mbit"), &reason));
      if (shaped.has_value()) b->net.emplace(std::move(*shaped));  // NetnsPair moves, no assign.
      if (!b->net) {
        absl::FPrintF(out, "  netns rows skipped: %s\n", reason);
        continue;
      }
      b->links.push_back({"netns", {}, true, {"off", "on", "auto"}, {}});
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--delta_links takes tcp, shm and netns, not '", name, "'"));
    }
  }
  if (b->links.empty()) return absl::InvalidArgumentError("no link to run (--delta_links)");
  return absl::OkStatus();
}

// A job's limit: the wsync jobs' (timeout_s plus 10 s per GB the busiest process holds and
// version), plus per version the AdamW step (40 ns per element of the busiest process) and, on the
// shaped link, twice the dense bytes' time at its rate.
double DeltaJobLimitSeconds(const DeltaBench& b, const DeltaLink& link) {
  const int32_t versions = b.options.steps;
  double per_version = b.facts.largest_process_bytes / 2 * 40e-9;
  if (link.netns) per_version += 2 * b.facts.bytes_total * 8.0 / (b.options.rate_mbit * 1e6);
  return JobLimitSeconds(b.options.job.timeout_s, versions, b.facts.largest_process_bytes,
                         /*element_check=*/false) +
         versions * per_version;
}

harness::JobSpec DeltaJobSpec(const DeltaBench& b, const DeltaLink& link, const std::string& mode,
                              double lr, bool verify) {
  const DeltaBenchOptions& o = b.options;
  const double limit = DeltaJobLimitSeconds(b, link);
  harness::JobSpec spec;
  spec.model = o.model;
  spec.from = o.from;
  spec.to = o.to;
  spec.trainers = b.facts.trainers;
  spec.rollouts = b.facts.rollouts;
  spec.versions = o.steps;
  spec.budget = o.job.budget;
  spec.timeout = absl::Seconds(limit);
  spec.rendezvous_timeout = absl::Seconds(60);
  const int32_t processes = b.facts.trainers + b.facts.rollouts;
  if (link.netns) {
    spec.coordinator_netns = b.net->ns(0);
    spec.coordinator_address = b.net->address(0);
    for (int32_t p = 0; p < processes; ++p) {
      spec.placement.push_back(harness::TwoNodePlacement(*b.net, p < b.facts.trainers ? 0 : 1));
    }
  } else {
    spec.tls = link.transports.tls;
    if (!link.transports.devices.empty()) {
      spec.placement.assign(processes,
                            harness::ProcessPlacement{"", "local", link.transports.devices, {}});
    }
  }
  spec.extra_worker_flags = {"--trainers",
                             absl::StrCat(b.facts.trainers),
                             "--rollouts",
                             absl::StrCat(b.facts.rollouts),
                             "--replica_policy",
                             o.job.policy,
                             "--check_values=false",
                             "--fill_pattern=false",
                             absl::StrCat("--verify=", verify ? "hash" : "off"),
                             absl::StrCat("--delta=", mode),
                             "--update=adamw",
                             absl::StrFormat("--lr=%.17g", lr),
                             absl::StrFormat("--weight_decay=%.17g", o.weight_decay),
                             absl::StrCat("--deadline_seconds=", limit)};
  if (mode != "off" && !link.calibration.empty()) {
    spec.extra_worker_flags.push_back(absl::StrCat("--calibration_file=", link.calibration));
  }
  spec.extra_worker_flags.insert(spec.extra_worker_flags.begin(), o.job.settings.begin(),
                                 o.job.settings.end());
  return spec;
}

// Runs one job of options.steps versions and returns every version's figures. Fails when a
// process fails or does not report libwsync.so mapped, a verified job's rollouts checked other
// than the schedule's chunks, a dense sync (every version of delta=off, the first of the others)
// received other than the schedule's bytes, or a delta sync more.
absl::StatusOr<std::vector<DeltaSync>> RunDeltaJob(const DeltaBench& b, const DeltaLink& link,
                                                   const std::string& mode, double lr,
                                                   bool verify) {
  const harness::JobSpec spec = DeltaJobSpec(b, link, mode, lr, verify);
  WSYNC_ASSIGN_OR_RETURN(const harness::JobResult result,
                         harness::RunJob(spec, b.options.job.host, b.options.job.wsync));
  const std::string what = absl::StrFormat("delta=%s job over %s (lr %g)", mode, link.name, lr);
  const int32_t trainers = b.facts.trainers;
  for (size_t p = 0; p < result.workers.size(); ++p) {
    const harness::WorkerResult& w = result.workers[p];
    if (w.exit_code != 0 || static_cast<int32_t>(w.stats.size()) != spec.versions) {
      return absl::InternalError(
          absl::StrFormat("%s: process %d exited %d%s with %d of %d STATS lines: %s", what, p,
                          w.exit_code, w.exit_code == -1 ? " (killed at the limit)" : "",
                          w.stats.size(), spec.versions, TailOf(w.stderr_text)));
    }
  }
  std::vector<DeltaSync> syncs;
  for (int32_t v = 0; v < spec.versions; ++v) {
    DeltaSync s;
    for (size_t p = 0; p < result.workers.size(); ++p) {
      const auto& stats = result.workers[p].stats[v];
      const auto library = stats.find("library");
      if (library == stats.end() || !absl::EndsWith(library->second, "/libwsync.so")) {
        return absl::InternalError(
            absl::StrCat(what, ": process ", p, " reports no libwsync.so mapped"));
      }
      const bool trainer = static_cast<int32_t>(p) < trainers;
      s.seconds = std::max(s.seconds, StatsFigure(stats, "seconds"));
      if (trainer) {
        s.call_seconds = std::max(s.call_seconds, StatsFigure(stats, "sync_seconds"));
        s.update_seconds = std::max(s.update_seconds, StatsFigure(stats, "update_seconds"));
      }
      s.cpu_seconds += StatsFigure(stats, "cpu_seconds");
      if (p == 0 && stats.count("predicted_delta_seconds") > 0) {
        s.predicted_next_seconds = StatsFigure(stats, "predicted_delta_seconds");
        if (stats.count("predicted_dense_seconds") > 0) {
          s.predicted_dense_seconds = StatsFigure(stats, "predicted_dense_seconds");
        }
      }
      s.wire_bytes += SumStatsFigures(stats, "wire_sent_");
      s.sent_bytes += static_cast<int64_t>(StatsFigure(stats, "sent"));
      if (!trainer) {
        s.received_bytes += static_cast<int64_t>(StatsFigure(stats, "received"));
        s.verified += static_cast<int64_t>(StatsFigure(stats, "verified"));
      }
    }
    if (verify && s.verified != b.facts.received_chunks) {
      return absl::InternalError(
          absl::StrFormat("%s with verify=hash: the rollouts checked %d chunk digests in sync %d; "
                          "the schedule sends them %d chunks",
                          what, s.verified, v + 1, b.facts.received_chunks));
    }
    const bool dense = mode == "off" || v == 0;
    if (dense ? s.received_bytes != b.facts.bytes_total : s.received_bytes > b.facts.bytes_total) {
      return absl::InternalError(absl::StrFormat(
          "%s: the rollouts received %d bytes in sync %d; the schedule sends %s%d", what,
          s.received_bytes, v + 1, dense ? "" : "at most ", b.facts.bytes_total));
    }
    syncs.push_back(s);
  }
  return syncs;
}

std::string LrText(double lr) { return absl::StrFormat("%g", lr); }

// One job per verification learning rate with delta=on and verify=hash, over shared memory when
// it runs (the quickest), else the first link.
absl::Status RunDeltaVerification(const DeltaBench& b, std::FILE* out) {
  const DeltaLink* chosen = &b.links.front();
  for (const DeltaLink& link : b.links) {
    if (link.name == "shm") chosen = &link;
  }
  const DeltaLink& link = *chosen;
  for (const double lr : b.verify_lrs) {
    const absl::Time start = absl::Now();
    WSYNC_ASSIGN_OR_RETURN(const std::vector<DeltaSync> syncs,
                           RunDeltaJob(b, link, "on", lr, /*verify=*/true));
    std::vector<std::string> sent;
    for (const DeltaSync& s : syncs) {
      sent.push_back(absl::StrFormat("%d (%.4f)", s.sent_bytes,
                                     static_cast<double>(s.sent_bytes) / b.facts.bytes_total));
    }
    absl::FPrintF(out,
                  "verified lr %s delta=on over %s: %d versions, every chunk's xxh3 equal on "
                  "sender and receiver after patching (verify=hash, %d chunks per version); "
                  "bytes sent per version (/ dense): %s (%.1f s)\n",
                  LrText(lr), link.name, syncs.size(), b.facts.received_chunks,
                  absl::StrJoin(sent, " "), absl::ToDoubleSeconds(absl::Now() - start));
    std::fflush(out);
  }
  return absl::OkStatus();
}

// Calibrates each link with the job's processes on its transports (the transfer patterns and the
// delta encode and apply rates: what delta=auto decides with and the delta rows' processes
// predict with), and prints the changed fraction below which the cost model says delta pays on
// each of its path classes.
absl::Status CalibrateDeltaLinks(DeltaBench& b, std::FILE* out) {
  const int32_t processes = b.facts.trainers + b.facts.rollouts;
  for (DeltaLink& link : b.links) {
    cli::CalibrationJob calibration;
    calibration.processes = processes;
    for (int32_t p = 0; p < processes; ++p) {
      const int side = p < b.facts.trainers ? 0 : 1;
      if (link.netns) {
        calibration.nodes.push_back(side == 0 ? "node-a" : "node-b");
        calibration.netns.push_back(b.net->ns(side));
        calibration.path_transports.push_back(
            absl::StrCat("intra_node=ucx:sm,cma,self;inter_node=ucx:tcp@", b.net->device(side)));
      } else {
        calibration.nodes.push_back("local");
        const std::string devices =
            link.transports.devices.empty() ? "" : absl::StrCat("@", link.transports.devices);
        calibration.path_transports.push_back(absl::StrCat("*=ucx:", link.transports.tls, devices));
      }
    }
    if (link.netns) calibration.coordinator_address = b.net->address(0);
    // Three sizes, three repeats: about 12 s for four processes here (the probe's defaults take
    // two minutes); the delta rates come from their own 32 MiB probe either way.
    calibration.sizes = {int64_t{256} << 10, int64_t{4} << 20, int64_t{16} << 20};
    calibration.repeats = 3;
    link.calibration = absl::StrCat(b.scratch_dir, "/", link.name, ".pb");
    calibration.out = link.calibration;
    const absl::Time start = absl::Now();
    WSYNC_ASSIGN_OR_RETURN(const proto::Calibration measured,
                           cli::RunCalibrationJob(calibration, b.options.job.wsync));
    WSYNC_ASSIGN_OR_RETURN(const LinkFits fits, FitLinks(measured));
    std::vector<std::string> rules;
    for (const auto& [path_class, below] : DeltaPaysBelow(fits)) {
      rules.push_back(below > 0 ? absl::StrFormat("%s below %.3f changed", path_class, below)
                                : absl::StrCat(path_class, " never"));
    }
    absl::FPrintF(out,
                  "  calibrated %s for delta=auto in %.1f s: delta encode %.2f GB/s, apply %.2f "
                  "GB/s; delta pays on %s\n",
                  link.name, absl::ToDoubleSeconds(absl::Now() - start),
                  fits.delta_encode_bytes_per_second / 1e9, fits.delta_apply_bytes_per_second / 1e9,
                  rules.empty() ? "no class" : absl::StrJoin(rules, ", "));
    std::fflush(out);
  }
  return absl::OkStatus();
}

std::vector<DeltaRow> MakeDeltaRows(const DeltaBench& b) {
  std::vector<DeltaRow> rows;
  for (const double lr : b.lrs) {
    for (const DeltaLink& link : b.links) {
      for (const std::string& mode : link.modes) rows.push_back({lr, &link, mode, {}});
    }
  }
  return rows;
}

absl::Status RunDeltaRounds(const DeltaBench& b, std::vector<DeltaRow>* rows, std::FILE* out) {
  const bool verify = b.options.verify_timed;
  for (int32_t round = 1; round <= b.options.rounds; ++round) {
    for (DeltaRow& row : *rows) {
      const absl::Time start = absl::Now();
      WSYNC_ASSIGN_OR_RETURN(const std::vector<DeltaSync> syncs,
                             RunDeltaJob(b, *row.link, row.mode, row.lr, verify));
      std::vector<std::string> seconds, sent;
      for (size_t v = 1; v < syncs.size(); ++v) {
        seconds.push_back(absl::StrFormat("%.4f", syncs[v].seconds));
        sent.push_back(absl::StrCat(syncs[v].sent_bytes));
        row.syncs.push_back(syncs[v]);
        row.syncs.back().predicted_seconds = syncs[v - 1].predicted_next_seconds;
      }
      absl::FPrintF(out,
                    "round %d/%d  lr %-6s %-5s delta=%-4s  first %.4f s; timed %s s; sent %s B; "
                    "AdamW step %.2f s%s (job %.1f s)\n",
                    round, b.options.rounds, LrText(row.lr), row.link->name, row.mode,
                    syncs[0].seconds, absl::StrJoin(seconds, " "), absl::StrJoin(sent, " "),
                    syncs.back().update_seconds, verify ? "; every sync verified" : "",
                    absl::ToDoubleSeconds(absl::Now() - start));
      std::fflush(out);
    }
  }
  return absl::OkStatus();
}

// The medians of a row's figures.
struct DeltaMedians {
  double seconds = 0, call = 0, cpu = 0, update = 0, wire = 0, sent = 0;
};

DeltaMedians MediansOf(const DeltaRow& row) {
  std::vector<double> seconds, call, cpu, update, wire, sent;
  for (const DeltaSync& s : row.syncs) {
    seconds.push_back(s.seconds);
    call.push_back(s.call_seconds);
    cpu.push_back(s.cpu_seconds);
    update.push_back(s.update_seconds);
    wire.push_back(static_cast<double>(s.wire_bytes));
    sent.push_back(static_cast<double>(s.sent_bytes));
  }
  return {Median(seconds), Median(call), Median(cpu), Median(update), Median(wire), Median(sent)};
}

const DeltaRow* DenseRowOf(const std::vector<DeltaRow>& rows, const DeltaRow& row) {
  for (const DeltaRow& other : rows) {
    if (other.lr == row.lr && other.link == row.link && other.mode == "off") return &other;
  }
  return nullptr;
}

double DeltaRatio(double value, double dense) { return dense > 0 ? value / dense : 0; }

void PrintDeltaTable(const std::vector<DeltaRow>& rows, std::FILE* out) {
  absl::FPrintF(out, "\n%-6s %-5s %-5s %5s %13s %7s %13s %7s %9s %7s %9s %7s %8s %8s %8s\n", "lr",
                "link", "delta", "syncs", "wire B/sync", "/dense", "sent B/sync", "/dense",
                "s/sync", "/dense", "call s", "/dense", "outside", "cpu s", "AdamW s");
  for (const DeltaRow& row : rows) {
    const DeltaMedians m = MediansOf(row);
    const DeltaMedians d = MediansOf(*DenseRowOf(rows, row));
    absl::FPrintF(out,
                  "%-6s %-5s %-5s %5d %13.0f %7.4f %13.0f %7.4f %9.4f %7.3f %9.4f %7.3f %8.4f "
                  "%8.3f %8.2f\n",
                  LrText(row.lr), row.link->name, row.mode, row.syncs.size(), m.wire,
                  DeltaRatio(m.wire, d.wire), m.sent, DeltaRatio(m.sent, d.sent), m.seconds,
                  DeltaRatio(m.seconds, d.seconds), m.call, DeltaRatio(m.call, d.call),
                  m.call - m.seconds, m.cpu, m.update);
  }
  absl::FPrintF(
      out,
      "  medians over the timed syncs (versions 2..S of every job). wire: the library's "
      "wsync_bytes_sent_total\n  (wire_sent_*, all processes); sent: wsync_stats_t.sent_bytes "
      "(the messages each sender posted, encoded\n  deltas included); s/sync: the library's "
      "transfer seconds (the encode before the rounds included),\n  slowest process; call s: "
      "the sync call of the slowest trainer (trigger, agreement, transfer,\n  commit); outside: "
      "call less transfer; cpu s: CPU of all processes during their sync calls\n  (rollouts "
      "wait there for the trainers' AdamW step); AdamW s: the slowest trainer's step before\n"
      "  each sync, outside every other figure.\n");
}

std::string GoalText(double value, double goal) {
  return absl::StrFormat("%.4f (goal <= %.2f: %s)", value, goal, value <= goal ? "met" : "NOT met");
}

// The issue's goals at each learning rate that has its rows (stated at lr 1e-6).
// Per row that predicted: the cost model's prediction of each timed delta sync (made after the
// sync before it, at that sync's changed fraction) against the measured transfer seconds, as the
// median error over the timed syncs (issue 44's goal: within 30 %).
void PrintDeltaPredictions(const std::vector<DeltaRow>& rows, std::FILE* out) {
  bool header = false;
  for (const DeltaRow& row : rows) {
    std::vector<double> predicted, measured, errors, dense;
    for (const DeltaSync& sync : row.syncs) {
      if (sync.predicted_seconds <= 0 || sync.seconds <= 0) continue;
      if (sync.predicted_dense_seconds > 0) dense.push_back(sync.predicted_dense_seconds);
      predicted.push_back(sync.predicted_seconds);
      measured.push_back(sync.seconds);
      errors.push_back((sync.predicted_seconds - sync.seconds) / sync.seconds);
    }
    if (errors.empty()) continue;
    if (!header) {
      absl::FPrintF(
          out, "\ncost model (wsync calibrate of each link; the schedule report's delta line):\n");
      header = true;
    }
    const double error = Median(errors);
    absl::FPrintF(out,
                  "  lr %-6s %-5s delta=%-4s predicted %.4f s, measured %.4f s (medians of %d "
                  "syncs): error %+.1f %% (goal within 30 %%: %s)\n",
                  LrText(row.lr), row.link->name, row.mode, Median(predicted), Median(measured),
                  errors.size(), 100 * error, std::abs(error) <= 0.3 ? "met" : "NOT met");
    const DeltaRow* dense_row = DenseRowOf(rows, row);
    if (!dense.empty() && dense_row != nullptr && !dense_row->syncs.empty()) {
      absl::FPrintF(out, "%34s the dense sync predicted %.4f s, the off row measured %.4f s\n", "",
                    Median(dense), MediansOf(*dense_row).seconds);
    }
  }
}

void PrintDeltaGoals(const std::vector<DeltaRow>& rows, std::FILE* out) {
  absl::FPrintF(out, "\ngoals of issue 44 (stated at lr 1e-6):\n");
  for (const DeltaRow& row : rows) {
    if (row.mode == "off") continue;
    const DeltaMedians m = MediansOf(row);
    const DeltaMedians d = MediansOf(*DenseRowOf(rows, row));
    const std::string head =
        absl::StrFormat("  lr %-6s %-5s delta=%-4s", LrText(row.lr), row.link->name, row.mode);
    if (row.mode == "auto") {
      absl::FPrintF(out, "%s seconds / dense %s\n", head,
                    GoalText(DeltaRatio(m.seconds, d.seconds), 1.05));
      continue;
    }
    absl::FPrintF(out, "%s wire / dense %s; sent / dense %s", head,
                  GoalText(DeltaRatio(m.wire, d.wire), 0.06),
                  GoalText(DeltaRatio(m.sent, d.sent), 0.06));
    if (row.link->name == "tcp" || row.link->netns) {
      absl::FPrintF(out, "; seconds / dense %s",
                    GoalText(DeltaRatio(m.seconds, d.seconds), row.link->netns ? 0.1 : 0.5));
    }
    absl::FPrintF(out, "\n");
  }
}

}  // namespace

std::string DeltaBenchUsage() {
  return "wsync-bench delta [--model M] [--from L] [--to L] [--delta_steps S]\n"
         "                  [--delta_rounds R] [--delta_lrs LR,...] [--delta_verify_lrs LR,...]\n"
         "                  [--delta_weight_decay W] [--delta_links tcp,shm,netns]\n"
         "                  [--delta_rate_mbit N] [--delta_verify_timed]\n"
         "                  [--staging_budget_bytes B] [--replica_policy P]\n"
         "                  [--sync_shm_tls T] [--sync_tcp_tls T]\n"
         "                  [--sync_tcp_devices D] [--sync_timeout_s S]\n"
         "  Issue 44's scenario: M (default qwen2.5-0.5b) from L (megatron(tp=2)) to L\n"
         "  (vllm(tp=2)), trainers of wsync_host --update adamw: fp32 masters initialised as the\n"
         "  Qwen2 family does (linear and embedding weights normal, std 0.02; norms 1; biases 0),\n"
         "  one AdamW step per version (beta1 0.9, beta2 0.999, eps 1e-8, weight decay W\n"
         "  (0.01) on the linear and embedding weights) on random normal gradients drawn per\n"
         "  element and step (Adam normalises them: the update's size is set by the learning\n"
         "  rate, as in real post-training), cast to bf16. First one delta=on job per\n"
         "  --delta_verify_lrs rate (1e-6,1e-5; empty: none) with the library's verify=hash:\n"
         "  every chunk's xxh3 compared between sender and receiver after patching, every\n"
         "  version, and its bytes sent per version. Then per --delta_lrs rate (1e-6) the rows\n"
         "  delta=off (dense) and on over UCX TCP on loopback, off, on and auto over UCX shared\n"
         "  memory, and (root) off and on across a veth between two network namespaces shaped\n"
         "  by tc to N Mbit/s (1000), trainers in one and rollouts in the other. Each job runs S\n"
         "  (4) versions: the first dense for every mode (it primes the bases), the others\n"
         "  timed; R (1) rounds run every row's job in turn (--delta_verify_timed: verified\n"
         "  too). Prints per row the bytes on the wire per sync (the library's metrics) and the\n"
         "  bytes sent (its stats), seconds per sync (transfer and sync call), CPU and the AdamW\n"
         "  step's time, each as a ratio to dense, and the issue's goals (wire <= 0.06, TCP <=\n"
         "  0.5, shaped link <= 0.1, auto over shared memory <= 1.05).\n";
}

absl::Status RunDeltaBench(const DeltaBenchOptions& options, std::FILE* out) {
  const absl::Time bench_start = absl::Now();
  DeltaBench b;
  char scratch_template[] = "/tmp/wsync-bench-delta-XXXXXX";
  if (mkdtemp(scratch_template) == nullptr) return absl::InternalError("mkdtemp failed");
  b.scratch_dir = scratch_template;
  const absl::Cleanup remove_scratch = [&b] {
    std::error_code ignored;
    std::filesystem::remove_all(b.scratch_dir, ignored);
  };
  absl::FPrintF(out, "wsync-bench delta: %s, %s -> %s\n", options.model, options.from, options.to);
  WSYNC_RETURN_IF_ERROR(SetUpDeltaBench(options, out, &b));
  const DeltaBenchOptions& o = b.options;
  std::vector<std::string> links;
  for (const DeltaLink& link : b.links) {
    links.push_back(link.netns ? absl::StrFormat("netns (UCX tcp over a veth shaped by tc tbf "
                                                 "to %d Mbit/s)",
                                                 o.rate_mbit)
                               : absl::StrCat(link.name, " (UCX_TLS=", link.transports.tls, ")"));
  }
  absl::FPrintF(out,
                "  machine: %s\n  CPU flags: %s\n  processes %s\n  wsync %s\n"
                "  %d trainer + %d rollout processes; dense sync: %d B to the rollouts in %d "
                "chunks\n  update: AdamW, lr %s, weight decay %g; %d versions per job (1 dense, "
                "%d timed), %d rounds\n  links: %s\n",
                MachineDescription(), CpuVectorFlags(), o.job.host, o.job.wsync, b.facts.trainers,
                b.facts.rollouts, b.facts.bytes_total, b.facts.received_chunks, o.lrs,
                o.weight_decay, o.steps, o.steps - 1, o.rounds, absl::StrJoin(links, ", "));
  std::fflush(out);
  WSYNC_RETURN_IF_ERROR(RunDeltaVerification(b, out));
  WSYNC_RETURN_IF_ERROR(CalibrateDeltaLinks(b, out));
  std::vector<DeltaRow> rows = MakeDeltaRows(b);
  if (rows.empty()) return absl::OkStatus();
  WSYNC_RETURN_IF_ERROR(RunDeltaRounds(b, &rows, out));
  PrintDeltaTable(rows, out);
  PrintDeltaGoals(rows, out);
  PrintDeltaPredictions(rows, out);
  absl::FPrintF(out, "load average at the end %s; total %.1f s\n", LoadAverage(),
                absl::ToDoubleSeconds(absl::Now() - bench_start));
  return absl::OkStatus();
}

}  // namespace wsync::bench
