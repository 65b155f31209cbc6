#ifndef WSYNC_CONTROL_RENDEZVOUS_PROGRESS_H_
#define WSYNC_CONTROL_RENDEZVOUS_PROGRESS_H_

// The text a process waiting for the roster adds to its timeout error, from the coordinator's
// latest RendezvousProgress (control.proto): who joined, who is missing, who was refused and when.

#include <string>

#include "absl/time/time.h"
#include "control/control.pb.h"

namespace wsync {

// "1 of 2 processes joined (process 0 (trainer rank 0, node a)); missing: process 1 (rollout rank
// 0); refused: rollout rank 0 claimed by a connection from 127.0.0.1:4242 was refused:
// authentication failed, 4.9 s ago", as of `received_ago` after the frame arrived (refusal ages
// grow by it). The wire's lists are untrusted: at most kMaxListedProgress entries of each, every
// text cut to kMaxProgressTextBytes, the counts only printed. Pure; any thread.
inline constexpr int kMaxListedProgress = 32;
inline constexpr size_t kMaxProgressTextBytes = 512;
std::string DescribeRendezvousProgress(const control::RendezvousProgress& progress,
                                       absl::Duration received_ago);

}  // namespace wsync

#endif  // WSYNC_CONTROL_RENDEZVOUS_PROGRESS_H_
