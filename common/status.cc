#include "common/status.h"

#include <exception>
#include <new>

#include "absl/strings/str_cat.h"

namespace wsync {

ErrorClass ClassifyError(const absl::Status& status) {
  if (const std::optional<std::string> kind = ErrorKind(status)) {
    if (*kind == kErrorWrongState) return ErrorClass::kWrongState;
    if (*kind == kErrorLayoutRefused) return ErrorClass::kLayoutRefused;
    if (*kind == kErrorRanksDisagree) return ErrorClass::kRanksDisagree;
    if (*kind == kErrorAuthentication) return ErrorClass::kAuthentication;
    // An unknown kind falls through to the code.
  }
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kNotFound:
      return ErrorClass::kInvalidArgument;
    case absl::StatusCode::kDeadlineExceeded:
      return ErrorClass::kTimedOut;
    case absl::StatusCode::kUnavailable:
      return ErrorClass::kPeerLost;
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kCancelled:
      return ErrorClass::kAborted;
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
      return ErrorClass::kAuthentication;
    case absl::StatusCode::kUnimplemented:
      return ErrorClass::kUnsupported;
    case absl::StatusCode::kResourceExhausted:
      return ErrorClass::kNoMemory;
    case absl::StatusCode::kDataLoss:
      return ErrorClass::kDataLoss;
    default:
      return ErrorClass::kInternal;
  }
}

}  // namespace wsync

namespace wsync {

absl::Status StatusOfCurrentException(absl::string_view where) {
  try {
    throw;
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(where, ": out of memory"));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(where, ": internal error: exception: ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat(where, ": internal error: unknown exception"));
  }
}

}  // namespace wsync
