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
# The torch / torchvision pair is pinned in requirements/torch.txt (the one
# place); requirements/dev.txt adds the training script's and the tests' needs,
# and the training frameworks pinned in requirements/frameworks.txt (Lightning,
# Accelerate). An existing .venv with another torch (an older checkout's, or
# one a user upgraded) gets the pinned pair, and the extension is rebuilt below;
# one with another Lightning or Accelerate gets the pinned ones.
pin_mismatch() {
  "$PY" - "$ROOT/requirements/torch.txt" "$ROOT/requirements/frameworks.txt" <<'PYEOF' 2>&1
import sys
from importlib.metadata import PackageNotFoundError, version
for path in sys.argv[1:]:
    for line in open(path):
        req = line.split("#")[0].strip()
        if not req:
            continue
        name, want = req.split("==")
        try:
            have = version(name).split("+")[0]
        except PackageNotFoundError:
            have = "none"
        if have != want:
            print(f"{name} {have} installed, {want} pinned")
PYEOF
}
mismatch=$(pin_mismatch)
# find_spec, not import: transformers alone takes a second to import.
if [ -n "$mismatch" ] || ! "$PY" -c "
import importlib.util, sys
sys.exit(any(importlib.util.find_spec(m) is None
             for m in ('torch', 'torchvision', 'tqdm', 'transformers', 'pytest', 'numpy', 'matplotlib',
                       'expecttest')))" 2>/dev/null; then
  echo "== installing requirements/dev.txt: the pinned torch pair (${mismatch:+${mismatch//$'\n'/; }; }a few minutes), tqdm, transformers, lightning, accelerate, test tools, matplotlib"
  # With uv (pinned in requirements/tools.txt) where it installs: from its
  # cache it links the packages into .venv instead of unpacking every wheel
  # again (a fresh clone's set-up: about 8 s of CPU instead of pip's 150);
  # with pip where uv cannot be had (e.g. only pip's cache offline).
  # Compiled to bytecode as pip does (uv does not by default): without the
  # .pyc files, and with PYTHONDONTWRITEBYTECODE set as CI sets it, every
  # process that imports torch compiles its sources again -- 5.2 s of CPU
  # instead of 2.5 here, and 500 s instead of 180 in the Soft-RoCE VM.
  if "$PY" -m pip install -q -r "$ROOT/requirements/tools.txt" 2>/dev/null; then
    "$VENV/bin/uv" pip install -q --compile-bytecode --python "$PY" -r "$ROOT/requirements/dev.txt"
  else
    echo "   (uv could not be installed: installing with pip)"
    "$PY" -m pip install -q -r "$ROOT/requirements/dev.txt"
  fi
  mismatch=$(pin_mismatch)
  [ -z "$mismatch" ] || { echo "error: after installing requirements/dev.txt: $mismatch" >&2; exit 1; }
fi
for tool in cmake ninja g++; do
  command -v "$tool" >/dev/null || { echo "error: $tool is required (apt-get install cmake ninja-build g++)" >&2; exit 1; }
done
# Rebuild the extension when any C++ or build file is newer than it, when it
# was built against another torch than .venv's (it records the version of the
# torch headers it was compiled with, maestro_torch._C.torch_version, and
# maestro_torch refuses to load it under another torch), or when rdma-core's
# headers are installed but it was built without the verbs transport.
SO=$(ls "$ROOT"/maestro_torch/_C*.so 2>/dev/null | head -1 || true)
stale=0
if [ -z "$SO" ] || [ -n "$(find "$ROOT/csrc" "$ROOT/CMakeLists.txt" "$ROOT/setup.py" "$ROOT/scripts/extension_build.py" -newer "$SO" -print -quit)" ]; then
  stale=1
elif ! why=$("$PY" -c 'import maestro_torch' 2>&1); then
  # maestro_torch refuses to load an extension built against another torch.
  echo "== rebuilding: ${why##*$'\n'}"
  stale=1
elif [ -f /usr/include/infiniband/verbs.h ] && [ -f /usr/include/rdma/rdma_cma.h ] &&
     [ "$("$PY" -c 'import maestro_torch._C as c; print(c.has_verbs)' 2>/dev/null)" != True ]; then
  stale=1
fi
if [ $stale = 1 ]; then
  echo "== building maestro_torch (pip install --no-build-isolation -e .)"
  (cd "$ROOT" && "$PY" -m pip install -q --no-build-isolation -e .)
  "$PY" -c 'import maestro_torch' || { echo "error: the freshly built maestro_torch does not import" >&2; exit 1; }
fi
export PATH=$VENV/bin:$PATH
