#ifndef WSYNC_PLUGIN_C_CONFIG_H_
#define WSYNC_PLUGIN_C_CONFIG_H_

// Conversions between the C ABI's types (include/wsync/wsync.h) and the Session's: the config
// struct into a SessionConfig, a Session status into a wsync_status_t. Internal to libwsync.so
// (c_api.cc); pure functions, thread-safe.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/dtype.h"
#include "planner/geometry.h"
#include "planner/layout.h"
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

// Copies `text` and its NUL into buffer[0, *size) with snprintf semantics: a smaller buffer gets
// a NUL-terminated prefix (nothing when *size is 0); *size becomes the bytes needed.
inline void CopyOut(const std::string& text, char* buffer, size_t* size) {
  if (buffer != nullptr && *size > 0) {
    const size_t count = std::min(text.size(), *size - 1);
    std::memcpy(buffer, text.data(), count);
    buffer[count] = '\0';
  }
  *size = text.size() + 1;
}

// The size-protocol arguments of schedule_report and metrics_text.
inline absl::Status CheckOutBuffer(const char* buffer, const size_t* size) {
  if (size == nullptr) return absl::InvalidArgumentError("size is NULL");
  if (buffer == nullptr && *size != 0) {
    return absl::InvalidArgumentError("buffer is NULL but *size is not 0");
  }
  return absl::OkStatus();
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

// The smallest wsync_fp8_parameter_t: every field (through scale_shape).
inline constexpr size_t kMinFp8ParameterSize =
    offsetof(wsync_fp8_parameter_t, scale_shape) + sizeof(const int64_t*);

// OK when `num_axes` is in 0..kMaxAxes and each array it names is non-null (NULL is fine for 0
// axes); else InvalidArgument naming the array.
absl::Status CheckAxes(int32_t num_axes,
                       std::initializer_list<std::pair<const char*, const void*>> arrays);

// The first `num_axes` values of `values` (checked by CheckAxes).
Dims ToDims(const int64_t* values, int32_t num_axes);

// A declare_fp8_parameter call's arguments as the Session takes them.
struct Fp8Declaration {
  std::string parameter;
  ParamQuant quant;  // Blocks from the scheme (quant/fp8.h kWholeAxis for a whole axis).
  DType scale_dtype = DType::kFloat32;
  Dims scale_shape;
};

// The Fp8Declaration of a caller's struct (of caller.struct_size bytes): the checks the ABI makes
// by itself (struct size, NULL strings and arrays, the scheme, block sizes, the scale dtype's
// name, the axis count). InvalidArgument naming the parameter otherwise. The Session checks the
// rest (DeclareFp8Parameter).
absl::StatusOr<Fp8Declaration> ToFp8Declaration(const wsync_fp8_parameter_t& caller);

// Each setting of `c` (plugin/settings.h) whose field is unset (zero or NULL) and whose variable
// is set in the environment, taken from the variable; the texts it stores live in `texts`, which
// must outlive the use of `c`. InvalidArgument naming the variable for a value that does not
// parse (only variables of unset fields are read).
absl::Status ApplyEnvironment(wsync_config_t& c, std::deque<std::string>& texts);

// The smallest wsync_setting_info_t: every field (through choices).
inline constexpr size_t kMinSettingInfoSize =
    offsetof(wsync_setting_info_t, choices) + sizeof(const char*);

// The C ABI's settings table (wsync.h: setting_count, setting_info, config_set), over Settings()
// (plugin/settings.h). The strings handed out live as long as the library. SettingCount never
// throws (0 when the table cannot be built: out of memory).
int32_t SettingCount() noexcept;
// Row `index` into the caller's `info` (up to info->struct_size); InvalidArgument naming the index
// and the count, a NULL info or a struct_size too small, with `info` untouched.
absl::Status DescribeSetting(int32_t index, wsync_setting_info_t* info);
// Parses `text` as setting `name`'s variable does and writes its field in `config` (a text field:
// the pointer `text`). InvalidArgument naming the setting, the text and what it takes, with
// `config` unchanged: NULL arguments, an unknown name, the secret, a field past
// config->struct_size, text that does not parse.
absl::Status SetConfigText(wsync_config_t* config, const char* name, const char* text);

// The SessionConfig of a config already copied into a zeroed full-size struct: the environment's
// values for unset settings (ApplyEnvironment), the table's defaults (plugin/settings.h) for the
// rest of the zero and NULL fields, and the checks that the conversion itself needs (enums, NULL
// strings, port range, NaN or negative numbers, reserved fields). Session::Create checks the rest
// (ranks, world sizes, who may host the coordinator, whether a port is needed, the heartbeats'
// bounds) and loads the secret.
absl::StatusOr<SessionConfig> ToSessionConfig(const wsync_config_t& c);

// The ABI status of a failed Session call (OK for OK), from its class (ClassifyError,
// common/status.h): wrong_state -> INVALID_ARGUMENT, data_loss -> INTERNAL, every other class to
// the code of the same name. A secret that cannot be loaded at init carries the authentication
// kind (Session::Create).
wsync_status_t ToWsyncStatus(const absl::Status& status);

}  // namespace wsync

#endif  // WSYNC_PLUGIN_C_CONFIG_H_
