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

}  // namespace wsync

#endif  // WSYNC_COMMON_STATUS_H_
