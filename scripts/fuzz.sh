#!/usr/bin/env bash
# libFuzzer targets for what maestro reads from the wire: the byte stream a
# live TCP path receives, cut into chunks anywhere, with region grants and
# writes by reference (fuzz_tcp_path), the TCP hello (fuzz_hello), rdma_cm
# private data and published endpoints (fuzz_cm_private_data), and the
# engine's control messages on a live 2-rank group (fuzz_control). Built with clang,
# AddressSanitizer and UndefinedBehaviorSanitizer; a crash, a sanitizer
# finding, a broken invariant or a hang (an input still running after 60 s)
# stops the run and fails it.
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
targets="tcp_path hello cm_private_data control"
# One target per core at a time (each is one process on one core); their
# lines and table rows in the targets' order.
fuzz_one() {
  local t=$1
  mkdir -p "fuzz/corpus/$t" "build/fuzz/new/$t" "build/fuzz/artifacts/$t"
  budget=(-max_total_time="$seconds")
  [ "$runs" -gt 0 ] && budget=(-runs="$runs")
  log="build/fuzz/$t.log"
  start=$(date +%s)
  if ! build/fuzz/fuzz_$t "${budget[@]}" -timeout=60 -print_final_stats=1 -artifact_prefix="build/fuzz/artifacts/$t/" \
       "build/fuzz/new/$t" "fuzz/corpus/$t" >"$log" 2>&1; then
    grep -E "ERROR|SUMMARY|Test unit written|runtime error" "$log" | head -20 >&2
    echo "fuzz_$t: FOUND A PROBLEM (log: $log, input: build/fuzz/artifacts/$t/)" >&2
    return 1
  fi
  took=$(( $(date +%s) - start ))
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | grep -o '[0-9]*$')
  if [ "$record" = 1 ]; then
    build/fuzz/fuzz_$t -merge=1 "fuzz/corpus/$t" "build/fuzz/new/$t" >/dev/null 2>&1
  fi
  corpus=$(ls "fuzz/corpus/$t" | wc -l)
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$')
  echo "fuzz_$t: $execs executions in $took s ($rate/s), no findings (corpus: $corpus inputs)" >"build/fuzz/$t.line"
  echo "| fuzz_$t | $execs | $took | $rate | 0 | $corpus |" >"build/fuzz/$t.row"
}
pids=()
for t in $targets; do
  rm -f "build/fuzz/$t.line" "build/fuzz/$t.row"
  while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do wait -n || true; done
  fuzz_one "$t" &
  pids+=($!)
done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
[ $failed = 0 ] || exit 1
rows=""
for t in $targets; do
  cat "build/fuzz/$t.line"
  rows+="$(cat "build/fuzz/$t.row")"$'\n'
done
if [ "$record" = 1 ]; then
  budget_text="--seconds $seconds"
  [ "$runs" -gt 0 ] && budget_text="--runs $runs"
  cat >docs/fuzzing.md <<DOC
# Fuzzing

What maestro reads from the wire is fuzzed with libFuzzer (clang, with AddressSanitizer and
UndefinedBehaviorSanitizer). The targets are in \`fuzz/\`, the corpus they grew in
\`fuzz/corpus/<target>\`. CI runs every target for 30 s on top of that corpus
(\`scripts/test.sh --full\`); a crash, a sanitizer report, a broken invariant or a hang (an
input still running after 60 s) fails the run, and the input is kept in \`build/fuzz/artifacts/\`.

## Targets

**\`fuzz_tcp_path\`: the byte stream a TCP path receives.** A real \`TcpPath\`, on the
process's event loop, holds one end of a socketpair; the input is what its peer sends, written
into the other end in chunks of sizes the input picks, so a header, a payload, a control
message, an offer or a by-reference address may be cut anywhere and the path's resumable
receive (header, payload, drain, message and by-reference states) has to pick it up at the next
readiness event. Every frame type: WRITEs with and without an immediate, granted, stale (a
previous key, a concealed region, a removed region: drained and ACKed) or rejected; SENDs;
ACKs of the writes the path posted itself; OFFERs (this process's own single-copy offer, which
the path verifies by reading its cookie with \`process_vm_readv\`, or a wrong one) and
ACCEPTs; and WRITEs by reference, whose payload the path copies out of the offering process
(this one), or drops unread once the sender's liveness word says its connection is gone.
Between chunks the input may conceal, expose or remove a region, which revokes a write landing
in it (its grant is dropped, the rest drained), or flip the sender's liveness. A fresh path,
socketpair and region table per input. Regions are exact-size heap allocations, so
AddressSanitizer sees any byte a bounds check let through, from the socket or from
\`process_vm_readv\`; the keys, addresses and offer fields the fuzzer cannot guess are put in
by the harness in place of marker values (listed at the top of \`fuzz/fuzz_tcp_path.cc\`).
Checked besides: the path keeps reading a live connection, and fails exactly once when the
peer closes; each of its own writes completes once, the ACKed ones in order; a failed path
pins no region; a region never exposed during the input, and the removed one, are untouched.

**\`fuzz_hello\`: the hello a TCP connection presents**, as the accepting side checks it
(\`checkHello\`). The first byte picks whether the group's real secret is put in, so the
checks after the secret are reached too, and the world size; an accepted hello must name a
rank of the world other than ours and a valid path index.

**\`fuzz_cm_private_data\`: what rdma_cm hands the verbs transport**: a connect request's
private data (the hello: decoded, encoded and decoded again it must come back the same), a
rejection's reason (never longer than the data), and the endpoint strings ranks publish in
the store (refused with an error, never a crash). Built without rdma-core too.

**\`fuzz_control\`: the engine's control messages from a peer**, fed to rank 0 of a live
2-rank group over loopback TCP (2 paths, path hunting on) as its transport delivers them:
descriptors, credits, aborts, barrier tokens, pings and pongs, goodbyes, path-down notices,
point-to-point ready/grant/done, and path hunting's hunt, ask (it really re-opens a path),
offer and pick. Most inputs are steered to a known type, a whole 16-byte header and a near
sequence number, so that most keep the peer alive; a message the protocol forbids must fail
the peer with a message, never crash. The messages reach the engine directly, not through the
channel mux: header byte 1, the channel byte that routes a message to its process group on
shared paths, arrives as the input has it (the engine does not read it), and the mux's
routing by it is not fuzzed.

## Recorded run

\`scripts/fuzz.sh $budget_text --record\` at $(git rev-parse --short HEAD), $(date -u +%Y-%m-%d),
on $(nproc) cores.

| target | executions | seconds | executions/s | findings | corpus inputs |
|---|---|---|---|---|---|
$rows
DOC
  echo "wrote docs/fuzzing.md"
fi
