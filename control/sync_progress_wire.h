#ifndef WSYNC_CONTROL_SYNC_PROGRESS_WIRE_H_
#define WSYNC_CONTROL_SYNC_PROGRESS_WIRE_H_

// A process's sync progress (common/sync_progress.h) on the wire (control.proto: SyncProgress,
// sent with every heartbeat of a client that has one) and in words. Pure; any thread.

#include <string>

#include "common/sync_progress.h"
#include "control/control.pb.h"

namespace wsync {

// `progress`'s current values into `heartbeat.progress`; nothing when `progress` is null.
void ProgressToProto(const SyncProgress* progress, control::Heartbeat& heartbeat);

// "transferring version 5: round 3 of 10, 1.5 of 4.0 MiB; committed 4", "idle; committed 4",
// "idle; nothing committed yet". Values from the wire are shown as they are, never trusted.
std::string DescribeSyncProgress(const control::SyncProgress& progress);

}  // namespace wsync

#endif  // WSYNC_CONTROL_SYNC_PROGRESS_WIRE_H_
