"""What the rank processes run in the reduce / gather / scatter / all-to-all
tests (importable by spawned children): every dtype (bool included), sizes
0, 1, odd and several MB, every root, uneven all-to-all splits, the object
collectives torch builds on gather and scatter, non-contiguous tensors, and
bad input: refused on every rank (the group goes on) or disagreeing between
ranks (an error on every rank, in a group of its own)."""
from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist

import workers
from p2p_workers import payload
from scenarios import _error_of
from workers import ALL_OPS, BITWISE, INTEGER_DTYPES, OPS, check, fold

DTYPES = {**workers.DTYPES, "bool": torch.bool}
SIZES = [0, 1, 100003, 1048583]
ROOTS = ["0", "1", "last"]  # "1" is the last rank in a group of 2


def cases() -> list[str]:
    out = []
    for dt in DTYPES:
        for op in OPS:
            if not (dt == "bool" and op == "avg"):
                out += [f"reduce-{op}-{dt}-{n}-last" for n in SIZES[:3]]
        out += [f"gather-{dt}-{n}-{root}" for n in SIZES for root in ROOTS]
        out += [f"scatter-{dt}-{n}-{root}" for n in SIZES for root in ROOTS]
        out += [f"all_to_all-{dt}-{n}" for n in SIZES]
        out += [f"all_to_all_single-{dt}-{n}" for n in SIZES]
        out += [f"all_to_all_single_uneven-{dt}-{n}" for n in SIZES[:3]]
    out += [f"reduce-{op}-float32-{n}-{root}" for op in OPS for n in (1, 1048583) for root in ROOTS]
    out += [f"reduce-{op}-{dt}-{n}-last" for op in BITWISE for dt in INTEGER_DTYPES for n in SIZES[1:3]]
    out += ["all_to_all-uneven-list", "all_to_all_single-moe", "all_to_all_single-2d", "all_to_all_single-inplace",
            "gather_object", "scatter_object_list", "all_gather_object", "reduce-noncontiguous",
            "gather-noncontiguous", "scatter-noncontiguous", "all_to_all_single-noncontiguous",
            "async-in-order", "refused-everywhere", "splits-disagree", "gather-sizes-disagree",
            "dtype-disagrees", "root-disagrees"]
    return out


def root_of(spec: str, world: int) -> int:
    return world - 1 if spec == "last" else int(spec)


def block(src: int, dst: int, n: int, dt: torch.dtype) -> torch.Tensor:
    """What rank src sends rank dst."""
    return payload(src, n, dt, salt=17 * dst + 1)


def uneven(src: int, dst: int, scale: int) -> int:
    """Rows rank src sends rank dst in an uneven exchange (some empty)."""
    return ((src * 7 + dst * 3) % 4) * scale


def coalesced_gather(out: torch.Tensor, x: torch.Tensor) -> None:
    with dist._coalescing_manager():
        dist.all_gather_into_tensor(out, x)


def run_case(name: str, rank: int, world: int) -> None:
    parts = name.split("-")
    kind = parts[0]
    if kind == "reduce" and len(parts) == 5:
        op, dt, n, root = parts[1], DTYPES[parts[2]], int(parts[3]), root_of(parts[4], world)
        prod = op == "product"
        xs = [payload(r, n, dt) if dt == torch.bool else workers.data(r, n, dt, prod) for r in range(world)]
        t = xs[rank].clone()
        dist.reduce(t, dst=root, op=ALL_OPS[op])
        check(name, t, fold(op, xs, world) if rank == root else xs[rank])  # the others' tensors unchanged
        return
    if kind in ("gather", "scatter") and len(parts) == 4:
        dt, n, root = DTYPES[parts[1]], int(parts[2]), root_of(parts[3], world)
        if kind == "gather":
            outs = [torch.empty(n, dtype=dt) for _ in range(world)] if rank == root else None
            dist.gather(block(rank, root, n, dt), outs, dst=root)
            if rank == root:
                for r in range(world):
                    check(f"{name}[{r}]", outs[r], block(r, root, n, dt))
        else:
            out = torch.empty(n, dtype=dt)
            ins = [block(root, r, n, dt) for r in range(world)] if rank == root else None
            dist.scatter(out, ins, src=root)
            check(name, out, block(root, rank, n, dt))
        return
    if kind == "all_to_all":
        if name == "all_to_all-uneven-list":
            # List form: every pair its own size, some empty; 2-D blocks.
            outs = [torch.empty(uneven(r, rank, 5), 3) for r in range(world)]
            dist.all_to_all(outs, [block(rank, r, uneven(rank, r, 5) * 3, torch.float32).view(-1, 3) for r in range(world)])
            for r in range(world):
                check(f"{name}[{r}]", outs[r], block(r, rank, uneven(r, rank, 5) * 3, torch.float32).view(-1, 3))
            return
        dt, n = DTYPES[parts[1]], int(parts[2])
        outs = [torch.empty(n, dtype=dt) for _ in range(world)]
        dist.all_to_all(outs, [block(rank, r, n, dt) for r in range(world)])
        for r in range(world):
            check(f"{name}[{r}]", outs[r], block(r, rank, n, dt))
        return
    if kind in ("all_to_all_single", "all_to_all_single_uneven") and len(parts) == 3:
        dt, n = DTYPES[parts[1]], int(parts[2])
        if kind == "all_to_all_single":
            out = torch.empty(n * world, dtype=dt)
            dist.all_to_all_single(out, torch.cat([block(rank, r, n, dt) for r in range(world)]))
            check(name, out, torch.cat([block(r, rank, n, dt) for r in range(world)]))
            return
        ins = [uneven(rank, r, n) for r in range(world)]
        outs = [uneven(r, rank, n) for r in range(world)]
        out = torch.empty(sum(outs), dtype=dt)
        dist.all_to_all_single(out, torch.cat([block(rank, r, ins[r], dt) for r in range(world)]), outs, ins)
        check(name, out, torch.cat([block(r, rank, outs[r], dt) for r in range(world)]))
        return
    if name == "all_to_all_single-moe":
        # A mixture-of-experts token shuffle: each rank routes a random number
        # of tokens (rows of a hidden size) to every expert rank, learns how
        # many it gets from an all_to_all_single of the counts, then moves
        # the tokens; and back again (the combine step).
        hidden = 24
        g = torch.Generator().manual_seed(rank)
        send_counts = torch.randint(0, 300, (world,), generator=g)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts)
        for r in range(world):
            want = torch.randint(0, 300, (world,), generator=torch.Generator().manual_seed(r))[rank]
            check(f"{name} counts[{r}]", recv_counts[r], want)
        tokens = torch.cat([block(rank, r, int(send_counts[r]) * hidden, torch.bfloat16).view(-1, hidden)
                            for r in range(world)])
        got = torch.empty(int(recv_counts.sum()), hidden, dtype=torch.bfloat16)
        dist.all_to_all_single(got, tokens, recv_counts.tolist(), send_counts.tolist())
        check(name, got, torch.cat([block(r, rank, int(recv_counts[r]) * hidden, torch.bfloat16).view(-1, hidden)
                                    for r in range(world)]))
        back = torch.empty_like(tokens)
        dist.all_to_all_single(back, got, send_counts.tolist(), recv_counts.tolist())
        check(name + " (combine)", back, tokens)
        return
    if name == "all_to_all_single-2d":
        out = torch.empty(2 * world, 5, dtype=torch.int64)
        dist.all_to_all_single(out, torch.cat([block(rank, r, 10, torch.int64).view(2, 5) for r in range(world)]))
        check(name, out, torch.cat([block(r, rank, 10, torch.int64).view(2, 5) for r in range(world)]))
        return
    if name == "all_to_all_single-inplace":
        t = torch.cat([block(rank, r, 33, torch.float64) for r in range(world)])
        dist.all_to_all_single(t, t)
        check(name, t, torch.cat([block(r, rank, 33, torch.float64) for r in range(world)]))
        return
    if name in ("gather_object", "scatter_object_list", "all_gather_object"):
        obj = {"rank": rank, "items": list(range(rank * 3)), "text": "x" * (rank * 1000 + 1)}
        want = [{"rank": r, "items": list(range(r * 3)), "text": "x" * (r * 1000 + 1)} for r in range(world)]
        root = world - 1
        if name == "gather_object":
            out = [None] * world if rank == root else None
            dist.gather_object(obj, out, dst=root)
            if rank == root and out != want:
                raise AssertionError(f"{name}: got {out!r:.200}")
        elif name == "scatter_object_list":
            out = [None]
            dist.scatter_object_list(out, want if rank == root else None, src=root)
            if out[0] != want[rank]:
                raise AssertionError(f"{name}: got {out[0]!r:.200}")
        else:
            out = [None] * world
            dist.all_gather_object(out, obj)
            if out != want:
                raise AssertionError(f"{name}: got {out!r:.200}")
        return
    if name == "reduce-noncontiguous":
        xs = [workers.data(r, 600, torch.float32).view(20, 30).t() for r in range(world)]
        t = xs[rank].clone().t().contiguous().t()
        assert not t.is_contiguous()
        dist.reduce(t, dst=0)
        check(name, t, fold("sum", xs, world) if rank == 0 else xs[rank])
        return
    if name == "gather-noncontiguous":
        outs = [torch.full((200,), -1, dtype=torch.int16)[::2] for _ in range(world)] if rank == 0 else None
        dist.gather(block(rank, 0, 100, torch.int16), outs, dst=0)
        if rank == 0:
            for r in range(world):
                check(f"{name}[{r}]", outs[r], block(r, 0, 100, torch.int16))
        return
    if name == "scatter-noncontiguous":
        out = torch.zeros(10, 20, dtype=torch.float16)[:, ::2]
        ins = [block(0, r, 100, torch.float16).view(10, 10).t() for r in range(world)] if rank == 0 else None
        dist.scatter(out, ins, src=0)
        check(name, out, block(0, rank, 100, torch.float16).view(10, 10).t())
        return
    if name == "all_to_all_single-noncontiguous":
        out = torch.zeros(3, 4 * world, dtype=torch.int32).t()  # (4*world, 3), not contiguous
        src = torch.cat([block(rank, r, 12, torch.int32).view(4, 3) for r in range(world)])
        dist.all_to_all_single(out, src)
        check(name, out, torch.cat([block(r, rank, 12, torch.int32).view(4, 3) for r in range(world)]))
        return
    if name == "async-in-order":
        # Several of them in flight at once, mixed with allreduce.
        t = workers.data(rank, 5000, torch.float32)
        gathered = [torch.empty(5000) for _ in range(world)] if rank == 0 else None
        a2a = torch.empty(7 * world, dtype=torch.int64)
        works = [dist.reduce(t.clone(), dst=world - 1, async_op=True),
                 dist.gather(t, gathered, dst=0, async_op=True),
                 dist.all_to_all_single(a2a, torch.cat([block(rank, r, 7, torch.int64) for r in range(world)]),
                                        async_op=True),
                 dist.all_reduce(s := t.clone(), async_op=True)]
        for w in works:
            w.wait()
        check(name + " allreduce", s, fold("sum", [workers.data(r, 5000, torch.float32) for r in range(world)], world))
        check(name + " all_to_all_single", a2a, torch.cat([block(r, rank, 7, torch.int64) for r in range(world)]))
        if rank == 0:
            for r in range(world):
                check(f"{name} gather[{r}]", gathered[r], workers.data(r, 5000, torch.float32))
        return
    if name == "refused-everywhere":
        # Every rank refuses before anything moves: an error on every rank,
        # and the group goes on.
        t = torch.ones(8)
        backend = dist.group.WORLD._get_backend(torch.device("cpu"))
        bad_root = dist.ReduceOptions()
        bad_root.rootRank = world + 2  # torch's own check is bypassed: maestro's is tested
        errors = {
            "reduce root": _error_of(lambda: backend.reduce([t], bad_root).wait()),
            "splits sum": _error_of(lambda: dist.all_to_all_single(torch.empty(4 * world), torch.ones(4 * world),
                                                                   [4] * world, [3] * world)),
            "rows": _error_of(lambda: dist.all_to_all_single(torch.empty(world + 1), torch.ones(world + 1))),
            "self": _error_of(lambda: dist.all_to_all([torch.empty(2) for _ in range(world)],
                                                      [torch.ones(3) for _ in range(world)])),
            "dtype": _error_of(lambda: dist.all_to_all_single(torch.empty(world, dtype=torch.uint32),
                                                              torch.ones(world, dtype=torch.uint32))),
            "bool avg": _error_of(lambda: dist.reduce(torch.ones(3, dtype=torch.bool), dst=0, op=dist.ReduceOp.AVG)),
            "coalesced": _error_of(lambda: coalesced_gather(torch.empty(world + 1), torch.ones(1))),
        }
        wants = {"reduce root": "is not a rank of this group", "splits sum": "add up to", "rows": "not divisible",
                 "self": "to itself", "dtype": "not supported", "bool avg": "not defined for bool",
                 "coalesced": "must be world size"}
        for what, err in errors.items():
            if wants[what] not in err:
                raise AssertionError(f"{name}: {what}: {err!r}")
        x = torch.full((5,), float(rank + 1))
        dist.reduce(x, dst=0)
        check(name + " (after)", x, torch.full((5,), float(sum(range(1, world + 1)))) if rank == 0
              else torch.full((5,), float(rank + 1)))
        return
    if name in ("splits-disagree", "gather-sizes-disagree", "dtype-disagrees", "root-disagrees"):
        # Ranks that disagree: an error on every rank naming it, long before
        # the timeout, in a group of its own (a failure ends a group).
        g = dist.new_group(backend="maestro", timeout=datetime.timedelta(seconds=60))
        start = time.time()
        if name == "splits-disagree":  # each rank's splits add up, but rank 1 sends rank 0 one row less
            ins = [3 if rank == 1 and r == 0 else 4 for r in range(world)]
            err = _error_of(lambda: dist.all_to_all_single(torch.empty(4 * world), torch.ones(sum(ins)), [4] * world,
                                                           ins, group=g))
            want = "disagree on what they exchange"
        elif name == "gather-sizes-disagree":
            outs = [torch.empty(10) for _ in range(world)] if rank == 0 else None
            err = _error_of(lambda: dist.gather(torch.ones(9 if rank == world - 1 else 10), outs if rank == 0 else None,
                                                dst=0, group=g))
            want = "different tensors"
        elif name == "dtype-disagrees":
            dt = torch.float64 if rank == 0 else torch.float32
            err = _error_of(lambda: dist.all_to_all([torch.empty(3, dtype=dt) for _ in range(world)],
                                                    [torch.ones(3, dtype=dt) for _ in range(world)], group=g))
            want = "different tensors"
        else:
            err = _error_of(lambda: dist.reduce(torch.ones(100), dst=0 if rank else 1, group=g))
            want = "different tensors"
        seconds = time.time() - start
        dist.barrier()  # no rank tears its group down while another still reads the error in it
        dist.destroy_process_group(g)
        if want not in err:
            raise AssertionError(f"{name}: {err!r}")
        if seconds > 30:
            raise AssertionError(f"{name}: the error took {seconds:.0f} s (the timeout is 60 s)")
        return
    raise ValueError(f"unknown case {name}")


def matrix(rank: int, world: int, names: list[str]) -> dict:
    """Every case in one process group; the error cases leave it usable."""
    return workers.matrix(rank, world, names, run=run_case, keep_going=True, timeout_s=120)
