#ifndef WSYNC_CONTROL_STATUS_CLIENT_H_
#define WSYNC_CONTROL_STATUS_CLIENT_H_

// The client side of `wsync status`: one authenticated, read-only query of a job's coordinator
// (control.proto: StatusRequest, JobStatus). It never joins the job: the coordinator answers from
// what it knows and closes the connection.

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "control/control.pb.h"

namespace wsync {

struct StatusQuery {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string job_id;
  std::string secret;  // The job secret (LoadSecret); only its MACs leave this process.
  absl::Time deadline = absl::InfiniteFuture();
};

// The coordinator's JobStatusBody. Errors: DeadlineExceeded (no answer in time), Unavailable
// (cannot connect, or the connection ended), the coordinator's refusal (Unauthenticated for a
// wrong secret; FailedPrecondition "unexpected frame" from a coordinator from before `wsync
// status`), Unauthenticated when the answer's MAC does not prove the coordinator holds the secret,
// Internal for a malformed answer. Never names the secret. Thread-safe (no shared state).
absl::StatusOr<control::JobStatusBody> QueryJobStatus(const StatusQuery& query);

}  // namespace wsync

#endif  // WSYNC_CONTROL_STATUS_CLIENT_H_
