"""no_test_deps.py's scanner: includes of tests/ and dependencies on test targets are found on
their lines, mentions in comments and other targets are not, and in a tree the same include or
link fails in product code but passes under tests/."""

import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import no_test_deps  # noqa: E402


def write(root, relative, text):
    path = os.path.join(root, relative)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


class NoTestDepsTest(unittest.TestCase):
    def test_includes_of_tests_are_found_on_their_line(self):
        text = ('#include "planner/job.h"\n// see "tests/testing/reference.h"\n'
                '#include "tests/testing/reference.h"\n  #  include <tests/x.h>\n'
                '#include "integration/fill/fill.h"\n')
        self.assertEqual([line for line, _ in no_test_deps.includes_of_tests(text)], [3, 4])

    def test_dependencies_in_every_form(self):
        text = ("# DEPS wsync::commented\n"
                "wsync_cc_library(\n  NAME a\n  SRCS a.cc\n  DEPS wsync::b wsync::c\n)\n"
                "target_link_libraries(a PRIVATE wsync::d)\n"
                "add_dependencies(e f)\n"
                'add_test(NAME t COMMAND $<TARGET_FILE:g> --x)\n'
                "wsync_cc_test(NAME t2 SRCS t.cc DEPS h LABELS unit)\n")
        self.assertEqual(no_test_deps.dependencies(text),
                         [("wsync::b", 5), ("wsync::c", 5), ("PRIVATE", 7), ("wsync::d", 7),
                          ("f", 8), ("g", 9), ("h", 10)])

    def test_test_targets_are_read_from_their_definitions(self):
        text = ("wsync_cc_library(\n  NAME helpers\n  SRCS h.cc)\n"
                "wsync_cc_binary(NAME worker SRCS w.cc)\nwsync_cc_test(NAME a_test SRCS a.cc)\n"
                "add_executable(tool tool.cc)\n# wsync_cc_library(NAME commented)\n")
        self.assertEqual(no_test_deps.test_targets(text),
                         {"wsync_helpers", "wsync::helpers", "worker", "a_test", "tool"})

    def test_product_code_may_not_stand_on_tests_but_tests_may(self):
        with tempfile.TemporaryDirectory() as root:
            write(root, "tests/testing/CMakeLists.txt", "wsync_cc_library(NAME helpers)\n")
            write(root, "tests/unit/CMakeLists.txt", "wsync_cc_test(NAME a DEPS wsync::helpers)\n")
            write(root, "tests/unit/a.cc", '#include "tests/testing/h.h"\n')
            write(root, "build/x/CMakeLists.txt", "wsync_cc_binary(NAME z DEPS wsync::helpers)\n")
            write(root, "integration/demo/CMakeLists.txt",
                  "wsync_cc_binary(NAME d DEPS wsync::planner)\n")
            write(root, "integration/demo/d.cc", '#include "planner/job.h"\n')
            self.assertEqual(no_test_deps.main(["--root", root]), 0)
            write(root, "integration/demo/CMakeLists.txt",
                  "wsync_cc_binary(NAME d\n  DEPS wsync::planner wsync::helpers)\n")
            write(root, "integration/cuda/c.cc", '\n#include "tests/testing/h.h"\n')
            write(root, "plugin/CMakeLists.txt", "target_link_libraries(p wsync::testing)\n")
            self.assertEqual(sorted(v.split(" ")[0] for v in no_test_deps.violations_under(root)),
                             ["integration/cuda/c.cc:2:", "integration/demo/CMakeLists.txt:2:",
                              "plugin/CMakeLists.txt:1:"])
            self.assertEqual(no_test_deps.main(["--root", root]), 1)


if __name__ == "__main__":
    unittest.main()
