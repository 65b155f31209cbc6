#include "integration/host/setting_args.h"

#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "common/status.h"

namespace wsync::host {
namespace {

// The text of `s` (a library string that may be NULL).
std::string Text(const char* s) { return s != nullptr ? s : ""; }

// "--name=value" splits into name and value; "--name" into name and nullopt. nullopt for an
// argument that is no "--" flag (or "--" itself).
std::optional<std::pair<std::string, std::optional<std::string>>> SplitFlag(
    absl::string_view argument) {
  if (!absl::StartsWith(argument, "--") || argument.size() == 2) return std::nullopt;
  argument.remove_prefix(2);
  const size_t equals = argument.find('=');
  if (equals == absl::string_view::npos) {
    return std::make_pair(std::string(argument), std::optional<std::string>());
  }
  return std::make_pair(std::string(argument.substr(0, equals)),
                        std::optional<std::string>(std::string(argument.substr(equals + 1))));
}

}  // namespace

absl::StatusOr<SettingArgs> SettingArgs::FromLibrary(const Plugin& plugin) {
  if (!WSYNC_PLUGIN_V1_HAS(plugin.table_size(), config_set)) {
    return absl::FailedPreconditionError(
        "this libwsync.so has no settings table (setting_count, setting_info, config_set): it "
        "is older than this program");
  }
  const wsync_plugin_v1_t& api = plugin.api();
  const int32_t count = api.setting_count();
  std::vector<SettingRow> rows;
  for (int32_t index = 0; index < count; ++index) {
    wsync_setting_info_t info;
    std::memset(&info, 0, sizeof(info));
    info.struct_size = sizeof(info);
    WSYNC_RETURN_IF_ERROR(
        PluginStatus(api, nullptr, api.setting_info(index, &info), "setting_info"));
    rows.push_back({Text(info.name), Text(info.type), Text(info.default_value),
                    Text(info.default_note), Text(info.variable), Text(info.help),
                    Text(info.choices)});
  }
  return SettingArgs(std::move(rows));
}

const SettingRow* SettingArgs::Find(absl::string_view name) const {
  for (const SettingRow& row : rows_) {
    if (row.name == name) return &row;
  }
  return nullptr;
}

absl::Status SettingArgs::Take(int* argc, char** argv) {
  int kept = 1;
  int i = 1;
  for (; i < *argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) break;
    auto flag = SplitFlag(argv[i]);
    const SettingRow* row = flag.has_value() ? Find(flag->first) : nullptr;
    if (row == nullptr) {
      argv[kept++] = argv[i];
      continue;
    }
    if (row->type == "secret") {
      return absl::InvalidArgumentError(
          absl::StrCat("--", row->name,
                       " is never given as an argument (secret_file or the "
                       "variable that secret_env names hold the job secret)"));
    }
    std::optional<std::string> value = std::move(flag->second);
    if (!value.has_value()) {
      if (row->type == "bool") {
        value = "1";
      } else if (i + 1 < *argc) {
        value = argv[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat("--", row->name, " needs a value"));
      }
    }
    bool replaced = false;
    for (auto& [name, given] : given_) {
      if (name == row->name) {
        given = *value;
        replaced = true;
      }
    }
    if (!replaced) given_.emplace_back(row->name, *std::move(value));
  }
  for (; i < *argc; ++i) argv[kept++] = argv[i];
  *argc = kept;
  argv[kept] = nullptr;  // argv[*argc] was NULL; kept <= the old *argc.
  return absl::OkStatus();
}

absl::Status SettingArgs::Apply(const Plugin& plugin, wsync_config_t* config) const {
  const wsync_plugin_v1_t& api = plugin.api();
  for (const SettingRow& row : rows_) {
    for (const auto& [name, value] : given_) {
      if (name != row.name) continue;
      if (api.config_set(config, name.c_str(), value.c_str()) != WSYNC_OK) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, "=", value, ": ", Text(api.last_error(nullptr))));
      }
    }
  }
  return absl::OkStatus();
}

std::optional<std::string> SettingArgs::Value(absl::string_view name) const {
  for (const auto& [given, value] : given_) {
    if (given == name) return value;
  }
  return std::nullopt;
}

std::vector<std::string> SettingArgs::Arguments() const {
  std::vector<std::string> arguments;
  for (const SettingRow& row : rows_) {
    if (std::optional<std::string> value = Value(row.name)) {
      arguments.push_back(absl::StrCat("--", row.name, "=", *value));
    }
  }
  return arguments;
}

std::string SettingArgs::HelpText() const {
  std::string text =
      "The library's settings (wsync_config_t; an argument wins over its WSYNC_<NAME> variable, "
      "which wins over the default):\n";
  for (const SettingRow& row : rows_) {
    if (row.type == "secret") continue;
    const std::string type =
        row.choices.empty() ? row.type : absl::StrReplaceAll(row.choices, {{",", "|"}});
    const std::string default_text = row.default_value.empty()
                                         ? (row.default_note.empty() ? "none" : row.default_note)
                                         : row.default_value;
    absl::StrAppend(
        &text, "  --", row.name, "=", type, "\n    ", row.help, "\n    default ", default_text,
        row.variable.empty() ? "; no variable" : absl::StrCat("; ", row.variable), "\n");
  }
  return text;
}

std::optional<std::string> PeekArgument(int argc, char** argv, absl::string_view name) {
  std::optional<std::string> found;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) break;
    auto flag = SplitFlag(argv[i]);
    if (!flag.has_value() || flag->first != name) continue;
    if (flag->second.has_value()) {
      found = flag->second;
    } else if (i + 1 < argc) {
      found = argv[++i];
    }
  }
  return found;
}

absl::StatusOr<LoadedHost> LoadHostSettings(int* argc, char** argv, absl::string_view usage) {
  const std::optional<std::string> library = PeekArgument(*argc, argv, "library");
  WSYNC_ASSIGN_OR_RETURN(
      std::unique_ptr<Plugin> plugin,
      Plugin::Load(library.has_value() && !library->empty() ? *library : DefaultLibrary()));
  WSYNC_ASSIGN_OR_RETURN(SettingArgs settings, SettingArgs::FromLibrary(*plugin));
  WSYNC_RETURN_IF_ERROR(settings.Take(argc, argv));
  absl::SetProgramUsageMessage(absl::StrCat(usage, "\n\n", settings.HelpText()));
  return LoadedHost{std::move(plugin), std::move(settings)};
}

}  // namespace wsync::host
