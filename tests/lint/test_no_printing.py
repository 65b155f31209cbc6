"""no_printing.py's scanner: every refused form is found on its line, calls that format into
memory or are only named in comments and literals are not, and in a tree the same call fails in
library code but passes in a program's folder and in the log's own sink."""

import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import no_printing  # noqa: E402

REFUSED = [
    'printf("x");', 'std::printf("%d", 1);', 'puts("x");', 'perror("open");',
    'fprintf(stream, "x");', 'std::fprintf(stderr, "x");', 'fputs("x", f);',
    'fwrite(p, 1, n, f);', 'std::cout << 1;', 'std::cerr << "x";', 'std::clog << 2;',
    'std::fflush(stderr);', 'FILE* out = stdout;', 'absl::PrintF("x");',
    'absl::FPrintF(stderr, "x");', 'write(2, p, n);', '::write(STDERR_FILENO, p, n);',
    'vfprintf(f, fmt, args);',
]
ALLOWED = [
    'snprintf(buf, n, "%d", 1);', 'std::snprintf(buf, n, "x");', 'absl::StrFormat("%d", 1);',
    'log.printf_count = 1;', 'writer.write(2, p);', 'write(fd, p, n);', 'out->fwrite_bytes();',
    '// printf("in a comment"); std::cerr', 'const char* s = "fprintf(stderr, x)";',
    '#include <cstdio>', 'int my_stderr_lines = 0;', 'WSYNC_LOG(kRound, kInfo, "printf");',
]


class NoPrintingTest(unittest.TestCase):
    def test_every_refused_form_is_found(self):
        for statement in REFUSED:
            text = "void F() {\n  int a = 0;\n  " + statement + "\n}\n"
            found = no_printing.printing_calls(text)
            self.assertEqual([line for line, _ in found][:1], [3], statement)

    def test_formatting_into_memory_and_mentions_are_fine(self):
        for statement in ALLOWED:
            self.assertEqual(no_printing.printing_calls(statement + "\n"), [], statement)

    def test_programs_and_the_sink_may_print_the_library_may_not(self):
        with tempfile.TemporaryDirectory() as root:
            call = 'void F() { std::fprintf(stderr, "x"); }\n'
            for relative in ("executor/run.cc", "common/log.cc", "tests/unit/a_test.cc",
                             "integration/cli/main.cc", "integration/python/wsync/x.c",
                             "build/gen/y.cc", "planner/x.pb.cc"):
                path = os.path.join(root, relative)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w") as f:
                    f.write(call)
            self.assertEqual(sorted(no_printing.scanned_files(root)),
                             ["executor/run.cc", "integration/python/wsync/x.c"])
            self.assertEqual(no_printing.main(["--root", root]), 1)


if __name__ == "__main__":
    unittest.main()
