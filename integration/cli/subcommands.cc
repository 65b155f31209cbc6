#include "integration/cli/subcommands.h"

#include <cstdio>

#include "absl/strings/str_format.h"

namespace wsync::cli {
namespace {

const Subcommand* Find(absl::Span<const Subcommand> subcommands, absl::string_view name) {
  for (const Subcommand& s : subcommands) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

}  // namespace

bool IsHelpWord(absl::string_view arg) {
  return arg == "help" || arg == "--help" || arg == "-h" || arg == "--helpfull" ||
         arg == "--helpshort";
}

int RunSubcommand(absl::string_view program, absl::string_view noun,
                  absl::Span<const Subcommand> subcommands, const std::string& usage, int argc,
                  char** argv) {
  if (argc < 2) {
    absl::FPrintF(stderr, "%s", usage);
    return 2;
  }
  const absl::string_view name = argv[1];
  if (IsHelpWord(name)) {
    const Subcommand* s = argc > 2 ? Find(subcommands, argv[2]) : nullptr;
    absl::PrintF("%s", s != nullptr ? s->usage() : usage);
    return 0;
  }
  const Subcommand* s = Find(subcommands, name);
  if (s == nullptr) {
    absl::FPrintF(stderr, "%s: unknown %s '%s'\n\n%s", program, noun, name, usage);
    return 2;
  }
  for (int i = 2; i < argc; ++i) {
    if (IsHelpWord(argv[i])) {
      absl::PrintF("%s", s->usage());
      return 0;
    }
  }
  return s->main(argc - 1, argv + 1);
}

}  // namespace wsync::cli
