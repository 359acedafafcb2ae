"""Disjoint path discovery trials (one rank on a netlab host, ECMP mode):
create a fresh maestro group with MAESTRO_DISCOVERY=ttl again and again;
each time record the core hops the paths to the ring's right neighbour take
(the data direction) and whether an allreduce on it is correct. Rank 0
prints "RESULT <json>".

    python benchmarks/discovery_trials.py --trials 20
"""
import argparse
import datetime
import json
import time

import torch
import torch.distributed as dist

import maestro_torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--pause", type=float, default=0.0, help="seconds between trials")
    args = ap.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))  # bookkeeping only
    rank, n = dist.get_rank(), dist.get_world_size()
    right = (rank + 1) % n
    trials = []
    for _ in range(args.trials):
        t0 = time.time()
        g = dist.new_group(backend="maestro", pg_options=maestro_torch.Options(discovery="ttl"))
        setup = time.time() - t0
        t = torch.full((4096,), float(rank))
        dist.all_reduce(t, group=g)
        ok = bool(torch.all(t == sum(range(n))))
        hops = [s["route"] for s in maestro_torch.path_stats(g) if s["peer"] == right]
        dist.barrier(group=g)
        dist.destroy_process_group(g)
        trials.append({"setup_s": setup, "ok": ok, "hops_to_right": hops})
        time.sleep(args.pause)
    everyone = [None] * n
    dist.all_gather_object(everyone, trials)
    if rank == 0:
        print("RESULT " + json.dumps({"world": n, "trials": everyone}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
