#!/usr/bin/env bash
# The demo, from a fresh clone: installs torch and maestro_torch into .venv,
# then runs 4 ranks on this machine over 4 loopback paths (127.0.0.1-4): a
# 64 MiB allreduce checked against the exact result, the per-path byte
# table, and the busbw of maestro and gloo measured in the same run.
source "$(dirname "$0")/env.sh"
cd "$ROOT"
exec "$VENV/bin/torchrun" --nproc-per-node 4 examples/demo.py
