#include "control/sync_progress_wire.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace wsync {

void ProgressToProto(const SyncProgress* progress, control::Heartbeat& heartbeat) {
  if (progress == nullptr) return;
  const SyncProgressSnapshot s = progress->Read();
  control::SyncProgress& out = *heartbeat.mutable_progress();
  out.set_version(s.version);
  out.set_phase(static_cast<control::SyncPhase>(s.phase));
  out.set_rounds_done(s.rounds_done);
  out.set_rounds_total(s.rounds_total);
  out.set_bytes_done(s.bytes_done);
  out.set_bytes_total(s.bytes_total);
  out.set_committed_version(s.committed_version);
}

std::string DescribeSyncProgress(const control::SyncProgress& progress) {
  constexpr double kMiB = 1024.0 * 1024.0;
  std::string text(SyncPhaseName(progress.phase()));
  if (progress.phase() != control::SYNC_PHASE_IDLE) {
    absl::StrAppend(&text, " version ", progress.version());
  }
  if (progress.phase() == control::SYNC_PHASE_TRANSFERRING ||
      progress.phase() == control::SYNC_PHASE_VERIFYING) {
    absl::StrAppendFormat(&text, ": round %d of %d, %.1f of %.1f MiB", progress.rounds_done(),
                          progress.rounds_total(), progress.bytes_done() / kMiB,
                          progress.bytes_total() / kMiB);
  }
  if (progress.committed_version() < 0) {
    absl::StrAppend(&text, "; nothing committed yet");
  } else {
    absl::StrAppend(&text, "; committed ", progress.committed_version());
  }
  return text;
}

}  // namespace wsync
