// Rendezvous progress of the coordinator: who joined, who is missing, and which identified peers
// were refused, told to the processes waiting for the roster (control.proto: RendezvousProgress)
// and named in the rendezvous' own failure. Part of the protocol core (coordinator_core.h).

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "control/coordinator_core.h"

namespace wsync {
namespace {

using coordinator_internal::kMaxListed;
using coordinator_internal::kMaxRememberedRefusals;
using coordinator_internal::kProgressInterval;

std::string WithoutPrefix(absl::string_view message) {
  absl::ConsumePrefix(&message, "control: ");
  return std::string(message);
}

}  // namespace

void CoordinatorCore::NoteRefusal(const Connection& c, const absl::Status& status, absl::Time now) {
  std::string who;
  if (c.process >= 0 && c.phase != Phase::kHandshake) {
    who = Describe(c.process);  // Authenticated: the identity is known.
  } else if (!c.claim.empty()) {
    who = absl::StrCat(c.claim, " claimed by a connection from ", c.peer);
  } else {
    return;  // A peer that never said who it is (a scanner, a flood): counted, not named.
  }
  refusals_.push_back(RefusalRecord{
      now, TruncateText(absl::StrCat(who, " was refused: ", WithoutPrefix(status.message())),
                        kMaxReasonBytes / kMaxRememberedRefusals)});
  if (refusals_.size() > kMaxRememberedRefusals) refusals_.pop_front();
  if (!rendezvous_done_) progress_changed_ = true;
}

std::vector<std::string> CoordinatorCore::MissingProcesses() const {
  std::vector<std::string> missing;
  for (int32_t id = 0; id < world_; ++id) {
    const Process& p = processes_[id];
    if (p.joined) continue;
    missing.push_back(absl::StrCat(Describe(id), p.connection != nullptr
                                                     ? " connected but did not join"
                                                 : p.left ? " joined, then left"
                                                          : ""));
  }
  return missing;
}

std::string CoordinatorCore::RefusalsText(absl::Time now) const {
  if (refusals_.empty()) return "";
  std::vector<std::string> notes;
  for (const RefusalRecord& r : refusals_) {
    notes.push_back(absl::StrFormat("%s, %.1f s ago", r.text, absl::ToDoubleSeconds(now - r.when)));
  }
  return absl::StrCat("; refused: ", absl::StrJoin(notes, "; "));
}

absl::Time CoordinatorCore::NextProgress() const {
  if (!progress_changed_ || rendezvous_done_ || rendezvous_failed_) return absl::InfiniteFuture();
  return next_progress_;
}

void CoordinatorCore::ReportProgress(absl::Time now) {
  if (now < NextProgress()) return;
  progress_changed_ = false;
  next_progress_ = now + kProgressInterval;
  control::Frame frame;
  control::RendezvousProgress* progress = frame.mutable_rendezvous_progress();
  progress->set_joined(joined_count_);
  progress->set_expected(world_);
  for (int32_t id = 0; id < world_; ++id) {
    if (processes_[id].joined && progress->joined_processes_size() < kMaxListed) {
      progress->add_joined_processes(Describe(id));
    }
  }
  std::vector<std::string> missing = MissingProcesses();
  missing.resize(std::min(missing.size(), kMaxListed));
  for (std::string& m : missing) progress->add_missing_processes(std::move(m));
  for (const RefusalRecord& r : refusals_) {
    control::RefusalNote* note = progress->add_refused();
    note->set_text(r.text);
    note->set_age_ms(absl::ToInt64Milliseconds(now - r.when));
  }
  auto encoded = PrepareFrame(frame, options_.max_frame_bytes);
  if (!encoded.ok()) return;  // Bounded lists: far below any frame cap the options allow.
  auto shared = *std::move(encoded);
  for (const Process& p : processes_) {
    const Connection* c = p.connection;
    if (!p.joined || c == nullptr || !c->open || !c->rendezvous_progress) continue;
    Enqueue(*c, shared);
  }
}

}  // namespace wsync
