#!/usr/bin/env python3
"""Checks the direction of includes between folders (README.md, "Repository map": integration ->
plugin -> executor -> planner -> cost -> common, plugin -> control -> transport -> common,
executor -> transport, planner and executor -> quant -> common, metrics -> common, plugin ->
calibration -> transport, cost, plugin -> device -> transport; each folder's README.md says what
it may include).

Usage: include_direction.py [--root DIR]
Prints one line per include a folder may not make (file:line) and exits 1 when there is any, 0
otherwise. Today's tree has none.

Files: every *.cc, *.h, *.c, *.cu and *.cuh below the root outside tests/ (no_test_deps.py keeps
product code off tests/), build trees and hidden directories. Only quoted includes of a wsync
folder are checked; Abseil, protobuf, system and other libraries' headers are the folders' own
business. The rule of a file is the one of the longest folder in RULES that holds it; a folder
may always include its own files. An allowed pattern is a path ("quant/fp8_device.h"), a folder's
top-level files ("transport/*") or a folder with everything below it ("planner/**").
"""

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import no_test_deps  # noqa: E402
import source_limits  # noqa: E402

WSYNC_FOLDERS = ("common", "quant", "cost", "calibration", "planner", "transport", "control",
                 "executor", "metrics", "plugin", "integration", "device")
BELOW_PLUGIN = ("common/**", "quant/**", "cost/**", "calibration/**", "planner/**",
                "transport/**", "control/**", "executor/**", "metrics/**", "plugin/**", "device/**")
RULES = {
    "common": (),
    "quant": ("common/**",),
    "cost": ("common/**",),
    "calibration": ("common/**", "transport/transport.h", "cost/**"),
    "planner": ("common/**", "quant/**", "cost/**"),
    "transport": ("common/**", "quant/fp8_device.h", "planner/layout.h"),
    "transport/cuda_ipc": ("common/**", "transport/transport.h", "transport/nccl/nccl_api.h"),
    "transport/loopback": ("common/**", "transport/transport.h"),
    # The real NcclApi (nccl_api_real.cc) launches device/'s kernels: an arrow back up.
    "transport/nccl": ("common/**", "transport/transport.h", "quant/fp8_device.h",
                       "device/cuda_copy_kernel.h", "device/cuda_quant_kernel.h"),
    "transport/selector": ("common/**", "transport/*"),
    "transport/ucx": ("common/**", "transport/transport.h"),
    "control": ("common/**", "transport/transport.h"),
    # The NcclApi interface; the module's entry also the real one (nccl_api_real.h).
    "device": ("common/**", "transport/device_memory.h", "transport/nccl/nccl_api.h",
               "transport/nccl/nccl_api_real.h", "quant/fp8_device.h", "quant/fp8_device_host.h"),
    # The interfaces of transport/, never a backend.
    "executor": ("common/**", "quant/**", "planner/**", "transport/*"),
    "metrics": ("common/**",),
    "plugin": BELOW_PLUGIN,
    "integration": BELOW_PLUGIN + ("integration/**",),
    # The SimGrid transport: what a transport/ backend may include, nothing of integration/.
    "integration/simulation/simgrid": ("common/**", "transport/**"),
}
QUOTED_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def rule_of(relative):
    """The RULES key of the longest folder that holds `relative`, or None."""
    folders = [f for f in RULES if relative.startswith(f + "/")]
    return max(folders, key=len) if folders else None


def allowed(pattern, included):
    if pattern.endswith("/**"):
        return included.startswith(pattern[:-2])
    if pattern.endswith("/*"):
        return included.startswith(pattern[:-1]) and "/" not in included[len(pattern) - 1:]
    return included == pattern


def violations_in(relative, text):
    """(line, included path) of every include the file `relative` may not make."""
    folder = rule_of(relative)
    if folder is None:
        return []
    found = []
    for number, line in enumerate(text.split("\n"), 1):
        match = QUOTED_INCLUDE.match(line)
        if match is None:
            continue
        included = match.group(1)
        if included.split("/")[0] not in WSYNC_FOLDERS or included.startswith(folder + "/"):
            continue
        if not any(allowed(pattern, included) for pattern in RULES[folder]):
            found.append((number, included))
    return found


def violations_under(root):
    keep = lambda name: name.endswith(no_test_deps.SOURCE_SUFFIXES)  # noqa: E731
    return [f"{relative}:{line}: includes {included}, which {rule_of(relative)}/ may not include "
            f"(its README.md says what it may)"
            for relative in no_test_deps.walk(root, keep)
            for line, included in violations_in(
                relative, no_test_deps.read(os.path.join(root, relative)))]


def main(argv):
    return source_limits.run_checker(argv, __doc__, "include_direction",
                                     "includes against the dependency rule", violations_under)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
