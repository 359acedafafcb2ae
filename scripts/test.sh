#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what it needs into
# .venv, builds the extension and the C++ tests, then runs
#   1. the C++ unit tests (CTest / GoogleTest: ranks as threads, real sockets),
#   2. the Python tests (real rank processes; lab tests build network
#      namespaces and need root -- they say so and skip without it),
# Extra arguments go to pytest (e.g. scripts/test.sh -k allreduce).
source "$(dirname "$0")/env.sh"
cd "$ROOT"
start=$(date +%s)

echo "== C++ tests"
cmake -S . -B build/tests -G Ninja -DCMAKE_BUILD_TYPE=Release -DMAESTRO_BUILD_TESTS=ON >/dev/null
cmake --build build/tests -j "$(nproc)"
(cd build/tests && ctest --output-on-failure -j 1 --timeout 300)

echo "== Python tests"
"$PY" -m pytest -q -rs tests/python "$@"

echo "== all tests passed in $(( $(date +%s) - start )) s"
