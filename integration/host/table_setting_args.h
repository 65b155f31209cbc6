#ifndef WSYNC_INTEGRATION_HOST_TABLE_SETTING_ARGS_H_
#define WSYNC_INTEGRATION_HOST_TABLE_SETTING_ARGS_H_

// SettingArgs (setting_args.h) over the settings table compiled into this program
// (plugin/settings.h) rather than a loaded library's: for launchers that link wsync::settings and
// start processes that load the library (`wsync demo`, `wsync-bench`). They take every
// --<setting>=<value> out of their own argv, check each value as its variable would be checked,
// and hand the settings on to every process they start (SettingArgs::Arguments), whose own pass
// applies them. Not thread-safe (a program's start-up).

#include "absl/status/statusor.h"
#include "integration/host/setting_args.h"

namespace wsync::host {

// The compiled table's rows, none taken yet.
SettingArgs CompiledSettingArgs();

// CompiledSettingArgs with every setting argument taken out of argv (SettingArgs::Take) and each
// value parsed as its variable is (ParseSettingValue): InvalidArgument "--<name>=<value>: <name>
// takes ..." for the first that does not parse.
absl::StatusOr<SettingArgs> TakeCompiledSettings(int* argc, char** argv);

}  // namespace wsync::host

#endif  // WSYNC_INTEGRATION_HOST_TABLE_SETTING_ARGS_H_
