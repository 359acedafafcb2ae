#!/usr/bin/env bash
# The evaluation suite, from a fresh clone: installs what it needs
# into .venv (torch, the extension, matplotlib), runs benchmarks/suite.py on
# the namespace leaf-spine lab (needs root), then benchmarks/report.py, which
# turns the JSON into docs/results.md, docs/results/*.png, the headline
# table in README.md and the tables of docs/performance.md.
#   scripts/bench.sh                 # full mode (about 60 min on 2 cores: the record at
#                                    # f1231ca took 59 min 24 s on a 2-core AMD EPYC, its
#                                    # suite 3,544 s; the one at f7f8d45 4,284 s there, the
#                                    # ones at c6dd8bf and 3332688 3,158 and 3,196 s on a Xeon)
#   scripts/bench.sh --quick         # every experiment, small (8-18 min on a shared 2-core machine)
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
