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
      "  help   print this message\n"
      "\n",
      PlanUsage(), "\n", BenchUsage(), "\n", CoordinatorUsage(), "\n", DemoUsage(), "\n",
      CalibrateUsage());
}

bool IsHelp(absl::string_view arg) { return arg == "help" || arg == "--help" || arg == "-h"; }

int Main(int argc, char** argv) {
  if (argc < 2) {
    absl::FPrintF(stderr, "%s", Usage());
    return 2;
  }
  const absl::string_view command = argv[1];
  if (IsHelp(command)) {
    absl::PrintF("%s", Usage());
    return 0;
  }
  if (command == "plan") return PlanMain(argc - 1, argv + 1);
  if (command == "bench") return BenchMain(argc - 1, argv + 1);
  if (command == "coordinator") return CoordinatorMain(argc - 1, argv + 1);
  if (command == "demo") return DemoMain(argc - 1, argv + 1);
  if (command == "calibrate") return CalibrateMain(argc - 1, argv + 1);
  absl::FPrintF(stderr, "wsync: unknown command '%s'\n\n%s", command, Usage());
  return 2;
}

}  // namespace
}  // namespace wsync::cli

int main(int argc, char** argv) { return wsync::cli::Main(argc, argv); }
