#ifndef WSYNC_PLUGIN_SETTINGS_H_
#define WSYNC_PLUGIN_SETTINGS_H_

// The settings of a session: one table (Settings()), one row per setting of the C ABI's config
// (wsync_config_t, include/wsync/wsync.h), each with its name (the field's), type, default, the
// environment variable that can replace the default, and a line of help. Each default is defined
// once: here, or where a lower folder needs it (the staging budget in executor/schedule.h, the
// heartbeats in control/coordinator.h), and the table and every other user take that constant.
// `wsync settings` prints the table with the values in effect (like `ucx_info -c`).
//
// Precedence, for each setting: the field as the host set it (nonzero, non-NULL) > the setting's
// environment variable (WSYNC_<NAME>) > the default. A zero or NULL field, and every field past the
// caller's struct_size, is unset (so a host cannot pin verify or delta to 0 against the
// environment). A variable whose value does not parse, or lies outside the setting's range, is
// refused: InvalidArgument (WSYNC_INVALID_ARGUMENT at init) naming the variable, never ignored.
//
// Fields that are not settings (no row): struct_size; role, rank, num_trainers, num_rollouts,
// host_coordinator, has_device_index and device_index (who this process is in the job: never
// from an environment that a node's processes share); job_id (required, no default);
// secret_length (part of secret). The secret's rows (secret_file, secret_env, secret) have no
// variable of their own, and a secret is never printed: only whether one is given.
//
// Thread-safe: the table is immutable; the environment is read with getenv.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace wsync {

// Defaults defined here (the others: kDefaultStagingBudgetBytes, executor/schedule.h;
// kDefaultHeartbeatInterval and kDefaultSilenceLimit, control/coordinator.h).
inline constexpr absl::string_view kDefaultCoordinatorHost = "127.0.0.1";
inline constexpr absl::string_view kDefaultSecretEnv = "WSYNC_SECRET";
inline constexpr double kDefaultDeadlineSeconds = 60;
inline constexpr absl::string_view kDefaultReplicaPolicy = "local_first_least_loaded";
inline constexpr int64_t kDefaultDeltaBudgetBytes = int64_t{16} << 30;

enum class SettingType {
  kBool,     // int32_t field; 0 or 1 ("true"/"false", "yes"/"no", "on"/"off" in a variable).
  kPort,     // int32_t field; a TCP port, 1..65535 in a variable.
  kBytes,    // int64_t field; at least 1 in a variable.
  kSeconds,  // double field; finite and positive in a variable.
  kEnum,     // int32_t field; a choice's index or name.
  kString,   // const char* field; non-empty in a variable.
  kSecret,   // The secret's bytes: never read from a variable, never printed.
};

// kBool, kPort, kBytes, kEnum: int64_t; kSeconds: double; kString: the text (empty: none).
using SettingValue = std::variant<int64_t, double, std::string>;

struct Setting {
  absl::string_view name;  // The wsync_config_t field.
  SettingType type;
  size_t offset;               // offsetof(wsync_config_t, name).
  SettingValue default_value;  // What an unset field takes when no variable is set.
  absl::string_view variable;  // "WSYNC_<NAME>"; empty: none.
  absl::string_view help;      // One line.
  // How the default reads where its value says nothing ("the host name", "none"); empty: the
  // value itself.
  absl::string_view default_note = {};
  absl::Span<const absl::string_view> choices = {};  // kEnum: the names of 0, 1, ...
};

// Every setting, in wsync_config_t's order.
absl::Span<const Setting> Settings();
// The row of `name`; nullptr when there is none.
const Setting* FindSetting(absl::string_view name);

// `text` as a value of `setting` (a variable's syntax, above); InvalidArgument saying what the
// setting takes otherwise (the caller names where the text came from).
absl::StatusOr<SettingValue> ParseSettingValue(const Setting& setting, absl::string_view text);
// The value as people read it: bytes with their binary unit ("67108864 (64 MiB)"), a choice by
// name, an empty string as the default note or "none".
std::string FormatSettingValue(const Setting& setting, const SettingValue& value);

// A row's texts as the C ABI's setting_info hands them out and host programs show them: the type's
// name (SettingTypeName), the default as its variable takes it (SettingVariableText), the choices
// comma-separated; empty strings for none.
struct SettingTexts {
  std::string name, type, default_value, default_note, variable, help, choices;
};
SettingTexts DescribeSettingTexts(const Setting& setting);

// The value as the setting's variable takes it (what ParseSettingValue reads back): a number, a
// choice by name, the text; "" for none (an empty text, port 0) and for the secret.
std::string SettingVariableText(const Setting& setting, const SettingValue& value);
// The type's name as the C ABI's setting_info gives it: "bool", "port", "bytes", "seconds",
// "choice", "text", "secret".
absl::string_view SettingTypeName(SettingType type);

// The value of `setting`'s variable in the environment: nullopt when the setting has none or it is
// unset; InvalidArgument "WSYNC_X='text': ..." when it does not parse.
absl::StatusOr<std::optional<SettingValue>> SettingFromEnvironment(const Setting& setting);

// The table with the values in effect for a host that sets no field (each variable's, else the
// default), the way `ucx_info -c` prints UCX's: per setting its name, type, help, default and where
// the value comes from, then `WSYNC_<NAME>=value`; a setting without a variable as a comment line;
// the secret only as whether WSYNC_SECRET is set. A variable that is refused is printed with the
// reason, and the first refusal returned (the text is complete either way).
absl::Status SettingsText(std::string* text);

}  // namespace wsync

#endif  // WSYNC_PLUGIN_SETTINGS_H_
