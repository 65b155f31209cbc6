"""source_limits.py's scanner on C++ it must read right: function bodies among scopes, member
initializers, literals and comments holding braces; and a tree with one file and one function
over the limits gives exactly those two violations."""

import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import source_limits  # noqa: E402

SNIPPET = '''#include "a.h"
#define BLOCK(x) { x; }
namespace a {
class X : public Base {
 public:
  X(int a) : a_(a), b_{2}, c_{3} {
    f();
  }
  int get() const { return a_; }
  int x_{4};
};
int F(int x) {
  std::string s = "}{";  // }}}
  char c = '{';
  /* { */ auto r = R"(}})";
  if (x) {
    return 1;
  }
}
struct Y {
  Y() = default;
};
Y::Y(const Y& o)
    : Z(o) {
  g();
}
auto G() -> int { return [] { return 1; }(); }
const int kTable[] = {1, 2, 3};
extern "C" {
void H() {}
}
}  // namespace a
'''


class SourceLimitsTest(unittest.TestCase):
    def test_function_bodies_found_and_sized(self):
        self.assertEqual(source_limits.long_functions(SNIPPET, 0),
                         [(6, 3), (9, 1), (12, 8), (24, 3), (27, 1), (30, 1)])

    def test_only_bodies_over_the_limit(self):
        self.assertEqual(source_limits.long_functions(SNIPPET, 3), [(12, 8)])

    def test_a_long_body_is_counted_whole(self):
        for length in (1, 7, 121, 300):
            body = "".join(f"  x += {i};\n" for i in range(length))
            text = "namespace n {\nint F() {\n" + body + "}\n}  // namespace n\n"
            self.assertEqual(source_limits.long_functions(text, 0), [(2, length + 2)])

    def test_tree_violations(self):
        with tempfile.TemporaryDirectory() as root:
            def write(relative, text):
                path = os.path.join(root, relative)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w") as f:
                    f.write(text)
            long_body = "int F() {\n" + "  f();\n" * 130 + "}\n"
            write("core/long.cc", long_body)
            write("tests/unit/long_test.cc", long_body)  # Functions in tests are not limited.
            write("core/big.h", "// x\n" * 601)
            write("core/fine.cc", "// x\n" * 600)
            write("build/big.cc", "// x\n" * 900)  # Build trees are skipped.
            self.assertEqual(source_limits.main(["--root", root]), 1)
            found = []
            for path in source_limits.source_files(root):
                found.append(os.path.relpath(path, root))
            self.assertNotIn(os.path.join("build", "big.cc"), found)
            self.assertEqual(source_limits.main(["--root", root, "--max_file_lines", "601",
                                                 "--max_function_lines", "132"]), 0)


if __name__ == "__main__":
    unittest.main()
