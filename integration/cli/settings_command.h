#ifndef WSYNC_INTEGRATION_CLI_SETTINGS_COMMAND_H_
#define WSYNC_INTEGRATION_CLI_SETTINGS_COMMAND_H_

// `wsync settings`: prints every setting of a session (plugin/settings.h, the settings of
// wsync_config_t) with the value a host that leaves its field unset gets here (its WSYNC_*
// variable's, else the default), where that value comes from, the variable and a line of help, as
// `ucx_info -c` prints UCX's. A variable whose value would be refused is printed with the reason.

#include <string>

namespace wsync::cli {

std::string SettingsUsage();

// argv[0] is "settings". Returns 0, 1 when a variable's value is refused (the table is printed
// all the same), 2 for a usage error.
int SettingsMain(int argc, char** argv);

}  // namespace wsync::cli

#endif  // WSYNC_INTEGRATION_CLI_SETTINGS_COMMAND_H_
