#!/usr/bin/env bash
# The evaluation suite, from a fresh clone: installs what it needs
# into .venv (torch, the extension, matplotlib), runs benchmarks/suite.py on
# the namespace leaf-spine lab (needs root), then benchmarks/report.py, which
# turns the JSON into docs/results.md, docs/results/*.png, the headline
# table in README.md and the tables of docs/performance.md.
#   scripts/bench.sh                 # full mode (about 60 min on 2 cores: 3,158 s for the
#                                    # record at c6dd8bf, 3,196 at 3332688, 68 min at 25511b0;
#                                    # small_cells, added since, 342 s at 6072a1a)
#   scripts/bench.sh --quick         # every experiment, small (8-16 min on a shared 2-core machine)
#   scripts/bench.sh --only latency,discovery --out /tmp/r   # a subset, elsewhere
#   scripts/bench.sh --only failover --loaded-seconds 600   # its loop under background traffic for 10 min
# A full run without --out records its JSON in docs/results/data and updates
# docs/results.md, docs/results/*.png, README.md and docs/performance.md. With --out DIR, or with
# --quick (DIR defaults to build/bench-quick), the JSON goes to DIR and the
# report to DIR/report: the recorded results stay untouched. The report is
# generated even when an experiment failed (it shows which); the exit code
# says whether any did.
source "$(dirname "$0")/env.sh"
cd "$ROOT"
[ "$(id -u)" = 0 ] || { echo "error: the lab needs root (network namespaces); run as root" >&2; exit 1; }
exec "$PY" benchmarks/suite.py --report "$@"
