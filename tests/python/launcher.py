"""Launch ranks as real processes (spawned, each with its own torch and its
own maestro engine) and collect what each returns or raises. Never hangs: a
rank still running at the deadline is killed and reported.

As under torchrun, the launcher (the "agent") hosts the c10d store on a port
the kernel picks, and every rank joins it as a client
(TORCHELASTIC_USE_AGENT_STORE): no free-port guess that another test's
listener can take in between, and the store outlives any rank."""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import traceback


def _child(rank, world, port, env, target, args, out):
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "TORCHELASTIC_USE_AGENT_STORE": "True"})
    os.environ.update(env)
    try:
        out.put((rank, "ok", target(rank, world, *args)))
    except BaseException as e:  # noqa: BLE001 - everything goes back to the test
        out.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def run_ranks(world: int, target, *args, env: dict | None = None, rank_env: dict | None = None,
              timeout: float = 300.0):
    """Run target(rank, world, *args) on `world` processes (env for all, rank_env
    {rank: env} for some). Returns a list of
    (status, value) per rank: ("ok", return value), ("error", text) or
    ("killed", text) for a rank that did not finish in time."""
    import datetime

    import torch.distributed as dist

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout))
    port = store.port
    procs = [ctx.Process(target=_child, args=(r, world, port, {**(env or {}), **(rank_env or {}).get(r, {})},
                                              target, args, out), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    results: list = [None] * world
    import time
    deadline = time.monotonic() + timeout
    pending = world
    while pending and time.monotonic() < deadline:
        try:
            rank, status, value = out.get(timeout=0.5)
        except queue.Empty:
            if all(not p.is_alive() for p in procs) and out.empty():
                break
            continue
        results[rank] = (status, value)
        pending -= 1
    for r, p in enumerate(procs):
        p.join(timeout=5 if results[r] else 0.1)
        if p.is_alive():
            p.kill()
            p.join()
        if results[r] is None:
            results[r] = ("killed", f"rank {r} did not finish within {timeout} s (exit code {p.exitcode})")
    del store
    return results


def case_errors(world_results, case: str) -> list[str]:
    """The failures of one case in the {case: error or None} dicts that
    every rank of a case matrix returned (run_ranks results)."""
    world, results = world_results
    errors = []
    for rank, (status, value) in enumerate(results):
        if status != "ok":
            errors.append(f"rank {rank} {status}: {value}")
        elif value.get(case):
            errors.append(f"rank {rank}: {value[case]}")
    return errors


def matrix_tests(target, cases: list[str], worlds: list[int], env: dict, timeout: float):
    """A case matrix as pytest tests. Returns (fixture, test_case,
    test_every_rank_finished) to bind at module level: the module-scoped
    fixture runs target(rank, world, cases) once per world size (each rank
    returns {case: error or None}), test_case(case) is one test per case,
    and test_every_rank_finished fails if a rank died or left a case out."""
    import pytest

    @pytest.fixture(scope="module", params=worlds, ids=lambda w: f"{w}ranks")
    def world_results(request):
        world = request.param
        return world, run_ranks(world, target, cases, env=env, timeout=timeout)

    @pytest.mark.parametrize("case", cases)
    def test_case(world_results, case):
        errors = case_errors(world_results, case)
        assert not errors, "\n".join(errors)

    def test_every_rank_finished(world_results):
        world, results = world_results
        for rank, (status, value) in enumerate(results):
            assert status == "ok", f"rank {rank}: {value}"
            assert set(cases) <= set(value), f"rank {rank}: cases missing from the report"

    return world_results, test_case, test_every_rank_finished
