#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what it needs into
# .venv, builds the extension and the C++ tests, then runs
#   1. the C++ unit tests (CTest / GoogleTest: ranks as threads, real sockets),
#   2. the Python tests: real rank processes; the lab tests (network
#      namespaces) and the verbs tests (a Soft-RoCE VM, scripts/softroce/)
#      need root -- they say so and skip without it.
# Extra arguments go to pytest (e.g. scripts/test.sh -k allreduce).
# As root, install rdma-core's headers first so that the extension is built
# with the verbs transport (its tests run in a Soft-RoCE VM, which the
# harness sets up itself).
if [ "$(id -u)" = 0 ] && { [ ! -f /usr/include/infiniband/verbs.h ] || [ ! -f /usr/include/rdma/rdma_cma.h ]; }; then
  echo "== installing libibverbs-dev librdmacm-dev (for the verbs transport)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq libibverbs-dev librdmacm-dev >/dev/null 2>&1 ||
    { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq libibverbs-dev librdmacm-dev >/dev/null; } ||
    echo "warning: could not install rdma-core headers; the verbs tests will fail"
fi
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
