#ifndef WSYNC_PLUGIN_ROSTER_CHECK_H_
#define WSYNC_PLUGIN_ROSTER_CHECK_H_

// What a process checks of the roster the coordinator sent before it plans on it, so that a
// tampered roster (an on-path attacker, a coordinator bug) cannot turn into reads or writes past
// the host's real buffers: its own entry and manifest are the ones it sent, and everything it
// will touch lies in buffers it registered, with the sizes it registered (never a size from the
// wire). Every refusal is FailedPrecondition of kind layout_refused, before any byte moves.
//
// Pure functions; thread-safe.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "control/client.h"
#include "planner/job.h"
#include "planner/layout.h"
#include "planner/plan.h"

namespace wsync {

// The roster's entry for `process` (this process's global id) names this process's role and rank,
// and its manifest is byte for byte `sent_manifest`, the manifest this process joined with.
absl::Status CheckOwnRosterEntry(const Roster& roster, int32_t process, ControlRole role,
                                 int32_t rank, absl::string_view sent_manifest);

// Every buffer of `process` in the job is one of `registered` (this process's registrations: id,
// bytes, memory kind) with the same size and kind; every piece of `process` and every endpoint of a
// segment on `process` (other than a relay arena, which the executor allocates) lies inside the
// registered buffer it names.
absl::Status CheckOwnMemory(const Job& job, absl::Span<const Segment> segments, int32_t process,
                            absl::Span<const BufferInfo> registered);

}  // namespace wsync

#endif  // WSYNC_PLUGIN_ROSTER_CHECK_H_
