"""Configures and builds the extension module maestro_torch._C with CMake
(CMakeLists.txt is the one build description). Torch's include and library
paths come from torch.utils.cpp_extension: find_package(Torch) fails with
the PyPI wheel.

setup.py (pip install --no-build-isolation -e .) calls build(). Run as a
script it builds a sanitizer build of the extension beside the real one,
with the package's Python files linked next to it, for a test run that puts
that folder first on PYTHONPATH (scripts/test.sh):

    python scripts/extension_build.py --sanitize address,undefined --out build/sanitize-ext
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sysconfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build(out_dir: str, build_dir: str, sanitize: str = "") -> None:
    """Builds maestro_torch._C into out_dir, with the CMake tree in build_dir;
    `sanitize` (e.g. "address,undefined") builds it with those sanitizers."""
    import torch

    try:
        from torch.utils import cpp_extension  # imports setuptools, which a bare Python may lack

        include_paths, library_paths = cpp_extension.include_paths(), cpp_extension.library_paths()
    except ImportError:  # what those two return for a CPU build, from torch's own folder
        base = os.path.dirname(os.path.abspath(torch.__file__))
        include_paths = [os.path.join(base, "include"), os.path.join(base, "include", "torch", "csrc", "api", "include")]
        library_paths = [os.path.join(base, "lib")]
    os.makedirs(build_dir, exist_ok=True)
    abi = "1" if torch._C._GLIBCXX_USE_CXX11_ABI else "0"
    args = [
        "cmake", "-S", ROOT, "-B", build_dir,
        "-DCMAKE_BUILD_TYPE=" + ("RelWithDebInfo" if sanitize else "Release"),
        "-DMAESTRO_BUILD_EXTENSION=ON",
        "-DMAESTRO_BUILD_TESTS=" + os.environ.get("MAESTRO_BUILD_TESTS", "OFF"),
        "-DMAESTRO_SANITIZE=" + sanitize,
        "-DMAESTRO_CXX11_ABI=" + abi,
        "-DTORCH_INCLUDE_DIRS=" + ";".join(include_paths),
        "-DTORCH_LIBRARY_DIRS=" + ";".join(library_paths),
        "-DPYTHON_INCLUDE_DIR=" + sysconfig.get_paths()["include"],
        "-DMAESTRO_EXT_OUTPUT_DIR=" + out_dir,
        "-DMAESTRO_EXT_SUFFIX=" + sysconfig.get_config_var("EXT_SUFFIX"),
    ]
    # CUDA tensors are staged whenever torch has CUDA (maestro_torch._C.has_cuda).
    args.append("-DMAESTRO_WITH_CUDA=" + ("ON" if torch.version.cuda else "OFF"))
    if os.environ.get("MAESTRO_WITH_VERBS"):
        args.append("-DMAESTRO_WITH_VERBS=" + os.environ["MAESTRO_WITH_VERBS"])
    subprocess.check_call(args)
    jobs = os.environ.get("MAESTRO_BUILD_JOBS", str(os.cpu_count() or 2))
    subprocess.check_call(["cmake", "--build", build_dir, "--target", "maestro_ext", "-j", jobs])
    check_libstdcxx(out_dir)


def check_libstdcxx(out_dir: str) -> None:
    """Refuse a module with its own copy of libstdc++ inside: some toolchains
    link it statically, and that copy's locale is never set up beside the
    libstdc++ torch loads, so the first number formatted into a stream
    crashes the process (seen with a GCC 13 build in /opt/gcc)."""
    import glob

    for so in glob.glob(os.path.join(out_dir, "_C*" + sysconfig.get_config_var("EXT_SUFFIX"))):
        try:
            symbols = subprocess.run(["nm", "-C", "--defined-only", so], capture_output=True, text=True).stdout
        except OSError:  # no binutils: nothing to check with
            return
        if "std::locale::classic()" in symbols:
            os.remove(so)
            raise SystemExit(f"{so}: the compiler ({os.environ.get('CXX', 'c++')}) linked libstdc++ into the module "
                             f"statically, which crashes beside torch's libstdc++; build with a compiler that links it "
                             f"dynamically, e.g. CXX=/usr/bin/g++ CC=/usr/bin/gcc")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sanitize", required=True, help="e.g. address,undefined")
    ap.add_argument("--out", required=True, help="folder: <out>/cmake is the CMake tree, <out>/pkg goes on PYTHONPATH")
    a = ap.parse_args()
    out = os.path.abspath(a.out)
    package = os.path.join(out, "pkg", "maestro_torch")
    build(package, os.path.join(out, "cmake"), a.sanitize)
    source = os.path.join(ROOT, "maestro_torch")
    for name in os.listdir(source):  # the Python files as they are in the checkout
        if name.endswith(".py"):
            link = os.path.join(package, name)
            if os.path.lexists(link):
                os.remove(link)
            os.symlink(os.path.join(source, name), link)
    print(os.path.join(out, "pkg"))


if __name__ == "__main__":
    main()
