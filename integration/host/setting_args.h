#ifndef WSYNC_INTEGRATION_HOST_SETTING_ARGS_H_
#define WSYNC_INTEGRATION_HOST_SETTING_ARGS_H_

// The settings of the loaded libwsync.so as command-line arguments of a host program: one flag
// --<name>=<value> (or --<name> <value>) per row of the library's settings table (the C ABI's
// setting_count and setting_info, wsync.h) except the secret, taking exactly what the setting's
// variable WSYNC_<NAME> takes, applied with config_set. The table comes from the library, never
// from a copy here, so every host of integration/ takes the same names, syntax and defaults as
// the library it runs (issue 43). ABI only: links nothing of plugin/.
//
// Precedence stays the library's: a setting given as an argument is a set field, which wins over
// its variable, which wins over the default; a setting not given leaves its field unset.
//
// Use, in main, before absl::ParseCommandLine (which refuses flags it does not know):
//   auto loaded = LoadHostSettings(&argc, argv, "usage of the program");
//   absl::ParseCommandLine(argc, argv);
//   ... loaded->settings.Apply(&config) ... loaded->plugin->Init(config) ...
// Not thread-safe (a program's start-up).

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "integration/host/plugin_host.h"
#include "plugin/include/wsync/wsync.h"

namespace wsync::host {

// One row of the library's settings table, copied (wsync_setting_info_t).
struct SettingRow {
  std::string name;
  std::string type;
  std::string default_value;
  std::string default_note;
  std::string variable;
  std::string help;
  std::string choices;
};

class SettingArgs {
 public:
  // The table of the loaded `plugin`; FailedPrecondition when the library is older than the table
  // entries (its wsyncPlugin_v1 ends before config_set).
  static absl::StatusOr<SettingArgs> FromLibrary(const Plugin& plugin);
  // The given rows (a table compiled into the program: table_setting_args.h), none taken yet.
  static SettingArgs FromRows(std::vector<SettingRow> rows) { return SettingArgs(std::move(rows)); }

  // Takes every --<setting>=<value> and --<setting> <value> out of argv[1, *argc) (a bool setting
  // also as --<setting> alone: 1), keeping the values (a setting given twice: the last), and
  // shrinks *argc; the other arguments keep their order, and "--" ends the scan.
  // InvalidArgument naming the flag for one without a value, or for --secret (never text).
  absl::Status Take(int* argc, char** argv);

  // Writes every taken setting into `config` with config_set, in the table's order; the first
  // refusal as InvalidArgument "--<name>=<value>: <what it takes>". A text field points into this
  // object: keep it alive until init has returned.
  absl::Status Apply(const Plugin& plugin, wsync_config_t* config) const;

  // The value taken for `name`; nullopt when the setting was not given.
  std::optional<std::string> Value(absl::string_view name) const;
  // Every taken setting as "--<name>=<value>", in the table's order (to hand on to processes a
  // launcher starts).
  std::vector<std::string> Arguments() const;

  // The settings for a program's --help: per setting "--<name>=<type>" with its choices, its help,
  // its default (or how an unset one reads) and its variable.
  std::string HelpText() const;

  const std::vector<SettingRow>& rows() const { return rows_; }

 private:
  explicit SettingArgs(std::vector<SettingRow> rows) : rows_(std::move(rows)) {}
  const SettingRow* Find(absl::string_view name) const;

  std::vector<SettingRow> rows_;
  std::vector<std::pair<std::string, std::string>> given_;  // Name, value; one entry per name.
};

// The value of --<name>=<value> or --<name> <value> in argv[1, argc) (the last one), before the
// flags are parsed; nullopt when absent.
std::optional<std::string> PeekArgument(int argc, char** argv, absl::string_view name);

// A host program's start: the library that --library names (else DefaultLibrary()), loaded; its
// settings taken out of argv (SettingArgs::Take); and the program's usage message (absl's, for
// --help) set to `usage` followed by the settings' HelpText. Call once, before
// absl::ParseCommandLine.
struct LoadedHost {
  std::unique_ptr<Plugin> plugin;
  SettingArgs settings;
};
absl::StatusOr<LoadedHost> LoadHostSettings(int* argc, char** argv, absl::string_view usage);

}  // namespace wsync::host

#endif  // WSYNC_INTEGRATION_HOST_SETTING_ARGS_H_
