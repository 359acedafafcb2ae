#!/usr/bin/env bash
# The GPU check, as one command, for a machine with a GPU (one H100/H200
# class GPU, many cores) and no network: builds maestro_torch there against
# the torch it has, runs the CUDA tests with MAESTRO_REQUIRE_GPU=1 (a missing
# GPU fails them instead of skipping), then measures, every rank on loopback
# and sharing the GPU:
#   - 64 MiB allreduce on CUDA tensors at 2 and 4 ranks: maestro, maestro
#     with whole copies (MAESTRO_STAGING_PIECE=0), gloo, and maestro on the
#     same data as CPU tensors (benchmarks/allreduce_bench.py);
#   - benchmarks/train.py --device cuda, DDP, 2 ranks: vgg19, resnet50 and
#     bert-large on maestro and on gloo (samples/s, exposed communication,
#     losses and final parameters);
#   - the loopback demo's 64 MiB CPU allreduce at 4, 8 and 16 ranks,
#     maestro vs gloo in the same processes ("a 16-core host").
# Every result is a JSON line under $OUT/gpu (default build/gpu-check);
# benchmarks/gpu_report.py turns that folder into docs/results.md's GPU
# section. A step that fails is logged and the others still run; the exit
# status says whether all passed. The whole run keeps to BUDGET seconds
# (default 480), so that a second try fits in a GPU machine's lease.
#
#   scripts/gpu_check.sh                 # on the GPU machine, from the checkout
#   scripts/gpu_check.sh --quick         # fewer steps and iterations (a rehearsal)
#   scripts/gpu_check.sh --determinism   # the build and the determinism check alone
#   MAESTRO_STAGING=force MAESTRO_TEST_DEVICE=cpu scripts/gpu_check.sh --quick
#                                        # here, without a GPU: CPU tensors through the staging
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
QUICK=0 ONLY_DETERMINISM=0
for arg in "$@"; do
  case $arg in
    --quick) QUICK=1 ;;
    --determinism) ONLY_DETERMINISM=1 ;;
    *) echo "usage: $0 [--quick] [--determinism]" >&2; exit 2 ;;
  esac
done
OUT_DIR=${OUT:-$ROOT/build/gpu-check}/gpu
mkdir -p "$OUT_DIR"
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PY=$ROOT/.venv/bin/python; else PY=$(command -v python3); fi
fi
LOG=$OUT_DIR/gpu_check.log
: >"$LOG"
failed=()
# The whole run stays inside BUDGET seconds (default 480): a step gets what
# is left, at most its own limit, and steps past the budget are not run
# (and reported as such), so the results so far always come back.
BUDGET=${BUDGET:-480}
step() {  # step NAME TIMEOUT_S CMD...: run, log, remember a failure
  local name=$1 limit=$2
  shift 2
  local left=$((BUDGET - SECONDS))
  if [ $left -lt 15 ]; then
    echo "== $name: NOT RUN (the ${BUDGET} s budget is spent)" | tee -a "$LOG"
    failed+=("$name (not run: budget)")
    return 1
  fi
  [ $limit -gt $left ] && limit=$left
  local t0=$SECONDS
  echo "== $name" | tee -a "$LOG"
  timeout --kill-after=10 "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  echo "== $name: exit $rc in $((SECONDS - t0)) s" | tee -a "$LOG"
  [ $rc = 0 ] || failed+=("$name (exit $rc)")
  return $rc
}

# maestro_torch from this checkout (no pip install there: the package imports
# from here, and its import registers the backend).
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# What the machine has, for the record.
"$PY" - >"$OUT_DIR/machine.json" <<'EOF'
import json, os, platform, subprocess, torch
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": gpu,
                  "gpus": torch.cuda.device_count(), "cores": os.cpu_count(), "python": platform.python_version(),
                  "memory_GiB": round(memory, 1), "kernel": platform.release(),
                  "commit": os.environ.get("MAESTRO_COMMIT") or commit}))
EOF
cat "$OUT_DIR/machine.json" | tee -a "$LOG"

# pytest travels as wheels where the machine has none (build/gpu-wheels).
if ! "$PY" -c "import pytest" 2>/dev/null && [ -d "$ROOT/build/gpu-wheels" ]; then
  step "install pytest from build/gpu-wheels" 120 "$PY" -m pip install -q --no-index --find-links "$ROOT/build/gpu-wheels" pytest
fi

# The build, against this machine's torch (setup.py's path, without pip),
# with the system's compiler where there is one: a toolchain that links
# libstdc++ statically makes a module that crashes beside torch's
# (extension_build.py refuses such a module).
[ -x /usr/bin/g++ ] && export CC=/usr/bin/gcc CXX=/usr/bin/g++
BUILD=$ROOT/build/gpu-ext-sys
if [ "${MAESTRO_SKIP_BUILD:-0}" != 1 ]; then
  step "build maestro_torch against $("$PY" -c 'import torch; print(torch.__version__)')" 300 \
    "$PY" -c "import sys; sys.path.insert(0, 'scripts'); import extension_build; extension_build.build('$ROOT/maestro_torch', '$BUILD')" ||
    { echo "the build failed: $LOG" >&2; tail -40 "$LOG" >&2; exit 1; }
fi
step "import" 60 "$PY" -c "import maestro_torch, torch; print('has_cuda', maestro_torch._C.has_cuda, 'gpu', torch.cuda.is_available())"

DEVICE=${MAESTRO_TEST_DEVICE:-cuda}
# train_once STEP LIMIT JSONL KEY VALUE [VAR=VALUE...] -- TRAIN_ARGS...:
# benchmarks/train.py on 2 ranks, with those variables set; its JSON, with
# KEY set to VALUE, becomes one line of JSONL (few files to bring back from
# the machine).
train_once() {
  local name=$1 limit=$2 jsonl=$3 key=$4 value=$5 env=()
  shift 5
  while [ "$1" != -- ]; do env+=("$1"); shift; done
  shift
  step "$name" "$limit" env "${env[@]}" "$PY" -m torch.distributed.run --nproc-per-node 2 benchmarks/train.py "$@" \
    --json "$OUT_DIR/train.json" &&
    "$PY" -c "import json, sys; r = json.load(open(sys.argv[1])); r[sys.argv[2]] = sys.argv[3]; print(json.dumps(r))" \
      "$OUT_DIR/train.json" "$key" "$value" >>"$jsonl"
  rm -f "$OUT_DIR/train.json"
}
# Whether equal losses can be asked of two backends on this GPU: vgg19 twice
# on gloo with cuDNN's default kernels (whose backward may sum in any order),
# then on maestro and on gloo with deterministic kernels (train.py
# --deterministic); losses and parameters of each run in determinism.jsonl.
determinism() {
  local args=(--model vgg19 --steps 3 --warmup 1 --checksum --no-progress --device "$DEVICE" --batch 16)
  [ $QUICK = 1 ] && args=(--model vgg19 --steps 3 --warmup 1 --checksum --no-progress --device "$DEVICE"
                          --batch 2 --image-size 32)
  local run backend extra
  for run in gloo gloo-again maestro-deterministic gloo-deterministic; do
    backend=${run%%-*} extra=()
    case $run in *-deterministic) extra=(--deterministic) ;; esac
    train_once "determinism: vgg19 on $run" 60 "$OUT_DIR/determinism.jsonl" run "$run" CUBLAS_WORKSPACE_CONFIG=:4096:8 \
      -- --backend $backend "${args[@]}" "${extra[@]}"
  done
}
finish() {
  echo "== results in $OUT_DIR" | tee -a "$LOG"
  if [ ${#failed[@]} -gt 0 ]; then
    printf '== FAILED: %s\n' "${failed[@]}" | tee -a "$LOG"
    exit 1
  fi
  echo "== all steps passed" | tee -a "$LOG"
  exit 0
}
[ $ONLY_DETERMINISM = 1 ] && { determinism; finish; }

export MAESTRO_REQUIRE_GPU=${MAESTRO_REQUIRE_GPU:-1}
# test_staging.py (CPU tensors through the staging) runs in every CI run;
# here it is the rehearsal's stand-in for the GPU tests.
tests=(tests/python/test_cuda.py)
[ "${MAESTRO_TEST_DEVICE:-cuda}" = cpu ] && tests+=(tests/python/test_staging.py)
step "CUDA tests (MAESTRO_REQUIRE_GPU=$MAESTRO_REQUIRE_GPU)" 200 \
  "$PY" -m pytest -q -p no:cacheprovider -rs "${tests[@]}" --junitxml "$OUT_DIR/tests.xml"

ITERS=4 ROUNDS=3
[ $QUICK = 1 ] && ITERS=2 ROUNDS=2
for n in 2 4; do
  step "allreduce 64 MiB on $DEVICE, $n ranks" 60 "$PY" -m torch.distributed.run --nproc-per-node $n \
    benchmarks/allreduce_bench.py --size 64M --device "$DEVICE" --iters $ITERS --rounds $ROUNDS \
    --json "$OUT_DIR/allreduce_$DEVICE.jsonl"
done

STEPS=8
[ $QUICK = 1 ] && STEPS=3
train() {  # train MODEL [BACKEND...]: train.py on each (default: maestro, then gloo)
  local model=$1
  local args=(--model "$model" --steps $STEPS --warmup 2 --compute-steps 2 --checksum --no-progress --device "$DEVICE")
  case $model in
    bert-large) args+=(--batch 8 --seq-len 128) ;;
    *) args+=(--batch 16) ;;
  esac
  [ $QUICK = 1 ] && args=(--model "$model" --steps $STEPS --warmup 1 --compute-steps 1 --checksum --no-progress
                          --device "$DEVICE" --batch 2 --image-size 32)
  shift
  # maestro-whole: maestro with whole copies (MAESTRO_STAGING_PIECE=0), what
  # the pipelined copies are measured against.
  local backends=("$@")
  [ ${#backends[@]} = 0 ] && backends=(maestro gloo)
  for backend in "${backends[@]}"; do
    local env=() name=$backend
    [ $backend = maestro-whole ] && env=(MAESTRO_STAGING_PIECE=0) && backend=maestro
    train_once "train.py $model on $name ($DEVICE)" 70 "$OUT_DIR/train.jsonl" backend "$name" "${env[@]}" \
      -- --backend $backend "${args[@]}"
  done
}
cpu_host() {  # cpu_host N: the 64 MiB CPU allreduce on N ranks
  step "allreduce 64 MiB on the CPU, $1 ranks" 50 env -u MAESTRO_STAGING "$PY" -m torch.distributed.run \
    --nproc-per-node $1 benchmarks/allreduce_bench.py --size 64M --device cpu --iters 3 --rounds 2 \
    --json "$OUT_DIR/allreduce_cpu_host.jsonl"
}
# In order of what matters most, should the budget run out.
train resnet50
[ $QUICK = 1 ] || train vgg19
for n in 4 8 16; do
  [ $QUICK = 1 ] && [ $n != 4 ] && continue
  cpu_host $n
done
[ $QUICK = 1 ] || train bert-large
train resnet50 maestro-whole
determinism
finish
