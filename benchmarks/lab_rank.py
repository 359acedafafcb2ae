"""One rank on a netlab host (started by scripts/labrun.py): allreduces for a
while, every result checked exactly, with per-iteration times and snapshots
of the path states, for the lab tests and benchmarks (failover, path
detection, resiliency). Rank 0 prints "READY" once the group is up and one
"RESULT <json>" line at the end (every rank's iterations under "ranks").

    python benchmarks/lab_rank.py --size 16M --seconds 12 [--backend maestro|gloo]
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from allreduce_bench import parse_size  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="16M")
    ap.add_argument("--seconds", type=float, default=10, help="run allreduces for this long (at least --min-iters)")
    ap.add_argument("--min-iters", type=int, default=1)
    ap.add_argument("--backend", default="maestro")
    ap.add_argument("--timeout", type=float, default=120, help="group timeout, seconds")
    args = ap.parse_args()
    if args.backend == "maestro":
        import maestro_torch  # noqa: F401
    import datetime

    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=args.timeout))
    rank, n = dist.get_rank(), dist.get_world_size()
    elems = parse_size(args.size) // 4
    base = (torch.arange(elems, dtype=torch.int64) % 1000)
    expected = (n * base + n * (n - 1) // 2).to(torch.float32)
    dist.barrier()
    if rank == 0:
        print("READY", flush=True)
    iters = []
    start = time.time()
    while time.time() - start < args.seconds or len(iters) < args.min_iters:
        t = (base + rank).to(torch.float32)
        dist.barrier()
        t0 = time.time()
        dist.all_reduce(t)
        t1 = time.time()
        it = {"start": t0 - start, "seconds": t1 - t0, "ok": bool(torch.equal(t, expected))}
        if args.backend == "maestro":
            import maestro_torch

            it["paths"] = [{k: s[k] for k in ("peer", "path", "state", "bytes_sent", "resent", "reconnects", "route")}
                           for s in maestro_torch.path_stats()]
        iters.append(it)
        # Every rank must agree to stop at the same iteration.
        go = torch.tensor([1.0 if time.time() - start < args.seconds else 0.0])
        dist.all_reduce(go, op=dist.ReduceOp.MIN)
        if go.item() == 0 and len(iters) >= args.min_iters:
            break
    everyone = [None] * n
    dist.all_gather_object(everyone, iters)
    if rank == 0:
        result = {"world": n, "bytes": elems * 4, "iters": iters, "ranks": everyone}
        print("RESULT " + json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
