#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what it needs into
# .venv, builds the extension and the C++ tests, then runs
#   1. the C++ unit tests (CTest / GoogleTest: ranks as threads, real sockets),
#      then again under ASan+UBSan and under TSan; the fuzzers for 30 s each,
#   2. the Python tests: real rank processes; the lab tests (network
#      namespaces) and the verbs tests (a Soft-RoCE VM, scripts/softroce/)
#      need root -- they say so and skip without it.
# Extra arguments go to pytest (e.g. scripts/test.sh -k allreduce).
# As root, install rdma-core's headers first so that the extension is built
# with the verbs transport (its tests run in a Soft-RoCE VM, which the
# harness sets up itself).
if [ "$(id -u)" = 0 ] && { [ ! -f /usr/include/infiniband/verbs.h ] || [ ! -f /usr/include/rdma/rdma_cma.h ] ||
                           ! command -v clang++ >/dev/null; }; then
  echo "== installing libibverbs-dev librdmacm-dev (the verbs transport) and clang (the fuzzers)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq libibverbs-dev librdmacm-dev clang >/dev/null 2>&1 ||
    { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq libibverbs-dev librdmacm-dev clang >/dev/null; } ||
    echo "warning: could not install rdma-core headers and clang; the verbs tests and the fuzzers will fail"
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
# Any finding fails the test that hit it. No suppressions. Under TSan (about
# 10x slower) the 64-ranks-as-threads test is left out: its one event loop
# then cannot keep 8,064 sockets moving within the path timeout, so it tests
# the host's speed, not the code; it runs in the plain and ASan builds.
for san in address,undefined thread; do
  echo "== C++ tests under -fsanitize=$san"
  exclude=()
  [ "$san" = thread ] && exclude=(-E 'CollectivesScale\.SixtyFourRanksAsThreads')
  dir="build/sanitize-${san//,/-}"
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMAESTRO_BUILD_TESTS=ON \
    -DMAESTRO_SANITIZE="$san" >/dev/null
  cmake --build "$dir" -j "$(nproc)" >/dev/null
  # The run's own output is kept and shown on failure: a race may not
  # happen again when the test is rerun.
  log="$dir/ctest.log"
  (cd "$dir" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
     TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 ctest "${exclude[@]}" --output-on-failure -j 1 --timeout 300 >ctest.log 2>&1) ||
   { echo "== sanitizer $san found something; the failing tests' output from that run ($log):" >&2
     grep -v -E '^ *Start [0-9]+:|Test +#[0-9]+: .* Passed ' "$log" >&2; exit 1; }
done

# The fuzzers, briefly, on top of their committed corpus (scripts/fuzz.sh).
if command -v clang++ >/dev/null; then
  echo "== fuzzing: every target for 30 s"
  bash scripts/fuzz.sh --seconds 30
elif [ "${MAESTRO_REQUIRE_ALL_SUITES:-0}" = 1 ]; then
  echo "error: clang is missing, so the fuzzers cannot run (MAESTRO_REQUIRE_ALL_SUITES=1)" >&2
  exit 1
else
  echo "== fuzzing SKIPPED: clang is not installed (apt-get install clang)"
fi

echo "== Python tests"
"$PY" -m pytest -q -rs tests/python "$@"

echo "== all tests passed in $(( $(date +%s) - start )) s"
