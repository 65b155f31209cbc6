#ifndef WSYNC_INTEGRATION_CLI_SUBCOMMANDS_H_
#define WSYNC_INTEGRATION_CLI_SUBCOMMANDS_H_

// The `program <subcommand> [flags]` dispatch both command lines share (`wsync`, `wsync-bench`):
// help the same way for every subcommand, before any flag is parsed.

#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace wsync::cli {

struct Subcommand {
  absl::string_view name;
  std::string (*usage)();  // What help prints: "usage: ..." lines.
  // Runs it: argv[0] is the subcommand's name, the rest its arguments. Returns the exit status.
  int (*main)(int argc, char** argv);
};

// Words that ask for help, as the subcommand or among its arguments: help, --help, -h,
// --helpfull, --helpshort.
bool IsHelpWord(absl::string_view arg);

// Dispatches argv[1]: none: `usage` on stderr, 2; `program help [SUB]`: SUB's usage (or `usage`)
// on stdout, 0; a help word among SUB's arguments: SUB's usage on stdout, 0; an unknown one:
// "<program>: unknown <noun> 'X'" and `usage` on stderr, 2; else SUB's main(argc - 1, argv + 1).
int RunSubcommand(absl::string_view program, absl::string_view noun,
                  absl::Span<const Subcommand> subcommands, const std::string& usage, int argc,
                  char** argv);

}  // namespace wsync::cli

#endif  // WSYNC_INTEGRATION_CLI_SUBCOMMANDS_H_
