#!/usr/bin/env bash
# libFuzzer targets for what maestro reads from the wire: TCP frames and
# region grants (fuzz_frames), the TCP hello (fuzz_hello), rdma_cm private
# data and published endpoints (fuzz_cm_private_data), and the engine's
# control messages on a live 2-rank group (fuzz_control). Built with clang,
# AddressSanitizer and UndefinedBehaviorSanitizer; a crash, a sanitizer
# finding or a broken invariant stops the run and fails it.
#   scripts/fuzz.sh                      # every target for 30 s (what CI runs)
#   scripts/fuzz.sh --seconds 300        # longer
#   scripts/fuzz.sh --runs 1000000 --record
#       # at least that many executions per target; writes docs/fuzzing.md
#       # (executions, time, findings, the command and commit) and merges
#       # new inputs into the committed corpus (fuzz/corpus/<target>)
# The committed corpus seeds every run; new inputs of a run without
# --record go to build/fuzz/new/ and leave the tree untouched.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
seconds=30
runs=0
record=0
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --record) record=1; shift ;;
    *) echo "usage: scripts/fuzz.sh [--seconds S | --runs N] [--record]" >&2; exit 2 ;;
  esac
done
command -v clang++ >/dev/null || { echo "error: clang is required (apt-get install clang)" >&2; exit 1; }
CC=clang CXX=clang++ cmake -S . -B build/fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DMAESTRO_BUILD_TESTS=OFF -DMAESTRO_FUZZ=ON >/dev/null
cmake --build build/fuzz -j "$(nproc)" >/dev/null
targets="frames hello cm_private_data control"
rows=""
for t in $targets; do
  mkdir -p "fuzz/corpus/$t" "build/fuzz/new/$t" "build/fuzz/artifacts/$t"
  budget=(-max_total_time="$seconds")
  [ "$runs" -gt 0 ] && budget=(-runs="$runs")
  log="build/fuzz/$t.log"
  start=$(date +%s)
  if ! build/fuzz/fuzz_$t "${budget[@]}" -print_final_stats=1 -artifact_prefix="build/fuzz/artifacts/$t/" \
       "build/fuzz/new/$t" "fuzz/corpus/$t" >"$log" 2>&1; then
    grep -E "ERROR|SUMMARY|Test unit written|runtime error" "$log" | head -20 >&2
    echo "fuzz_$t: FOUND A PROBLEM (log: $log, input: build/fuzz/artifacts/$t/)" >&2
    exit 1
  fi
  took=$(( $(date +%s) - start ))
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | grep -o '[0-9]*$')
  if [ "$record" = 1 ]; then
    build/fuzz/fuzz_$t -merge=1 "fuzz/corpus/$t" "build/fuzz/new/$t" >/dev/null 2>&1
  fi
  corpus=$(ls "fuzz/corpus/$t" | wc -l)
  echo "fuzz_$t: $execs executions in $took s, no findings (corpus: $corpus inputs)"
  rows+="| fuzz_$t | $execs | $took | 0 | $corpus |"$'\n'
done
if [ "$record" = 1 ]; then
  budget_text="--seconds $seconds"
  [ "$runs" -gt 0 ] && budget_text="--runs $runs"
  cat >docs/fuzzing.md <<DOC
# Fuzzing

What maestro reads from the wire is fuzzed with libFuzzer (clang, with AddressSanitizer and
UndefinedBehaviorSanitizer): TCP frames and the region table's bounds checks (\`fuzz_frames\`:
every granted write lands its full length in an exact-size buffer), the TCP hello
(\`fuzz_hello\`), rdma_cm's private data and the endpoints ranks publish
(\`fuzz_cm_private_data\`), and control messages fed to a live 2-rank engine over loopback
(\`fuzz_control\`). The targets are in \`fuzz/\`, the corpus they grew in \`fuzz/corpus/\`.
CI runs every target for 30 s on top of that corpus (\`scripts/test.sh --full\`).

Recorded run: \`scripts/fuzz.sh $budget_text --record\` at $(git rev-parse --short HEAD), $(date -u +%Y-%m-%d),
on $(nproc) cores.

| target | executions | seconds | findings | corpus inputs |
|---|---|---|---|---|
$rows
DOC
  echo "wrote docs/fuzzing.md"
fi
