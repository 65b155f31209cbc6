#include "integration/cli/settings_command.h"

#include <cstdio>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "plugin/settings.h"

namespace wsync::cli {

std::string SettingsUsage() {
  return "usage: wsync settings\n"
         "  every setting of wsync_config_t: its name, type and help, the default, the value a\n"
         "  host that leaves the field unset gets here (its WSYNC_* variable, else the default)\n"
         "  and where it comes from, as WSYNC_<NAME>=value lines (exit 1 when a variable's value\n"
         "  would be refused: the line says why)\n";
}

int SettingsMain(int argc, char** argv) {
  if (argc > 1) {
    absl::FPrintF(stderr, "wsync settings: takes no arguments, got '%s'\n\n%s", argv[1],
                  SettingsUsage());
    return 2;
  }
  std::string text;
  const absl::Status status = SettingsText(&text);
  absl::PrintF("%s", text);
  if (!status.ok()) {
    absl::FPrintF(stderr, "wsync settings: %s\n", status.message());
    return 1;
  }
  return 0;
}

}  // namespace wsync::cli
