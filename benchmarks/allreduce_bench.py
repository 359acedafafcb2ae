"""Allreduce bus bandwidth, maestro vs gloo, side by side in one run.

Run under torchrun (one process per rank):

    torchrun --nproc-per-node 2 benchmarks/allreduce_bench.py --size 64M

Both backends run in the same processes on the same tensors: the default
group uses maestro, a second group uses gloo, and they alternate iteration
blocks so that machine noise hits both alike. Reports nccl-tests' algbw
(bytes / time) and busbw (algbw x 2(n-1)/n) and the maestro/gloo ratio.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import maestro_torch


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def time_allreduce(t: torch.Tensor, group, iters: int) -> list[float]:
    times = []
    for _ in range(iters):
        dist.barrier(group=group)
        start = time.perf_counter()
        dist.all_reduce(t, group=group)
        times.append(time.perf_counter() - start)
    # The slowest rank defines the collective's time.
    worst = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=group)
    return worst.tolist()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="64M", help="bytes per allreduce (K/M/G suffixes), float32")
    ap.add_argument("--iters", type=int, default=10, help="timed iterations per backend per round")
    ap.add_argument("--rounds", type=int, default=3, help="alternating maestro/gloo rounds")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--backends", default="maestro,gloo", help="which to run, comma-separated")
    ap.add_argument("--json", help="append the result as one JSON line to this file")
    args = ap.parse_args()

    dist.init_process_group("maestro")
    rank, n = dist.get_rank(), dist.get_world_size()
    wanted = args.backends.split(",")
    groups = {"maestro": dist.group.WORLD}
    if "gloo" in wanted:
        groups["gloo"] = dist.new_group(backend="gloo")
    groups = {k: v for k, v in groups.items() if k in wanted}
    size = parse_size(args.size)
    t = torch.ones(size // 4, dtype=torch.float32)

    samples = {name: [] for name in groups}
    for name, group in groups.items():
        time_allreduce(t, group, args.warmup)
    for _ in range(args.rounds):
        for name, group in groups.items():
            samples[name] += time_allreduce(t, group, args.iters)

    # Correctness of what we timed: n^k after k allreduces of ones.
    t.fill_(1.0)
    dist.all_reduce(t)
    ok = bool(torch.all(t == n))

    result = {"bench": "allreduce", "ranks": n, "bytes": size, "ok": ok}
    for name, times in samples.items():
        med = statistics.median(times)
        algbw = size / med / 1e9
        result[name] = {"median_s": med, "algbw_GBps": algbw, "busbw_GBps": algbw * 2 * (n - 1) / n,
                        "samples": len(times)}
    if "gloo" in result and "maestro" in result:
        result["ratio_busbw"] = result["maestro"]["busbw_GBps"] / result["gloo"]["busbw_GBps"]
    if rank == 0:
        stats = maestro_torch.path_stats()
        result["paths"] = maestro_torch.backend_of().paths
        result["transport"] = maestro_torch.backend_of().transport
        print(f"allreduce {size / 2**20:.0f} MiB float32, {n} ranks, median of {args.iters * args.rounds} per backend")
        print(f"{'backend':10}{'time ms':>10}{'algbw GB/s':>12}{'busbw GB/s':>12}")
        for name in groups:
            r = result[name]
            print(f"{name:10}{r['median_s'] * 1e3:10.1f}{r['algbw_GBps']:12.3f}{r['busbw_GBps']:12.3f}")
        if "ratio_busbw" in result:
            print(f"maestro / gloo busbw: {result['ratio_busbw']:.2f}x")
        print(f"result {'correct' if ok else 'WRONG'}")
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(result) + "\n")
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
