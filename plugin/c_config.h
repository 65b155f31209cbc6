#ifndef WSYNC_PLUGIN_C_CONFIG_H_
#define WSYNC_PLUGIN_C_CONFIG_H_

// Conversions between the C ABI's types (include/wsync/wsync.h) and the Session's: the config
// struct into a SessionConfig, a Session status into a wsync_status_t. Internal to libwsync.so
// (c_api.cc); pure functions, thread-safe.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "plugin/session.h"
#include "wsync/wsync.h"

namespace wsync {

// The smallest config the ABI accepts: every field up to job_id, the last one without a default
// (role, rank, the world sizes and the job id must be given).
inline constexpr size_t kMinConfigSize = offsetof(wsync_config_t, job_id) + sizeof(const char*);
// The smallest stats struct: struct_size and version.
inline constexpr size_t kMinStatsSize = offsetof(wsync_stats_t, version) + sizeof(int64_t);
// The smallest progress struct: struct_size and version.
inline constexpr size_t kMinProgressSize = offsetof(wsync_progress_t, version) + sizeof(int64_t);

// OK when a caller's `struct_size` reaches `minimum`; else InvalidArgument naming
// "<argument>->struct_size" and `type`.
inline absl::Status CheckStructSize(size_t struct_size, size_t minimum, absl::string_view argument,
                                    absl::string_view type) {
  if (struct_size >= minimum) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(argument, "->struct_size is ", struct_size,
                                                 "; set it to sizeof(", type, ") (at least ",
                                                 minimum, ")"));
}

// Copies `full` into the caller's `out` (both start with struct_size): every byte after
// struct_size up to the smaller of out.struct_size and sizeof(Struct); the rest of `out` is left.
template <typename Struct>
void CopyPrefix(const Struct& full, Struct& out) {
  const size_t end = std::min(out.struct_size, sizeof(Struct));
  std::memcpy(reinterpret_cast<char*>(&out) + sizeof(size_t),
              reinterpret_cast<const char*>(&full) + sizeof(size_t), end - sizeof(size_t));
}

// The integer a C host stored in an enum-typed field or argument. C lets a host store any int
// there; reading a value that is no enumerator through the C++ enum type is undefined behaviour
// (UBSan: "not a valid value for type"), so the argument checks read the representation.
template <typename Enum>
int EnumValue(const Enum& value) {
  static_assert(sizeof(Enum) == sizeof(int));
  int raw;
  std::memcpy(&raw, &value, sizeof(raw));
  return raw;
}

// The SessionConfig of a config already copied into a zeroed full-size struct: defaults for zero
// and NULL fields, and the checks that the conversion itself needs (enums, NULL strings, port
// range, NaN or negative numbers, reserved fields). Session::Create checks the rest (ranks, world
// sizes, who may host the coordinator, whether a port is needed) and loads the secret.
absl::StatusOr<SessionConfig> ToSessionConfig(const wsync_config_t& c);

// The ABI status of a failed Session call (OK for OK), from its class (ClassifyError,
// common/status.h): wrong_state -> INVALID_ARGUMENT, data_loss -> INTERNAL, every other class to
// the code of the same name. A secret that cannot be loaded at init carries the authentication
// kind (Session::Create).
wsync_status_t ToWsyncStatus(const absl::Status& status);

}  // namespace wsync

#endif  // WSYNC_PLUGIN_C_CONFIG_H_
