"""maestro demo: a 64 MiB allreduce over 4 paths, checked exactly, then the
per-path byte table and the bus bandwidth of maestro and gloo in this run.

    torchrun --nproc-per-node 4 examples/demo.py
"""
import time

import torch
import torch.distributed as dist

import maestro_torch

MIB = 1 << 20


def busbw(group, t, iters=5):
    n = dist.get_world_size()
    dist.all_reduce(t, group=group)  # warm-up (registration, connections)
    times = []
    for _ in range(iters):
        dist.barrier(group=group)
        start = time.perf_counter()
        dist.all_reduce(t, group=group)
        times.append(time.perf_counter() - start)
    worst = torch.tensor(sorted(times)[len(times) // 2], dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=group)
    return t.numel() * t.element_size() / worst.item() / 1e9 * 2 * (n - 1) / n


def main():
    dist.init_process_group("maestro")
    rank, n = dist.get_rank(), dist.get_world_size()
    size = 64 * MIB

    # Integer-valued float32: the sum is exact, so the check is equality.
    i = torch.arange(size // 4, dtype=torch.int64) % 1000
    t = (i + rank).to(torch.float32)
    dist.all_reduce(t)
    expected = (n * i + n * (n - 1) // 2).to(torch.float32)
    ok = torch.equal(t, expected)
    oks = [None] * n
    dist.all_gather_object(oks, ok)

    stats = [None] * n
    dist.all_gather_object(stats, maestro_torch.path_stats())
    gloo = dist.new_group(backend="gloo")
    x = torch.ones(size // 4)
    bw_maestro = busbw(dist.group.WORLD, x)
    bw_gloo = busbw(gloo, x)

    if rank == 0:
        backend = maestro_torch.backend_of()
        print(f"\n64 MiB allreduce on {n} ranks, transport {backend.transport}, {backend.paths} paths per peer: "
              f"{'exact result on every rank' if all(oks) else 'WRONG RESULT on ranks ' + str([r for r, o in enumerate(oks) if not o])}")
        print("\nbytes each rank sent per path (ring neighbours carry the allreduce):")
        print(f"{'rank':>4} {'peer':>4} {'path':>4}  {'addresses':44} {'sent MB':>9} {'recv MB':>9} {'chunks':>7}")
        for r, rows in enumerate(stats):
            for s in rows:
                if s["bytes_sent"] or s["bytes_received"]:
                    print(f"{r:4} {s['peer']:4} {s['path']:4}  {s['addresses']:44} {s['bytes_sent'] / 1e6:9.1f} "
                          f"{s['bytes_received'] / 1e6:9.1f} {s['chunks_sent']:7}")
        print(f"\nallreduce 64 MiB busbw: maestro {bw_maestro:.2f} GB/s, gloo {bw_gloo:.2f} GB/s "
              f"({bw_maestro / bw_gloo:.2f}x), measured in this run")
    dist.destroy_process_group()
    if not all(oks):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
