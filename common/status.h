#ifndef WSYNC_COMMON_STATUS_H_
#define WSYNC_COMMON_STATUS_H_

// Status propagation macros. Abseil 20220623 ships absl::Status and absl::StatusOr but no macros.
//
//   WSYNC_RETURN_IF_ERROR(expr);            // returns the status of `expr` when it is not OK
//   WSYNC_ASSIGN_OR_RETURN(auto x, expr);   // `expr` is a StatusOr<T>; on error returns its status
//
// Both evaluate `expr` exactly once. They may be used in functions returning absl::Status or any
// absl::StatusOr<U>.

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define WSYNC_STATUS_CONCAT_INNER_(a, b) a##b
#define WSYNC_STATUS_CONCAT_(a, b) WSYNC_STATUS_CONCAT_INNER_(a, b)

#define WSYNC_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::absl::Status wsync_status_ = (expr);         \
    if (!wsync_status_.ok()) return wsync_status_; \
  } while (0)

#define WSYNC_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr)  \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#define WSYNC_ASSIGN_OR_RETURN(lhs, expr) \
  WSYNC_ASSIGN_OR_RETURN_IMPL_(WSYNC_STATUS_CONCAT_(wsync_statusor_, __LINE__), lhs, expr)

#include <optional>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"

namespace wsync {

// An error's kind beyond its code, for callers that must tell apart errors sharing a code (the C
// ABI maps kinds to its status codes). Carried as a status payload, so it survives copies.
inline constexpr absl::string_view kErrorKindUrl = "type.wsync/error_kind";
inline constexpr absl::string_view kErrorLayoutRefused = "layout_refused";
inline constexpr absl::string_view kErrorRanksDisagree = "ranks_disagree";
inline constexpr absl::string_view kErrorWrongState = "wrong_state";
// The process's own secret could not be loaded (missing variable or file, unusable content).
inline constexpr absl::string_view kErrorAuthentication = "authentication";

// `status` (unchanged when OK) with its kind set.
inline absl::Status WithErrorKind(absl::Status status, absl::string_view kind) {
  if (!status.ok()) status.SetPayload(kErrorKindUrl, absl::Cord(kind));
  return status;
}

// The kind set by WithErrorKind, if any.
inline std::optional<std::string> ErrorKind(const absl::Status& status) {
  absl::optional<absl::Cord> kind = status.GetPayload(kErrorKindUrl);
  if (!kind) return std::nullopt;
  return std::string(*kind);
}

// The bounded classes every failure falls into: the C ABI's status codes (plugin/c_api.cc) and
// the error kinds of wsync_errors_total (metrics) are both read from ClassifyError, the one
// mapping from a status to a class.
enum class ErrorClass {
  kWrongState,
  kLayoutRefused,
  kRanksDisagree,
  kInvalidArgument,
  kTimedOut,
  kPeerLost,
  kAborted,
  kAuthentication,
  kUnsupported,
  kNoMemory,
  kDataLoss,
  kInternal,
};
inline constexpr int kErrorClassCount = static_cast<int>(ErrorClass::kInternal) + 1;
// Each class's lower-case name, in the enum's order: the label values of wsync_errors_total.
inline constexpr absl::string_view kErrorClassNames[kErrorClassCount] = {
    "wrong_state", "layout_refused", "ranks_disagree", "invalid_argument", "timed_out", "peer_lost",
    "aborted",     "authentication", "unsupported",    "no_memory",        "data_loss", "internal"};

// The class of a failed `status`: its kind (WithErrorKind) when it is one of the kinds above,
// else by code: InvalidArgument, OutOfRange, AlreadyExists, FailedPrecondition, NotFound ->
// kInvalidArgument; DeadlineExceeded -> kTimedOut; Unavailable -> kPeerLost; Aborted, Cancelled
// -> kAborted; Unauthenticated, PermissionDenied -> kAuthentication; Unimplemented ->
// kUnsupported; ResourceExhausted -> kNoMemory; DataLoss -> kDataLoss; anything else (OK
// included) -> kInternal.
ErrorClass ClassifyError(const absl::Status& status);

// Inside a catch block: the exception being handled as a status, for the exception firewall of the
// library's threads (no exception leaves a thread the library starts): std::bad_alloc is
// ResourceExhausted, anything else Internal, the message naming `where` and the exception's what().
absl::Status StatusOfCurrentException(absl::string_view where);

// The class's name in kErrorClassNames.
inline absl::string_view ErrorClassName(ErrorClass error_class) {
  return kErrorClassNames[static_cast<int>(error_class)];
}

}  // namespace wsync

#endif  // WSYNC_COMMON_STATUS_H_
