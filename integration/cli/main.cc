// The `wsync` command line: `wsync <command> [flags]`. The command is argv[1]; each command parses
// its own flags. Exit status: 0 on success, 1 when a command fails, 2 for a usage error.

#include <cstdio>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "integration/cli/calibrate_command.h"
#include "integration/cli/coordinator_command.h"
#include "integration/cli/demo_command.h"
#include "integration/cli/plan_command.h"
#include "integration/cli/settings_command.h"
#include "integration/cli/status_command.h"
#include "integration/cli/subcommands.h"

namespace wsync::cli {
namespace {

std::string Usage() {
  return absl::StrCat(
      "usage: wsync <command> [flags]\n"
      "\n"
      "commands:\n"
      "  plan   plan the resharding between two named layouts of a model and print it\n"
      "  calibrate  write or show a calibration file\n"
      "  coordinator  run a job's coordinator\n"
      "  demo   run the main job here: trainers sync rollouts through libwsync.so\n"
      "  status  ask a running job's coordinator who is joined, missing, lost or refused\n"
      "  settings  print every session setting, its value here, default and WSYNC_* variable\n"
      "  help   print this message; `wsync help COMMAND` or `wsync COMMAND --help`: its usage\n"
      "\n",
      PlanUsage(), "\n", CoordinatorUsage(), "\n", DemoUsage(), "\n", CalibrateUsage(), "\n",
      StatusUsage(), "\n", SettingsUsage());
}

constexpr Subcommand kCommands[] = {
    {"plan", PlanUsage, PlanMain},       {"coordinator", CoordinatorUsage, CoordinatorMain},
    {"demo", DemoUsage, DemoMain},       {"calibrate", CalibrateUsage, CalibrateMain},
    {"status", StatusUsage, StatusMain}, {"settings", SettingsUsage, SettingsMain},
};

int Main(int argc, char** argv) {
  // The benchmarks are their own binary now (integration/bench).
  if (argc > 1 && (absl::string_view(argv[1]) == "bench" ||
                   (IsHelpWord(argv[1]) && argc > 2 && absl::string_view(argv[2]) == "bench"))) {
    absl::FPrintF(stderr,
                  "wsync: the benchmarks moved to their own binary: run `wsync-bench <benchmark>` "
                  "(build/integration/bench/wsync-bench; `wsync-bench help` lists them)\n");
    return 2;
  }
  return RunSubcommand("wsync", "command", kCommands, Usage(), argc, argv);
}

}  // namespace
}  // namespace wsync::cli

int main(int argc, char** argv) { return wsync::cli::Main(argc, argv); }
