#!/usr/bin/env python3
"""Checks that product code does not stand on test code: no C/C++ source outside tests/ includes
"tests/..." (or <tests/...>), and no CMakeLists.txt outside tests/ makes a target depend on a test
target (a library, binary or test defined under tests/, and always wsync::testing).

Usage: no_test_deps.py [--root DIR]
Prints one line per violation (file:line) and exits 1 when there is any, 0 otherwise.

Files: every *.cc, *.h, *.c, *.cu, *.cuh and CMakeLists.txt below the root, except tests/, build
trees (any directory whose name starts with "build") and hidden directories. A dependency is a
target named after the first argument of target_link_libraries or add_dependencies, in the DEPS
of a wsync_cc_library / wsync_cc_binary / wsync_cc_test, or in a $<TARGET_...:name> generator
expression; comments are ignored. The test targets are read from the NAME of those helpers and
from add_library / add_executable in tests/'s CMakeLists.txt files (a wsync_cc_library NAME x
defines wsync_x and its alias wsync::x).
"""

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import source_limits  # noqa: E402

SOURCE_SUFFIXES = (".cc", ".h", ".c", ".cu", ".cuh")
TEST_LIBRARIES = ("wsync::testing",)
INCLUDE_OF_TESTS = re.compile(r'^\s*#\s*include\s*["<]tests/')
COMMAND = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)\s*\(")
DEFINITION = re.compile(
    r"\b(wsync_cc_library|wsync_cc_binary|wsync_cc_test|add_library|add_executable)\s*\(\s*"
    r"(?:NAME\s+)?([A-Za-z0-9_.+-]+)")
GENERATOR_TARGET = re.compile(r"\$<TARGET_[A-Z_]+:([A-Za-z0-9_:.+-]+)>")
HELPER_KEYWORDS = {"NAME", "SRCS", "HDRS", "DEPS", "LABELS", "TIMEOUT", "COST", "SANITIZERS",
                   "SHARDS"}


def walk(root, keep):
    """Paths relative to `root` of the files `keep(name)` accepts, outside tests/, build trees and
    hidden directories, sorted."""
    for directory, subdirs, files in os.walk(root):
        relative_dir = os.path.relpath(directory, root)
        subdirs[:] = sorted(
            d for d in subdirs if not d.startswith(".") and not d.startswith("build") and
            not (relative_dir == "." and d == "tests"))
        for name in sorted(files):
            if keep(name):
                yield os.path.normpath(os.path.join(relative_dir, name))


def strip_cmake_comments(text):
    """`text` with every # comment blanked (outside quoted strings), newlines kept."""
    out = []
    for line in text.split("\n"):
        quoted = False
        for i, c in enumerate(line):
            if c == '"':
                quoted = not quoted
            elif c == "#" and not quoted:
                line = line[:i]
                break
        out.append(line)
    return "\n".join(out)


def test_targets(text):
    """The target names a tests/ CMakeLists.txt defines: NAME x of wsync_cc_library gives wsync_x
    and wsync::x, of the other helpers x."""
    names = set()
    for kind, name in DEFINITION.findall(strip_cmake_comments(text)):
        if kind == "wsync_cc_library":
            names.update({"wsync_" + name, "wsync::" + name})
        else:
            names.add(name)
    return names


def commands(text):
    """(command, [(argument, line)]) for every command call in CMake `text` (comments stripped)."""
    text = strip_cmake_comments(text)
    for match in COMMAND.finditer(text):
        depth, i = 1, match.end()
        while i < len(text) and depth > 0:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        arguments = []
        for word in re.finditer(r"[^\s()]+", text[match.end():i - 1]):
            line = text.count("\n", 0, match.end() + word.start()) + 1
            arguments.append((word.group(0), line))
        yield match.group(1), arguments


def dependencies(text):
    """(name, line) of every target `text` makes something depend on (see the module doc)."""
    found = []
    for command, arguments in commands(text):
        if command in ("target_link_libraries", "add_dependencies"):
            found.extend(arguments[1:])
        elif command.startswith("wsync_cc_"):
            in_deps = False
            for word, line in arguments:
                if word in HELPER_KEYWORDS:
                    in_deps = word == "DEPS"
                elif in_deps:
                    found.append((word, line))
    stripped = strip_cmake_comments(text)
    for match in GENERATOR_TARGET.finditer(stripped):
        found.append((match.group(1), stripped.count("\n", 0, match.start()) + 1))
    return sorted(set(found), key=lambda item: (item[1], item[0]))


def includes_of_tests(text):
    """(line, include text) of every #include of a path under tests/."""
    return [(n, line.strip()) for n, line in enumerate(text.split("\n"), 1)
            if INCLUDE_OF_TESTS.match(line)]


def read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def violations_under(root):
    targets = set(TEST_LIBRARIES)
    for directory, _, files in os.walk(os.path.join(root, "tests")):
        if "CMakeLists.txt" in files:
            targets |= test_targets(read(os.path.join(directory, "CMakeLists.txt")))
    found = []
    for relative in walk(root, lambda name: name.endswith(SOURCE_SUFFIXES)):
        for line, include in includes_of_tests(read(os.path.join(root, relative))):
            found.append(f"{relative}:{line}: {include} (product code includes tests/)")
    for relative in walk(root, lambda name: name == "CMakeLists.txt"):
        for name, line in dependencies(read(os.path.join(root, relative))):
            if name in targets:
                found.append(f"{relative}:{line}: depends on {name}, a target defined under "
                             f"tests/ (product targets never link test code)")
    return found


def main(argv):
    return source_limits.run_checker(argv, __doc__, "no_test_deps",
                                     "dependencies of product code on tests/", violations_under)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
