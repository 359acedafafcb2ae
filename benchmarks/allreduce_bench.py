"""Allreduce bus bandwidth, maestro vs gloo, side by side in one run.

Run under torchrun (one process per rank):

    torchrun --nproc-per-node 2 benchmarks/allreduce_bench.py --size 64M

Both backends run in the same processes on the same tensors: the default
group uses maestro, a second group uses gloo, and they alternate iteration
blocks so that machine noise hits both alike. Reports nccl-tests' algbw
(bytes / time) and busbw (algbw x 2(n-1)/n) and the maestro/gloo ratio.

--device cuda runs the same on CUDA tensors (ranks share the GPUs there are),
beside maestro on the same data as CPU tensors ("maestro-cpu"): maestro
stages CUDA tensors through pinned host memory, gloo copies them too. The
staging's cost is reported as the exposed copy time: (CUDA op - CPU op) /
CUDA op, medians of interleaved blocks. "maestro-whole" is maestro on the
same CUDA tensor with MAESTRO_STAGING_PIECE=0 (a group of its own): the
whole tensor copied in before the ring and back after it, against the
default's pieces that overlap the ring's transfer.
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
    cuda = t.is_cuda
    for _ in range(iters):
        dist.barrier(group=group)
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        dist.all_reduce(t, group=group)
        if cuda:
            torch.cuda.synchronize()  # the copy back is on the GPU's streams
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
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cuda: CUDA tensors (and maestro-cpu, maestro on the same data as CPU tensors)")
    ap.add_argument("--json", help="append the result as one JSON line to this file")
    args = ap.parse_args()

    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist.init_process_group("maestro")
    rank, n = dist.get_rank(), dist.get_world_size()
    wanted = args.backends.split(",")
    groups = {"maestro": dist.group.WORLD}
    if "gloo" in wanted:
        groups["gloo"] = dist.new_group(backend="gloo")
    groups = {k: v for k, v in groups.items() if k in wanted}
    size = parse_size(args.size)
    # What each variant reduces: the tensor on the device asked for, and for
    # --device cuda maestro on a CPU tensor of the same size beside it.
    variants = {name: (group, torch.ones(size // 4, dtype=torch.float32, device=device))
                for name, group in groups.items()}
    if device.type == "cuda" and "maestro" in groups:
        whole = dist.new_group(backend="maestro", pg_options=maestro_torch.Options(staging_piece=0))
        variants["maestro-whole"] = (whole, torch.ones(size // 4, dtype=torch.float32, device=device))
        variants["maestro-cpu"] = (groups["maestro"], torch.ones(size // 4, dtype=torch.float32))

    samples = {name: [] for name in variants}
    for name, (group, t) in variants.items():
        time_allreduce(t, group, args.warmup)
    for _ in range(args.rounds):
        for name, (group, t) in variants.items():
            samples[name] += time_allreduce(t, group, args.iters)

    # Correctness of what we timed: n after one allreduce of ones, on each variant.
    ok = True
    for name, (group, t) in variants.items():
        t.fill_(1.0)
        dist.all_reduce(t, group=group)
        ok = ok and bool(torch.all(t == n))

    result = {"bench": "allreduce", "ranks": n, "bytes": size, "ok": ok, "device": device.type}
    if device.type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(device)
        result["torch"] = torch.__version__
    for name, times in samples.items():
        med = statistics.median(times)
        algbw = size / med / 1e9
        result[name] = {"median_s": med, "algbw_GBps": algbw, "busbw_GBps": algbw * 2 * (n - 1) / n,
                        "samples": len(times), "times_s": times}
    if "gloo" in result and "maestro" in result:
        result["ratio_busbw"] = result["maestro"]["busbw_GBps"] / result["gloo"]["busbw_GBps"]
    if "maestro-cpu" in result:
        cuda_s, cpu_s = result["maestro"]["median_s"], result["maestro-cpu"]["median_s"]
        result["ratio_vs_cpu"] = cpu_s / cuda_s
        result["copy_exposed"] = max(0.0, (cuda_s - cpu_s) / cuda_s)
        if "maestro-whole" in result:
            whole_s = result["maestro-whole"]["median_s"]
            result["copy_exposed_whole"] = max(0.0, (whole_s - cpu_s) / whole_s)
    if rank == 0:
        stats = maestro_torch.path_stats()
        result["paths"] = maestro_torch.backend_of().paths
        result["transport"] = maestro_torch.backend_of().transport
        print(f"allreduce {size / 2**20:.0f} MiB float32 on {device}, {n} ranks, median of "
              f"{args.iters * args.rounds} per backend")
        print(f"{'backend':12}{'time ms':>10}{'algbw GB/s':>12}{'busbw GB/s':>12}")
        for name in variants:
            r = result[name]
            print(f"{name:12}{r['median_s'] * 1e3:10.1f}{r['algbw_GBps']:12.3f}{r['busbw_GBps']:12.3f}")
        if "ratio_busbw" in result:
            print(f"maestro / gloo busbw: {result['ratio_busbw']:.2f}x")
        if "ratio_vs_cpu" in result:
            print(f"maestro on CUDA / on CPU tensors: {result['ratio_vs_cpu']:.2f}x; copy time exposed "
                  f"{result['copy_exposed']:.0%} of the op")
        if "copy_exposed_whole" in result:
            print(f"whole copies (MAESTRO_STAGING_PIECE=0): copy time exposed {result['copy_exposed_whole']:.0%}")
        print(f"result {'correct' if ok else 'WRONG'}")
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(result) + "\n")
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
