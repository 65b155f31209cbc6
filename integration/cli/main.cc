// The `wsync` command line: `wsync <command> [flags]`. The command is argv[1]; each command parses
// its own flags. Exit status: 0 on success, 1 when a command fails, 2 for a usage error.

#include <cstdio>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "integration/cli/bench_command.h"
#include "integration/cli/calibrate_command.h"
#include "integration/cli/coordinator_command.h"
#include "integration/cli/demo_command.h"
#include "integration/cli/plan_command.h"
#include "integration/cli/status_command.h"

namespace wsync::cli {
namespace {

std::string Usage() {
  return absl::StrCat(
      "usage: wsync <command> [flags]\n"
      "\n"
      "commands:\n"
      "  plan   plan the resharding between two named layouts of a model and print it\n"
      "  bench  run a benchmark (executor, sync, compare, predict, relay)\n"
      "  calibrate  write or show a calibration file\n"
      "  coordinator  run a job's coordinator\n"
      "  demo   run the main job here: trainers sync rollouts through libwsync.so\n"
      "  status  ask a running job's coordinator who is joined, missing, lost or refused\n"
      "  help   print this message; `wsync help COMMAND` or `wsync COMMAND --help`: its usage\n"
      "\n",
      PlanUsage(), "\n", BenchUsage(), "\n", CoordinatorUsage(), "\n", DemoUsage(), "\n",
      CalibrateUsage(), "\n", StatusUsage());
}

// Words that ask for help, as a command or among a command's arguments.
bool IsHelp(absl::string_view arg) {
  return arg == "help" || arg == "--help" || arg == "-h" || arg == "--helpfull" ||
         arg == "--helpshort";
}

struct Command {
  absl::string_view name;
  std::string (*usage)();
  int (*main)(int argc, char** argv);
};

constexpr Command kCommands[] = {
    {"plan", PlanUsage, PlanMain},
    {"bench", BenchUsage, BenchMain},
    {"coordinator", CoordinatorUsage, CoordinatorMain},
    {"demo", DemoUsage, DemoMain},
    {"calibrate", CalibrateUsage, CalibrateMain},
    {"status", StatusUsage, StatusMain},
};

const Command* FindCommand(absl::string_view name) {
  for (const Command& command : kCommands) {
    if (command.name == name) return &command;
  }
  return nullptr;
}

// `wsync help [COMMAND]`, `wsync COMMAND --help` (or -h, help, --helpfull anywhere among its
// arguments): the command's usage on stdout and exit 0, before any flag is parsed, the same for
// every command.
int Main(int argc, char** argv) {
  if (argc < 2) {
    absl::FPrintF(stderr, "%s", Usage());
    return 2;
  }
  const absl::string_view name = argv[1];
  if (IsHelp(name)) {
    const Command* command = argc > 2 ? FindCommand(argv[2]) : nullptr;
    absl::PrintF("%s", command != nullptr ? command->usage() : Usage());
    return 0;
  }
  const Command* command = FindCommand(name);
  if (command == nullptr) {
    absl::FPrintF(stderr, "wsync: unknown command '%s'\n\n%s", name, Usage());
    return 2;
  }
  for (int i = 2; i < argc; ++i) {
    if (IsHelp(argv[i])) {
      absl::PrintF("%s", command->usage());
      return 0;
    }
  }
  return command->main(argc - 1, argv + 1);
}

}  // namespace
}  // namespace wsync::cli

int main(int argc, char** argv) { return wsync::cli::Main(argc, argv); }
