# Sourced by demo.sh and test.sh: a project virtualenv (.venv) with torch and
# maestro_torch installed from this checkout. Idempotent and quick when done.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=$ROOT/.venv
PY=$VENV/bin/python

if [ ! -x "$PY" ]; then
  echo "== creating $VENV"
  python3 -m venv "$VENV"
  "$PY" -m pip install -q --upgrade pip
fi
if ! "$PY" -c "import torch, pytest, numpy, matplotlib" 2>/dev/null; then
  echo "== installing torch (CPU use; about 1 minute), test tools and matplotlib (benchmark plots)"
  "$PY" -m pip install -q torch numpy pytest matplotlib
fi
for tool in cmake ninja g++; do
  command -v "$tool" >/dev/null || { echo "error: $tool is required (apt-get install cmake ninja-build g++)" >&2; exit 1; }
done
# Rebuild the extension when any C++ or build file is newer than it, or when
# rdma-core's headers are installed but it was built without the verbs
# transport.
SO=$(ls "$ROOT"/maestro_torch/_C*.so 2>/dev/null | head -1 || true)
stale=0
if [ -z "$SO" ] || [ -n "$(find "$ROOT/csrc" "$ROOT/CMakeLists.txt" "$ROOT/setup.py" -newer "$SO" -print -quit)" ]; then
  stale=1
elif [ -f /usr/include/infiniband/verbs.h ] && [ -f /usr/include/rdma/rdma_cma.h ] &&
     [ "$("$PY" -c 'import maestro_torch._C as c; print(c.has_verbs)' 2>/dev/null)" != True ]; then
  stale=1
fi
if [ $stale = 1 ]; then
  echo "== building maestro_torch (pip install --no-build-isolation -e .)"
  (cd "$ROOT" && "$PY" -m pip install -q --no-build-isolation -e .)
fi
export PATH=$VENV/bin:$PATH
