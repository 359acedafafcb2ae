#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what it needs into
# .venv, builds the extension and the C++ tests, then runs
#   1. the C++ unit tests (CTest / GoogleTest: ranks as threads, real sockets),
#      then again under ASan+UBSan and under TSan,
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

# The same tests under the sanitizers: AddressSanitizer + UndefinedBehavior-
# Sanitizer (out-of-bounds, use-after-free, leaks, UB), and ThreadSanitizer
# (data races: the ranks run as threads, so every cross-rank path is raced).
# Any finding fails the test that hit it. No suppressions.
for san in address,undefined thread; do
  echo "== C++ tests under -fsanitize=$san"
  dir="build/sanitize-${san//,/-}"
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMAESTRO_BUILD_TESTS=ON \
    -DMAESTRO_SANITIZE="$san" >/dev/null
  cmake --build "$dir" -j "$(nproc)" >/dev/null
  (cd "$dir" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
     TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 ctest --output-on-failure -j 1 --timeout 300 >/dev/null ||
   { echo "== sanitizer $san found something; the failing tests again, with their output:" >&2; ctest --rerun-failed --output-on-failure -j 1 --timeout 300; exit 1; })
done

echo "== Python tests"
"$PY" -m pytest -q -rs tests/python "$@"

echo "== all tests passed in $(( $(date +%s) - start )) s"
