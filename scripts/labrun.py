"""Run maestro ranks across a netlab leaf-spine lab: one rank per host
namespace, rendezvous on h0's primary address, each rank's vNICs = its host's
aliases (MAESTRO_VNICS). Used by the lab tests and the benchmarks.

    sys.path.insert(0, "scripts"); import netlab, labrun
    with netlab.Lab(name="x", core=200) as lab:
        results = labrun.run(lab, ["benchmarks/allreduce_bench.py", "--size", "64M"])
"""
from __future__ import annotations

import os
import random
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class RankResult:
    def __init__(self, rank, returncode, stdout, stderr):
        self.rank, self.returncode, self.stdout, self.stderr = rank, returncode, stdout, stderr

    def __repr__(self):
        return f"RankResult(rank={self.rank}, rc={self.returncode})"


def rank_env(lab, host: int, world: int, port: int, extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.update({
        "MASTER_ADDR": lab.host_addr(0), "MASTER_PORT": str(port), "RANK": str(host), "WORLD_SIZE": str(world),
        "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "MAESTRO_VNICS": ",".join(lab.aliases(host)),
        "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
        "GLOO_SOCKET_IFNAME": "eth0",  # gloo would pick loopback inside a namespace
    })
    env.update(extra or {})
    return env


def start(lab, script_argv: list[str], *, world: int | None = None, env: dict | None = None,
          rank_env_extra: dict | None = None, python: str | None = None) -> list[subprocess.Popen]:
    """Start `python script_argv...` as rank i on host i for i < world."""
    world = world or lab.cfg.hosts
    port = random.randint(20000, 40000)
    python = python or sys.executable
    procs = []
    for host in range(world):
        e = rank_env(lab, host, world, port, {**(env or {}), **(rank_env_extra or {}).get(host, {})})
        procs.append(lab.popen(host, [python] + script_argv, env=e, cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True))
    return procs


def wait_for_line(proc: subprocess.Popen, prefix: str, timeout: float) -> str:
    """Read proc's stdout until a line starting with prefix (returns it)."""
    import select
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith(prefix):
                return line
    raise TimeoutError(f"no line starting with {prefix!r} within {timeout} s")


def wait(procs: list[subprocess.Popen], timeout: float) -> list[RankResult]:
    """Wait for every rank; kill them all at the timeout."""
    deadline = time.monotonic() + timeout
    results = []
    for host, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, err = p.communicate()
            err += f"\nlabrun: killed after {timeout} s"
        results.append(RankResult(host, p.returncode, out, err))
    return results


def run(lab, script_argv: list[str], *, timeout: float = 600, **kw) -> list[RankResult]:
    """Run `python script_argv...` as rank i on host i for i < world; returns
    every rank's exit code and output. Kills everything at the timeout."""
    return wait(start(lab, script_argv, **kw), timeout)
