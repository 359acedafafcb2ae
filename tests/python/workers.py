"""What the rank processes run in the Python tests (importable by spawned
children). Every rank builds every rank's input from a seed, so each can
compute the exact reference locally.

Values are small integers (products: +-1, +-2), so float sums and products
are exact in every dtype and every result is compared exactly -- including
float16/bfloat16 and AVG -- whatever the reduction order."""
from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

DTYPES = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int8": torch.int8, "int16": torch.int16, "int32": torch.int32, "int64": torch.int64, "uint8": torch.uint8,
}
OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX,
       "product": dist.ReduceOp.PRODUCT}
# Bitwise ops: integers and bool; bool also under the arithmetic ops
# (SUM/MAX = or, PRODUCT/MIN = and, as torch defines them).
BITWISE = {"band": dist.ReduceOp.BAND, "bor": dist.ReduceOp.BOR, "bxor": dist.ReduceOp.BXOR}
INTEGER_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "bool")
ALL_DTYPES = {**DTYPES, "bool": torch.bool}
ALL_OPS = {**OPS, **BITWISE}
FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")
# PREMUL_SUM's factor: x 0.5 keeps data()'s small integers and their sums
# exact in every floating dtype.
PREMUL = 0.5
# 0, 1, a prime not divisible by ranks x chunks, and several MB.
SIZES = [0, 1, 100003, 1048583]
RS_SIZES = [0, 1, 100003, 262147]  # per rank (the input is world x this)


def cases() -> list[str]:
    out = []
    for dt in DTYPES:
        for op in OPS:
            out += [f"allreduce-{op}-{dt}-{n}" for n in SIZES]
            out += [f"reduce_scatter-{op}-{dt}-{n}" for n in RS_SIZES]
            out += [f"reduce_scatter_tensor-{op}-{dt}-{n}" for n in RS_SIZES]
        out += [f"all_gather-{dt}-{n}" for n in RS_SIZES]
        out += [f"all_gather_into_tensor-{dt}-{n}" for n in RS_SIZES]
        out += [f"broadcast-{dt}-{n}" for n in SIZES]
    for dt in INTEGER_DTYPES:
        for op in list(BITWISE) + (["sum", "min", "max", "product"] if dt == "bool" else []):
            out += [f"allreduce-{op}-{dt}-{n}" for n in (1, 100003)]
            out += [f"reduce_scatter_tensor-{op}-{dt}-{n}" for n in (1, 100003)]
    out += [f"broadcast-bool-{n}" for n in (1, 100003)] + [f"all_gather_into_tensor-bool-{n}" for n in (1, 100003)]
    out += ["barrier", "allreduce-noncontiguous", "broadcast-noncontiguous", "all_gather-noncontiguous-outputs",
            "reduce_scatter_tensor-noncontiguous-output", "all_gather_into_tensor-view-of-storage",
            "allreduce_coalesced", "broadcast-root0", "allreduce-async-overlap"]
    out += [f"{kind}-{dt}" for kind in ("all_gather_coalesced", "all_gather_into_tensor_coalesced",
                                        "reduce_scatter_tensor_coalesced") for dt in ("float32", "int64", "bfloat16")]
    out += ["all_gather_into_tensor_coalesced-noncontiguous"]
    out += [f"premul-{kind}-{dt}-{n}" for kind in ("allreduce", "reduce_scatter", "reduce_scatter_tensor", "reduce")
            for dt in FLOAT_DTYPES for n in (1, 100003)]
    out += ["premul-tensor_factor", "premul-allreduce_coalesced", "premul-reduce_scatter_tensor_coalesced"]
    return out


def data(rank: int, n: int, dtype: torch.dtype, product: bool = False, salt: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000003 * rank + 7919 * n + salt)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if product:
        v = torch.tensor([-2, -1, 1, 2])[torch.randint(0, 4, (n,), generator=g)]
        if dtype == torch.uint8:
            v = v.abs()
    else:
        lo = 0 if dtype == torch.uint8 else -8
        v = torch.randint(lo, 9, (n,), generator=g)
    return v.to(dtype)


def fold(op: str, xs: list[torch.Tensor], world: int) -> torch.Tensor:
    ref = xs[0].clone()
    for x in xs[1:]:
        if op in ("sum", "avg"):
            ref = ref + x
        elif op == "product":
            ref = ref * x
        elif op == "min":
            ref = torch.minimum(ref, x)
        elif op == "band":
            ref = torch.bitwise_and(ref, x)
        elif op == "bor":
            ref = torch.bitwise_or(ref, x)
        elif op == "bxor":
            ref = torch.bitwise_xor(ref, x)
        else:
            ref = torch.maximum(ref, x)
    if op == "avg":
        ref = ref / world if ref.is_floating_point() else torch.div(ref, world, rounding_mode="trunc")
        ref = ref.to(xs[0].dtype)
    return ref


def check(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    if got.dtype != want.dtype or got.shape != want.shape:
        raise AssertionError(f"{name}: got {got.dtype}{tuple(got.shape)}, want {want.dtype}{tuple(want.shape)}")
    if not torch.equal(got, want):
        bad = (got != want).nonzero()
        i = tuple(bad[0].tolist())
        raise AssertionError(f"{name}: {len(bad)} elements differ, first at {i}: got {got[i].item()}, want {want[i].item()}")


def run_premul(name: str, rank: int, world: int) -> None:
    """PREMUL_SUM: the sum of every rank's tensor multiplied by a factor (a
    number, or a one-element tensor); inputs that the caller keeps (the
    input of reduce_scatter_tensor, the tensors of reduce's other ranks)
    are left as they were."""
    parts = name.split("-")
    kind = parts[1]
    op = dist._make_nccl_premul_sum(torch.tensor([PREMUL]) if kind == "tensor_factor" else PREMUL)
    dt, n = (DTYPES[parts[2]], int(parts[3])) if len(parts) == 4 else (torch.float32, 1000)
    scaled = lambda xs: [x * PREMUL for x in xs]  # noqa: E731
    if kind in ("allreduce", "tensor_factor", "reduce"):
        xs = [data(r, n, dt) for r in range(world)]
        t = xs[rank].clone()
        if kind == "reduce":
            dist.reduce(t, dst=world - 1, op=op)
            check(name, t, fold("sum", scaled(xs), world) if rank == world - 1 else xs[rank])
        else:
            dist.all_reduce(t, op=op)
            check(name, t, fold("sum", scaled(xs), world))
        return
    if kind == "allreduce_coalesced":
        ts = [data(rank, m, torch.float32, salt=m) for m in (3, 0, 20)]
        dist.all_reduce_coalesced(ts, op=op)
        for i, m in enumerate((3, 0, 20)):
            check(f"{name}[{i}]", ts[i], fold("sum", scaled([data(r, m, torch.float32, salt=m) for r in range(world)]),
                                              world))
        return
    if kind == "reduce_scatter_tensor_coalesced":
        xs = [[data(r, m * world, torch.float32, salt=m) for m in (3, 0, 20)] for r in range(world)]
        outs = [torch.empty(m) for m in (3, 0, 20)]
        with dist._coalescing_manager():
            for out, x in zip(outs, xs[rank]):
                dist.reduce_scatter_tensor(out, x.clone(), op=op)
        for i, m in enumerate((3, 0, 20)):
            check(f"{name}[{i}]", outs[i], fold("sum", scaled([xs[r][i][rank * m:(rank + 1) * m] for r in range(world)]),
                                                world))
        return
    xs = [data(r, n * world, dt) for r in range(world)]
    want = fold("sum", scaled([x[rank * n:(rank + 1) * n] for x in xs]), world)
    out = torch.empty(n, dtype=dt)
    inp = xs[rank].clone()
    if kind == "reduce_scatter":
        dist.reduce_scatter(out, list(inp.chunk(world)), op=op)
    else:
        dist.reduce_scatter_tensor(out, inp, op=op)
    check(name + " (input untouched)", inp, xs[rank])
    check(name, out, want)


def run_case(name: str, rank: int, world: int) -> None:
    parts = name.split("-")
    kind = parts[0]
    if kind == "premul":
        run_premul(name, rank, world)
        return
    if kind == "barrier":
        # A barrier holds every rank until the last has entered: the last
        # rank enters 0.2 s late, and no rank may leave before it did (one
        # host, one clock).
        if rank == world - 1:
            time.sleep(0.2)
        entered = time.time()
        dist.barrier()
        left = time.time()
        times = torch.zeros(world, dtype=torch.float64)
        times[rank] = entered
        dist.all_reduce(times)
        if left < float(times.max()):
            raise AssertionError(f"barrier: rank {rank} left at {left:.6f}, before rank {int(times.argmax())} "
                                 f"entered at {float(times.max()):.6f}")
        return
    if name == "allreduce-noncontiguous":
        xs = [data(r, 600, torch.float32).view(20, 30).t() for r in range(world)]
        t = xs[rank].clone().t().contiguous().t()  # same non-contiguous layout
        assert not t.is_contiguous()
        dist.all_reduce(t)
        check(name, t, fold("sum", xs, world))
        return
    if name == "broadcast-noncontiguous":
        base = data(rank, 1000, torch.int32).view(10, 100)
        t = base[:, ::3]
        assert not t.is_contiguous()
        dist.broadcast(t, src=world - 1)
        check(name, t, data(world - 1, 1000, torch.int32).view(10, 100)[:, ::3])
        return
    if name == "all_gather-noncontiguous-outputs":
        x = data(rank, 50, torch.float64)
        outs = [torch.zeros(100, dtype=torch.float64)[::2] for _ in range(world)]
        dist.all_gather(outs, x)
        for r in range(world):
            check(f"{name}[{r}]", outs[r], data(r, 50, torch.float64))
        return
    if name == "reduce_scatter_tensor-noncontiguous-output":
        xs = [data(r, 64 * world, torch.int64) for r in range(world)]
        out = torch.zeros(128, dtype=torch.int64)[::2]
        dist.reduce_scatter_tensor(out, xs[rank].clone())
        check(name, out, fold("sum", [x[rank * 64:(rank + 1) * 64] for x in xs], world))
        return
    if name == "all_gather_into_tensor-view-of-storage":
        # The output is a view in the middle of a larger storage: the peers
        # must write at the right offset and nothing around it.
        big = torch.full((10 + 7 * world + 10,), -1.0)
        out = big[10:10 + 7 * world]
        dist.all_gather_into_tensor(out, torch.full((7,), float(rank)))
        check(name, out, torch.cat([torch.full((7,), float(r)) for r in range(world)]))
        check(name + " (guard)", torch.cat([big[:10], big[-10:]]), torch.full((20,), -1.0))
        return
    if name == "allreduce_coalesced":
        shapes = [(3,), (4, 5), (0,), (7, 1)]
        ts = [data(rank, int(torch.tensor(s).prod()), torch.float32, salt=i).view(s) for i, s in enumerate(shapes)]
        dist.all_reduce_coalesced(ts)
        for i, s in enumerate(shapes):
            n = int(torch.tensor(s).prod())
            check(f"{name}[{i}]", ts[i], fold("sum", [data(r, n, torch.float32, salt=i).view(s) for r in range(world)], world))
        return
    if name == "broadcast-root0":
        t = data(rank, 5000, torch.float32)
        dist.broadcast(t, src=0)
        check(name, t, data(0, 5000, torch.float32))
        return
    if name == "allreduce-async-overlap":
        # Several operations in flight at once complete in order, correctly.
        ts = [data(rank, 20000 + i, torch.float32, salt=i) for i in range(6)]
        works = [dist.all_reduce(t, async_op=True) for t in ts]
        for i, w in enumerate(works):
            w.wait()
            check(f"{name}[{i}]", ts[i], fold("sum", [data(r, 20000 + i, torch.float32, salt=i) for r in range(world)], world))
        return

    if kind in ("all_gather_coalesced", "all_gather_into_tensor_coalesced", "reduce_scatter_tensor_coalesced"):
        # Several tensors of different shapes (one empty) in one collective;
        # the tensor forms through torch's coalescing manager.
        dt = torch.float32 if parts[1] == "noncontiguous" else DTYPES[parts[1]]
        shapes = [(3,), (4, 5), (0,), (7, 1)]
        sizes = [int(torch.tensor(s).prod()) for s in shapes]
        if kind == "reduce_scatter_tensor_coalesced":
            xs = [[data(r, n * world, dt, salt=i) for i, n in enumerate(sizes)] for r in range(world)]
            outs = [torch.empty(n, dtype=dt) for n in sizes]
            with dist._coalescing_manager():
                for out, x in zip(outs, xs[rank]):
                    dist.reduce_scatter_tensor(out, x.clone())
            for i, n in enumerate(sizes):
                check(f"{name}[{i}]", outs[i], fold("sum", [xs[r][i][rank * n:(rank + 1) * n] for r in range(world)], world))
            return
        ins = [data(rank, n, dt, salt=i).view(s) for i, (n, s) in enumerate(zip(sizes, shapes))]
        want = [[data(r, n, dt, salt=i).view(s) for r in range(world)] for i, (n, s) in enumerate(zip(sizes, shapes))]
        if kind == "all_gather_coalesced":
            # torch's layout: outs[r][i] receives rank r's input i (the
            # shapes differ per input, so a transposed reading cannot pass).
            outs = [[torch.empty(s, dtype=dt) for s in shapes] for _ in range(world)]
            dist.all_gather_coalesced(outs, ins)
            for r in range(world):
                for i in range(len(shapes)):
                    check(f"{name}[{r}][{i}]", outs[r][i], want[i][r])
            return
        if parts[1] == "noncontiguous":
            outs = [torch.zeros(2 * n * world, dtype=dt)[::2] for n in sizes]
        else:
            outs = [torch.empty(n * world, dtype=dt) for n in sizes]
        with dist._coalescing_manager():
            for out, x in zip(outs, ins):
                dist.all_gather_into_tensor(out, x)
        for i in range(len(shapes)):
            check(f"{name}[{i}]", outs[i], torch.cat([w.reshape(-1) for w in want[i]]))
        return
    if kind in ("allreduce", "reduce_scatter", "reduce_scatter_tensor"):
        op, dt, n = parts[1], ALL_DTYPES[parts[2]], int(parts[3])
        prod = op == "product"
        if kind == "allreduce":
            xs = [data(r, n, dt, prod) for r in range(world)]
            t = xs[rank].clone()
            dist.all_reduce(t, op=ALL_OPS[op])
            check(name, t, fold(op, xs, world))
        else:
            xs = [data(r, n * world, dt, prod) for r in range(world)]
            want = fold(op, [x[rank * n:(rank + 1) * n] for x in xs], world)
            out = torch.empty(n, dtype=dt)
            before = xs[rank].clone()
            if kind == "reduce_scatter":
                dist.reduce_scatter(out, list(xs[rank].clone().chunk(world)) if n else
                                    [torch.empty(0, dtype=dt) for _ in range(world)], op=ALL_OPS[op])
            else:
                inp = xs[rank].clone()
                dist.reduce_scatter_tensor(out, inp, op=ALL_OPS[op])
                check(name + " (input untouched)", inp, before)
            check(name, out, want)
        return
    if kind in ("all_gather", "all_gather_into_tensor"):
        dt, n = ALL_DTYPES[parts[1]], int(parts[2])
        x = data(rank, n, dt)
        want = [data(r, n, dt) for r in range(world)]
        if kind == "all_gather":
            outs = [torch.empty(n, dtype=dt) for _ in range(world)]
            dist.all_gather(outs, x)
            for r in range(world):
                check(f"{name}[{r}]", outs[r], want[r])
        else:
            out = torch.empty(n * world, dtype=dt)
            dist.all_gather_into_tensor(out, x)
            check(name, out, torch.cat(want))
        return
    if kind == "broadcast":
        dt, n = ALL_DTYPES[parts[1]], int(parts[2])
        t = data(rank, n, dt)
        dist.broadcast(t, src=world - 1)
        check(name, t, data(world - 1, n, dt))
        return
    raise ValueError(f"unknown case {name}")


def matrix(rank: int, world: int, names: list[str], run=None, keep_going: bool = False,
           timeout_s: float = 120) -> dict:
    """Run every case (run(name, rank, world), default run_case) in one
    process group; returns {case: error or None}. An exception other than a
    failed check breaks a collective group, so the later cases are not run,
    unless keep_going (point to point: an error leaves the group usable)."""
    import maestro_torch  # noqa: F401  (registers the backend)

    run = run or run_case
    dist.init_process_group("maestro", timeout=__import__("datetime").timedelta(seconds=timeout_s))
    results, broken = {}, None
    start = time.time()
    for name in names:
        if broken:
            results[name] = f"not run: the group broke in an earlier case ({broken})"
            continue
        try:
            run(name, rank, world)
            results[name] = None
        except AssertionError as e:
            results[name] = str(e)
        except Exception as e:  # noqa: BLE001
            results[name] = f"{type(e).__name__}: {e}"
            broken = None if keep_going else name
    results["_seconds"] = time.time() - start
    results["_path_stats"] = __import__("maestro_torch").path_stats()
    dist.destroy_process_group()
    return results


def tcp_sockets_of_this_process() -> list[tuple[bool, str, int]]:
    """(listening, local IPv4 address, local port) of each of this process's
    TCP sockets, from /proc/self/fd and /proc/net/tcp."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    out = []
    with open("/proc/net/tcp") as f:
        for line in list(f)[1:]:
            cols = line.split()
            if cols[9] in inodes:
                hexip, hexport = cols[1].split(":")
                out.append((cols[3] == "0A", ".".join(str(b) for b in reversed(bytes.fromhex(hexip))),  # 0A: LISTEN
                            int(hexport, 16)))
    return out


def tcp_addresses_of_this_process() -> tuple[set, set]:
    """(listening, connected) local IPv4 addresses of this process's TCP sockets."""
    socks = tcp_sockets_of_this_process()
    return {ip for listening, ip, _ in socks if listening}, {ip for listening, ip, _ in socks if not listening}


def gloo_devices_allreduce(rank: int, world: int, per_rank: int) -> dict:
    """benchmarks/gloo_devices.py on loopback aliases: rank r's devices on
    127.0.0.(10 + per_rank * r + k); several allreduces in flight at once,
    each result checked exactly; returns the group's device count and this
    process's TCP addresses."""
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                    "benchmarks"))
    import gloo_devices

    dist.init_process_group("gloo")
    try:
        addrs = [f"127.0.0.{10 + per_rank * rank + k}" for k in range(per_rank)]
        g = gloo_devices.new_group(",".join(addrs))
        xs = [torch.full((100003,), float((rank + 1) * (i + 1))) for i in range(3 * per_rank)]
        works = [dist.all_reduce(x, group=g, async_op=True) for x in xs]
        for w in works:
            w.wait()
        total = world * (world + 1) // 2
        for i, x in enumerate(xs):
            check(f"allreduce {i}", x, torch.full_like(x, float(total * (i + 1))))
        listening, connected = tcp_addresses_of_this_process()
        out = {"devices": gloo_devices.device_count(g), "addrs": addrs, "listening": sorted(listening),
               "connected": sorted(connected)}
        dist.barrier(group=g)
        return out
    finally:
        dist.destroy_process_group()
