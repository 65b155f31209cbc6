"""Puts libwsync.so inside the wsync package (wsync/_lib.py loads it from there, with no
WSYNC_LIBRARY), as ``pip install integration/python`` runs it (Debian's setuptools, offline:
``--no-build-isolation --no-index``). The library is, in this order:

1. the file ``$WSYNC_PREBUILT_LIBRARY`` names (it must exist);
2. the project's ``build/plugin/libwsync.so`` (what ``make build`` leaves);
3. built here by the project's CMake (target wsync_plugin, Release) under setuptools' build_temp.

The package then holds a platform binary, so the wheel is tagged for this platform."""

import os
import shutil
import subprocess

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def _library(build_temp):
    named = os.environ.get("WSYNC_PREBUILT_LIBRARY")
    if named:
        if not os.path.isfile(named):
            raise SystemExit(f"WSYNC_PREBUILT_LIBRARY={named} does not exist")
        return named
    built = os.path.join(ROOT, "build", "plugin", "libwsync.so")
    if os.path.isfile(built):
        return built
    cmake_dir = os.path.join(os.path.abspath(build_temp), "cmake")
    subprocess.check_call(["cmake", "-S", ROOT, "-B", cmake_dir, "-DCMAKE_BUILD_TYPE=Release"])
    subprocess.check_call(["cmake", "--build", cmake_dir, "--target", "wsync_plugin", "-j",
                           str(os.cpu_count() or 1)])
    return os.path.join(cmake_dir, "plugin", "libwsync.so")


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        build_temp = self.get_finalized_command("build").build_temp
        target = os.path.join(self.build_lib, "wsync", "libwsync.so")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(_library(build_temp), target)


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildPyWithLibrary}, distclass=BinaryDistribution)
