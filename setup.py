"""Builds maestro_torch._C by driving CMake (CMakeLists.txt is the one build
description). Torch's include and library paths come from
torch.utils.cpp_extension: find_package(Torch) fails with the PyPI wheel.

    pip install --no-build-isolation -e .
"""
import os
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        import torch
        from torch.utils import cpp_extension

        out_dir = os.path.dirname(os.path.abspath(self.get_ext_fullpath(ext.name)))
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        build_dir = os.environ.get("MAESTRO_BUILD_DIR", os.path.join(ROOT, "build", "ext"))
        os.makedirs(build_dir, exist_ok=True)
        abi = "1" if torch._C._GLIBCXX_USE_CXX11_ABI else "0"
        args = [
            "cmake", "-S", ROOT, "-B", build_dir,
            "-DCMAKE_BUILD_TYPE=Release",
            "-DMAESTRO_BUILD_EXTENSION=ON",
            "-DMAESTRO_BUILD_TESTS=" + os.environ.get("MAESTRO_BUILD_TESTS", "OFF"),
            "-DMAESTRO_CXX11_ABI=" + abi,
            "-DTORCH_INCLUDE_DIRS=" + ";".join(cpp_extension.include_paths()),
            "-DTORCH_LIBRARY_DIRS=" + ";".join(cpp_extension.library_paths()),
            "-DPYTHON_INCLUDE_DIR=" + sysconfig.get_paths()["include"],
            "-DMAESTRO_EXT_OUTPUT_DIR=" + out_dir,
            "-DMAESTRO_EXT_SUFFIX=" + suffix,
        ]
        if os.environ.get("MAESTRO_WITH_VERBS"):
            args.append("-DMAESTRO_WITH_VERBS=" + os.environ["MAESTRO_WITH_VERBS"])
        subprocess.check_call(args)
        jobs = os.environ.get("MAESTRO_BUILD_JOBS", str(os.cpu_count() or 2))
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "maestro_ext", "-j", jobs])


setup(ext_modules=[CMakeExtension("maestro_torch._C")], cmdclass={"build_ext": CMakeBuild})
