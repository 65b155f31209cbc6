#include "plugin/settings.h"

#include <cmath>
#include <cstdlib>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "control/coordinator.h"
#include "executor/schedule.h"
#include "wsync/wsync.h"

namespace wsync {
namespace {

constexpr absl::string_view kVerifyChoices[] = {"off", "hash", "keyed"};  // executor/verify.cc
constexpr absl::string_view kDeltaChoices[] = {"off", "auto", "on"};      // WSYNC_DELTA_OFF ...

std::vector<Setting> MakeSettings() {
  using T = SettingType;
  const auto text = [](absl::string_view value) { return SettingValue(std::string(value)); };
  const SettingValue none = std::string();
  return {
      {"coordinator_host", T::kString, offsetof(wsync_config_t, coordinator_host),
       text(kDefaultCoordinatorHost), "WSYNC_COORDINATOR_HOST",
       "The coordinator's host name or address (unless this process hosts it)."},
      {"coordinator_port", T::kPort, offsetof(wsync_config_t, coordinator_port), int64_t{0},
       "WSYNC_COORDINATOR_PORT",
       "The coordinator's TCP port; with host_coordinator the port it listens on.",
       "none: required, but with host_coordinator (any free port)"},
      {"secret_file", T::kString, offsetof(wsync_config_t, secret_file), none, "",
       "A file of mode 0600 holding the job secret (instead of secret_env or secret).", "none"},
      {"secret_env", T::kString, offsetof(wsync_config_t, secret_env), text(kDefaultSecretEnv), "",
       "The variable holding the job secret; init removes it from the environment."},
      {"node_id", T::kString, offsetof(wsync_config_t, node_id), none, "WSYNC_NODE_ID",
       "This process's node: processes of one node use the same-node transports.", "the host name"},
      {"staging_budget_bytes", T::kBytes, offsetof(wsync_config_t, staging_budget_bytes),
       kDefaultStagingBudgetBytes, "WSYNC_STAGING_BUDGET_BYTES",
       "Staging memory per peer and direction."},
      {"deadline_seconds", T::kSeconds, offsetof(wsync_config_t, deadline_seconds),
       kDefaultDeadlineSeconds, "WSYNC_DEADLINE_SECONDS",
       "The limit of every blocking step (connect, each step of a sync)."},
      {"replica_policy", T::kString, offsetof(wsync_config_t, replica_policy),
       text(kDefaultReplicaPolicy), "WSYNC_REPLICA_POLICY",
       "Which replica sends each piece: first_holder, local_first_least_loaded, cost_aware."},
      {"path_transports", T::kString, offsetof(wsync_config_t, path_transports), none,
       "WSYNC_PATH_TRANSPORTS",
       "Transports per path class, e.g. intra_node=ucx:sm,cma,self;inter_node=ucx:tcp.",
       "UCX's defaults"},
      {"metrics_address", T::kString, offsetof(wsync_config_t, metrics_address), none,
       "WSYNC_METRICS_ADDRESS", "HOST:PORT where the exporter serves /metrics (port 0 picks one).",
       "none: no exporter"},
      {"calibration_file", T::kString, offsetof(wsync_config_t, calibration_file), none,
       "WSYNC_CALIBRATION_FILE",
       "A calibration (wsync calibrate --out) read by trainer rank 0, shared at connect.", "none"},
      {"verify", T::kEnum, offsetof(wsync_config_t, verify), int64_t{0}, "WSYNC_VERIFY",
       "End-to-end integrity: off, hash (xxh3 per chunk), keyed (MACs from the job secret).", "",
       kVerifyChoices},
      {"heartbeat_interval_seconds", T::kSeconds,
       offsetof(wsync_config_t, heartbeat_interval_seconds),
       absl::ToDoubleSeconds(kDefaultHeartbeatInterval), "WSYNC_HEARTBEAT_INTERVAL_SECONDS",
       "host_coordinator only: the hosted coordinator's heartbeat interval (at least 0.001)."},
      {"silence_limit_seconds", T::kSeconds, offsetof(wsync_config_t, silence_limit_seconds),
       absl::ToDoubleSeconds(kDefaultSilenceLimit), "WSYNC_SILENCE_LIMIT_SECONDS",
       "host_coordinator only: silence after which a process is lost (>= twice the interval)."},
      {"delta", T::kEnum, offsetof(wsync_config_t, delta), int64_t{WSYNC_DELTA_OFF}, "WSYNC_DELTA",
       "Delta sync: off, auto (where the calibration says it pays), on; the same everywhere.", "",
       kDeltaChoices},
      {"secret", T::kSecret, offsetof(wsync_config_t, secret), none, "",
       "The job secret's bytes from the host (instead of secret_file or secret_env).", "none"},
      {"metrics_allow_any_address", T::kBool, offsetof(wsync_config_t, metrics_allow_any_address),
       int64_t{0}, "WSYNC_METRICS_ALLOW_ANY_ADDRESS",
       "Lets metrics_address be a wildcard (every interface)."},
      {"delta_budget_bytes", T::kBytes, offsetof(wsync_config_t, delta_budget_bytes),
       kDefaultDeltaBudgetBytes, "WSYNC_DELTA_BUDGET_BYTES",
       "With delta: the most host memory a sender keeps as its bases."},
  };
}

}  // namespace

absl::string_view SettingTypeName(SettingType type) {
  switch (type) {
    case SettingType::kBool:
      return "bool";
    case SettingType::kPort:
      return "port";
    case SettingType::kBytes:
      return "bytes";
    case SettingType::kSeconds:
      return "seconds";
    case SettingType::kEnum:
      return "choice";
    case SettingType::kString:
      return "text";
    case SettingType::kSecret:
      return "secret";
  }
  return "?";
}

namespace {

absl::StatusOr<SettingValue> ParseInteger(const Setting& setting, absl::string_view text) {
  int64_t value = 0;
  const bool parsed = absl::SimpleAtoi(text, &value);
  switch (setting.type) {
    case SettingType::kPort:
      if (parsed && value >= 1 && value <= 65535) return value;
      return absl::InvalidArgumentError("takes a TCP port, 1..65535");
    case SettingType::kBytes:
      if (parsed && value >= 1) return value;
      return absl::InvalidArgumentError("takes a number of bytes, at least 1");
    default: {
      for (size_t i = 0; i < setting.choices.size(); ++i) {
        if (text == setting.choices[i] || (parsed && value == static_cast<int64_t>(i))) {
          return static_cast<int64_t>(i);
        }
      }
      std::string names;
      for (size_t i = 0; i < setting.choices.size(); ++i) {
        absl::StrAppend(&names, i == 0 ? "" : ", ", setting.choices[i], " (", i, ")");
      }
      return absl::InvalidArgumentError(absl::StrCat("takes one of ", names));
    }
  }
}

std::string Comment(absl::string_view line) { return absl::StrCat("# ", line, "\n"); }

}  // namespace

absl::Span<const Setting> Settings() {
  static const std::vector<Setting>* const settings = new std::vector<Setting>(MakeSettings());
  return *settings;
}

const Setting* FindSetting(absl::string_view name) {
  for (const Setting& setting : Settings()) {
    if (setting.name == name) return &setting;
  }
  return nullptr;
}

absl::StatusOr<SettingValue> ParseSettingValue(const Setting& setting, absl::string_view text) {
  const absl::string_view stripped = absl::StripAsciiWhitespace(text);
  switch (setting.type) {
    case SettingType::kBool: {
      bool value = false;
      if (absl::SimpleAtob(stripped, &value)) return int64_t{value ? 1 : 0};
      if (stripped == "on" || stripped == "off") return int64_t{stripped == "on" ? 1 : 0};
      return absl::InvalidArgumentError("takes 1 or 0 (true, false, yes, no, on, off)");
    }
    case SettingType::kPort:
    case SettingType::kBytes:
    case SettingType::kEnum:
      return ParseInteger(setting, stripped);
    case SettingType::kSeconds: {
      double value = 0;
      if (absl::SimpleAtod(stripped, &value) && std::isfinite(value) && value > 0) return value;
      return absl::InvalidArgumentError("takes a finite, positive number of seconds");
    }
    case SettingType::kString:
      if (!text.empty()) return std::string(text);
      return absl::InvalidArgumentError("takes a non-empty text");
    case SettingType::kSecret:
      break;
  }
  return absl::InvalidArgumentError("is never given as text");
}

std::string FormatSettingValue(const Setting& setting, const SettingValue& value) {
  if (setting.type == SettingType::kSecret) {
    return std::get<std::string>(value).empty() ? "none" : "(given; never printed)";
  }
  if (const auto* text = std::get_if<std::string>(&value)) {
    if (!text->empty()) return *text;
    return std::string(setting.default_note.empty() ? "none" : setting.default_note);
  }
  if (const auto* seconds = std::get_if<double>(&value)) return absl::StrCat(*seconds);
  const int64_t number = std::get<int64_t>(value);
  if (setting.type == SettingType::kEnum && number >= 0 &&
      number < static_cast<int64_t>(setting.choices.size())) {
    return std::string(setting.choices[number]);
  }
  if (setting.type == SettingType::kBytes) {
    constexpr absl::string_view kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
    for (int i = 3; i >= 0; --i) {
      const int64_t unit = int64_t{1} << (10 * (i + 1));
      if (number >= unit && number % unit == 0) {
        return absl::StrCat(number, " (", number / unit, " ", kUnits[i], ")");
      }
    }
  }
  if (number == 0 && !setting.default_note.empty()) return std::string(setting.default_note);
  return absl::StrCat(number);
}

std::string SettingVariableText(const Setting& setting, const SettingValue& value) {
  if (setting.type == SettingType::kSecret) return "";
  if (const auto* text = std::get_if<std::string>(&value)) return *text;
  if (const auto* seconds = std::get_if<double>(&value)) return absl::StrCat(*seconds);
  if (setting.type == SettingType::kEnum) return FormatSettingValue(setting, value);
  const int64_t number = std::get<int64_t>(value);
  // Port 0: none (the variable takes 1..65535).
  if (setting.type == SettingType::kPort && number == 0) return "";
  return absl::StrCat(number);
}

SettingTexts DescribeSettingTexts(const Setting& setting) {
  return {std::string(setting.name),
          std::string(SettingTypeName(setting.type)),
          SettingVariableText(setting, setting.default_value),
          std::string(setting.default_note),
          std::string(setting.variable),
          std::string(setting.help),
          absl::StrJoin(setting.choices, ",")};
}

absl::StatusOr<std::optional<SettingValue>> SettingFromEnvironment(const Setting& setting) {
  if (setting.variable.empty()) return std::nullopt;
  const char* text = std::getenv(std::string(setting.variable).c_str());
  if (text == nullptr) return std::nullopt;
  absl::StatusOr<SettingValue> value = ParseSettingValue(setting, text);
  if (!value.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        setting.variable, "='", text, "': ", setting.name, " ", value.status().message()));
  }
  return *std::move(value);
}

absl::Status SettingsText(std::string* text) {
  absl::Status first;
  absl::StrAppend(text,
                  Comment("wsync settings (wsync_config_t): a field the host sets wins over its "
                          "variable, which wins over the default."),
                  Comment("Zero or NULL fields are unset. The secret is never printed."));
  for (const Setting& setting : Settings()) {
    absl::StrAppend(text, "#\n",
                    Comment(absl::StrCat(setting.name, " (", SettingTypeName(setting.type),
                                         "): ", setting.help)));
    std::string default_text = FormatSettingValue(setting, setting.default_value);
    if (setting.variable.empty()) {
      if (setting.name == "secret_env") {
        const char* held = std::getenv(std::string(kDefaultSecretEnv).c_str());
        absl::StrAppend(&default_text, "; ", kDefaultSecretEnv,
                        held == nullptr ? " is not set here" : " is set here");
      }
      absl::StrAppend(text, Comment(absl::StrCat("default ", default_text,
                                                 "; no variable: ", "only the host sets it")));
      continue;
    }
    absl::StatusOr<std::optional<SettingValue>> from_environment = SettingFromEnvironment(setting);
    if (!from_environment.ok()) {
      if (first.ok()) first = from_environment.status();
      absl::StrAppend(text, Comment(absl::StrCat("default ", default_text, "; refused: ",
                                                 from_environment.status().message())));
      absl::StrAppend(text, setting.variable, "=",
                      std::getenv(std::string(setting.variable).c_str()), "\n");
      continue;
    }
    const bool set = from_environment->has_value();
    const SettingValue& value = set ? **from_environment : setting.default_value;
    absl::StrAppend(text, Comment(absl::StrCat("default ", default_text, "; value from ",
                                               set ? "the environment" : "the default")));
    absl::StrAppend(text, setting.variable, "=", SettingVariableText(setting, value), "\n");
  }
  return first;
}

}  // namespace wsync
