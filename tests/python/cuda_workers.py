"""What the rank processes of the staging tests run: CUDA tensors through
maestro (tests/python/test_cuda.py, on a GPU), and the same steps on CPU
tensors with MAESTRO_STAGING=force (tests/python/test_staging.py, anywhere).
Each case returns None or its error text; every rank builds every rank's
data from a seed, so each computes the exact reference locally."""
from __future__ import annotations

import os
import time
import traceback

import torch
import torch.distributed as dist

import maestro_torch  # noqa: F401 - registers the backend where no entry point is installed


def _device() -> torch.device:
    if torch.cuda.is_available() and os.environ.get("MAESTRO_TEST_DEVICE", "cuda") == "cuda":
        d = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(d)
        return d
    return torch.device("cpu")


def data(rank: int, n: int, dtype=torch.float32, device="cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + rank)
    return torch.randint(-8, 8, (n,), generator=g).to(dtype).to(device)


def _cases(rank: int, world: int, dev: torch.device) -> dict:
    """name -> callable raising on a wrong result."""
    cpu = torch.device("cpu")
    cases = {}

    def allreduce(n, dtype, op):
        def run():
            t = data(rank, n, dtype, dev)
            dist.all_reduce(t, op=op)
            ref = torch.stack([data(r, n, dtype) for r in range(world)])
            want = {dist.ReduceOp.SUM: ref.sum(0), dist.ReduceOp.MAX: ref.max(0).values}[op].to(dtype)
            assert t.device == dev, t.device
            assert torch.equal(t.cpu(), want), f"allreduce {n} {dtype}: wrong result"
        return run

    for n in (0, 1, 100003, 1048583):
        for dtype in (torch.float32, torch.bfloat16, torch.int64):
            cases[f"allreduce-sum-{dtype}-{n}"] = allreduce(n, dtype, dist.ReduceOp.SUM)
    cases["allreduce-max"] = allreduce(100003, torch.float32, dist.ReduceOp.MAX)

    def noncontiguous():
        base = data(rank, 2 * 5001, torch.float32, dev).view(5001, 2)
        t = base[:, 1]  # strided
        dist.all_reduce(t)
        want = sum(data(r, 2 * 5001).view(5001, 2)[:, 1] for r in range(world))
        assert torch.equal(t.cpu(), want) and torch.equal(base[:, 0].cpu(), data(rank, 2 * 5001).view(5001, 2)[:, 0])
    cases["allreduce-noncontiguous"] = noncontiguous

    def broadcast():
        t = data(rank, 70001, torch.float32, dev)
        dist.broadcast(t, src=world - 1)
        assert torch.equal(t.cpu(), data(world - 1, 70001))
    cases["broadcast"] = broadcast

    def all_gather_into_tensor_in_place():
        # FSDP's pattern: the input is this rank's slice of the output.
        out = torch.zeros(world * 3001, device=dev)
        mine = out.narrow(0, rank * 3001, 3001)
        mine.copy_(data(rank, 3001, device=dev))
        dist.all_gather_into_tensor(out, mine)
        assert torch.equal(out.cpu(), torch.cat([data(r, 3001) for r in range(world)]))
    cases["all_gather_into_tensor-in-place"] = all_gather_into_tensor_in_place

    def all_gather():
        outs = [torch.empty(4099, device=dev) for _ in range(world)]
        dist.all_gather(outs, data(rank, 4099, device=dev))
        for r in range(world):
            assert torch.equal(outs[r].cpu(), data(r, 4099)), f"block {r}"
    cases["all_gather"] = all_gather

    def reduce_scatter_tensor():
        inp = data(rank, world * 2053, device=dev)
        out = torch.empty(2053, device=dev)
        dist.reduce_scatter_tensor(out, inp)
        want = sum(data(r, world * 2053) for r in range(world)).narrow(0, rank * 2053, 2053)
        assert torch.equal(out.cpu(), want)
    cases["reduce_scatter_tensor"] = reduce_scatter_tensor

    def all_to_all_single():
        inp = data(rank, world * 1000, device=dev)
        out = torch.empty(world * 1000, device=dev)
        dist.all_to_all_single(out, inp)
        want = torch.cat([data(r, world * 1000).narrow(0, rank * 1000, 1000) for r in range(world)])
        assert torch.equal(out.cpu(), want)
    cases["all_to_all_single"] = all_to_all_single

    def reduce():
        t = data(rank, 9001, device=dev)
        dist.reduce(t, dst=0)
        if rank == 0:
            assert torch.equal(t.cpu(), sum(data(r, 9001) for r in range(world)))
        else:
            assert torch.equal(t.cpu(), data(rank, 9001)), "reduce changed a non-root tensor"
    cases["reduce"] = reduce

    def gather_scatter():
        outs = [torch.empty(777, device=dev) for _ in range(world)] if rank == 0 else None
        dist.gather(data(rank, 777, device=dev), outs, dst=0)
        if rank == 0:
            for r in range(world):
                assert torch.equal(outs[r].cpu(), data(r, 777))
        got = torch.empty(555, device=dev)
        dist.scatter(got, [data(100 + r, 555, device=dev) for r in range(world)] if rank == 0 else None, src=0)
        assert torch.equal(got.cpu(), data(100 + rank, 555))
    cases["gather-scatter"] = gather_scatter

    def p2p():
        peer = (rank + 1) % world
        src = (rank - 1) % world
        got = torch.empty(300007, device=dev)
        ops = [dist.P2POp(dist.isend, data(rank, 300007, device=dev), peer),
               dist.P2POp(dist.irecv, got, src)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        assert torch.equal(got.cpu(), data(src, 300007))
    cases["batch_isend_irecv"] = p2p

    def coalesced():
        ts = [data(rank, n, device=dev) for n in (10, 2000, 1)]
        dist.all_reduce_coalesced(ts)
        for t, n in zip(ts, (10, 2000, 1)):
            assert torch.equal(t.cpu(), sum(data(r, n) for r in range(world)))
    cases["allreduce_coalesced"] = coalesced

    def stream_order():
        # The op must wait for the caller's stream: the tensor is written
        # there behind a long kernel, then reduced at once.
        t = torch.zeros(1 << 20, device=dev)
        if dev.type == "cuda":
            torch.cuda._sleep(50_000_000)  # ~tens of ms of GPU time before the fill
        t.fill_(rank + 1.0)
        work = dist.all_reduce(t, async_op=True)
        work.wait()  # the current stream waits for the copy back; then read on it
        total = t.sum()
        assert total.item() == (1 << 20) * world * (world + 1) / 2, total.item()
    cases["stream-order"] = stream_order

    def side_stream_async():
        # async_op on a user's stream, work.wait() on it, then compute there.
        if dev.type != "cuda":
            return
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            x = torch.full((1 << 18,), float(rank), device=dev)
            w = dist.all_reduce(x, async_op=True)
            w.wait()
            y = x * 2
        s.synchronize()
        assert torch.all(y == 2 * sum(range(world))).item()
    cases["side-stream-async"] = side_stream_async

    def future_then():
        t = torch.ones(4096, device=dev)
        fut = dist.all_reduce(t, async_op=True).get_future()
        got = fut.then(lambda f: f.value()[0] * 3).wait()
        assert torch.all(got == 3 * world).item()
    cases["future-then"] = future_then

    def mixed_devices_refused():
        # A CPU output with a CUDA input: a clear error on every rank, and
        # the group goes on.
        if dev.type != "cuda":
            return
        try:
            dist.all_gather_into_tensor(torch.empty(world * 4), torch.ones(4, device=dev))
        except Exception as e:  # noqa: BLE001
            assert "every tensor of a call must be on one device" in str(e), str(e)
        else:
            raise AssertionError("a CPU output with a CUDA input was not refused")
        t = torch.ones(8, device=dev)
        dist.all_reduce(t)
        assert torch.all(t == world).item()
    cases["mixed-devices-refused"] = mixed_devices_refused

    def slabs_reused():
        import maestro_torch

        pg = dist.distributed_c10d._get_default_group()
        backend = pg._get_backend(dev)
        t = data(rank, 1 << 20, device=dev)
        dist.all_reduce(t)
        before, regs = backend.staging_stats(), backend.registration_cache_stats()
        for _ in range(5):
            dist.all_reduce(t)
        after, regs_after = backend.staging_stats(), backend.registration_cache_stats()
        assert after["allocations"] == before["allocations"], (before, after)
        assert regs_after["misses"] == regs["misses"], (regs, regs_after)
        assert isinstance(backend, maestro_torch.ProcessGroupMaestro)
    cases["slabs-reused"] = slabs_reused

    def pipelined():
        # Two asynchronous allreduces of tensors made on the caller's stream
        # just before each call: the pieces of their copies wait for that
        # stream, the ring sends each piece as it lands, and each part goes
        # back as soon as it is final.
        backend = dist.distributed_c10d._get_default_group()._get_backend(dev)
        before = backend.staging_stats()["pipelined_ops"]
        n = 3 << 20  # 12 MiB of float32: pieces on every setting the tests use
        src = data(rank, n, device=dev)
        t = src * 3
        works = [dist.all_reduce(t, async_op=True)]
        u = src * 5
        works.append(dist.all_reduce(u, async_op=True))
        for w in works:
            w.wait()
        ref = sum(data(r, n) for r in range(world))
        assert torch.equal(t.cpu(), ref * 3) and torch.equal(u.cpu(), ref * 5), "pipelined allreduce: wrong result"
        if dev.type == "cuda" or os.environ.get("MAESTRO_STAGING") == "force":
            after = backend.staging_stats()["pipelined_ops"]
            assert after == before + 2, f"{after - before} of 2 allreduces were pipelined"
    cases["allreduce-pipelined"] = pipelined
    return cases


def matrix(rank: int, world: int) -> dict:
    dev = _device()
    dist.init_process_group("maestro", device_id=dev if dev.type == "cuda" else None)
    out = {}
    try:
        for name, run in _cases(rank, world, dev).items():
            try:
                run()
                out[name] = None
            except Exception:  # noqa: BLE001
                out[name] = traceback.format_exc()
            dist.barrier()
    finally:
        dist.destroy_process_group()
    return out


def matrix_of(rank: int, world: int, _cases: list) -> dict:
    """matrix() as launcher.matrix_tests calls it."""
    return matrix(rank, world)


def case_names() -> list[str]:
    return list(_cases(0, 2, torch.device("cpu")).keys())


def ddp_matches_gloo(rank: int, world: int) -> dict:
    """DDP on maestro and on gloo, same seed and data: the same parameters
    (2 ranks: a sum of two is exact in any order)."""
    dev = _device()
    dist.init_process_group("maestro")
    gloo = dist.new_group(backend="gloo")
    from torch.nn.parallel import DistributedDataParallel as DDP

    params = {}
    times = {}
    for name, group in (("maestro", None), ("gloo", gloo)):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).to(dev)
        ddp = DDP(model, process_group=group, bucket_cap_mb=1,
                  device_ids=[dev.index] if dev.type == "cuda" else None)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(10 + rank)
        start = time.perf_counter()
        for _ in range(4):
            x = torch.randn(32, 256, generator=g).to(dev)
            y = torch.randint(0, 10, (32,), generator=g).to(dev)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times[name] = time.perf_counter() - start
        params[name] = [p.detach().cpu() for p in model.parameters()]
    same = all(torch.equal(a, b) for a, b in zip(params["maestro"], params["gloo"]))
    dist.destroy_process_group()
    return {"same": same, "device": str(dev), "times": times}


def fsdp_matches_ddp(rank: int, world: int) -> dict:
    """FSDP2 (fully_shard over a DeviceMesh) on maestro trains to the same
    parameters as DDP on maestro."""
    dev = _device()
    dist.init_process_group("maestro")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8)).to(dev)

    def train(m):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(10 + rank)
        for _ in range(3):
            x = torch.randn(16, 64, generator=g).to(dev)
            opt.zero_grad()
            m(x).square().mean().backward()
            opt.step()

    mesh = init_device_mesh(dev.type, (world,))
    sharded = model()
    fully_shard(sharded[0], mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    train(sharded)
    full = [p.full_tensor().detach().cpu() for p in sharded.parameters()]
    plain = model()
    train(DDP(plain, device_ids=[dev.index] if dev.type == "cuda" else None))
    ref = [p.detach().cpu() for p in plain.parameters()]
    close = all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(full, ref))
    dist.destroy_process_group()
    return {"close": close}


def init_forms(rank: int, world: int, backend: str) -> dict:
    """init_process_group(backend) with a CUDA allreduce: which backend
    object took the CUDA tensor."""
    dev = _device()
    dist.init_process_group(backend)
    t = torch.ones(1000, device=dev)
    dist.all_reduce(t)
    pg = dist.distributed_c10d._get_default_group()
    name = type(pg._get_backend(dev)).__name__
    ok = bool(torch.all(t == world).item())
    dist.destroy_process_group()
    return {"ok": ok, "backend": name}


def staging_off_refuses(rank: int, world: int) -> dict:
    dev = _device()
    dist.init_process_group("maestro")
    error = ""
    try:
        dist.all_reduce(torch.ones(10, device=dev))
    except Exception as e:  # noqa: BLE001
        error = str(e)
    t = torch.ones(10)
    dist.all_reduce(t)  # the group goes on (CPU tensors)
    ok = bool(torch.all(t == world))
    dist.destroy_process_group()
    return {"error": error, "ok": ok}


def maestro_for_cuda_only(rank: int, world: int) -> dict:
    """"cpu:gloo,cuda:maestro" on any machine: maestro is the group's CUDA
    backend, and maestro_torch finds it there (path_stats, describe)."""
    import maestro_torch

    dist.init_process_group("cpu:gloo,cuda:maestro")
    pg = dist.distributed_c10d._get_default_group()
    out = {"cpu": type(pg._get_backend(torch.device("cpu"))).__name__,
           "cuda": type(pg._get_backend(torch.device("cuda"))).__name__,
           "found": type(maestro_torch.backend_of()).__name__,
           "paths": len(maestro_torch.path_stats()) > 0}
    dist.destroy_process_group()
    return out
