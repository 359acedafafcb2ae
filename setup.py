"""Builds maestro_torch._C by driving CMake (scripts/extension_build.py;
CMakeLists.txt is the one build description).

    pip install --no-build-isolation -e .
"""
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import extension_build  # noqa: E402


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        out_dir = os.path.dirname(os.path.abspath(self.get_ext_fullpath(ext.name)))
        build_dir = os.environ.get("MAESTRO_BUILD_DIR", os.path.join(ROOT, "build", "ext"))
        extension_build.build(out_dir, build_dir)


setup(ext_modules=[CMakeExtension("maestro_torch._C")], cmdclass={"build_ext": CMakeBuild})
