"""The GPU record: from the folder scripts/gpu_check.sh wrote on a GPU
machine to a record docs/results/data/gpu.json (the suite's record format),
then the whole report (benchmarks/report.py; the record's section of
docs/results.md is benchmarks/reporting/gpu.py).

    python benchmarks/gpu_report.py build/gpu-check/gpu --seconds 412   # record, then the whole report

What the record holds, every figure measured in that run:
  - allreduce_cuda: 64 MiB allreduce on CUDA tensors at 2 and 4 ranks
    sharing the GPU, maestro / gloo / maestro on the same data as CPU
    tensors, interleaved blocks (benchmarks/allreduce_bench.py --device cuda);
  - train: benchmarks/train.py --device cuda, DDP on 2 ranks, maestro and gloo;
  - allreduce_cpu_host: the loopback demo's 64 MiB CPU allreduce at 4-16
    ranks on that machine's cores, maestro vs gloo in the same processes.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

COMMAND = "scripts/gpu_check.sh"
LOG_LINE = re.compile(r"(?P<model>\S+) ddp on (?P<backend>\w+), (?P<world>\d+) ranks x batch (?P<batch>\d+) "
                      r"\((?P<input>[^)]*)\): (?P<sps>[\d.]+) samples/s, iteration (?P<it>[\d.]+) s, exposed comm "
                      r"(?P<exp>[\d.]+) s \(\d+%\), compute alone (?P<comp>[\d.]+) s")


def _jsonl(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def collect(folder: str, seconds: float, date: str | None = None) -> dict:
    """The record of one gpu_check.sh run from its folder."""
    with open(os.path.join(folder, "machine.json")) as f:
        machine = json.load(f)
    train = {}
    for r in _jsonl(os.path.join(folder, "train.jsonl")):
        train.setdefault(r["model"], {})[r["backend"]] = r
    for name in sorted(os.listdir(folder)):  # one file per run (older runs of the script)
        if name.startswith("train_") and name.endswith(".json"):
            with open(os.path.join(folder, name)) as f:
                r = json.load(f)
            train.setdefault(r["model"], {})[r["backend"]] = r
    # A run whose JSON did not come back: the line train.py printed for it
    # in the run's log (no losses or checksums then).
    log = os.path.join(folder, "gpu_check.log")
    for line in open(log) if os.path.exists(log) else []:
        m = LOG_LINE.match(line.strip())
        if m and m["backend"] not in train.get(m["model"], {}):
            train.setdefault(m["model"], {})[m["backend"]] = {
                "model": m["model"], "backend": m["backend"], "world": int(m["world"]), "batch": int(m["batch"]),
                "input": m["input"], "samples_per_s": float(m["sps"]), "iteration_s": float(m["it"]),
                "exposed_comm_s": float(m["exp"]), "compute_s": float(m["comp"]), "from_log": True}
    data = {"lab": f"none: every rank on one machine over loopback, sharing its GPU ({machine.get('gpu')})",
            "gpu": machine.get("gpu"), "gpus": machine.get("gpus"),
            "allreduce_cuda": _jsonl(os.path.join(folder, "allreduce_cuda.jsonl")),
            "allreduce_cpu_host": _jsonl(os.path.join(folder, "allreduce_cpu_host.jsonl")),
            "determinism": _jsonl(os.path.join(folder, "determinism.jsonl")),
            # `gpu_check.sh --determinism` run on its own: its machine record beside the main one's.
            "determinism_machine": (json.load(open(os.path.join(folder, "determinism_machine.json")))
                                    if os.path.exists(os.path.join(folder, "determinism_machine.json")) else None),
            "train": train}
    log = os.path.join(folder, "gpu_check.log")
    failed = []
    if os.path.exists(log):
        failed = [line.strip()[3:] for line in open(log) if line.startswith("== FAILED")]
    data["failed_steps"] = failed
    return {"experiment": "gpu", "status": "ok", "date": date or datetime.datetime.now().isoformat(timespec="seconds"),
            "command": COMMAND, "quick": False, "seconds": seconds,
            "machine": {"cores": machine.get("cores"), "cpu": machine.get("gpu") or "no GPU",
                        "memory_GiB": machine.get("memory_GiB", "?"), "kernel": machine.get("kernel", "?"),
                        "torch": machine.get("torch"), "maestro_commit": machine.get("commit")},
            "data": data}




def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", help="what scripts/gpu_check.sh wrote ($OUT/gpu)")
    ap.add_argument("--seconds", type=float, default=0, help="how long the run took")
    ap.add_argument("--date", help="when it ran (ISO); default now")
    ap.add_argument("--data", default=os.path.join(ROOT, "docs", "results", "data"))
    ap.add_argument("--no-report", action="store_true", help="write the record only")
    args = ap.parse_args()
    rec = collect(args.folder, args.seconds, args.date)
    with open(os.path.join(args.data, "gpu.json"), "w") as f:
        json.dump(rec, f, indent=1)
    print(f"wrote {os.path.join(args.data, 'gpu.json')}")
    if args.no_report:
        return 0
    import report

    return report.generate(args.data, os.path.join(ROOT, "docs"), os.path.join(ROOT, "README.md"),
                           os.path.join(ROOT, "docs", "performance.md"))


if __name__ == "__main__":
    sys.exit(main())
