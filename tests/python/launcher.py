"""Launch ranks as real processes (each with its own torch and its own
maestro engine) and collect what each returns or raises. Never hangs: a rank
still running at the deadline is killed and reported. The ranks are forked
from a server that has imported torch (scripts/prefork.py) and end through the
interpreter's normal exit, as a spawned process does.

As under torchrun, the launcher (the "agent") hosts the c10d store on a port
the kernel picks, and every rank joins it as a client
(TORCHELASTIC_USE_AGENT_STORE): no free-port guess that another test's
listener can take in between, and the store outlives any rank."""
from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts"))
import prefork  # noqa: E402


def _rank_main(path: str) -> None:
    """In a rank process: run the call pickled at path, pickle its outcome to
    path + ".out"."""
    with open(path, "rb") as f:
        rank, world, port, env, target, args = pickle.load(f)
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "TORCHELASTIC_USE_AGENT_STORE": "True"})
    os.environ.update(env)
    try:
        outcome = (rank, "ok", target(rank, world, *args))
    except BaseException as e:  # noqa: BLE001 - everything goes back to the test
        outcome = (rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
    with open(path + ".tmp", "wb") as f:
        pickle.dump(outcome, f)
    os.replace(path + ".tmp", path + ".out")


def run_ranks(world: int, target, *args, env: dict | None = None, rank_env: dict | None = None,
              timeout: float = 300.0):
    """Run target(rank, world, *args) on `world` processes (env for all, rank_env
    {rank: env} for some; each starts from the test's environment at the
    call). Returns a list of (status, value) per rank: ("ok", return value),
    ("error", text) or ("killed", text) for a rank that did not finish in time."""
    import datetime

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout))
    port = store.port
    work = tempfile.mkdtemp(prefix="ranks-")
    os.chmod(work, 0o1777)  # a rank may give up root before it writes its outcome
    # torch is imported once in the server (2.5 s of CPU per rank saved); a
    # rank still ends through the interpreter's normal exit, as a spawned one
    # does (a group not destroyed says goodbye from its destructor).
    server = prefork.shared()
    procs = []
    try:
        for r in range(world):
            path = os.path.join(work, f"rank{r}")
            with open(path, "wb") as f:
                pickle.dump((r, world, port, {**(env or {}), **(rank_env or {}).get(r, {})}, target, args), f)
            code = f"import sys; sys.path[:0] = {[HERE] + sys.path!r}; import launcher; launcher._rank_main({path!r})"
            procs.append(server.popen(["-c", code]))
        results: list = [None] * world

        def collect():
            for r in range(world):
                out = os.path.join(work, f"rank{r}.out")
                if results[r] is None and os.path.exists(out):
                    with open(out, "rb") as f:
                        results[r] = pickle.load(f)[1:]

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ended = [p.poll() is not None for p in procs]
            collect()  # after the polls: a rank that ended has written its outcome
            if all(res is not None or end for res, end in zip(results, ended)):
                break
            time.sleep(0.02)
        collect()
        for r, p in enumerate(procs):
            try:
                p.wait(timeout=5 if results[r] else 0.1)
            except subprocess.TimeoutExpired:  # still running: killed below
                pass
            if p.poll() is None:
                p.kill()
                p.wait()
            if results[r] is None:
                results[r] = ("killed", f"rank {r} did not finish within {timeout} s (exit code {p.returncode})")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(work, ignore_errors=True)
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
