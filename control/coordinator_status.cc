// The coordinator's refusal names and counters, and `wsync status`: an authenticated, read-only
// StatusRequest in place of a Hello is answered with one JobStatus (control.proto) built from what
// the coordinator already knows, and the connection is closed. Part of the protocol core
// (coordinator_core.h).

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "control/auth.h"
#include "control/coordinator_core.h"
#include "control/sync_progress_wire.h"

namespace wsync {

absl::string_view RefusalReasonName(RefusalReason reason) {
  switch (reason) {
    case RefusalReason::kAuthenticationFailed:
      return "authentication_failed";
    case RefusalReason::kUnknownJob:
      return "unknown_job";
    case RefusalReason::kRankOutOfRange:
      return "rank_out_of_range";
    case RefusalReason::kDuplicateRank:
      return "duplicate_rank";
    case RefusalReason::kBadField:
      return "bad_field";
    case RefusalReason::kProtocolVersion:
      return "protocol_version";
    case RefusalReason::kOversizedFrame:
      return "oversized_frame";
    case RefusalReason::kTruncatedFrame:
      return "truncated_frame";
    case RefusalReason::kMalformedFrame:
      return "malformed_frame";
    case RefusalReason::kUnexpectedFrame:
      return "unexpected_frame";
    case RefusalReason::kHandshakeTimeout:
      return "handshake_timeout";
    case RefusalReason::kFrameTimeout:
      return "frame_timeout";
    case RefusalReason::kTooManyConnections:
      return "too_many_connections";
    case RefusalReason::kRendezvousClosed:
      return "rendezvous_closed";
    case RefusalReason::kTooFarAhead:
      return "too_far_ahead";
  }
  return "unknown";
}

int64_t CoordinatorCounters::TotalRefused() const {
  int64_t total = 0;
  for (int64_t n : refused) total += n;
  return total;
}

void CoordinatorCore::HandleStatusRequest(Connection& c, const control::StatusRequest& request,
                                          absl::Time now) {
  c.claim = "a status query";
  if (request.client_nonce().size() != kNonceBytes || request.mac().size() != kMacBytes) {
    return Refuse(c, RefusalReason::kBadField,
                  absl::InvalidArgumentError("control: bad nonce or MAC length"), now);
  }
  const std::string expected =
      StatusRequestMac(options_.secret, c.nonce, request.client_nonce(), request.job_id());
  if (!ConstantTimeEquals(expected, request.mac())) {
    return Refuse(c, RefusalReason::kAuthenticationFailed,
                  absl::UnauthenticatedError("control: authentication failed"), now);
  }
  if (request.job_id() != options_.job_id) {
    return Refuse(c, RefusalReason::kUnknownJob,
                  absl::InvalidArgumentError(
                      absl::StrCat("control: unknown job id '", request.job_id(), "'")),
                  now);
  }
  {
    absl::MutexLock lock(&mu_);
    ++counters_.status_queries;
  }
  const std::string body = StatusBody(now).SerializeAsString();
  control::Frame frame;
  control::JobStatus* status = frame.mutable_job_status();
  status->set_mac(StatusReplyMac(options_.secret, request.client_nonce(), c.nonce, body));
  status->set_body(body);
  Send(c, frame);
  CloseAfterWrites(c, now, std::nullopt, "status query answered");
}

control::JobStatusBody CoordinatorCore::StatusBody(absl::Time now) const {
  control::JobStatusBody body;
  body.set_job_id(options_.job_id);
  body.set_num_trainers(options_.num_trainers);
  body.set_num_rollouts(options_.num_rollouts);
  if (rendezvous_done_) {
    body.set_rendezvous("done");
  } else if (rendezvous_failed_) {
    absl::MutexLock lock(&mu_);
    body.set_rendezvous(std::string(rendezvous_status_.message()));
  } else {
    body.set_rendezvous("pending");
  }
  body.set_joined(joined_count_);
  body.set_open_collectives(rounds_.size());
  for (int32_t id = 0; id < world_; ++id) {
    const Process& p = processes_[id];
    control::ProcessStatus* s = body.add_processes();
    s->set_process(id);
    s->set_role(RoleToProto(p.role));
    s->set_rank(p.rank);
    s->set_node_id(p.node_id);
    if (p.lost) {
      s->set_state("lost");
      s->set_detail(p.lost_reason);
    } else if (p.joined) {
      s->set_state("joined");
    } else {
      s->set_state(p.connection != nullptr ? "connected" : "missing");
    }
    const Connection* c = p.connection;
    s->set_heard_ms_ago(c != nullptr && c->heartbeats && c->last_heard <= now
                            ? absl::ToInt64Milliseconds(now - c->last_heard)
                            : -1);
    s->set_collectives(p.next_number);
    if (p.progress.has_value()) *s->mutable_progress() = *p.progress;
  }
  for (const RefusalRecord& r : refusals_) {
    control::RefusalNote* note = body.add_refused();
    note->set_text(r.text);
    note->set_age_ms(absl::ToInt64Milliseconds(now - r.when));
  }
  return body;
}

namespace {

// Rounds and bytes of a report, bounded before any sum: [0, 2^50].
int64_t Bounded(int64_t value) { return std::clamp<int64_t>(value, 0, int64_t{1} << 50); }

// Adds (sign 1) or removes (sign -1) one process's report from the counters' sums.
void Account(const control::SyncProgress& progress, int sign, CoordinatorCounters& counters) {
  if (progress.phase() >= 0 && progress.phase() < kSyncPhaseCount) {
    counters.in_phase[progress.phase()] += sign;
  }
  counters.sync_bytes_done += sign * progress.bytes_done();
  counters.sync_bytes_total += sign * progress.bytes_total();
}

}  // namespace

void CoordinatorCore::NoteProgress(const Connection& c, control::Heartbeat& heartbeat) {
  if (c.process < 0 || c.process >= world_ || !heartbeat.has_progress()) return;
  // Only the known fields are kept (never the unknown ones a peer may add, of any size): a report
  // costs the same few bytes here and in every status reply.
  const control::SyncProgress& sent = heartbeat.progress();
  control::SyncProgress report;
  report.set_version(sent.version());
  report.set_phase(sent.phase());
  report.set_rounds_done(Bounded(sent.rounds_done()));
  report.set_rounds_total(Bounded(sent.rounds_total()));
  report.set_bytes_done(Bounded(sent.bytes_done()));
  report.set_bytes_total(Bounded(sent.bytes_total()));
  report.set_committed_version(sent.committed_version());
  std::optional<control::SyncProgress>& kept = processes_[c.process].progress;
  absl::MutexLock lock(&mu_);
  if (kept.has_value()) Account(*kept, -1, counters_);
  kept = std::move(report);
  Account(*kept, 1, counters_);
}

std::string CoordinatorCore::LastProgressNote(int32_t id) const {
  if (id < 0 || id >= world_ || !processes_[id].progress.has_value()) return "";
  return absl::StrCat("; it last reported: ", DescribeSyncProgress(*processes_[id].progress));
}

}  // namespace wsync
