#!/usr/bin/env bash
# Flakiness harness: runs the tests over and over and prints each test's
# failure rate, with the first failing output of each test kept.
#   scripts/flaky.sh                                  # C++: plain x50, asan x20, tsan x20
#   scripts/flaky.sh --builds plain:10,tsan:5         # builds and their repeat counts
#   scripts/flaky.sh --cpp-repeat 30 --builds tsan    # one count for every build named
#   scripts/flaky.sh --filter 'SharedPaths.*'         # a gtest filter
#   scripts/flaky.sh --builds none --python-repeat 3 --modules test_p2p,test_behaviour
#   scripts/flaky.sh --contention ...                 # every core kept busy meanwhile
# C++: each build's maestro_tests runs with --gtest_repeat and --gtest_shuffle
# (a new random seed per process, written to the log); a test that crashes
# the process (a sanitizer report halts it) or runs past --test-timeout is
# a failure, and a new process goes on with the iterations left. Builds:
# plain (Release), asan (ASan+UBSan), tsan (TSan; CollectivesScale.
# SixtyFourRanksAsThreads left out, as in scripts/test.sh), in build/flaky-*.
# Python (needs the .venv of scripts/env.sh, which this does not set up):
# every named module runs --python-repeat times, the runs in random order,
# one pytest process each.
# Results go to --out (default build/flaky/<time>): results.jsonl (one line a
# test run), failures/ (the first failing output of each test), <build>.log
# (everything), table.txt (every test). Exit status 1 if any test failed.
# --jobs sets the build's parallelism (default: every core).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

builds="plain:50,asan:20,tsan:20"
cpp_repeat=""
filter=""
python_repeat=0
modules="test_collectives,test_p2p,test_behaviour,test_exchange,test_staging"
contention=0
test_timeout=300
jobs=$(nproc)
out="build/flaky/$(date +%Y%m%d-%H%M%S)"
usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --builds) builds="$2"; shift 2 ;;
    --cpp-repeat) cpp_repeat="$2"; shift 2 ;;
    --filter) filter="$2"; shift 2 ;;
    --python-repeat) python_repeat="$2"; shift 2 ;;
    --modules) modules="$2"; shift 2 ;;
    --contention) contention=1; shift ;;
    --test-timeout) test_timeout="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) usage ;;
  esac
done
mkdir -p "$out"
echo "== results in $out (commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- csrc tests ':!csrc/c10d' || echo ', with local changes'))"

load=()
stop_load() { for pid in "${load[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap stop_load EXIT
if [ "$contention" = 1 ]; then
  # One busy loop per core, at the tests' own priority.
  for _ in $(seq "$(nproc)"); do
    (while :; do :; done) &
    load+=($!)
  done
  echo "== contention: ${#load[@]} busy loops (pids ${load[*]})"
fi

IFS=, read -ra build_list <<<"$builds"
for spec in "${build_list[@]}"; do
  name=${spec%%:*}
  repeat=${cpp_repeat:-${spec#*:}}
  [ "$repeat" = "$spec" ] && repeat=${cpp_repeat:-20}
  env=()
  build_filter=$filter
  case "$name" in
    none) continue ;;
    plain) flags=(-DCMAKE_BUILD_TYPE=Release) ;;
    asan) flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DMAESTRO_SANITIZE=address,undefined)
          env=(ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1) ;;
    tsan) flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DMAESTRO_SANITIZE=thread)
          env=(TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1)
          # As scripts/test.sh: 64 ranks on one event loop under TSan test the host's speed.
          case "$build_filter" in
            *-*) build_filter="$build_filter:CollectivesScale.SixtyFourRanksAsThreads" ;;
            *) build_filter="${build_filter:-*}-CollectivesScale.SixtyFourRanksAsThreads" ;;
          esac ;;
    *) echo "unknown build '$name' (plain, asan, tsan, none)" >&2; exit 2 ;;
  esac
  dir="build/flaky-$name"
  # Each build takes the tree as it is when its turn comes: say which.
  echo "== $name: building $dir at $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- csrc tests || echo ' with local changes')"
  cmake -S . -B "$dir" -G Ninja -DMAESTRO_BUILD_TESTS=ON "${flags[@]}" >"$out/$name-build.log" 2>&1 &&
    cmake --build "$dir" -j "$jobs" --target maestro_tests >>"$out/$name-build.log" 2>&1 ||
    { tail -30 "$out/$name-build.log" >&2; exit 1; }
  echo "== $name: $repeat shuffled repeats${build_filter:+ of $build_filter}"
  t0=$(date +%s)
  python3 scripts/flaky.py gtest --out "$out" --group "$name" --repeat "$repeat" --filter "$build_filter" \
    --test-timeout "$test_timeout" -- "$dir/maestro_tests" "${env[@]}"
  echo "   $(( $(date +%s) - t0 )) s"
done

if [ "$python_repeat" -gt 0 ]; then
  PY=$ROOT/.venv/bin/python
  [ -x "$PY" ] || { echo "error: no $PY; scripts/test.sh (or scripts/env.sh) sets it up" >&2; exit 1; }
  IFS=, read -ra mods <<<"$modules"
  runs=()
  for m in "${mods[@]}"; do for _ in $(seq "$python_repeat"); do runs+=("$m"); done; done
  mapfile -t runs < <(printf '%s\n' "${runs[@]}" | shuf)
  echo "== python: ${#runs[@]} runs (${modules//,/, } x $python_repeat) in random order"
  i=0
  for m in "${runs[@]}"; do
    i=$((i + 1))
    file="tests/python/${m%.py}.py"
    log="$out/py-$i-$m.log"
    rc=0
    timeout 3600 "$PY" -m pytest -q -p no:cacheprovider --junitxml="$out/py-$i.xml" "$file" >"$log" 2>&1 || rc=$?
    echo "   [$i/${#runs[@]}] $m: exit $rc"
    python3 scripts/flaky.py pytest --out "$out" --group python --module "$m" --xml "$out/py-$i.xml" \
      --log "$log" --rc "$rc"
  done
fi

python3 scripts/flaky.py report --out "$out" --all >/dev/null || true
echo "== tests that failed at least once (every test: $out/table.txt)"
python3 scripts/flaky.py report --out "$out"
# A clean sweep of every C++ test in all three builds: the list that
# scripts/test.sh --full stops repeating (copy it to tests/cpp/swept.txt).
swept_all() { for b in plain asan tsan; do [[ ",$builds," == *",$b"[,:]* ]] || return 1; done; }
if [ -z "$filter" ] && [ -x build/flaky-plain/maestro_tests ] && swept_all; then
  { echo "# The C++ tests of a clean sweep: scripts/flaky.sh --builds $builds at $(git rev-parse --short HEAD)"
    echo "# (every test repeated, 0 failures). scripts/test.sh --full repeats the tests not listed here."
    build/flaky-plain/maestro_tests --gtest_list_tests | awk '/^[^ ]/ { suite = $1 } /^  [^ ]/ { print suite $1 }' | sort -u
  } >"$out/swept.txt"
  echo "== every test swept in every build: the list is $out/swept.txt (for tests/cpp/swept.txt)"
fi
