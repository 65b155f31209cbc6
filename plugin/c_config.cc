#include "plugin/c_config.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "common/status.h"
#include "plugin/settings.h"
#include "quant/fp8.h"

namespace wsync {

absl::Status CheckAxes(int32_t num_axes,
                       std::initializer_list<std::pair<const char*, const void*>> arrays) {
  if (num_axes < 0 || num_axes > kMaxAxes) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_axes must be in 0..", kMaxAxes, ", got ", num_axes));
  }
  for (const auto& [name, array] : arrays) {
    if (num_axes > 0 && array == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(name, " is NULL with ", num_axes, " axes"));
    }
  }
  return absl::OkStatus();
}

Dims ToDims(const int64_t* values, int32_t num_axes) {
  return num_axes == 0 ? Dims() : Dims(values, values + num_axes);
}

absl::StatusOr<Fp8Declaration> ToFp8Declaration(const wsync_fp8_parameter_t& caller) {
  WSYNC_RETURN_IF_ERROR(
      CheckStructSize(caller.struct_size, kMinFp8ParameterSize, "fp8", "wsync_fp8_parameter_t"));
  // Fields of a newer header past this library's struct are not read.
  wsync_fp8_parameter_t c;
  std::memset(&c, 0, sizeof(c));
  std::memcpy(&c, &caller, std::min(caller.struct_size, sizeof(c)));
  if (c.parameter == nullptr) return absl::InvalidArgumentError("fp8->parameter is NULL");
  const auto refuse = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("FP8 parameter '", c.parameter, "': ", why));
  };
  Fp8Declaration declared;
  declared.parameter = c.parameter;
  if (c.block_rows < 0 || c.block_cols < 0) {
    return refuse(absl::StrCat("block_rows ", c.block_rows, " and block_cols ", c.block_cols,
                               " must not be negative"));
  }
  switch (c.scheme) {
    case WSYNC_QUANT_FP8_BLOCK:
      declared.quant.block_rows = c.block_rows == 0 ? 128 : c.block_rows;
      declared.quant.block_cols = c.block_cols == 0 ? 128 : c.block_cols;
      break;
    case WSYNC_QUANT_FP8_CHANNEL:
    case WSYNC_QUANT_FP8_TENSOR:
      if (c.block_rows != 0 || c.block_cols != 0) {
        return refuse("block_rows and block_cols are for WSYNC_QUANT_FP8_BLOCK; give 0");
      }
      declared.quant.block_rows = c.scheme == WSYNC_QUANT_FP8_CHANNEL ? 1 : quant::kWholeAxis;
      declared.quant.block_cols = quant::kWholeAxis;
      break;
    default:
      return refuse(
          absl::StrCat("scheme must be WSYNC_QUANT_FP8_BLOCK (1), _CHANNEL (2) or "
                       "_TENSOR (3), got ",
                       c.scheme));
  }
  if (c.scale_name == nullptr) return refuse("scale_name is NULL");
  declared.quant.scale_param = c.scale_name;
  if (c.scale_dtype == nullptr) return refuse("scale_dtype is NULL");
  absl::StatusOr<DType> dtype = ParseDType(c.scale_dtype);
  if (!dtype.ok()) return refuse(absl::StrCat("scale_dtype: ", dtype.status().message()));
  declared.scale_dtype = *dtype;
  if (absl::Status axes = CheckAxes(c.scale_num_axes, {{"scale_shape", c.scale_shape}});
      !axes.ok()) {
    return refuse(axes.message());
  }
  declared.scale_shape = ToDims(c.scale_shape, c.scale_num_axes);
  return declared;
}

namespace {

// Whether the field of `setting` in `c` is unset (zero or NULL).
bool Unset(const wsync_config_t& c, const Setting& setting) {
  const char* field = reinterpret_cast<const char*>(&c) + setting.offset;
  switch (setting.type) {
    case SettingType::kBool:
    case SettingType::kPort:
    case SettingType::kEnum: {
      int32_t value;
      std::memcpy(&value, field, sizeof(value));
      return value == 0;
    }
    case SettingType::kBytes: {
      int64_t value;
      std::memcpy(&value, field, sizeof(value));
      return value == 0;
    }
    case SettingType::kSeconds: {
      double value;
      std::memcpy(&value, field, sizeof(value));
      return value == 0;
    }
    case SettingType::kString:
    case SettingType::kSecret: {
      const char* value;
      std::memcpy(&value, field, sizeof(value));
      return value == nullptr;
    }
  }
  return false;
}

// Stores `value` in the field of `setting` in the config at `c` (bytes, so that a caller's shorter
// struct is written only where it has the field); a text field gets `text`, which holds the
// value's text and must outlive the config's use.
void StoreField(char* c, const Setting& setting, const SettingValue& value, const char* text) {
  char* field = c + setting.offset;
  if (std::holds_alternative<std::string>(value)) {
    std::memcpy(field, &text, sizeof(text));
  } else if (const auto* seconds = std::get_if<double>(&value)) {
    std::memcpy(field, seconds, sizeof(*seconds));
  } else if (setting.type == SettingType::kBytes) {
    std::memcpy(field, &std::get<int64_t>(value), sizeof(int64_t));
  } else {
    const int32_t number = static_cast<int32_t>(std::get<int64_t>(value));
    std::memcpy(field, &number, sizeof(number));
  }
}

// Stores `value` in the field of `setting` in `c`; a text is kept in `texts` (which must outlive
// `c`'s use).
void Store(wsync_config_t& c, const Setting& setting, const SettingValue& value,
           std::deque<std::string>& texts) {
  const auto* text = std::get_if<std::string>(&value);
  StoreField(reinterpret_cast<char*>(&c), setting, value,
             text != nullptr ? texts.emplace_back(*text).c_str() : nullptr);
}

// The bytes of a setting's field in wsync_config_t.
size_t FieldSize(SettingType type) {
  switch (type) {
    case SettingType::kBytes:
      return sizeof(int64_t);
    case SettingType::kSeconds:
      return sizeof(double);
    case SettingType::kString:
    case SettingType::kSecret:
      return sizeof(const char*);
    default:
      return sizeof(int32_t);
  }
}

// Every row's strings as setting_info hands them out: built once, kept while the library is loaded.
const std::vector<SettingTexts>& AllSettingTexts() {
  static const std::vector<SettingTexts>* const all = [] {
    auto* rows = new std::vector<SettingTexts>();
    for (const Setting& setting : Settings()) rows->push_back(DescribeSettingTexts(setting));
    return rows;
  }();
  return *all;
}

// The table's default of a kSeconds setting.
double DefaultSeconds(absl::string_view name) {
  return std::get<double>(FindSetting(name)->default_value);
}

// verify, delta, delta_budget_bytes and the heartbeats of `c` into `config`.
absl::Status ConvertSyncSettings(const wsync_config_t& c, SessionConfig& config) {
  if (c.verify < 0 || c.verify > 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("verify must be 0 (off), 1 (xxh3 hashes) or 2 (keyed MACs), got ", c.verify));
  }
  config.verify = static_cast<VerifyMode>(c.verify);
  if (c.delta_budget_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta_budget_bytes must be at least 0 (0: the default, ",
                     log::Bytes(kDefaultDeltaBudgetBytes), "), got ", c.delta_budget_bytes));
  }
  config.delta_budget_bytes =
      c.delta_budget_bytes > 0 ? c.delta_budget_bytes : kDefaultDeltaBudgetBytes;
  switch (c.delta) {
    case WSYNC_DELTA_OFF:
    case WSYNC_DELTA_AUTO:
    case WSYNC_DELTA_ON:
      config.delta = static_cast<DeltaMode>(c.delta);
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "delta must be WSYNC_DELTA_OFF (0), WSYNC_DELTA_AUTO (1) or WSYNC_DELTA_ON (2), got ",
          c.delta));
  }
  for (const auto& [name, seconds, duration] :
       {std::tuple{"heartbeat_interval_seconds", c.heartbeat_interval_seconds,
                   &config.heartbeat_interval},
        std::tuple{"silence_limit_seconds", c.silence_limit_seconds, &config.silence_limit}}) {
    if (!std::isfinite(seconds) || seconds < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, " must be a finite number of seconds, at least 0 (0: the default), got ", seconds));
    }
    *duration = absl::Seconds(seconds != 0 ? seconds : DefaultSeconds(name));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ApplyEnvironment(wsync_config_t& c, std::deque<std::string>& texts) {
  for (const Setting& setting : Settings()) {
    if (setting.variable.empty() || !Unset(c, setting)) continue;
    WSYNC_ASSIGN_OR_RETURN(std::optional<SettingValue> value, SettingFromEnvironment(setting));
    if (value.has_value()) Store(c, setting, *value, texts);
  }
  return absl::OkStatus();
}

int32_t SettingCount() noexcept {
  try {
    return static_cast<int32_t>(Settings().size());
  } catch (...) {
    return 0;
  }
}

absl::Status DescribeSetting(int32_t index, wsync_setting_info_t* info) {
  const int32_t count = SettingCount();
  if (index < 0 || index >= count) {
    return absl::InvalidArgumentError(absl::StrCat("index ", index, " is not a setting: there are ",
                                                   count, " (0..", count - 1, ")"));
  }
  if (info == nullptr) return absl::InvalidArgumentError("info is NULL");
  WSYNC_RETURN_IF_ERROR(
      CheckStructSize(info->struct_size, kMinSettingInfoSize, "info", "wsync_setting_info_t"));
  const Setting& setting = Settings()[index];
  const SettingTexts& strings = AllSettingTexts()[index];
  wsync_setting_info_t full = {};
  full.struct_size = sizeof(full);
  full.name = strings.name.c_str();
  full.type = strings.type.c_str();
  full.offset = setting.offset;
  full.default_value = strings.default_value.c_str();
  full.default_note = strings.default_note.c_str();
  full.variable = strings.variable.c_str();
  full.help = strings.help.c_str();
  full.choices = strings.choices.c_str();
  CopyPrefix(full, *info);
  return absl::OkStatus();
}

absl::Status SetConfigText(wsync_config_t* config, const char* name, const char* text) {
  if (config == nullptr) return absl::InvalidArgumentError("config is NULL");
  if (name == nullptr) return absl::InvalidArgumentError("name is NULL");
  if (text == nullptr) return absl::InvalidArgumentError(absl::StrCat(name, ": text is NULL"));
  const Setting* setting = FindSetting(name);
  if (setting == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", name, "' is not a setting (setting_info lists them)"));
  }
  if (setting->type == SettingType::kSecret) {
    return absl::InvalidArgumentError(absl::StrCat(
        name,
        " is never given as text: set secret and secret_length (or secret_file, secret_env)"));
  }
  if (setting->offset + FieldSize(setting->type) > config->struct_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " lies past config->struct_size (", config->struct_size,
                     "; the field ends at ", setting->offset + FieldSize(setting->type), ")"));
  }
  absl::StatusOr<SettingValue> value = ParseSettingValue(*setting, text);
  if (!value.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "='", text, "': ", name, " ", value.status().message()));
  }
  StoreField(reinterpret_cast<char*>(config), *setting, *value, text);
  return absl::OkStatus();
}

absl::StatusOr<SessionConfig> ToSessionConfig(const wsync_config_t& caller) {
  wsync_config_t c = caller;
  std::deque<std::string> texts;  // What `c` points to from the environment.
  WSYNC_RETURN_IF_ERROR(ApplyEnvironment(c, texts));
  SessionConfig config;
  const int role = EnumValue(c.role);
  if (role != WSYNC_ROLE_TRAINER && role != WSYNC_ROLE_ROLLOUT) {
    return absl::InvalidArgumentError(
        absl::StrCat("role must be WSYNC_ROLE_TRAINER (1) or WSYNC_ROLE_ROLLOUT (2), got ", role));
  }
  config.role = role == WSYNC_ROLE_TRAINER ? Role::kTrainer : Role::kRollout;
  config.rank = c.rank;
  config.num_trainers = c.num_trainers;
  config.num_rollouts = c.num_rollouts;
  if (c.job_id == nullptr) return absl::InvalidArgumentError("job_id is required");
  config.job_id = c.job_id;
  config.coordinator_host = std::string(kDefaultCoordinatorHost);
  if (c.coordinator_host != nullptr) {
    if (c.coordinator_host[0] == '\0') {
      return absl::InvalidArgumentError(
          absl::StrCat("coordinator_host is empty (NULL means ", kDefaultCoordinatorHost, ")"));
    }
    config.coordinator_host = c.coordinator_host;
  }
  config.host_coordinator = c.host_coordinator != 0;
  if (c.coordinator_port < 0 || c.coordinator_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("coordinator_port must be in 0..65535, got ", c.coordinator_port));
  }
  config.coordinator_port = c.coordinator_port;
  if ((c.secret_file != nullptr) + (c.secret_env != nullptr) + (c.secret != nullptr) > 1) {
    return absl::InvalidArgumentError("give one of secret_file, secret_env and secret, not more");
  }
  config.secret = SecretSource::Environment(std::string(kDefaultSecretEnv));
  if (c.secret != nullptr) {
    if (c.secret_length > static_cast<size_t>(kMaxSecretBytes)) {
      return absl::InvalidArgumentError(absl::StrCat("secret_length is ", c.secret_length,
                                                     "; a secret has at most ", kMaxSecretBytes,
                                                     " bytes"));
    }
    config.secret = SecretSource::Value(std::string(c.secret, c.secret_length));
  } else if (c.secret_file != nullptr) {
    config.secret = SecretSource::File(c.secret_file);
  } else if (c.secret_env != nullptr) {
    config.secret = SecretSource::Environment(c.secret_env);
  }
  if (c.node_id != nullptr) config.node_id = c.node_id;
  if (c.has_device_index != 0) {
    if (c.device_index < 0 || c.device_index > kMaxDevice) {
      return absl::InvalidArgumentError(
          absl::StrCat("device_index must be in 0..", kMaxDevice, ", got ", c.device_index));
    }
    config.device = c.device_index;
  }
  if (c.staging_budget_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("staging_budget_bytes must be positive, got ", c.staging_budget_bytes));
  }
  config.staging_budget_bytes = static_cast<double>(
      c.staging_budget_bytes != 0 ? c.staging_budget_bytes : kDefaultStagingBudgetBytes);
  if (std::isnan(c.deadline_seconds) || c.deadline_seconds < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("deadline_seconds must be positive, got ", c.deadline_seconds));
  }
  config.deadline =
      absl::Seconds(c.deadline_seconds != 0 ? c.deadline_seconds : kDefaultDeadlineSeconds);
  config.replica_policy = c.replica_policy != nullptr ? std::string(c.replica_policy)
                                                      : std::string(kDefaultReplicaPolicy);
  if (c.path_transports != nullptr) config.path_transports = c.path_transports;
  if (c.metrics_address != nullptr) {
    if (c.metrics_address[0] == '\0') {
      return absl::InvalidArgumentError("metrics_address is empty (NULL means no exporter)");
    }
    config.metrics_address = c.metrics_address;
  }
  config.metrics_allow_any_address = c.metrics_allow_any_address != 0;
  if (c.calibration_file != nullptr) config.calibration_file = c.calibration_file;
  WSYNC_RETURN_IF_ERROR(ConvertSyncSettings(c, config));
  return config;
}

wsync_status_t ToWsyncStatus(const absl::Status& status) {
  if (status.ok()) return WSYNC_OK;
  switch (ClassifyError(status)) {
    case ErrorClass::kWrongState:
    case ErrorClass::kInvalidArgument:
      return WSYNC_INVALID_ARGUMENT;
    case ErrorClass::kLayoutRefused:
      return WSYNC_LAYOUT_REFUSED;
    case ErrorClass::kRanksDisagree:
      return WSYNC_RANKS_DISAGREE;
    case ErrorClass::kTimedOut:
      return WSYNC_TIMED_OUT;
    case ErrorClass::kPeerLost:
      return WSYNC_PEER_LOST;
    case ErrorClass::kAborted:
      return WSYNC_ABORTED;
    case ErrorClass::kAuthentication:
      return WSYNC_AUTHENTICATION;
    case ErrorClass::kUnsupported:
      return WSYNC_UNSUPPORTED;
    case ErrorClass::kNoMemory:
      return WSYNC_NO_MEMORY;
    case ErrorClass::kDataLoss:
    case ErrorClass::kInternal:
      return WSYNC_INTERNAL;
  }
  return WSYNC_INTERNAL;
}

}  // namespace wsync
