"""all_gather_coalesced's output layout, maestro against gloo.

torch (and gloo) take output_tensor_lists[rank][i]: one list per rank, each
holding one tensor per input. maestro used to read outputLists[i][rank].
With as many inputs as ranks the shapes match either way, so it accepted
the call and filled out[r][i] with rank i's input r: a wrong result, no
error. With any other count it refused the call ("1 inputs but 2 output
lists"), which is what distributed_test's all_gather_coalesced tests hit.
Exits 1 when a backend's result differs from torch's layout.

    python tests/torch_suite/repros/all_gather_coalesced_layout.py   # gloo, then maestro
"""
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank, world, backend, init_file, out):
    if backend == "maestro":
        import maestro_torch  # noqa: F401
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world)
    inputs = [torch.full((2,), float(10 * rank + i)) for i in range(world)]  # input i of rank r = 10r+i
    outputs = [[torch.full((2,), -1.0) for _ in range(world)] for _ in range(world)]  # [rank][input]
    try:
        dist.all_gather_coalesced(outputs, inputs)
        got = [[t[0].item() for t in per_rank] for per_rank in outputs]
    except RuntimeError as e:
        got = f"error: {str(e).splitlines()[0]}"
    dist.destroy_process_group()
    out.put((rank, got))


def run(backend, world=2):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        procs = [ctx.Process(target=rank_main, args=(r, world, backend, os.path.join(d, "init"), out))
                 for r in range(world)]
        for p in procs:
            p.start()
        results = dict(out.get(timeout=120) for _ in procs)
        for p in procs:
            p.join(30)
    return results


if __name__ == "__main__":
    world = 2
    expected = [[float(10 * r + i) for i in range(world)] for r in range(world)]
    print(f"expected on every rank (out[rank][input]): {expected}")
    bad = False
    for backend in ("gloo", "maestro"):
        for rank, got in sorted(run(backend, world).items()):
            ok = got == expected
            bad |= not ok
            print(f"{backend:8s} rank {rank}: {got}  {'ok' if ok else 'WRONG'}")
    sys.exit(1 if bad else 0)
