"""What the rank processes run in the point-to-point tests (importable by
spawned children): send / recv / isend / irecv / recv from any source /
batch_isend_irecv, each case checked exactly against data every rank can
rebuild from a seed. Blocking send returns once the receiver has the
message, so exchanges where both sides send post the send with isend."""
from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist

import workers
from scenarios import _error_of
from workers import DTYPES, check, data

DTYPES = {**DTYPES, "bool": torch.bool}
SIZES = [0, 1, 100003, 1048583]  # 0, 1, odd, several MiB (float32: 4 MiB)


def cases() -> list[str]:
    out = [f"ring-{dt}-{n}" for dt in DTYPES for n in SIZES]
    out += [f"blocking-{n}" for n in SIZES]
    out += ["tags-in-order", "anysource", "recv-posted-first", "send-posted-first", "noncontiguous",
            "batch", "many-small-beside-collectives", "self-and-bad-rank", "size-mismatch"]
    return out


def payload(rank: int, n: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    if dtype == torch.bool:
        return data(rank, n, torch.int8, salt=salt) > 0
    return data(rank, n, dtype, salt=salt)




def run_case(name: str, rank: int, world: int) -> None:
    parts = name.split("-")
    right, left = (rank + 1) % world, (rank - 1) % world
    if parts[0] == "ring":
        # Every rank sends to its right and receives from its left at once.
        dt, n = DTYPES[parts[1]], int(parts[2])
        out = payload(rank, n, dt)
        got = torch.empty(n, dtype=dt)
        reqs = [dist.isend(out, right), dist.irecv(got, left)]
        for q in reqs:
            q.wait()
        check(name, got, payload(left, n, dt))
        return
    if parts[0] == "blocking":
        # Rank 0 talks to every other rank in turn with blocking calls.
        n = int(parts[1])
        if rank == 0:
            for q in range(1, world):
                got = torch.empty(n, dtype=torch.float64)
                dist.recv(got, q)
                check(f"{name} from {q}", got, payload(q, n, torch.float64))
                dist.send(payload(0, n, torch.float64, salt=q), q)
        else:
            dist.send(payload(rank, n, torch.float64), 0)
            got = torch.empty(n, dtype=torch.float64)
            dist.recv(got, 0)
            check(name, got, payload(0, n, torch.float64, salt=rank))
        return
    if name == "tags-in-order":
        # Rank 0 sends tags 1, 2, 1, 2, ... to each rank; the receivers take
        # tag 2 first, then tag 1: each tag's messages arrive in send order.
        k = 6
        if rank == 0:
            reqs = [dist.isend(payload(0, 33 + i, torch.int32, salt=q), q, tag=1 + i % 2)
                    for q in range(1, world) for i in range(k)]
            for r in reqs:
                r.wait()
        else:
            for tag in (2, 1):
                for i in range(k):
                    if 1 + i % 2 != tag:
                        continue
                    got = torch.empty(33 + i, dtype=torch.int32)
                    dist.recv(got, 0, tag=tag)
                    check(f"{name} tag {tag} #{i}", got, payload(0, 33 + i, torch.int32, salt=rank))
        return
    if name == "anysource":
        # Rank 0 receives one message from every other rank, from any source;
        # recv returns who sent it.
        if rank == 0:
            seen = []
            for _ in range(world - 1):
                got = torch.empty(77, dtype=torch.int64)
                src = dist.recv(got)
                seen.append(src)
                check(f"{name} from {src}", got, payload(src, 77, torch.int64))
            assert sorted(seen) == list(range(1, world)), f"{name}: sources {seen}"
        else:
            dist.send(payload(rank, 77, torch.int64), 0)
        return
    if name in ("recv-posted-first", "send-posted-first"):
        # A barrier orders the posts: the first side has posted before the
        # other one starts.
        n = 300007
        if rank == 0:
            got = torch.empty(n)
            if name == "recv-posted-first":
                req = dist.irecv(got, 1)
                dist.barrier()
                req.wait()
            else:
                dist.barrier()
                time.sleep(0.2)
                dist.recv(got, 1)
            check(name, got, payload(1, n, torch.float32))
        elif rank == 1:
            if name == "recv-posted-first":
                dist.barrier()
                time.sleep(0.2)
                dist.send(payload(1, n, torch.float32), 0)
            else:
                req = dist.isend(payload(1, n, torch.float32), 0)
                dist.barrier()
                req.wait()
        else:
            dist.barrier()
        return
    if name == "noncontiguous":
        src = payload(rank, 40 * 30, torch.float32).view(40, 30).t()  # non-contiguous
        dst = torch.zeros(30, 80)[:, ::2]                               # non-contiguous, other strides
        assert not src.is_contiguous() and not dst.is_contiguous()
        reqs = [dist.isend(src, right), dist.irecv(dst, left)]
        for q in reqs:
            q.wait()
        check(name, dst, payload(left, 40 * 30, torch.float32).view(40, 30).t())
        return
    if name == "batch":
        # batch_isend_irecv with receives listed before sends, two messages
        # each way with every neighbour.
        outs = [payload(rank, 5000, torch.bfloat16, salt=i) for i in range(2)]
        ins = [torch.empty(5000, dtype=torch.bfloat16) for _ in range(4)]
        ops = [dist.P2POp(dist.irecv, ins[0], left), dist.P2POp(dist.irecv, ins[1], left),
               dist.P2POp(dist.irecv, ins[2], right), dist.P2POp(dist.irecv, ins[3], right)]
        ops += [dist.P2POp(dist.isend, outs[0], right), dist.P2POp(dist.isend, outs[1], right),
                dist.P2POp(dist.isend, outs[0], left), dist.P2POp(dist.isend, outs[1], left)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        for i in range(2):
            check(f"{name} left #{i}", ins[i], payload(left, 5000, torch.bfloat16, salt=i))
            check(f"{name} right #{i}", ins[2 + i], payload(right, 5000, torch.bfloat16, salt=i))
        return
    if name == "many-small-beside-collectives":
        # 300 small messages each way between neighbours while allreduces run.
        k = 300
        outs = [payload(rank, 1 + i % 17, torch.int16, salt=i) for i in range(k)]
        ins = [torch.empty(1 + i % 17, dtype=torch.int16) for i in range(k)]
        reqs = []
        for i in range(k):
            reqs.append(dist.isend(outs[i], right, tag=i % 3))
            reqs.append(dist.irecv(ins[i], left, tag=i % 3))
            if i % 50 == 0:
                t = torch.full((1000,), float(rank))
                dist.all_reduce(t)
                check(f"{name} allreduce {i}", t, torch.full((1000,), float(sum(range(world)))))
        for r in reqs:
            r.wait()
        for i in range(k):
            check(f"{name} #{i}", ins[i], payload(left, 1 + i % 17, torch.int16, salt=i))
        return
    if name == "self-and-bad-rank":
        # Refused on the calling rank, at once; the group stays usable.
        backend = dist.group.WORLD._get_backend(torch.device("cpu"))
        t = torch.ones(3)
        errors = [_error_of(lambda: backend.send([t], rank, 0)), _error_of(lambda: backend.recv([t], rank, 0)),
                  _error_of(lambda: backend.send([t], world, 0)), _error_of(lambda: backend.recv([t], world + 3, 0))]
        assert "is this rank" in errors[0] and "is this rank" in errors[1], errors
        assert "not a rank of this group" in errors[2] and "not a rank of this group" in errors[3], errors
        # Tags 0x80000000-0x8000ffff (as int32) carry maestro's own messages (monitored_barrier).
        peer = (rank + 1) % world
        reserved = [_error_of(lambda: backend.send([t], peer, -2**31)),
                    _error_of(lambda: backend.recv([t], peer, -2**31 + 65535))]
        assert all("is reserved by maestro" in e for e in reserved), reserved
        t = torch.full((10,), float(rank))
        dist.all_reduce(t)
        check(name, t, torch.full((10,), float(sum(range(world)))))
        return
    if name == "size-mismatch":
        # Both sides fail with both sizes named; both go on afterwards.
        if rank < 2:
            t = torch.ones(100 if rank == 0 else 99)
            start = time.time()
            err = _error_of(lambda: dist.send(t, 1) if rank == 0 else dist.recv(t, 0))
            assert "400 bytes" in err and "396 bytes" in err, err  # float32: 100 and 99 elements
            assert time.time() - start < 20, "the error must not wait for the timeout"
            t = torch.full((5,), float(rank))
            reqs = [dist.isend(t, 1 - rank), dist.irecv(got := torch.empty(5), 1 - rank)]
            for r in reqs:
                r.wait()
            check(name, got, torch.full((5,), float(1 - rank)))
        dist.barrier()
        return
    raise ValueError(f"unknown case {name}")


def matrix(rank: int, world: int, names: list[str]) -> dict:
    """Every point-to-point case in one process group; an error in one
    leaves the group usable for the next."""
    return workers.matrix(rank, world, names, run=run_case, keep_going=True, timeout_s=60)


def unmatched(rank: int, world: int) -> dict:
    """A recv nobody sends to and a send nobody receives time out with a
    clear error; later traffic works; a recv from a rank that exits fails."""
    import maestro_torch  # noqa: F401

    dist.init_process_group("maestro", timeout=datetime.timedelta(seconds=3))
    out = {}
    start = time.time()
    if rank == 0:
        out["recv"] = _error_of(lambda: dist.recv(torch.empty(4), 1, tag=9))
        out["send"] = _error_of(lambda: dist.send(torch.ones(4), 1, tag=8))
    else:
        time.sleep(7)  # rank 0 waits out both timeouts before the barrier
    out["seconds"] = time.time() - start
    dist.barrier()
    t = torch.full((4,), float(rank))
    dist.all_reduce(t)
    out["after"] = t.tolist()
    if rank == 1:
        # Now rank 1 takes the message rank 0 gave up on: it is told so.
        out["late"] = _error_of(lambda: dist.recv(torch.empty(4), 0, tag=8))
    dist.barrier()
    if rank == 1:
        return out  # exits without destroying the group
    start = time.time()
    out["peer_gone"] = _error_of(lambda: dist.recv(torch.empty(4), 1, tag=1))
    out["peer_gone_seconds"] = time.time() - start
    return out


def anysource_from_a_stranger(rank: int, world: int) -> dict:
    """A recv from any source whose sender was not connected to the receiver
    at start-up (lazy connections: ring neighbours and barrier partners
    only): the sender connects on its first message, the receiver takes it."""
    import maestro_torch

    dist.init_process_group("maestro", timeout=datetime.timedelta(seconds=60))
    peers = lambda: sorted({s["peer"] for s in maestro_torch.path_stats() if s["state"] == "up"})  # noqa: E731
    before = peers()
    got = torch.zeros(1000)
    source = None
    if rank == 3:
        dist.send(torch.arange(1000, dtype=torch.float32) * 3, 0)
    elif rank == 0:
        source = dist.recv(got)  # any source
    after = peers()
    dist.barrier()
    ok = rank != 0 or bool(torch.equal(got, torch.arange(1000, dtype=torch.float32) * 3))
    dist.destroy_process_group()
    return {"before": before, "after": after, "source": source, "ok": ok}
