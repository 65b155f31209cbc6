#!/usr/bin/env python3
"""Checks that the library never prints: no C or C++ source outside the programs' own folders
writes to standard output or standard error. The library speaks through the trace facility
(common/log.h), whose default sink (common/log.cc) is the one place allowed to write to stderr.

Usage: no_printing.py [--root DIR]
Prints one line per call found (path:line: the call) and exits 1 when there is any, 0 otherwise.

Scanned: every *.cc, *.h, *.c and *.cu below the root, except build trees, hidden directories,
generated protobuf code and the folders of programs, which may print: tests/ (test programs and
their helpers), integration/cli, integration/bench, integration/demo and integration/host (the
wsync, wsync-bench, demo process and wsync_host programs). Comments, string literals and preprocessor lines are blanked first
(source_limits.strip_code), so a call named in a comment or a message does not count.

Refused: the printf family writing to the console (printf, vprintf, puts, putchar, perror), any
fprintf, fputs or fwrite (they write to a FILE, and only the console is at hand), the standard
streams (std::cout, std::cerr, std::clog), the stdout and stderr handles, absl::PrintF and
absl::FPrintF, and write() to file descriptor 1 or 2. snprintf and absl::StrFormat, which
format into memory, are fine.
"""

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import source_limits  # noqa: E402

SUFFIXES = (".cc", ".h", ".c", ".cu")
PROGRAM_FOLDERS = ("tests", os.path.join("integration", "cli"),
                   os.path.join("integration", "bench"), os.path.join("integration", "demo"),
                   os.path.join("integration", "host"))
# The trace facility's default sink.
ALLOWED_FILES = (os.path.join("common", "log.cc"),)

PRINTING = re.compile(
    r"(?<![\w.>])(?:std::)?(?:v?printf|f?puts|putchar|perror|v?fprintf|fwrite)\s*\("
    r"|\bstd::(?:cout|cerr|clog)\b"
    r"|(?<![\w.>])(?:std::)?(?:stdout|stderr)\b"
    r"|\babsl::F?PrintF\s*\("
    r"|(?<![\w.>])(?:::)?write\s*\(\s*(?:1|2|STDOUT_FILENO|STDERR_FILENO)\s*,")


def scanned_files(root):
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs
                            if not d.startswith(".") and not d.startswith("build"))
        relative_dir = os.path.relpath(directory, root)
        if any(relative_dir == folder or relative_dir.startswith(folder + os.sep)
               for folder in PROGRAM_FOLDERS):
            subdirs[:] = []
            continue
        for name in sorted(files):
            if name.endswith(SUFFIXES) and not name.endswith((".pb.cc", ".pb.h")):
                relative = os.path.normpath(os.path.join(relative_dir, name))
                if relative not in ALLOWED_FILES:
                    yield relative


def printing_calls(text):
    """[(line, the matched text)] of every printing call in C or C++ source `text`."""
    code = source_limits.strip_code(text)
    found = []
    for number, line in enumerate(code.split("\n"), start=1):
        for match in PRINTING.finditer(line):
            found.append((number, match.group(0).strip()))
    return found


def main(argv):
    root = source_limits.root_argument(argv, __doc__)
    violations = []
    for relative in scanned_files(root):
        with open(os.path.join(root, relative), encoding="utf-8", errors="replace") as f:
            for line, call in printing_calls(f.read()):
                violations.append(f"{relative}:{line}: {call} (library code logs through "
                                  f"common/log.h, it never prints)")
    return source_limits.report(
        violations, f"no_printing: {len(violations)} printing calls in library code under {root}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
