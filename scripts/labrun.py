"""Run maestro ranks across a netlab leaf-spine lab: one rank per host
namespace, rendezvous on h0's alias 0, each rank's vNICs = its host's aliases
(MAESTRO_VNICS). Used by the lab tests and the benchmarks as a module:

    sys.path.insert(0, "scripts"); import netlab, labrun
    with netlab.Lab(name="x", core=200) as lab:
        results = labrun.run(lab, ["benchmarks/allreduce_bench.py", "--size", "64M"])

and from the command line with torchrun, one torchrun (one node) per host
namespace, on a lab it builds and tears down (or an existing one, --prefix):

    python scripts/labrun.py [--mode pinned|ecmp] [--core 200] [--access 1000] \
        [--hosts 4] [--spines 4] [--prefix P] -- SCRIPT [ARGS...]
"""
from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import prefork  # noqa: E402


class RankResult:
    def __init__(self, rank, returncode, stdout, stderr):
        self.rank, self.returncode, self.stdout, self.stderr = rank, returncode, stdout, stderr

    def __repr__(self):
        return f"RankResult(rank={self.rank}, rc={self.returncode})"


def rank_env(lab, rank: int, host: int, master_host: int, world: int, port: int, extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.update({
        # The rendezvous on the master's alias 0: in pinned mode it crosses
        # spine 0 only, which the fault experiments keep up (a primary
        # address is ECMP-hashed and may land on a cut link).
        "MASTER_ADDR": lab.alias_addr(master_host, 0), "MASTER_PORT": str(port), "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "MAESTRO_VNICS": ",".join(lab.aliases(host)),
        "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
        "GLOO_SOCKET_IFNAME": "eth0",  # gloo would pick loopback inside a namespace
    })
    env.update(extra or {})
    return env


class RankSet:
    """Rank processes whose stdout and stderr are drained continuously by
    reader threads (a rank blocked on a full pipe would stall the others in
    their next collective), with line callbacks and waits on lines."""

    def __init__(self, procs: list[subprocess.Popen], on_line=None):
        self.procs = procs
        self.out = [[] for _ in procs]
        self.err = [[] for _ in procs]
        self._cv = threading.Condition()
        self._on_line = on_line
        self._threads = []
        for rank, p in enumerate(procs):
            for stream, sink in ((p.stdout, self.out[rank]), (p.stderr, self.err[rank])):
                t = threading.Thread(target=self._drain, args=(rank, stream, sink, stream is p.stdout), daemon=True)
                t.start()
                self._threads.append(t)

    def _drain(self, rank, stream, sink, is_stdout):
        for line in stream:
            with self._cv:
                sink.append(line)
                self._cv.notify_all()
            if self._on_line:
                self._on_line(rank, "stdout" if is_stdout else "stderr", line)

    def wait_for_line(self, rank: int, prefix: str, timeout: float) -> str:
        """Block until rank's stdout has a line starting with prefix."""
        with self._cv:
            def found():
                return next((l for l in self.out[rank] if l.startswith(prefix)), None)
            if not self._cv.wait_for(lambda: found() is not None or self.procs[rank].poll() is not None, timeout):
                raise TimeoutError(f"rank {rank} printed no line starting with {prefix!r} within {timeout} s")
            line = found()
            if line is None:
                raise RuntimeError(f"rank {rank} exited ({self.procs[rank].returncode}) before {prefix!r}")
            return line

    def wait(self, timeout: float, fail_fast: float | None = None) -> list[RankResult]:
        """Wait for every rank; kill them all at the timeout. With fail_fast,
        once one rank has exited with an error the others get fail_fast
        seconds to end (and report their side) before they are killed: a
        rank that waits on a failed peer would otherwise hold the run until
        the timeout."""
        deadline = time.monotonic() + timeout
        note, killed = "", set()
        while True:
            pending = [p for p in self.procs if p.poll() is None]
            if not pending:
                break
            now = time.monotonic()
            failed = next((r for r, p in enumerate(self.procs) if p.returncode is not None and p.returncode > 0), None)
            if fail_fast is not None and failed is not None and not note:
                note = f"\nlabrun: killed {fail_fast:g} s after rank {failed} failed"
                deadline = min(deadline, now + fail_fast)
            if now >= deadline:
                for q in pending:
                    q.kill()
                    killed.add(q.pid)
                note = note or f"\nlabrun: killed after {timeout} s"
                break
            try:
                pending[0].wait(timeout=min(0.5, max(0.01, deadline - now)))
            except subprocess.TimeoutExpired:
                pass
        for p in self.procs:
            p.wait()
        for t in self._threads:
            t.join(timeout=10)
        results = []
        for rank, p in enumerate(self.procs):
            why = note if p.pid in killed else ""  # not a rank that a signal from elsewhere ended
            results.append(RankResult(rank, p.returncode, "".join(self.out[rank]), "".join(self.err[rank]) + why))
        return results


def rendezvous_port(lab, host: int, span: int = 12000) -> int:
    """A port for the rendezvous store on host's namespace: below the
    namespace's ephemeral range (so no outgoing connection of an earlier run,
    still in TIME_WAIT or alive, holds it) and not listened on there: one of
    the span ports below that range."""
    out = lab.run(host, ["sh", "-c", "cat /proc/sys/net/ipv4/ip_local_port_range; ss -Htln"], timeout=30).stdout
    lines = out.splitlines()
    low = int(lines[0].split()[0]) if lines and lines[0].split() else 32768
    used = set()
    for line in lines[1:]:
        fields = line.split()
        if len(fields) >= 4 and fields[3].rpartition(":")[2].isdigit():
            used.add(int(fields[3].rpartition(":")[2]))
    free = [p for p in range(max(1024, low - span), low) if p not in used]
    return random.choice(free)


def start(lab, script_argv: list[str], *, world: int | None = None, hosts: list[int] | None = None,
          env: dict | None = None, rank_env_extra: dict | None = None, python: str | None = None,
          on_line=None, fork: bool | None = None) -> RankSet:
    """Start `python script_argv...` as rank i on host hosts[i] (default:
    host i, for i < world). on_line(rank, stream, line) sees every line.
    fork: the ranks are forked from scripts/prefork.py's shared server
    (torch imported once, not once per rank), the default for this
    interpreter's Python scripts unless LABRUN_PREFORK=0; False starts each
    with `ip netns exec python`."""
    hosts = hosts or list(range(world or lab.cfg.hosts))
    world = len(hosts)
    port = rendezvous_port(lab, hosts[0])
    if fork is None:
        fork = (python in (None, sys.executable) and os.environ.get("LABRUN_PREFORK", "1") != "0"
                and prefork.runs(script_argv))
    python = python or sys.executable
    procs = []
    for rank, host in enumerate(hosts):
        e = rank_env(lab, rank, host, hosts[0], world, port, {**(env or {}), **(rank_env_extra or {}).get(rank, {})})
        procs.append(lab.popen(host, [python] + script_argv, env=e, cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, prefork=prefork.shared() if fork else None))
    return RankSet(procs, on_line)


def run_local(world: int, script_argv: list[str], *, env: dict | None = None, timeout: float = 600,
              on_line=None) -> list[RankResult]:
    """`python script_argv...` as `world` ranks of this host, over loopback,
    no lab: each with the environment torchrun gives its workers (RANK,
    LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT,
    the store hosted here as torchrun's agent hosts it), on top of this
    process's environment, OMP_NUM_THREADS=1 and `env`; each forked from
    scripts/prefork.py's shared server, which has imported torch (a launch
    under torchrun imports it once more per rank, and once for its agent:
    3 s of CPU each here). A rank that fails ends the others within 60 s."""
    import datetime

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout))
    procs = []
    try:
        for rank in range(world):
            e = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {}), "RANK": str(rank), "LOCAL_RANK": str(rank),
                 "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world), "GROUP_RANK": "0",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port), "TORCHELASTIC_USE_AGENT_STORE": "True"}
            procs.append(prefork.shared().popen(script_argv, env=e, cwd=ROOT, stdout=subprocess.PIPE,
                                                stderr=subprocess.PIPE, text=True))
        return RankSet(procs, on_line).wait(timeout, fail_fast=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        del store


def torchrun(lab, script_argv: list[str], *, env: dict | None = None, timeout: float = 3600,
             python: str | None = None) -> list[RankResult]:
    """torchrun on every host of the lab (--nnodes = hosts, one process per
    node, static rendezvous on h0's alias 0), as a user runs it on a cluster."""
    hosts = list(range(lab.cfg.hosts))
    port = rendezvous_port(lab, 0)
    python = python or sys.executable
    procs = []
    for host in hosts:
        e = rank_env(lab, host, host, 0, len(hosts), port, env)
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
            e.pop(k)  # torchrun sets them
        argv = [python, "-m", "torch.distributed.run", "--nnodes", str(len(hosts)), "--node-rank", str(host),
                "--nproc-per-node", "1", "--master-addr", e["MASTER_ADDR"], "--master-port", str(port)]
        procs.append(lab.popen(host, argv + script_argv, env=e, cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True))

    def echo(rank, stream, line):
        print(f"[h{rank}] {line}", end="", file=sys.stdout if stream == "stdout" else sys.stderr, flush=True)
    return RankSet(procs, echo).wait(timeout, fail_fast=60)


def main() -> int:
    import argparse

    import netlab

    ap = argparse.ArgumentParser(description="torchrun across a netlab leaf-spine lab, one node per host namespace "
                                             "(needs root)")
    ap.add_argument("--prefix", help="use this existing lab (netlab.py up) instead of building one")
    ap.add_argument("--mode", choices=["pinned", "ecmp"], default="pinned")
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--spines", type=int, default=4)
    ap.add_argument("--core", type=float, default=200, help="leaf-spine rate, Mbit/s")
    ap.add_argument("--access", type=float, default=1000, help="host-leaf rate, Mbit/s")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("script", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...] (run by torchrun on every host)")
    args = ap.parse_args()
    script = args.script[1:] if args.script[:1] == ["--"] else args.script
    if not script:
        ap.error("give the script to run after --")
    if args.prefix:
        results = torchrun(netlab.Lab.attach(args.prefix), script, timeout=args.timeout)
    else:
        with netlab.Lab(hosts=args.hosts, spines=args.spines, mode=args.mode, core=args.core,
                        access=args.access) as lab:
            results = torchrun(lab, script, timeout=args.timeout)
    bad = [r for r in results if r.returncode != 0]
    for r in bad:
        print(f"labrun: host {r.rank} exited with {r.returncode}", file=sys.stderr)
    return 1 if bad else 0


def run(lab, script_argv: list[str], *, timeout: float = 600, fail_fast: float | None = 60,
        **kw) -> list[RankResult]:
    """Run `python script_argv...` as rank i on host i for i < world; returns
    every rank's exit code and output. Kills everything at the timeout, or
    fail_fast seconds after a rank failed."""
    return start(lab, script_argv, **kw).wait(timeout, fail_fast)


if __name__ == "__main__":
    sys.exit(main())
