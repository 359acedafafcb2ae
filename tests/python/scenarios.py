"""Rank-process bodies for the behaviour tests (errors, registration, paths,
DDP). Each returns something small the test asserts on."""
from __future__ import annotations

import datetime
import io
import os
import sys
import time

import torch
import torch.distributed as dist


def _init(timeout_s: float = 60, backend: str = "maestro", **kw):
    import maestro_torch  # noqa: F401

    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s), **kw)


def _start_late(rank, late):
    """Rank `late` starts its collective 3 s after the others: by then they
    have failed it and left."""
    if rank == late:
        time.sleep(3)


def _error_of(fn) -> str:
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return ""


def mismatched_shapes(rank, world, late=-1):
    """Rank 1's tensor is one element short; `late`: see _start_late."""
    _init()
    t = torch.ones(1000 if rank != 1 else 999)
    _start_late(rank, late)
    start = time.time()
    err = _error_of(lambda: dist.all_reduce(t))
    later = _error_of(lambda: dist.all_reduce(torch.ones(10)))
    return {"error": err, "seconds": time.time() - start, "later": later}


def mismatched_collectives(rank, world):
    _init()
    t = torch.ones(100)
    if rank == 0:
        err = _error_of(lambda: dist.broadcast(t, src=0))
    else:
        err = _error_of(lambda: dist.all_reduce(t))
    return {"error": err}


def mismatched_dtype(rank, world):
    _init()
    t = torch.ones(100, dtype=torch.float32 if rank else torch.float64)
    return {"error": _error_of(lambda: dist.all_reduce(t))}


def one_rank_rejects_its_input(rank, world, late=-1):
    """The last rank's tensor is of a dtype maestro refuses; `late`: see
    _start_late."""
    _init()
    good = torch.ones(100)
    bad = torch.ones(100, dtype=torch.uint32)  # passes torch.distributed, not maestro
    _start_late(rank, late)
    start = time.time()
    err = _error_of(lambda: dist.all_reduce(bad if rank == world - 1 else good))
    return {"error": err, "seconds": time.time() - start}


def sparse_tensor(rank, world):
    _init()
    s = torch.sparse_coo_tensor(torch.tensor([[0, 2]]), torch.tensor([1.0, 2.0]), (4,))
    return {"error": _error_of(lambda: dist.all_reduce(s))}


def bad_lists(rank, world, rooted="gather"):
    """Tensor lists that do not fit the tensor every rank has: all-gather's
    outputs and reduce-scatter's inputs on every rank (each rank refuses
    its own call, so the group goes on), then the list of `rooted` (gather's
    outputs, scatter's inputs) at the root only (the root refuses; the
    others, who started, learn why from it)."""
    _init()
    two = torch.ones(2)
    errors = {
        "allgather": _error_of(lambda: dist.all_gather([torch.empty(3) for _ in range(world)], two)),
        "reduce_scatter": _error_of(lambda: dist.reduce_scatter(two, [torch.ones(3) for _ in range(world)])),
    }
    t = torch.full((2,), float(rank))
    errors["later"] = _error_of(lambda: dist.all_reduce(t))
    errors["result"] = t.tolist()
    lst = [torch.empty(3) for _ in range(world)] if rank == 0 else None
    if rooted == "gather":
        errors["rooted"] = _error_of(lambda: dist.gather(two, lst, dst=0))
    else:
        errors["rooted"] = _error_of(lambda: dist.scatter(two, lst, src=0))
    return errors


def unsupported_op(rank, world):
    _init()
    err = _error_of(lambda: dist.all_reduce(torch.ones(4), op=dist.ReduceOp.BAND))
    # Every rank refused it before anything moved: the group goes on.
    t = torch.full((4,), float(rank))
    later = _error_of(lambda: dist.all_reduce(t))
    premul = dist._make_nccl_premul_sum(2.0)  # defined for floating point only
    err2 = _error_of(lambda: dist.reduce_scatter_tensor(torch.empty(2, dtype=torch.int8),
                                                        torch.ones(2 * world, dtype=torch.int8), op=premul))
    b = torch.full((3,), float(rank))
    later2 = _error_of(lambda: dist.broadcast(b, src=world - 1))
    return {"error": err, "later": later, "result": t.tolist(), "error2": err2, "later2": later2,
            "broadcast": b.tolist()}


def skipped_collective(rank, world, skipper=1):
    _init(timeout_s=3)
    dist.barrier()
    start = time.time()
    if rank == skipper:
        time.sleep(10)  # alive, but never calls the collective
        return {"error": "", "seconds": 0}
    err = _error_of(lambda: dist.all_reduce(torch.ones(10)))
    return {"error": err, "seconds": time.time() - start}


def per_call_timeout(rank, world):
    """The group's timeout is 60 s; one call sets its own (opts.timeout, 2 s)
    and rank 1 never joins it: rank 0's call fails after that call's 2 s."""
    import datetime
    _init(timeout_s=60)
    if rank == 1:
        time.sleep(10)  # alive, but never calls the collective
        return {"error": "", "seconds": 0}
    opts = dist.AllreduceOptions()
    opts.timeout = datetime.timedelta(seconds=2)
    pg = dist.distributed_c10d._get_default_group()
    start = time.time()
    err = _error_of(lambda: pg.allreduce([torch.ones(10)], opts).wait())
    return {"error": err, "seconds": time.time() - start}


def frozen_peer(rank, world, thaw_after=None):
    """Rank 1 is frozen (SIGSTOP) while allreduces stream. Left frozen, rank
    0 must get an error naming it long before the group's timeout (60 s) and
    leave the group at once. Thawed after `thaw_after` s (shorter than the
    peer timeout), the rounds go on and every result is exact."""
    import signal
    import threading

    _init(timeout_s=60)
    pids = torch.tensor([os.getpid() if rank == 1 else 0], dtype=torch.int64)
    dist.all_reduce(pids)
    t = torch.empty(16 * 1024 * 1024)  # 64 MiB a round, rounds back to back
    wrong = []
    stopped = []  # rank 0's: when it froze rank 1, and when it thawed it
    thawed = []

    def rounds():
        # Left frozen: rounds until the error. Thawed: rounds until three
        # have ended after the thaw, rank 0 deciding (it sends the freeze
        # and the thaw) and telling rank 1 with each round's result, so the
        # count follows the host's speed: a fixed 40 rounds of 64 MiB took
        # 2-8 s on an idle host and over 120 s under the sanitizers beside
        # the other suites.
        after_thaw = 0
        for i in range(2000):
            t.fill_(rank + i)
            dist.all_reduce(t)
            if not thaw_after:
                continue
            if not bool((t == 2 * i + 1).all()):
                wrong.append(i)
            if rank == 0 and thawed:
                after_thaw += 1
            go = torch.tensor([1 if rank == 0 and after_thaw < 3 else 0], dtype=torch.int32)
            dist.all_reduce(go, op=dist.ReduceOp.MAX)
            if not int(go[0]):
                return

    if rank == 1:
        err = _error_of(rounds)
        return {"error": err, "wrong": wrong}

    def freeze():
        os.kill(int(pids[0]), signal.SIGSTOP)
        stopped.append(time.time())
        if thaw_after:
            time.sleep(thaw_after)
            os.kill(int(pids[0]), signal.SIGCONT)
            thawed.append(time.time())

    timer = threading.Thread(target=lambda: (time.sleep(0.5), freeze()))
    timer.start()
    err = _error_of(rounds)
    failed_after = time.time() - stopped[0] if stopped else -1.0
    timer.join()
    start = time.time()
    dist.destroy_process_group()
    destroyed_after = time.time() - start
    os.kill(int(pids[0]), signal.SIGCONT)
    return {"error": err, "failed_after": failed_after, "destroyed_after": destroyed_after, "wrong": wrong,
            "frozen_for": thawed[0] - stopped[0] if thawed else None}


def peer_frozen_between_operations(rank, world, op, stops_after=1.5):
    """Rank 1 stops itself (SIGSTOP) between two operations, `stops_after`
    s after rank 0 entered the second one (an allreduce, or a recv from rank
    1): long enough for what rank 0 sent to arrive and be confirmed (a
    probe's answer), so rank 0 has nothing in flight to rank 1 and only
    waits for its word (its descriptor, its READY). It must
    still get the peer-timeout error naming rank 1 long before the group's
    timeout (60 s); it wakes rank 1 once it has left the group."""
    import signal

    _init(timeout_s=60)
    pids = torch.tensor([os.getpid() if rank == 1 else 0], dtype=torch.int64)
    dist.all_reduce(pids)
    t = torch.ones(1024)
    second = (lambda: dist.all_reduce(t)) if op == "allreduce" else (lambda: dist.send(t, 0) if rank else dist.recv(t, 1))
    if rank == 1:
        time.sleep(stops_after)  # alive meanwhile: its event loop answers probes
        os.kill(os.getpid(), signal.SIGSTOP)
        return {"error": _error_of(second)}
    start = time.time()
    err = _error_of(second)
    failed_after = time.time() - start
    dist.destroy_process_group()
    os.kill(int(pids[0]), signal.SIGCONT)
    return {"error": err, "failed_after": failed_after}


def stop_while_waiting(rank, world, how):
    """Rank 1 never joins rank 0's allreduce (group timeout 60 s); rank 0
    stops the group while it waits: abort() fails it at once, shutdown()
    (destroy_process_group) after its grace period, not after the timeout."""
    import maestro_torch

    _init(timeout_s=60)
    dist.barrier()
    if rank == 1:
        time.sleep(20)
        return {}
    work = dist.all_reduce(torch.ones(1000), async_op=True)
    time.sleep(0.5)
    start = time.time()
    if how == "abort":
        maestro_torch.backend_of().abort()
    else:
        dist.destroy_process_group()
    stopped_after = time.time() - start
    return {"stopped_after": stopped_after, "error": _error_of(work.wait)}


def future_results(rank, world, case):
    """Work.get_future_result(): an int future of the outcome (WorkResult),
    never an error. A call that succeeds, then one that fails: "timeout",
    the last rank never joins it and the others give it its own 2 s
    timeout; "peer_exits", the last rank exits first (as after a crash)."""
    import datetime

    from torch._C._distributed_c10d import WorkResult

    _init(timeout_s=60)
    pg = dist.distributed_c10d._get_default_group()
    fired = []  # abort hooks: run once when the group is given up, before the failed Work completes
    pg.register_abort_hook(7, lambda: fired.append("hook 7"))
    pg.register_abort_hook(8, lambda: fired.append("hook 8, unregistered"))
    pg.unregister_abort_hook(8)
    t = torch.ones(1000)
    first = pg.allreduce([t])
    fut = first.get_future_result()
    out = {"success": int(fut.wait()), "value_ok": bool(torch.all(t == world)),
           "codes": {"SUCCESS": int(WorkResult.SUCCESS), "TIMEOUT": int(WorkResult.TIMEOUT),
                     "COMM_ERROR": int(WorkResult.COMM_ERROR)}}
    start = time.monotonic()
    out["duration_ms"] = first._get_duration()
    out["hooks_after_success"] = list(fired)
    import maestro_torch

    out["record"] = [(op["seq"], op["op"], op["bytes"], op["state"]) for op in maestro_torch.dump()["ops"]]
    if rank == world - 1:
        if case == "peer_exits":
            dist.barrier()  # the others' first call has completed everywhere
            os._exit(0)
        time.sleep(8)  # alive, but never calls the next collective
        return out
    opts = dist.AllreduceOptions()
    opts.timeout = datetime.timedelta(seconds=2 if case == "timeout" else 30)
    if case == "peer_exits":
        dist.barrier()
    work = pg.allreduce([torch.ones(10)], opts)
    out["failed"] = int(work.get_future_result().wait())  # the result future itself never raises
    out["hooks_when_failed"] = list(fired)
    out["wait_error"] = _error_of(work.wait)
    out["failed_duration_ms"] = work._get_duration()
    out["since_start_ms"] = (time.monotonic() - start) * 1e3
    return out


def shrink_after_a_rank_exits(rank, world, flags):
    """The last rank exits (as after a crash); the others' next collective
    fails, they shrink the default group without it and go on training on
    the same paths."""
    from torch.distributed import distributed_c10d as c10d

    import maestro_torch

    _init(timeout_s=60)
    dist.all_reduce(torch.ones(1000))
    if rank == world - 1:
        dist.barrier()
        os._exit(0)
    dist.barrier()
    failed = _error_of(lambda: dist.all_reduce(torch.ones(10)))
    start = time.monotonic()
    dist.shrink_group([world - 1], shrink_flags=c10d.SHRINK_ABORT if flags == "abort" else c10d.SHRINK_DEFAULT)
    seconds = time.monotonic() - start
    out = {"failed": failed, "seconds": seconds, "rank": dist.get_rank(), "size": dist.get_world_size(),
           "backend": dist.get_backend()}
    base = torch.arange(100_000, dtype=torch.float32)
    for step in range(3):
        x = base * (dist.get_rank() + 1) + step
        dist.all_reduce(x)
        expected = base * sum(range(1, world)) + step * (world - 1)
        out.setdefault("exact", []).append(bool(torch.equal(x, expected)))
    out["peers"] = sorted({s["peer"] for s in maestro_torch.path_stats()})
    out["paths_up"] = all(s["state"] == "up" for s in maestro_torch.path_stats())
    out["states"] = [(s["state"], s["last_error"]) for s in maestro_torch.path_stats()]
    dist.barrier()  # read before either rank destroys the group (which closes the paths)
    dist.destroy_process_group()
    return out


def metrics_lines(rank, world):
    """MAESTRO_METRICS (set by the test with {rank} and {group}, a short
    interval): allreduces on the default group and on a subgroup, then
    destroy; returns what path_stats() said last."""
    import maestro_torch

    _init()
    sub = dist.new_group([0, 1])
    for _ in range(25):  # 2.5 s: several monitor ticks (0.5 s apart)
        dist.all_reduce(torch.ones(1 << 18))
        dist.all_reduce(torch.ones(1 << 16), group=sub)
        time.sleep(0.1)
    last = {s["path"]: s["bytes_sent"] for s in maestro_torch.path_stats() if s["peer"] == 1 - rank}
    dist.destroy_process_group()
    return {"bytes_sent": last}


def set_timeout_on_a_subgroup(rank, world):
    """dist.set_timeout on a subgroup (on the default group's paths) bounds
    that group's next call; the default group keeps its own timeout and goes
    on."""
    _init(timeout_s=60)
    sub = dist.new_group([0, 1])
    out = {}
    if rank < 2:
        dist.set_timeout(datetime.timedelta(seconds=2), group=sub)
        dist.all_reduce(torch.ones(10), group=sub)
    if rank == 0:
        start = time.monotonic()
        out["error"] = _error_of(lambda: dist.all_reduce(torch.ones(10), group=sub))  # rank 1 never calls it
        out["seconds"] = time.monotonic() - start
    x = torch.ones(10)
    dist.all_reduce(x)  # the default group: rank 1 waits here, well within its 60 s
    out["world_ok"] = bool(torch.all(x == world))
    return out


def abort_hooks(rank, world):
    """abort() runs the abort hooks, once, on the caller's thread; one that
    raises does not stop the others."""
    import threading

    _init()
    pg = dist.distributed_c10d._get_default_group()
    calls = []

    def bad():
        raise RuntimeError("a hook that fails")

    pg.register_abort_hook(1, bad)
    pg.register_abort_hook(2, lambda: calls.append(threading.current_thread() is threading.main_thread()))
    dist.all_reduce(torch.ones(10))
    work = pg.allreduce([torch.ones(10)])
    work.wait()
    pending = _error_of(lambda: work._get_duration())  # completed: a number, not an error
    before = list(calls)
    pg.abort()
    pg.abort()
    return {"before": before, "after": calls, "duration_error": pending}


def peer_exits(rank, world):
    _init()
    if rank == 1:
        os._exit(0)  # gone without a goodbye, as after a crash
    return {"error": _error_of(lambda: dist.all_reduce(torch.ones(10)))}


def bad_knob(rank, world):
    import maestro_torch  # noqa: F401

    return {"error": _error_of(lambda: dist.init_process_group("maestro", timeout=datetime.timedelta(seconds=30)))}


def listening_ports(rank, world):
    """Where this rank's maestro listeners are, [ip, port] each (a group on
    MAESTRO_PORT_RANGE), and whether an allreduce over its paths is right."""
    import workers

    _init()
    t = torch.full((100000,), float(rank + 1))
    dist.all_reduce(t)
    listening = [[ip, port] for is_listening, ip, port in workers.tcp_sockets_of_this_process() if is_listening]
    dist.barrier()
    dist.destroy_process_group()
    return {"ok": bool((t == world * (world + 1) / 2).all()), "listening": sorted(listening)}


def verbs_without_device(rank, world):
    import maestro_torch  # noqa: F401

    err = _error_of(lambda: dist.init_process_group("maestro", timeout=datetime.timedelta(seconds=60)))
    return {"error": err}


def entry_point_without_import(rank, world):
    # No `import maestro_torch`: torch finds the backend through the
    # torch.distributed.backends entry point.
    assert "maestro_torch" not in sys.modules
    dist.init_process_group("maestro", timeout=datetime.timedelta(seconds=60))
    t = torch.full((10,), float(rank))
    dist.all_reduce(t)
    ok = bool(torch.all(t == sum(range(world))))
    dist.destroy_process_group()
    return {"ok": ok}


def device_string(rank, world):
    _init(backend="cpu:maestro")
    t = torch.ones(10)
    dist.all_reduce(t)
    import maestro_torch

    return {"ok": bool(torch.all(t == world)), "transport": maestro_torch.backend_of().transport}


def path_share(rank, world, single_copy="auto"):
    import maestro_torch

    # reno: built into every kernel, and not this machine's default (bbr).
    _init(pg_options=maestro_torch.Options(paths=4, policy="round_robin", tcp_congestion="reno",
                                           tcp_single_copy=single_copy))
    t = torch.ones(16 * 1024 * 1024)  # 64 MiB of float32
    dist.all_reduce(t)
    ok = bool(torch.all(t == world))
    stats = maestro_torch.path_stats()
    dist.barrier()  # nobody leaves (closing paths) before everyone has its snapshot
    dist.destroy_process_group()
    return {"ok": ok, "stats": stats}


def after_shutdown(rank, world):
    """What a user holding the backend gets once the group is gone, and two
    threads stopping it at once."""
    import threading

    import maestro_torch

    _init()
    backend = maestro_torch.backend_of()
    dist.barrier()
    errors = []

    def stop(fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=stop, args=(f,)) for f in (backend.shutdown, backend.abort, backend.shutdown)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return {"alive": [t.is_alive() for t in threads], "stop_errors": errors,
            "path_stats": _error_of(backend.path_stats), "describe": _error_of(backend.describe),
            "paths": _error_of(lambda: backend.paths),
            "cache": _error_of(backend.registration_cache_stats),
            "allreduce": _error_of(lambda: dist.all_reduce(torch.ones(4)))}


def temporaries_are_not_registered(rank, world):
    """Operations that must copy anyway (non-contiguous tensors, lists packed
    into one) stage in a reused buffer: the registration cache sees only the
    caller's own tensors, once each."""
    import maestro_torch

    _init()
    backend = maestro_torch.backend_of()
    dense = torch.ones(1000)
    strided = torch.ones(100, 20)[:, ::2]  # not contiguous
    grads = [torch.ones(300), torch.ones(7, 3), torch.ones(1)]
    outs = [torch.empty(1000) for _ in range(world)]
    before = backend.registration_cache_stats()
    ok = True
    for _ in range(20):
        for t in [dense, strided] + grads:
            t.fill_(1.0)
        dist.all_reduce(dense)
        dist.all_reduce(strided)
        dist.all_reduce_coalesced(grads)
        dist.all_gather(outs, dense)
        ok = ok and bool(torch.all(dense == world)) and bool(torch.all(strided == world))
        ok = ok and all(bool(torch.all(g == world)) for g in grads) and all(bool(torch.all(o == world)) for o in outs)
    after = backend.registration_cache_stats()
    return {"ok": ok, "misses": after["misses"] - before["misses"], "entries": after["entries"]}


def registrations_bounded_in_bytes(rank, world):
    """MAESTRO_REG_CACHE_BYTES through Options: eight 256 KiB tensors, each
    reduced once, under a 1 MiB bound; then the first again."""
    import maestro_torch

    _init(pg_options=maestro_torch.Options(reg_cache_bytes="1M"))
    backend = maestro_torch.backend_of()
    ts = [torch.ones(64 * 1024) for _ in range(8)]
    sizes = []
    for t in ts:
        dist.all_reduce(t)
        sizes.append(backend.registration_cache_stats()["bytes"])
    dist.all_reduce(ts[0])  # evicted: registered again, and exact
    stats = backend.registration_cache_stats()
    ok = bool(torch.all(ts[0] == world * world)) and all(bool(torch.all(t == world)) for t in ts[1:])
    return {"ok": ok, "bytes_after_each": sizes, "stats": stats}


def registrations_of_freed_tensors_go(rank, world):
    """Tensors reduced once, then freed, with no operation after: their
    registrations are dropped while the group is idle."""
    import maestro_torch

    _init()
    backend = maestro_torch.backend_of()
    ts = [torch.ones(64 * 1024) for _ in range(4)]
    for t in ts:
        dist.all_reduce(t)
    ok = all(bool(torch.all(t == world)) for t in ts)
    held = backend.registration_cache_stats()
    del ts, t
    until = time.monotonic() + 10
    while backend.registration_cache_stats()["entries"] > 0 and time.monotonic() < until:
        time.sleep(0.1)
    seconds = round(10 - (until - time.monotonic()), 2)  # from the tensors freed to no registration left
    after = backend.registration_cache_stats()
    dist.barrier()
    return {"ok": ok, "held": held, "after": after, "seconds": seconds}


def options_and_subgroups(rank, world):
    import maestro_torch

    _init(pg_options=maestro_torch.Options(chunk_size="64K", paths=2))
    world_paths = maestro_torch.backend_of().paths
    sub = dist.new_group([0, 2], backend="maestro", pg_options=maestro_torch.Options(paths=3, chunk_size="32K"))
    result = {"world_paths": world_paths}
    if rank in (0, 2):
        t = torch.full((100000,), float(rank))
        dist.all_reduce(t, group=sub)
        result["sub_ok"] = bool(torch.all(t == 2.0))
        result["sub_paths"] = maestro_torch.backend_of(sub).paths
        result["sub_stats_peers"] = sorted({s["global_peer"] for s in maestro_torch.path_stats(sub)})
    t = torch.ones(10)
    dist.all_reduce(t)
    result["world_ok"] = bool(torch.all(t == world))
    dist.destroy_process_group()
    return result


def split_group(rank, world):
    """ProcessGroup.split_group (what dist.split_group and DeviceMesh call on a
    group bound to a device): [0, 1] and [3, 2] (in that order: rank 3 is the
    second group's rank 0), with the parent's knobs."""
    import datetime

    import maestro_torch

    _init(pg_options=maestro_torch.Options(chunk_size="64K", paths=2))
    parent = dist.distributed_c10d._get_default_group()
    mine = [0, 1] if rank < 2 else [3, 2]
    sub = parent.split_group(mine, timeout=datetime.timedelta(seconds=60))
    t = torch.full((100000,), float(rank))
    sub.allreduce([t]).wait()
    b = torch.full((5,), float(rank))
    sub.broadcast([b], dist.BroadcastOptions()).wait()  # from the new group's rank 0
    out = {"rank": sub.rank(), "size": sub.size(), "paths": maestro_torch.backend_of(sub).paths,
           "splits": maestro_torch.backend_of(parent).supports_splitting,
           "sum": t.unique().tolist(), "broadcast": b.unique().tolist(),
           "not_listed": parent.split_group([r for r in mine if r != rank]) is None}
    out["bad"] = _error_of(lambda: parent.split_group([0, world + 3]))
    w = torch.ones(10)
    dist.all_reduce(w)
    out["world_ok"] = bool(torch.all(w == world))
    dist.destroy_process_group()
    return out


def _sockets() -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return n


def shared_paths(rank, world):
    """Subgroups as a 2 x 2 device mesh makes them (rows and columns, by
    new_group and by init_device_mesh), each running beside the default group
    at once: results, channels, and the sockets they add (none)."""
    import threading

    from torch.distributed.device_mesh import init_device_mesh

    import maestro_torch

    _init()
    dist.all_reduce(torch.ones(10))
    sockets = _sockets()
    threads = threading.active_count()
    rows = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    cols = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    row, col = rows[rank // 2], cols[rank % 2]
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    groups = {"world": None, "row": row, "col": col, "dp": mesh.get_group("dp"), "tp": mesh.get_group("tp")}
    out = {"channels": {k: maestro_torch.backend_of(g).channel for k, g in groups.items()}, "sums": {}}
    # Every group at once, from threads of its own, several rounds.
    errors = []

    def run(name, group):
        try:
            for i in range(3):
                t = torch.full((200003,), float(rank + 1 + i))
                dist.all_reduce(t, group=group)
                members = dist.get_process_group_ranks(group) if group is not None else range(world)
                want = sum(m + 1 + i for m in members)
                if not torch.all(t == want):
                    errors.append(f"{name} round {i}: {t[:3].tolist()} != {want}")
            out["sums"][name] = True
        except Exception as e:  # noqa: BLE001
            errors.append(f"{name}: {type(e).__name__}: {e}")

    runners = [threading.Thread(target=run, args=(k, g)) for k, g in groups.items()]
    for t in runners:
        t.start()
    for t in runners:
        t.join()
    out["errors"] = errors
    out["added_sockets"] = _sockets() - sockets
    stats = maestro_torch.path_stats(row)
    out["row_stats"] = sorted({(s["peer"], s["global_peer"], s["state"]) for s in stats})
    out["describe"] = maestro_torch.backend_of(col).describe()
    dist.barrier()
    dist.destroy_process_group()
    return out


def single_copy_between_users(rank, world):
    """Each rank runs as an unprivileged user of its own, so neither may read
    the other's memory (as under Yama's ptrace_scope=1 without root): the
    payloads stay on the socket, and the INFO log says why, once."""
    import maestro_torch

    os.setgroups([])
    os.setgid(60000 + rank)
    os.setuid(60000 + rank)
    r, w = os.pipe()
    saved = os.dup(2)
    os.dup2(w, 2)
    try:
        _init()
        t = torch.arange(1 << 20, dtype=torch.float32) * (rank + 1)
        dist.all_reduce(t)
        ok = bool(torch.equal(t, torch.arange(1 << 20, dtype=torch.float32) * sum(range(1, world + 1))))
        stats = maestro_torch.path_stats()
        dist.barrier()
        dist.destroy_process_group()
    finally:
        os.dup2(saved, 2)
        os.close(w)
    with os.fdopen(r) as f:
        log = f.read()
    return {"log": log, "ok": ok, "by_reference": [s["path_counters"].get("single_copy_bytes_sent", 0) for s in stats],
            "bytes_sent": [s["bytes_sent"] for s in stats]}


def info_logging(rank, world):
    # The C++ core writes to fd 2: capture it through a pipe.
    r, w = os.pipe()
    saved = os.dup(2)
    os.dup2(w, 2)
    try:
        _init()
        dist.all_reduce(torch.ones(1000))
        dist.destroy_process_group()
    finally:
        os.dup2(saved, 2)
        os.close(w)
    with os.fdopen(r) as f:
        return {"log": f.read()}


def algorithms(rank, world):
    """Allreduces on both sides of the tuner's limits, in one group with the
    tuner's choices and in groups with each algorithm forced (Options), every
    dtype's sum exact; what describe() says of each."""
    import maestro_torch

    _init()
    limit = maestro_torch._C._constants()["recursive_doubling_bytes_one_host"]
    groups = {"auto": dist.group.WORLD}
    for algo in ("ring", "recursive_doubling"):
        groups[algo] = dist.new_group(backend="maestro", pg_options=maestro_torch.Options(algo=algo))
    wrong = []
    for name, g in groups.items():
        for count in (1, 1000, limit // 4, limit // 4 + 1, 300000):
            for dtype in (torch.float32, torch.int64, torch.bfloat16):
                t = (torch.arange(count) % 7 + rank).to(dtype)
                dist.all_reduce(t, group=g)
                want = (torch.arange(count) % 7 * world + world * (world - 1) // 2).to(dtype)
                if not torch.equal(t, want):
                    wrong.append(f"{name}: {count} x {dtype}")
    out = {"wrong": wrong, "describe": {k: maestro_torch.backend_of(g).describe() for k, g in groups.items()}}
    dist.destroy_process_group()
    return out


def ddp_training(rank, world, backend):
    """A few steps of DDP on a small model; returns the final parameters."""
    torch.manual_seed(0)
    _init(backend=backend)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    if rank == 1:  # different initial weights: DDP must broadcast rank 0's
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.01)  # several buckets
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(5):
        x = torch.randn(16, 32, generator=g)
        y = torch.randn(16, 4, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    params = [p.detach().tolist() for p in model.parameters()]  # plain lists cross the process boundary
    dist.destroy_process_group()
    return params


def scale(rank, world, cases):
    """Every collective on one group of many ranks, checked exactly; then the
    threads and descriptors this rank holds."""
    import workers

    _init(timeout_s=240)
    failures = {}
    for name in cases:
        try:
            workers.run_case(name, rank, world)
        except Exception as e:  # noqa: BLE001
            failures[name] = f"{type(e).__name__}: {e}"
    threads = int(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("Threads:")))
    names = sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
    fds = len(os.listdir("/proc/self/fd"))
    dist.destroy_process_group()
    return {"failures": failures, "threads": threads, "thread_names": names, "fds": fds}


def threads_on_the_default_group(rank, world, backend):
    """The threads a rank runs (names included) once its default group is up
    and has run one allreduce, and again after one send/recv; the set-up's
    connect pool is waited out (it leaves once the group is up)."""
    def names():
        return sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))

    def settled():
        deadline = time.time() + 10
        while any(n.startswith("maestro-connect") for n in names()) and time.time() < deadline:
            time.sleep(0.05)
        return names()

    _init(backend=backend)
    t = torch.ones(1000)
    dist.all_reduce(t)
    assert t[0].item() == world, t[0].item()
    after_allreduce = settled()
    if rank == 0:
        dist.send(torch.ones(10), 1)
    elif rank == 1:
        dist.recv(torch.empty(10), 0)
    dist.barrier()
    after_p2p = settled()
    dist.destroy_process_group()
    return {"allreduce": after_allreduce, "p2p": after_p2p}


def monitored_barrier(rank, world):
    """dist.monitored_barrier: passes when everyone comes; ranks 2 and up
    come late twice (once with wait_all_ranks); the group goes on."""
    _init(timeout_s=60)
    out = {"pass": _error_of(lambda: [dist.monitored_barrier(timeout=datetime.timedelta(seconds=20))
                                      for _ in range(3)])}
    for key, wait_all in (("first", False), ("all", True)):
        if rank >= 2:
            time.sleep(4)
        start = time.time()
        out[key] = _error_of(lambda: dist.monitored_barrier(timeout=datetime.timedelta(seconds=2),
                                                            wait_all_ranks=wait_all))
        out[key + "_seconds"] = time.time() - start
        dist.barrier()
    t = torch.full((3,), float(rank))
    dist.all_reduce(t)
    out["after"] = t.tolist()
    return out
