"""What a rank costs: threads, file descriptors, memory and set-up time per
rank as the group grows, and CPU time per GB reduced -- maestro and gloo side
by side, on this host's loopback (no lab, no root needed for this part).

    python benchmarks/footprint.py                  # both parts, printed as JSON
    python benchmarks/footprint.py --quick          # small (smoke test)
    scripts/bench.sh --only footprint               # recorded through the suite into docs/results.md

Footprint: for each world size, a fresh group of each variant (separate
launches, interleaved: maestro, maestro-eager, gloo, maestro, ...), maestro
with 2 paths per peer (MAESTRO_VNICS=127.0.0.1,127.0.0.2), as it comes (ring
neighbours at start-up, any other pair on first use) and with
MAESTRO_CONNECT=eager (every pair at start-up); every rank reports after one
small allreduce. CPU: both backends' groups in the same processes, 64 MiB
allreduces timed alternately in rounds; getrusage of each process (all its
threads) over each backend's loop, summed over the ranks, per GB of tensor
reduced; maestro runs with its defaults (4 loopback paths).
Subgroups: what the groups of a 2-D DeviceMesh (init_device_mesh, world/4 x 4:
each rank in a row and a column group) add to a rank after one allreduce in
each -- maestro as it comes (its subgroups on the default group's paths),
with MAESTRO_SHARE_PATHS=0 (each subgroup on paths of its own), and gloo.
Where a footprint launch has a subgroups variant's configuration (maestro,
gloo), it measures the subgroups too, after its footprint: the same state
a launch of their own starts from, one launch fewer.

The rank side is footprint.py rank ARGS, started as torchrun starts its
workers (launch_script): each rank forked from a process that has imported
torch (scripts/prefork.py), with torchrun's environment and the store hosted
by the launcher, as torchrun's agent hosts it.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import labrun  # noqa: E402
BACKENDS = ("maestro", "gloo")
# The footprint's variants: maestro as it comes (ring neighbours connected at
# start-up, other pairs on first use), maestro with every pair connected at
# start-up (MAESTRO_CONNECT=eager: the full mesh), gloo.
VARIANTS = {"maestro": {"MAESTRO_VNICS": "127.0.0.1,127.0.0.2"},
            "maestro-eager": {"MAESTRO_VNICS": "127.0.0.1,127.0.0.2", "MAESTRO_CONNECT": "eager"},
            "gloo": {}}
# The subgroups part's variants.
MESH_VARIANTS = {"maestro": {"MAESTRO_VNICS": "127.0.0.1,127.0.0.2"},
                 "maestro-own": {"MAESTRO_VNICS": "127.0.0.1,127.0.0.2", "MAESTRO_SHARE_PATHS": "0"},
                 "gloo": {}}


# ---------------------------------------------------------------- rank side

def _proc_status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def rank_footprint(variant: str, mesh: bool = False) -> None:
    """A fresh group's footprint after one small allreduce; with `mesh`, then
    what a 2-D DeviceMesh's subgroups add to it (rank_mesh's measurement, in
    the same processes: it starts from this very state)."""
    import torch
    import torch.distributed as dist

    t0 = time.perf_counter()
    dist.init_process_group(variant.split("-")[0])
    dist.all_reduce(torch.ones(1024))
    setup = time.perf_counter() - t0
    mine = {"setup_s": setup, "threads": _proc_status("Threads"), "fds": len(os.listdir("/proc/self/fd")),
            "rss_MB": _proc_status("VmRSS") / 1024.0}
    rows = [None] * dist.get_world_size()
    dist.all_gather_object(rows, mine)
    result = {"backend": variant, "world": dist.get_world_size(), "ranks": rows}
    if mesh:
        result["mesh"] = _mesh_added(variant)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(result), flush=True)
    dist.destroy_process_group()


def _mesh_added(variant: str) -> dict:
    """What the groups of a 2-D DeviceMesh add to this rank after one
    allreduce in each, from where the default group stands (initialised,
    one allreduce done): the subgroups' record of one launch."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    n = dist.get_world_size()
    before = {"threads": _proc_status("Threads"), "fds": len(os.listdir("/proc/self/fd"))}
    t0 = time.perf_counter()
    mesh = init_device_mesh("cpu", (n // 4, 4), mesh_dim_names=("rows", "cols"))
    for dim in ("rows", "cols"):
        dist.all_reduce(torch.ones(1024), group=mesh.get_group(dim))
    setup = time.perf_counter() - t0
    mine = {"setup_s": setup, "threads_added": _proc_status("Threads") - before["threads"],
            "fds_added": len(os.listdir("/proc/self/fd")) - before["fds"]}
    rows = [None] * n
    dist.all_gather_object(rows, mine)
    return {"backend": variant, "world": n, "ranks": rows}


def rank_mesh(variant: str) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group(variant.split("-")[0])
    dist.all_reduce(torch.ones(1024))
    result = _mesh_added(variant)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(result), flush=True)
    dist.destroy_process_group()


def rank_cpu(size: int, rounds: int, iters: int) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    groups = {"maestro": dist.new_group(backend="maestro"), "gloo": dist.new_group(backend="gloo")}
    n = dist.get_world_size()
    x = torch.ones(size // 4)
    for g in groups.values():
        dist.all_reduce(x, group=g)  # registration, connections, warm caches
    samples = {b: [] for b in groups}  # per round: (wall s, this rank's CPU s)
    for _ in range(rounds):
        for name, g in groups.items():
            dist.barrier(group=g)
            c0, t0 = _cpu_seconds(), time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(x, group=g)
            samples[name].append((time.perf_counter() - t0, _cpu_seconds() - c0))
    everyone = [None] * n
    dist.all_gather_object(everyone, samples)
    if dist.get_rank() == 0:
        out = {"world": n, "bytes": size, "iters": iters, "rounds": rounds, "backends": {}}
        for name in groups:
            per_round = []
            for k in range(rounds):
                wall = max(everyone[r][name][k][0] for r in range(n))
                cpu = sum(everyone[r][name][k][1] for r in range(n))
                gb = size * iters / 1e9
                per_round.append({"wall_s": wall, "cpu_s": cpu, "cpu_s_per_GB": cpu / gb,
                                  "busbw_GBps": size * iters / wall / 1e9 * 2 * (n - 1) / n})
            out["backends"][name] = per_round
        print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()


# ---------------------------------------------------------------- driver

def launch(world: int, argv: list[str], env: dict | None = None, timeout: float = 600) -> dict:
    """`footprint.py rank ARGV` on `world` ranks of this host: rank 0's RESULT."""
    return launch_script(world, [os.path.abspath(__file__), "rank", *argv], env, timeout)


def launch_script(world: int, script_argv: list[str], env: dict | None = None, timeout: float = 600) -> dict:
    """A rank script (its path, then its arguments) on `world` ranks of this
    host, over loopback (scripts/labrun.py's run_local: torchrun's
    environment, each rank forked from a process that has imported torch):
    rank 0's RESULT. A 32-rank launch under torchrun spent 33 imports of
    torch, 50 s of a 2-core host, before its first rank started. What a rank
    reports (threads, descriptors, memory, set-up) is its own: the child
    keeps none of the server's descriptors or threads."""
    results = labrun.run_local(world, script_argv, env=env, timeout=timeout)
    failed = [r for r in results if r.returncode != 0]
    if not failed:
        for line in results[0].stdout.splitlines():
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT "):])
    why = failed[0] if failed else results[0]
    raise RuntimeError(f"{' '.join(script_argv)} on {world} ranks: rank {why.rank} exited {why.returncode} "
                       f"without a result:\n{why.stderr[-3000:]}")


def interleaved(what: str, variants: dict, worlds: list[int], trials: int, summary, once_above: int = 0,
                argv=lambda variant, world, trial: []) -> dict:
    """Launch `rank what <variant> ARGV` for every variant and world size,
    trials times over, interleaved (once only for worlds above once_above,
    where it is set); argv(variant, world, trial) gives a launch's extra arguments,
    summary(record) is printed after each launch."""
    runs = []
    for trial in range(trials):
        for world in worlds:
            if trial and once_above and world > once_above:
                continue
            for backend, env in variants.items():
                rec = launch(world, [what, backend, *argv(backend, world, trial)], env)
                rec["trial"] = trial
                runs.append(rec)
                print(f"{what}: {backend} x{world} trial {trial}: {summary(rec)}", file=sys.stderr, flush=True)
    return {"paths": 2, "worlds": worlds, "trials": trials, "runs": runs,
            **({"once_above": once_above} if once_above and trials > 1 else {})}


def footprint_and_subgroups(worlds: list[int], trials: int, once_above: int, mesh_worlds: list[int]) -> dict:
    """The footprint, and the subgroups at mesh_worlds (their first trial):
    where a footprint variant runs with the subgroups' configuration
    (maestro, gloo), its launch measures the subgroups too, after its
    footprint (in its first trial only) -- one launch less per world and
    variant; the subgroups' other variants (maestro-own) launch apart."""
    shared = [v for v in MESH_VARIANTS if VARIANTS.get(v) == MESH_VARIANTS[v]]
    fp = interleaved("footprint", VARIANTS, worlds, trials, _footprint_summary, once_above,
                     argv=lambda v, world, trial: ["--mesh"] if v in shared and world in mesh_worlds and trial == 0
                     else [])
    measured = {}
    for rec in fp["runs"]:
        mesh = rec.pop("mesh", None)
        if mesh is not None:
            measured[(mesh["backend"], mesh["world"])] = {**mesh, "trial": 0}
    runs = []
    for world in mesh_worlds:
        for backend, env in MESH_VARIANTS.items():
            rec = measured.get((backend, world))
            if rec is None:
                rec = {**launch(world, ["mesh", backend], env), "trial": 0}
            runs.append(rec)
            print(f"mesh: {backend} x{world}: {_mesh_summary(rec)}", file=sys.stderr, flush=True)
    return {"footprint": fp, "subgroups": {"paths": 2, "worlds": mesh_worlds, "trials": 1, "runs": runs,
                                           "in_footprint_launch": sorted({b for b, _ in measured})}}


def _footprint_summary(rec: dict) -> str:
    return f"threads {max(r['threads'] for r in rec['ranks'])}, fds {max(r['fds'] for r in rec['ranks'])}"


def _mesh_summary(rec: dict) -> str:
    return f"fds added {max(r['fds_added'] for r in rec['ranks'])}"


def cpu_cost(worlds: list[int], size: int, rounds: int, iters: int) -> dict:
    out = []
    for world in worlds:
        rec = launch(world, ["cpu", "--size", str(size), "--rounds", str(rounds), "--iters", str(iters)])
        out.append(rec)
        med = {b: statistics.median(r["busbw_GBps"] for r in rec["backends"][b]) for b in BACKENDS}
        print(f"cpu: x{world}: busbw maestro {med['maestro']:.2f} GB/s, gloo {med['gloo']:.2f} GB/s",
              file=sys.stderr, flush=True)
    return {"runs": out}


# How the ranks are started (launch_script), as the record says it: the
# memory a rank holds depends on it (a torchrun worker also holds the modules
# its agent imported: 525 MB resident per rank in the record at f7f8d45, a
# forked rank about 315).
RANK_LAUNCH = "prefork"


def measure(quick: bool) -> dict:
    """Both parts, as the suite records them."""
    if quick:
        return {**footprint_and_subgroups([2, 4], 1, 0, [4]), "cpu": cpu_cost([2], 16 << 20, 2, 2),
                "rank_launch": RANK_LAUNCH}
    # Two trials: threads, descriptors and memory come out the same in every
    # trial, set-up time varies (both trials are shown); one at 8, 16 and 32
    # ranks, whose launches took 12, 22 and 43 s on 2 cores under torchrun
    # (their set-up's spread is over 8 to 32 ranks). The subgroups' one: what they add is
    # counted, the same in every trial, and their set-up's spread is over
    # the ranks.
    # The subgroups are measured in the footprint's launches where their
    # configurations agree (footprint_and_subgroups).
    return {**footprint_and_subgroups([2, 4, 8, 16, 32], 2, 4, [8, 16]), "cpu": cpu_cost([2, 4], 64 << 20, 5, 3),
            "rank_launch": RANK_LAUNCH}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "rank":
        ap = argparse.ArgumentParser()
        ap.add_argument("what", choices=["footprint", "mesh", "cpu"])
        ap.add_argument("backend", nargs="?")
        ap.add_argument("--mesh", action="store_true", help="footprint: then the subgroups' measurement too")
        ap.add_argument("--size", type=int, default=64 << 20)
        ap.add_argument("--rounds", type=int, default=5)
        ap.add_argument("--iters", type=int, default=3)
        a = ap.parse_args(sys.argv[2:])
        if a.what == "footprint":
            rank_footprint(a.backend, a.mesh)
        elif a.what == "mesh":
            rank_mesh(a.backend)
        else:
            rank_cpu(a.size, a.rounds, a.iters)
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    print(json.dumps(measure(args.quick), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
