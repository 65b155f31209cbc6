// Collective rounds of the coordinator: numbering, completion, per-contributor deadlines,
// failures and the bound on open rounds. Part of the protocol core (coordinator_core.h).

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "control/coordinator_core.h"

namespace wsync {
namespace {

using coordinator_internal::ListOf;

absl::string_view KindName(int kind) { return CollectiveName(kind); }

std::string CallName(int kind, int32_t root) {
  if (kind == control::COLLECTIVE_BROADCAST) return absl::StrCat("Broadcast(root ", root, ")");
  return std::string(KindName(kind));
}

}  // namespace

bool CoordinatorCore::AdmitContribution(Connection& c, const control::Contribute& contribute,
                                        absl::Time now) {
  const int32_t id = c.process;
  const Process& p = processes_[id];
  const uint64_t number = contribute.number();
  const int kind = contribute.kind();
  if (number != p.next_number) {
    Refuse(c, RefusalReason::kUnexpectedFrame,
           absl::FailedPreconditionError(absl::StrCat("control: collective #", number, " where #",
                                                      p.next_number, " was expected")),
           now);
    return false;
  }
  if (kind < control::COLLECTIVE_ALL_GATHER || kind > control::COLLECTIVE_DECIDE ||
      static_cast<int64_t>(contribute.reason().size()) > kMaxReasonBytes ||
      contribute.timeout_ms() < 0 ||
      (kind == control::COLLECTIVE_BROADCAST &&
       (contribute.root() < 0 || contribute.root() >= world_))) {
    Refuse(c, RefusalReason::kBadField,
           absl::InvalidArgumentError(
               absl::StrCat("control: bad contribution to collective #", number,
                            " (kind, root, reason length or timeout out of range)")),
           now);
    return false;
  }
  // Bounded work after authentication: a few unanswered contributions and a byte cap per process.
  int32_t unanswered = 0;
  int64_t held = static_cast<int64_t>(contribute.payload().size());
  for (const auto& [open_number, open] : rounds_) {
    if (open.contributed.empty()) continue;
    if (open.contributed[id] && !open.answered[id]) ++unanswered;
    held += static_cast<int64_t>(open.payloads[id].size());
  }
  if (unanswered >= options_.max_rounds_ahead || held > options_.max_held_bytes_per_process) {
    Refuse(c, RefusalReason::kTooFarAhead,
           absl::ResourceExhaustedError(
               absl::StrCat("control: collective #", number, " would leave ", unanswered + 1,
                            " contributions unanswered (at most ", options_.max_rounds_ahead,
                            ") holding ", held, " payload bytes (at most ",
                            options_.max_held_bytes_per_process, ") on the coordinator")),
           now);
    return false;
  }
  return true;
}

void CoordinatorCore::HandleContribute(Connection& c, control::Contribute& contribute,
                                       absl::Time now) {
  if (!AdmitContribution(c, contribute, now)) return;
  const int32_t id = c.process;
  Process& p = processes_[id];
  const uint64_t number = contribute.number();
  const int kind = contribute.kind();
  ++p.next_number;
  const std::string name = absl::StrCat(KindName(kind), " #", number);
  if (number < forgotten_below_) {
    return AnswerStatus(id, number,
                        absl::AbortedError(absl::StrCat(name, " was forgotten: more than ",
                                                        options_.max_open_rounds,
                                                        " collectives were open at once")));
  }
  auto [it, created] = rounds_.try_emplace(number);
  Round& r = it->second;
  if (created) {
    r.contributed.assign(world_, 0);
    r.answered.assign(world_, 0);
    r.expiry.assign(world_, absl::InfiniteFuture());
    r.payloads.resize(world_);
  }
  r.contributed[id] = 1;
  ++r.count;
  if (!r.failure.ok()) {
    AnswerStatus(id, number, r.failure);
    if (r.count == world_) rounds_.erase(number);
    return;
  }
  if (r.first < 0) {
    r.kind = kind;
    r.root = contribute.root();
    r.first = id;
  } else if (r.kind != kind ||
             (kind == control::COLLECTIVE_BROADCAST && r.root != contribute.root())) {
    return FailRound(number, absl::InvalidArgumentError(absl::StrCat(
                                 "collective #", number, ": ", Describe(id), " called ",
                                 CallName(kind, contribute.root()), " but ", Describe(r.first),
                                 " called ", CallName(r.kind, r.root))));
  }
  const std::string reason = contribute.reason().empty() ? "no reason given" : contribute.reason();
  if (contribute.failed() && kind != control::COLLECTIVE_DECIDE) {
    return FailRound(
        number, absl::AbortedError(absl::StrCat(name, ": ", Describe(id), " failed: ", reason)));
  }
  if (kind == control::COLLECTIVE_ALL_GATHER ||
      (kind == control::COLLECTIVE_BROADCAST && id == r.root)) {
    r.payloads[id] = std::move(*contribute.mutable_payload());
  } else if (kind == control::COLLECTIVE_DECIDE && (!contribute.ok() || contribute.failed())) {
    // One "no" decides: every process, voted or still to vote, learns at once who refused.
    return FailRound(number, absl::AbortedError(
                                 absl::StrCat(name, ": aborted by ", Describe(id), ": ", reason)));
  }
  if (r.count == world_) return CompleteRound(number);
  std::vector<std::string> lost;
  for (int32_t q = 0; q < world_; ++q) {
    if (processes_[q].lost) {
      lost.push_back(absl::StrCat(Describe(q), " left the job (", processes_[q].lost_reason, ")"));
    }
  }
  if (!lost.empty()) {
    return FailRound(number, absl::UnavailableError(absl::StrCat(name, ": ", ListOf(lost))));
  }
  r.expiry[id] = now + absl::Milliseconds(contribute.timeout_ms());
  expiries_.emplace(r.expiry[id], number, id);
  EnforceRoundLimit();
}

void CoordinatorCore::Answer(int32_t id, uint64_t number,
                             std::shared_ptr<const OutgoingFrame> encoded) {
  auto it = rounds_.find(number);
  if (it != rounds_.end()) {
    Round& r = it->second;
    r.answered[id] = 1;
    expiries_.erase({r.expiry[id], number, id});
    r.expiry[id] = absl::InfiniteFuture();
  }
  Connection* c = processes_[id].connection;
  if (c != nullptr && c->open) Enqueue(*c, std::move(encoded));
}

void CoordinatorCore::AnswerStatus(int32_t id, uint64_t number, const absl::Status& status) {
  control::Frame frame;
  control::Result* result = frame.mutable_result();
  result->set_number(number);
  result->set_code(static_cast<int32_t>(status.code()));
  result->set_message(TruncateText(status.message(), kMaxReasonBytes * 4));
  // A status-only result is small; the cap cannot refuse it.
  auto encoded = PrepareFrame(frame, options_.max_frame_bytes);
  if (encoded.ok()) Answer(id, number, *std::move(encoded));
}

void CoordinatorCore::CompleteRound(uint64_t number) {
  Round& r = rounds_.at(number);
  const std::string name = absl::StrCat(KindName(r.kind), " #", number);
  control::Frame frame;
  control::Result* result = frame.mutable_result();
  result->set_number(number);
  if (r.kind == control::COLLECTIVE_ALL_GATHER) {
    for (std::string& payload : r.payloads) result->add_payloads(std::move(payload));
  } else if (r.kind == control::COLLECTIVE_BROADCAST) {
    result->add_payloads(std::move(r.payloads[r.root]));
  }
  auto encoded = PrepareFrame(frame, options_.max_frame_bytes);
  if (!encoded.ok()) {
    return FailRound(number,
                     absl::ResourceExhaustedError(absl::StrCat(
                         name, ": the result (", frame.ByteSizeLong(),
                         " bytes) exceeds the frame cap of ", options_.max_frame_bytes, " bytes")));
  }
  auto shared = *std::move(encoded);
  for (int32_t id = 0; id < world_; ++id) {
    if (!r.answered[id]) Answer(id, number, shared);
  }
  if (r.kind == control::COLLECTIVE_DECIDE) {
    WSYNC_LOG(kControl, kInfo, "coordinator: ", name, ": every process voted yes: commit");
  } else {
    WSYNC_LOG(kControl, kDebug, "coordinator: ", name, " completed");
  }
  rounds_.erase(number);
  absl::MutexLock lock(&mu_);
  ++counters_.rounds_completed;
}

void CoordinatorCore::FailRound(uint64_t number, const absl::Status& status) {
  Round& r = rounds_.at(number);
  WSYNC_LOG(kFault, kWarn, "coordinator: ", status.ToString());
  r.failure = status;
  r.payloads.assign(world_, std::string());
  for (int32_t id = 0; id < world_; ++id) {
    if (r.contributed[id] && !r.answered[id]) AnswerStatus(id, number, status);
  }
  if (r.count == world_) rounds_.erase(number);
  absl::MutexLock lock(&mu_);
  ++counters_.rounds_failed;
}

void CoordinatorCore::ExpireContributor(uint64_t number, int32_t id) {
  auto it = rounds_.find(number);
  if (it == rounds_.end()) {  // Not expected: entries leave with their round. Stay live anyway.
    for (auto e = expiries_.begin(); e != expiries_.end();) {
      e = std::get<1>(*e) == number ? expiries_.erase(e) : std::next(e);
    }
    return;
  }
  const Round& r = it->second;
  std::vector<std::string> missing;
  for (int32_t q = 0; q < world_; ++q) {
    if (!r.contributed[q]) missing.push_back(Describe(q));
  }
  // Once one contributor gave up the round cannot complete for everyone: it fails for all, and a
  // process that contributes later learns that at once (instead of completing the round alone
  // with what the others left, which would put it one round out of step with them).
  FailRound(number, absl::DeadlineExceededError(absl::StrCat(
                        KindName(r.kind), " #", number, ": ", missing.size(), " of ", world_,
                        " processes did not contribute before the deadline: ", ListOf(missing))));
}

void CoordinatorCore::OnProcessLost(int32_t id) {
  std::vector<uint64_t> waiting;
  for (const auto& [number, r] : rounds_) {
    if (r.failure.ok()) waiting.push_back(number);
  }
  const Process& p = processes_[id];
  for (uint64_t number : waiting) {
    FailRound(number, absl::UnavailableError(absl::StrCat(KindName(rounds_.at(number).kind), " #",
                                                          number, ": ", Describe(id),
                                                          " left the job (", p.lost_reason, ")")));
  }
}

void CoordinatorCore::EnforceRoundLimit() {
  while (static_cast<int64_t>(rounds_.size()) > options_.max_open_rounds) {
    const uint64_t oldest = rounds_.begin()->first;
    if (rounds_.begin()->second.failure.ok()) {
      FailRound(oldest, absl::AbortedError(absl::StrCat(
                            "collective #", oldest, " was forgotten: more than ",
                            options_.max_open_rounds, " collectives were open at once")));
    }
    rounds_.erase(oldest);  // Every contributor was answered.
    forgotten_below_ = std::max(forgotten_below_, oldest + 1);
  }
}

}  // namespace wsync
