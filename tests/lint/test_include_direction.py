"""include_direction.py's rules: includes down the dependency graph pass, includes up it or into
a transport backend from outside fail on their line, and other libraries' headers are not
checked."""

import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import include_direction  # noqa: E402


class IncludeDirectionTest(unittest.TestCase):
    def test_includes_down_the_graph_pass(self):
        for relative, included in (("planner/plan.cc", "cost/fit.h"),
                                   ("calibration/probe.cc", "cost/link_model.h"),
                                   ("calibration/probe.cc", "transport/transport.h"),
                                   ("executor/run.cc", "transport/transport.h"),
                                   ("plugin/session.cc", "executor/execute.h"),
                                   ("transport/ucx/ucx.cc", "transport/transport.h"),
                                   ("integration/cli/main.cc", "plugin/runtime.h"),
                                   ("plugin/runtime.cc", "control/client.h"),
                                   ("plugin/cuda_setup.cc", "device/cuda_module.h"),
                                   ("device/cuda_copy.h", "transport/nccl/nccl_api.h"),
                                   ("control/client.cc", "transport/transport.h"),
                                   ("integration/simulation/simgrid/platform.cc",
                                    "transport/transport.h"),
                                   ("common/log.cc", "absl/strings/str_cat.h"),
                                   ("common/log.cc", "common/status.h")):
            text = f'#include "{included}"\n'
            self.assertEqual(include_direction.violations_in(relative, text), [], relative)

    def test_includes_up_the_graph_or_into_a_backend_fail(self):
        for relative, included in (("planner/plan.cc", "calibration/probe.h"),
                                   ("cost/link_model.cc", "calibration/probe.h"),
                                   ("cost/link_model.cc", "planner/plan.h"),
                                   ("common/log.cc", "planner/layout.h"),
                                   ("executor/run.cc", "transport/ucx/ucx.h"),
                                   ("executor/run.cc", "plugin/runtime.h"),
                                   ("control/c.cc", "transport/ucx/ucx.h"),
                                   ("executor/run.cc", "control/client.h"),
                                   ("executor/run.cc", "device/cuda_copy.h"),
                                   ("device/cuda_copy.cc", "plugin/runtime.h"),
                                   ("transport/ucx/ucx.cc", "control/client.h"),
                                   ("integration/simulation/simgrid/platform.cc",
                                    "planner/plan.h"),
                                   ("plugin/session.cc", "integration/fill/fill.h")):
            text = f'#include <vector>\n\n#include "{included}"\n'
            self.assertEqual(include_direction.violations_in(relative, text), [(3, included)],
                             relative)

    def test_a_tree_with_one_upward_include_fails(self):
        with tempfile.TemporaryDirectory() as root:
            os.makedirs(os.path.join(root, "planner"))
            with open(os.path.join(root, "planner", "a.cc"), "w") as f:
                f.write('#include "common/status.h"\n')
            self.assertEqual(include_direction.main(["--root", root]), 0)
            with open(os.path.join(root, "planner", "a.cc"), "a") as f:
                f.write('#include "executor/run.h"\n')
            self.assertEqual(include_direction.main(["--root", root]), 1)


if __name__ == "__main__":
    unittest.main()
