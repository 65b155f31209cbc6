#!/usr/bin/env python3
"""Checks the repository's size rules (docs/testing.md, "What each test folder holds", lint/): no
source file over 600 lines, and no C++ function body over 120 lines outside tests/.

Usage: source_limits.py [--root DIR] [--max_file_lines N] [--max_function_lines N]
Prints one line per violation and exits 1 when there is any, 0 otherwise.

Files: every tracked-looking *.cc, *.h and *.py below the root, except build trees (any directory
whose name starts with "build"), hidden directories and generated protobuf code. A function body
is counted from the line of its opening brace to the line of its closing brace, both included;
lambdas and local classes count toward the function that contains them. The C++ scanner knows
comments, string and character literals (raw strings included) and preprocessor lines; a brace
opens a function body when the text before it at namespace or class scope ends a parameter list
(")" followed by qualifiers, a trailing return type or a constructor's initializer list).
"""

import argparse
import os
import re
import sys

SOURCE_SUFFIXES = (".cc", ".h", ".py")
SCOPE_HEAD = re.compile(r'\b(namespace|class|struct|union|enum)\b|^\s*extern\s+"C"\s*$')


def source_files(root):
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs
                            if not d.startswith(".") and not d.startswith("build"))
        for name in sorted(files):
            if name.endswith(SOURCE_SUFFIXES) and not name.endswith((".pb.cc", ".pb.h")):
                yield os.path.join(directory, name)


def strip_code(text):
    """`text` with comments, literals' contents and preprocessor lines blanked (newlines kept),
    so that braces and parentheses left are the code's own."""
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == "#":
            # A preprocessor line, with its continuations.
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append("\n")
                    i += 2
                    continue
                i += 1
            continue
        if c == "\n":
            out.append(c)
            line_start = True
            i += 1
            continue
        if c in " \t":
            out.append(c)
            i += 1
            continue
        line_start = False
        if text.startswith("//", i):
            while i < n and text[i] != "\n":
                i += 1
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append("\n" * text.count("\n", i, end))
            i = end
        elif c == "R" and i + 1 < n and text[i + 1] == '"' and not _word_before(text, i):
            open_paren = text.find("(", i + 2)
            delimiter = text[i + 2:open_paren]
            end = text.find(")" + delimiter + '"', open_paren)
            end = n if end < 0 else end + len(delimiter) + 2
            out.append('""' + "\n" * text.count("\n", i, end))
            i = end
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _word_before(text, i):
    return i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")


def long_functions(text, max_lines):
    """[(first line, body lines)] of the function bodies over `max_lines` lines."""
    code = strip_code(text)
    found = []
    stack = []  # ("scope" | "function" | "other", line of the brace)
    head = []
    stack_head = []  # The head before each open brace-initialized member of an initializer list.
    line = 1
    for c in code:
        if c == "\n":
            line += 1
            head.append(" ")
            continue
        inside_function = any(kind == "function" for kind, _ in stack)
        if c == "{":
            if inside_function:
                stack.append(("other", line))
            else:
                kind = _classify("".join(head))
                if kind == "member_init":
                    stack_head.append("".join(head))
                stack.append((kind, line))
            head = []
        elif c == "}":
            if stack:
                kind, start = stack.pop()
                if kind == "function" and line - start + 1 > max_lines:
                    found.append((start, line - start + 1))
                if kind == "member_init":
                    head = list(stack_head.pop() + "{}")
                    continue
            head = []
        elif c == ";":
            head = []
        else:
            head.append(c)
    return found


def _classify(head):
    head = head.strip()
    if SCOPE_HEAD.search(head) and "(" not in head.split("{")[0].split("=")[0]:
        return "scope"
    if re.search(r"\)\s*(const|override|final|noexcept|mutable|volatile|&|&&|\s)*"
                 r"(->\s*[\w:<>,\s*&]+)?$", head):
        return "function"
    if re.search(r"\)\s*:\s*[^?;]*[\w>]$", head):
        return "member_init"  # `X() : a_{...}`: a member's brace initializer, not the body.
    if re.search(r"\)\s*:\s*[\w:]+[({]", head) or re.search(r"\)\s*:[^?]*[)}]\s*$", head):
        return "function"  # A constructor's initializer list.
    return "other"


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    parser.add_argument("--max_file_lines", type=int, default=600)
    parser.add_argument("--max_function_lines", type=int, default=120)
    args = parser.parse_args(argv)
    root = os.path.normpath(args.root)
    violations = []
    for path in source_files(root):
        relative = os.path.relpath(path, root)
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
        if lines > args.max_file_lines:
            violations.append(f"{relative}: {lines} lines (limit {args.max_file_lines})")
        if path.endswith((".cc", ".h")) and not relative.startswith("tests" + os.sep):
            for start, length in long_functions(text, args.max_function_lines):
                violations.append(f"{relative}:{start}: function body of {length} lines "
                                  f"(limit {args.max_function_lines})")
    return report(violations, f"source_limits: {len(violations)} violations under {root}")


def root_argument(argv, doc):
    """The normalized --root of a checker that takes only that option (default: the repository
    this file is in); `doc` is the checker's module docstring."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    return os.path.normpath(parser.parse_args(argv).root)


def run_checker(argv, doc, name, what, violations_under):
    """main() of a checker that takes only --root: prints violations_under(root), one line each,
    then "<name>: <count> <what> under <root>"; `doc` is the checker's module docstring."""
    root = root_argument(argv, doc)
    found = violations_under(root)
    return report(found, f"{name}: {len(found)} {what} under {root}")


def report(violations, summary):
    """Prints each violation, then `summary`; the exit status: 1 when there is any, else 0."""
    for violation in violations:
        print(violation)
    print(summary)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
