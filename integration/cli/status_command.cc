#include "integration/cli/status_command.h"

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "common/sync_progress.h"
#include "control/auth.h"
#include "control/protocol.h"
#include "control/status_client.h"
#include "integration/bench/bench_report.h"

ABSL_DECLARE_FLAG(std::string, job);
ABSL_DECLARE_FLAG(std::string, secret_file);
ABSL_DECLARE_FLAG(std::string, secret_env);
ABSL_FLAG(std::string, coordinator, "", "`wsync status`: the coordinator's HOST:PORT.");
ABSL_FLAG(bool, json, false, "`wsync status`: print JSON (one object per query).");
ABSL_FLAG(double, watch, 0, "`wsync status`: repeat every this many seconds (0: once).");
ABSL_FLAG(double, status_timeout_s, 5, "`wsync status`: limit of one query, seconds.");

namespace wsync::cli {

using bench::JsonString;  // integration/bench/bench_report.h (library wsync::bench_report).
namespace {

std::string RoleName(int role) {
  const std::optional<ControlRole> known = RoleFromProto(role);
  return known.has_value() ? std::string(ControlRoleName(*known)) : "unknown";
}

std::string Age(int64_t ms) {
  return ms < 0 ? "-" : absl::StrFormat("%.1f s", static_cast<double>(ms) / 1000);
}

// "HOST:PORT" ("[::1]:PORT" for IPv6).
absl::Status ParseCoordinator(const std::string& text, StatusQuery& query) {
  const size_t colon = text.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(text.substr(colon + 1), &port) || port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--coordinator must be HOST:PORT; got '", text, "'"));
  }
  query.host = text.substr(0, colon);
  if (query.host.size() > 2 && query.host.front() == '[' && query.host.back() == ']') {
    query.host = query.host.substr(1, query.host.size() - 2);
  }
  query.port = port;
  return absl::OkStatus();
}

// The progress columns of the table: committed version, phase (with the sync's version),
// rounds and MiB done of total; "-" where the process reported none.
struct ProgressColumns {
  std::string committed = "-", phase = "-", rounds = "-", bytes = "-";
};

ProgressColumns ProgressOf(const control::ProcessStatus& p) {
  ProgressColumns columns;
  if (!p.has_progress()) return columns;
  const control::SyncProgress& s = p.progress();
  constexpr double kMiB = 1024.0 * 1024.0;
  if (s.committed_version() >= 0) columns.committed = absl::StrCat(s.committed_version());
  columns.phase = std::string(SyncPhaseName(s.phase()));
  if (s.version() >= 0) absl::StrAppend(&columns.phase, " v", s.version());
  columns.rounds = absl::StrCat(s.rounds_done(), "/", s.rounds_total());
  columns.bytes = absl::StrFormat("%.1f/%.1f MiB", s.bytes_done() / kMiB, s.bytes_total() / kMiB);
  return columns;
}

std::string ProgressJson(const control::ProcessStatus& p) {
  if (!p.has_progress()) return "null";
  const control::SyncProgress& s = p.progress();
  return absl::StrFormat(
      "{\"version\":%d,\"phase\":%s,\"rounds_done\":%d,\"rounds_total\":%d,"
      "\"bytes_done\":%d,\"bytes_total\":%d,\"committed_version\":%s}",
      s.version(), JsonString(SyncPhaseName(s.phase())), s.rounds_done(), s.rounds_total(),
      s.bytes_done(), s.bytes_total(),
      s.committed_version() < 0 ? "null" : absl::StrCat(s.committed_version()));
}

}  // namespace

std::string StatusText(const control::JobStatusBody& body) {
  const int32_t world = body.num_trainers() + body.num_rollouts();
  std::string text = absl::StrFormat(
      "job %s: %d trainers, %d rollouts; rendezvous %s (%d of %d joined); %d collectives open\n",
      body.job_id(), body.num_trainers(), body.num_rollouts(), body.rendezvous(), body.joined(),
      world, body.open_collectives());
  static constexpr char kRow[] = "%7s  %-8s %4s  %-16s %-9s %8s %11s %9s  %-17s %9s %19s  %s\n";
  absl::StrAppendFormat(&text, kRow, "process", "role", "rank", "node", "state", "heard",
                        "collectives", "committed", "sync", "rounds", "bytes", "detail");
  std::vector<std::string> missing;
  for (const control::ProcessStatus& p : body.processes()) {
    const ProgressColumns progress = ProgressOf(p);
    absl::StrAppendFormat(&text, kRow, absl::StrCat(p.process()), RoleName(p.role()),
                          absl::StrCat(p.rank()), p.node_id().empty() ? "-" : p.node_id(),
                          p.state(), Age(p.heard_ms_ago()), absl::StrCat(p.collectives()),
                          progress.committed, progress.phase, progress.rounds, progress.bytes,
                          p.detail());
    if (p.state() == "missing" || p.state() == "lost") {
      missing.push_back(absl::StrCat(RoleName(p.role()), " rank ", p.rank(), " (process ",
                                     p.process(), ", ", p.state(), ")"));
    }
  }
  absl::StrAppend(&text, "missing: ", missing.empty() ? "none" : absl::StrJoin(missing, ", "),
                  "\n");
  for (const control::RefusalNote& r : body.refused()) {
    absl::StrAppendFormat(&text, "refused: %s, %s ago\n", r.text(), Age(r.age_ms()));
  }
  return text;
}

std::string StatusJson(const control::JobStatusBody& body) {
  std::vector<std::string> processes, missing, refused;
  for (const control::ProcessStatus& p : body.processes()) {
    processes.push_back(absl::StrFormat(
        "{\"process\":%d,\"role\":%s,\"rank\":%d,\"node\":%s,\"state\":%s,\"detail\":%s,"
        "\"heard_s_ago\":%s,\"collectives\":%d,\"progress\":%s}",
        p.process(), JsonString(RoleName(p.role())), p.rank(), JsonString(p.node_id()),
        JsonString(p.state()), JsonString(p.detail()),
        p.heard_ms_ago() < 0
            ? "null"
            : absl::StrFormat("%.3f", static_cast<double>(p.heard_ms_ago()) / 1000),
        p.collectives(), ProgressJson(p)));
    if (p.state() == "missing" || p.state() == "lost") missing.push_back(absl::StrCat(p.process()));
  }
  for (const control::RefusalNote& r : body.refused()) {
    refused.push_back(absl::StrFormat("{\"text\":%s,\"s_ago\":%.3f}", JsonString(r.text()),
                                      static_cast<double>(r.age_ms()) / 1000));
  }
  return absl::StrFormat(
      "{\"job\":%s,\"trainers\":%d,\"rollouts\":%d,\"rendezvous\":%s,\"joined\":%d,"
      "\"open_collectives\":%d,\"processes\":[%s],\"missing\":[%s],\"refused\":[%s]}\n",
      JsonString(body.job_id()), body.num_trainers(), body.num_rollouts(),
      JsonString(body.rendezvous()), body.joined(), body.open_collectives(),
      absl::StrJoin(processes, ","), absl::StrJoin(missing, ","), absl::StrJoin(refused, ","));
}

std::string StatusUsage() {
  return "usage: wsync status --coordinator HOST:PORT --job J (--secret_file F | --secret_env V)\n"
         "                    [--json] [--watch S] [--status_timeout_s S]\n"
         "  Asks a running job's coordinator (authenticated with the job secret, read-only)\n"
         "  for every process's state, when it was last heard, its committed version and sync\n"
         "  progress (phase, rounds, bytes), and who is missing or refused.\n";
}

int StatusMain(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  auto fail = [](const absl::Status& status) {
    absl::FPrintF(stderr, "wsync status: %s\n", status.ToString());
    return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  };
  StatusQuery query;
  if (absl::Status parsed = ParseCoordinator(absl::GetFlag(FLAGS_coordinator), query);
      !parsed.ok()) {
    return fail(parsed);
  }
  const std::string file = absl::GetFlag(FLAGS_secret_file);
  const std::string env = absl::GetFlag(FLAGS_secret_env);
  if (file.empty() == env.empty()) {
    return fail(absl::InvalidArgumentError("give exactly one of --secret_file and --secret_env"));
  }
  absl::StatusOr<std::string> secret =
      LoadSecret(file.empty() ? SecretSource::Environment(env) : SecretSource::File(file));
  if (!secret.ok()) return fail(secret.status());
  query.secret = *std::move(secret);
  query.job_id = absl::GetFlag(FLAGS_job);
  const double watch = absl::GetFlag(FLAGS_watch);
  for (;;) {
    query.deadline = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_status_timeout_s));
    absl::StatusOr<control::JobStatusBody> body = QueryJobStatus(query);
    if (!body.ok()) {
      WipeSecret(query.secret);
      return fail(body.status());
    }
    absl::PrintF("%s", absl::GetFlag(FLAGS_json) ? StatusJson(*body) : StatusText(*body));
    std::fflush(stdout);
    if (watch <= 0) break;
    absl::SleepFor(absl::Seconds(watch));
  }
  WipeSecret(query.secret);
  return 0;
}

}  // namespace wsync::cli
