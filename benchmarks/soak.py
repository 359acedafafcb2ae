"""Soak with faults on the lab: thousands of random operations on 4 ranks
while a fault injector flaps spine links, destroys single path sockets,
freezes ranks (SIGSTOP for less than the group timeout) and, with
--kill-after, kills one rank.

Every operation (collective, size 0 to 64 MiB, dtype, reduce op, root,
world group or a subgroup) is drawn from a seeded generator that every rank
runs alike, on inputs every rank can compute, so each rank checks its own
result exactly. The invariants:
  * every result is exact, or the operation raises a clean error (a
    RuntimeError with a message) -- on every rank of its group;
  * nothing hangs: the driver gives the whole run a deadline;
  * resident memory and open descriptors stay flat.
After an error the ranks agree on who is still there and where to go on,
destroy the group and build a new one (what an elastic job's restart would
do); a killed rank's survivors go on without it.

    sudo .venv/bin/python benchmarks/soak.py --ops 10000 [--kill-after S] [--seed 1] [--out FILE]

--large-reductions draws only large reductions (allreduce and
reduce-scatter of 2-8 Mi int64 elements on the world group) and injects a
fault every 0.5-2 s: many chunks in flight whenever a path is set aside or
closed, where a chunk landing twice or late would show. It is recorded
beside the main run (docs/results/soak_large_reductions.json, a section of
docs/soak.md).

prints one summary (operations, faults by kind, wrong results, hangs,
errors and their worst latency, RSS and descriptors over the run and their
growth after the warm-up) and writes it
as JSON to --out (default docs/results/soak.json; not in results/data, which
holds the evaluation suite's experiments).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = ["all_reduce", "all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier"]
DTYPES = ["float32", "float64", "int32", "int64"]
REDUCE = ["sum", "max", "min"]
SUBGROUPS = [[0, 1], [1, 2, 3]]  # created by every rank in every generation
GROUP_TIMEOUT_S = 20
FAULT_INTERVAL_S = (2, 5)  # seconds between faults, drawn uniformly
# --large-reductions: elements per rank's block, and a fault more often
LARGE_ELEMENTS = (1 << 21, 1 << 23)
LARGE_FAULT_INTERVAL_S = (0.5, 2)


# ---------------------------------------------------------------- the plan


def plan(seed: int, i: int, large_reductions: bool = False) -> dict:
    """Operation i, the same on every rank."""
    r = random.Random(seed * 1_000_003 + i)
    if large_reductions:
        return {"kind": r.choice(["all_reduce", "reduce_scatter"]), "n": r.randint(*LARGE_ELEMENTS),
                "dtype": "int64", "op": "sum", "root": 0, "group": None, "members": [0, 1, 2, 3]}
    kind = r.choice(KINDS)
    u = r.random()
    if u < 0.02:
        n = 0
    elif u < 0.60:
        n = r.randint(1, 1024)
    elif u < 0.98:
        n = r.randint(1025, 256 * 1024)
    else:
        n = int(2 ** r.uniform(18, 24))  # up to 16 Mi elements: 64 MiB of float32
    group = r.choice([None, None, None, 0, 1])  # mostly the world
    members = [0, 1, 2, 3] if group is None else SUBGROUPS[group]
    return {"kind": kind, "n": n, "dtype": r.choice(DTYPES), "op": r.choice(REDUCE),
            "root": r.choice(members), "group": group, "members": members}


def _wrong(torch, p, i, rank, gen, got, want) -> dict:
    """What a wrong result was: operation i of the plan, on which rank and in
    which group generation, and where its elements differ. The reduction is
    named only for all_reduce, the one kind that uses it (reduce_scatter
    always sums)."""
    rec = {"index": i, "rank": rank, "generation": gen,
           **{k: p[k] for k in ("kind", "n", "dtype", "group")}}
    if p["kind"] == "all_reduce":
        rec["op"] = p["op"]
    if got.shape != want.shape:
        rec["shape"] = [list(got.shape), list(want.shape)]
        return rec
    bad = (got != want).reshape(-1).nonzero().reshape(-1)
    rec["elements_wrong"] = int(bad.numel())
    if bad.numel():
        rec["first_wrong"], rec["last_wrong"] = int(bad[0]), int(bad[-1])
        rec["got_want_at_first"] = [got.reshape(-1)[bad[0]].item(), want.reshape(-1)[bad[0]].item()]
    return rec


def _input(torch, p, i, rank, n, start=0):
    """Small integers, exact in every dtype and in a sum over 4 ranks
    (elements [start, start + n) of rank's input)."""
    base = torch.arange(start, start + n, dtype=torch.int64)
    return ((base * 7 + rank * 13 + i) % 1000).to(getattr(torch, p["dtype"]))


def _expected(torch, p, i, members):
    ins = [_input(torch, p, i, r, p["n"]) for r in members]
    if p["kind"] == "all_reduce":
        if p["op"] == "sum":
            return sum(ins[1:], ins[0].clone())
        stacked = torch.stack(ins)
        return stacked.amax(0) if p["op"] == "max" else stacked.amin(0)
    if p["kind"] == "broadcast":
        return ins[members.index(p["root"])]
    return torch.cat(ins)  # all_gather


# ---------------------------------------------------------------- a rank


def _rss_and_fds():
    # What the process holds, not what the allocator keeps cached for it.
    import ctypes

    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return rss, len(os.listdir("/proc/self/fd"))


def worker(args) -> int:
    import torch
    import torch.distributed as dist

    import maestro_torch  # noqa: F401

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, rank == 0,
                          timeout=datetime.timedelta(seconds=600), wait_for_workers=True)
    stats = {"rank": rank, "ok": 0, "wrong": [], "errors": 0, "error_latency": [], "skipped": 0,
             "generations": 1, "samples": [], "destroy_s": [], "dropped": 0}
    alive = list(range(world))  # original ranks still in the job
    gen, i = 0, 0
    print("SOAK-READY", flush=True)
    while i < args.ops:
        failed = False
        start = time.monotonic()
        # Ranks of this generation's groups are positions in `alive`; a
        # subgroup that lost a member is gone, and so are its operations.
        subs = {}
        try:
            dist.init_process_group("maestro", store=dist.PrefixStore(f"g{gen}", store), rank=alive.index(rank),
                                    world_size=len(alive), timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
            for k, m in enumerate(SUBGROUPS):
                if all(x in alive for x in m):
                    subs[k] = dist.new_group([alive.index(x) for x in m], backend="maestro")
        except RuntimeError as e:  # a set-up that a fault broke: a clean error too
            _record_error(stats, "set-up", e, start)
            failed = True
        while i < args.ops and not failed:
            p = plan(args.seed, i, args.large_reductions)
            members = alive if p["group"] is None else p["members"]
            if p["group"] is not None and p["group"] not in subs:
                stats["dropped"] += 1  # its subgroup lost a rank
            elif p["kind"] == "broadcast" and p["root"] not in members:
                stats["dropped"] += 1  # its root was killed
            elif rank not in members:
                stats["skipped"] += 1
            else:
                g = None if p["group"] is None else subs[p["group"]]
                start = time.monotonic()
                try:
                    got, want = _run_op(torch, dist, p, i, rank, members, g, alive)
                    if want is not None and not torch.equal(got, want):
                        stats["wrong"].append(_wrong(torch, p, i, rank, gen, got, want))
                    else:
                        stats["ok"] += 1
                except RuntimeError as e:
                    _record_error(stats, f"#{i} {p['kind']} n={p['n']}", e, start)
                    failed = True
            i += 1
            _sample(stats, i)
        if dist.is_initialized():
            t = time.monotonic()
            dist.destroy_process_group()
            stats["destroy_s"].append(round(time.monotonic() - t, 3))
        if not failed and i >= args.ops:
            store.set(f"g{gen + 1}/next/{rank}", str(i))  # finished: the others stop rather than wait for it
            break
        if failed:
            # Who is still here, and where to go on (the furthest any got).
            # Rank 0 holds the store and is never killed: it decides.
            gen += 1
            stats["generations"] += 1
            store.set(f"g{gen}/next/{rank}", str(i))
            if rank == 0:
                here, until = {}, time.monotonic() + 10
                while time.monotonic() < until and len(here) < len(alive):
                    for r in alive:
                        if r not in here and store.check([f"g{gen}/next/{r}"]):
                            here[r] = int(store.get(f"g{gen}/next/{r}"))
                    time.sleep(0.05)
                store.set(f"g{gen}/plan", json.dumps({"alive": sorted(here), "next": max(here.values())}))
            decided = json.loads(store.get(f"g{gen}/plan"))
            if rank not in decided["alive"]:
                break  # counted out (too late): leave
            alive, i = decided["alive"], decided["next"]
    stats["alive_at_end"] = alive
    print("SOAK-RESULT " + json.dumps(stats), flush=True)
    return 0


def _sample(stats, i):
    """Every 250 operations: [operation index, RSS MB, open descriptors]."""
    if i % 250 == 0:
        rss, fds = _rss_and_fds()
        stats["samples"].append([i, round(rss / 2**20, 1), fds])


def growth_after_warmup(samples: list) -> dict:
    """How a rank's RSS and descriptors moved once warm: the first quarter of
    the run fills the allocator's pools, the scratch buffers and the
    registration cache up to the largest sizes drawn; a leak keeps growing
    after it. Returns the first sample, the one at the end of the first
    quarter, the last, and the least-squares slope over the last three
    quarters (MB and descriptors per 1,000 operations)."""
    if len(samples) < 4:
        return {}
    last_op = samples[-1][0]
    warm = [x for x in samples if x[0] >= last_op / 4]
    ops = [x[0] / 1000 for x in warm]
    mean = sum(ops) / len(ops)
    var = sum((o - mean) ** 2 for o in ops)

    def slope(col):
        ys = [x[col] for x in warm]
        ybar = sum(ys) / len(ys)
        return round(sum((o - mean) * (y - ybar) for o, y in zip(ops, ys)) / var, 2) if var else 0.0

    return {"first": samples[0], "warm": warm[0], "last": samples[-1],
            "rss_mb_per_kop": slope(1), "fds_per_kop": slope(2)}


def _record_error(stats, what, e, start):
    stats["errors"] += 1
    stats["error_latency"].append(round(time.monotonic() - start, 3))
    if len(stats.setdefault("messages", [])) < 5:
        stats["messages"].append(f"{what}: {str(e).splitlines()[0][:200]}")


def _run_op(torch, dist, p, i, rank, members, g, alive):
    n, kind = p["n"], p["kind"]
    x = _input(torch, p, i, rank, n)
    if kind == "barrier":
        dist.barrier(group=g)
        return None, None
    if kind == "all_reduce":
        op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[p["op"]]
        dist.all_reduce(x, op=op, group=g)
        return x, _expected(torch, p, i, members)
    if kind == "broadcast":
        dist.broadcast(x, src=alive.index(p["root"]), group=g)  # a rank of this generation's world
        return x, _expected(torch, p, i, members)
    if kind == "all_gather":
        out = torch.empty(n * len(members), dtype=x.dtype)
        dist.all_gather_into_tensor(out, x, group=g)
        return out, _expected(torch, p, i, members)
    # reduce_scatter of a (len(members) * n) input: this rank's block summed
    k, pos = len(members), members.index(rank)
    out = torch.empty(n, dtype=x.dtype)
    dist.reduce_scatter_tensor(out, _input(torch, p, i, rank, n * k), group=g)
    return out, sum(_input(torch, p, i, r, n, start=pos * n) for r in members)


# ---------------------------------------------------------------- the driver


class Injector(threading.Thread):
    """Faults at random moments: a spine link down for 1-3 s, one path's
    socket destroyed (ss -K), a rank frozen for 0.5-3 s."""

    def __init__(self, lab, ranks, seed, interval=FAULT_INTERVAL_S):
        super().__init__(daemon=True)
        self.interval = interval  # seconds between faults, drawn uniformly
        self.lab, self.ranks, self.rng = lab, ranks, random.Random(seed)
        self.stop = threading.Event()
        self.counts = {"link_flap": 0, "socket_destroyed": 0, "rank_frozen": 0, "rank_killed": 0}
        self.kill_after = None  # seconds into the run: one rank (not 0, the store's) is killed then
        self.started = time.monotonic()

    def run(self):
        kinds = ["link_flap", "socket_destroyed", "rank_frozen"]
        while not self.stop.wait(self.rng.uniform(*self.interval)):
            kind = kinds[self.rng.randrange(len(kinds))]
            if self.kill_after is not None and not self.counts["rank_killed"] and \
                    time.monotonic() - self.started > self.kill_after:
                kind = "rank_killed"
            try:
                getattr(self, kind)()
                self.counts[kind] += 1
            except Exception as e:  # noqa: BLE001 -- a fault that could not be injected is reported, not fatal
                print(f"soak: could not inject {kind}: {e}", file=sys.stderr)

    def link_flap(self):
        leaf, spine = self.rng.randrange(self.lab.cfg.leaves), self.rng.randrange(self.lab.cfg.spines)
        self.lab.link_down(leaf, spine)
        self.stop.wait(self.rng.uniform(1, 3))
        self.lab.link_up(leaf, spine)

    def socket_destroyed(self):
        h = self.rng.randrange(self.lab.cfg.hosts)
        peer = self.rng.choice([x for x in range(self.lab.cfg.hosts) if x != h])
        k = self.rng.randrange(len(self.lab.aliases(h)))
        self.lab.run(h, ["ss", "-K", "src", self.lab.alias_addr(h, k), "dst", self.lab.alias_addr(peer, k)],
                     check=True)

    def rank_killed(self):
        self.killed = self.rng.randrange(1, len(self.ranks.procs))
        self.ranks.procs[self.killed].kill()

    def rank_frozen(self):
        live = [p for p in self.ranks.procs if p.poll() is None]
        p = live[self.rng.randrange(len(live))]
        os.kill(p.pid, signal.SIGSTOP)
        try:
            self.stop.wait(self.rng.uniform(0.5, 3))
        finally:
            os.kill(p.pid, signal.SIGCONT)


def plot_rss(s: dict, docs: str) -> str:
    """docs/results/soak_rss.png: RSS per surviving rank over the operations."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    last = 0
    for rank, samples in sorted(s["samples"].items(), key=lambda kv: int(kv[0])):
        ax.plot([x[0] for x in samples], [x[1] for x in samples], ".-", label=f"rank {rank}")
        last = max([last] + [x[0] for x in samples])
    ax.axvspan(0, last / 4, color="0.9", zorder=0)
    ax.set_xlabel("operation")
    ax.set_ylabel("RSS (MB)")
    ax.legend()
    fig.tight_layout()
    name = "soak_rss.png"
    fig.savefig(os.path.join(docs, "results", name), dpi=100)
    plt.close(fig)
    return name


BASELINE_PREFIX = "soak_baseline_"


def baseline_markdown(results_dir: str) -> list:
    """A section on memory without faults, from the baseline runs recorded
    beside the main one (docs/results/soak_baseline_*.json): the same random
    operations without the injector, once with glibc's default allocator
    settings and once with its mmap threshold fixed, so that what glibc's
    heap keeps can be told apart from what is still allocated."""
    runs = []
    for name in sorted(os.listdir(results_dir)) if os.path.isdir(results_dir) else []:
        if name.startswith(BASELINE_PREFIX) and name.endswith(".json"):
            with open(os.path.join(results_dir, name)) as f:
                runs.append(json.load(f))
    if not runs:
        return []
    text = ["", "## Memory without faults", "",
            "The same random operations without the fault injector, to tell a leak from the allocator. With",
            "glibc's default settings a freed allocation above the mmap threshold raises the threshold, so",
            "later tensors of up to 32 MiB come from the heap, which keeps what it grew to; with the",
            "threshold fixed every large tensor is mapped and given back when freed. RSS in MB at the first",
            "sample / after the first quarter / at the end, and its least-squares slope over the last three",
            "quarters:", "",
            "| run | malloc | results checked | wrong | errors | " +
            " | ".join(f"rank {r}" for r in range(4)) + " |",
            "|---|---|---|---|---|" + "---|" * 4]
    for b in runs:
        cells = []
        for r in range(4):
            g = b["growth"].get(str(r))
            cells.append(f"{g['first'][1]:.0f} / {g['warm'][1]:.0f} / {g['last'][1]:.0f}; "
                         f"{g['rss_mb_per_kop']:+.2f} MB/kop" if g else "-")
        text.append(f"| `{b['command']}` at {b['commit']}, {b['date'][:10]} | {b.get('malloc', '-')} | "
                    f"{b['ops_checked']} | {len(b['wrong_results'])} | {b['errors']} | " + " | ".join(cells) + " |")
    return text


LARGE_REDUCTIONS = "soak_large_reductions.json"


def large_reductions_markdown(results_dir: str) -> list:
    """A section on the run of large reductions only (--large-reductions,
    recorded as docs/results/soak_large_reductions.json), if there is one."""
    path = os.path.join(results_dir, LARGE_REDUCTIONS)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        b = json.load(f)
    faults = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in b["faults"].items() if v) or "none"
    (lo, hi), (fast, slow) = LARGE_ELEMENTS, LARGE_FAULT_INTERVAL_S
    return ["", "## Large reductions under faults", "",
            f"Only allreduces and reduce-scatters of {lo >> 20}-{hi >> 20} Mi int64 elements on the world group, "
            f"a fault every", f"{fast}-{slow} s: many chunks in flight whenever a path is set aside or closed, "
            "where a chunk that lands", "twice, or after the next message took its place, would show.", "",
            "| run | results checked | wrong | errors | hung ranks | faults | seconds |",
            "|---|---|---|---|---|---|---|",
            f"| `{b['command']}` at {b['commit']}, {b['date'][:10]} | {b['ops_checked']} | "
            f"{len(b['wrong_results'])} | {b['errors']} | {len(b['hung_ranks'])} | {faults} | {b['seconds']} |"]


def write_markdown(s: dict, path: str):
    """docs/soak.md from a run's summary (nothing typed by hand)."""
    faults = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in s["faults"].items()) or "none"
    rows = [
        ("operations planned (each run by the ranks of its group)", s["ops_planned"]),
        ("results checked, summed over ranks", s["ops_checked"]),
        ("wrong results", len(s["wrong_results"])),
        ("hung ranks", len(s["hung_ranks"])),
        ("faults injected", faults),
        ("operation failures with an error, summed over ranks", s["errors"]),
        ("worst time from an operation's start to its error", f"{s['worst_error_latency_s']} s"),
        ("group generations (a new group after each failure)", s["generations"]),
        ("worst destroy_process_group", f"{s['worst_destroy_s']} s"),
        ("killed rank; survivors at the end", f"{s['killed_rank']}; {s['survivors_at_end'][0] if s['survivors_at_end'] else '-'}"),
        ("operations dropped because a member was killed", s["ops_dropped_with_a_killed_member"]),
    ]
    for rank, g in sorted(s["growth"].items(), key=lambda kv: int(kv[0])):
        if g:
            rows.append((f"rank {rank}: RSS MB at the start / after the first quarter / at the end; growth since",
                         f"{g['first'][1]:.0f} / {g['warm'][1]:.0f} / {g['last'][1]:.0f}; "
                         f"{g['rss_mb_per_kop']:+.2f} MB per 1,000 operations"))
            rows.append((f"rank {rank}: open descriptors at the start / after the first quarter / at the end",
                         f"{g['first'][2]} / {g['warm'][2]} / {g['last'][2]}; {g['fds_per_kop']:+.2f} per 1,000 operations"))
    text = ["# Soak with faults", "",
            "Random operations on 4 ranks of the leaf-spine lab (pinned paths, 1 Gbit/s links) while a fault",
            "injector flaps spine links, destroys single path sockets (`ss -K`), freezes ranks (SIGSTOP for",
            "0.5-3 s, less than the group timeout) and kills one rank. Every result is checked exactly on",
            "every rank; after an error the ranks agree on who is left and build a new group",
            "(`benchmarks/soak.py`).", "",
            f"Recorded with `{s['command']}` at {s['commit']}, {s['date'][:10]}, in {s['seconds']} s;",
            f"group timeout {s['group_timeout_s']} s.", "",
            "| measure | value |", "|---|---|"]
    text += [f"| {k} | {v} |" for k, v in rows]
    if s["samples"]:
        text += ["", "RSS of every surviving rank, sampled every 250 operations (the first quarter, shaded, is",
                 "the warm-up: pools, scratch and caches fill up to the largest sizes drawn; a leak keeps",
                 "growing after it):", "", f"![soak RSS](results/{plot_rss(s, os.path.dirname(path))})"]
    if s["error_messages"]:
        text += ["", "The first errors, as the ranks reported them:", ""]
        text += [f"- `{m}`" for m in s["error_messages"][:6]]
    text += large_reductions_markdown(os.path.join(os.path.dirname(path), "results"))
    text += baseline_markdown(os.path.join(os.path.dirname(path), "results"))
    with open(path, "w") as f:
        f.write("\n".join(text) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ops", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--no-faults", action="store_true", help="the same run without the injector (a baseline)")
    ap.add_argument("--large-reductions", action="store_true",
                    help="only large allreduce / reduce-scatter (2-8 Mi int64 elements), a fault every 0.5-2 s")
    ap.add_argument("--kill-after", type=float, default=None,
                    help="kill one rank (not rank 0) this many seconds in; the survivors go on in a new group")
    ap.add_argument("--deadline", type=float, default=3600, help="seconds before the run counts as hung")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "results", "soak.json"))
    ap.add_argument("--markdown", default=None, help="also write this summary as markdown (docs/soak.md)")
    ap.add_argument("--malloc-mmap-threshold", type=int, default=None, metavar="BYTES",
                    help="run the ranks with glibc's mmap threshold fixed at BYTES (MALLOC_MMAP_THRESHOLD_): "
                         "every larger allocation is mapped and given back when freed, so RSS shows what is "
                         "still allocated rather than what glibc's heap kept")
    ap.add_argument("--report", action="store_true",
                    help="run nothing: write --markdown from the summary in --out (and the baselines beside it)")
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if args.report:
        with open(args.out) as f:
            write_markdown(json.load(f), args.markdown)
        return 0
    if args.malloc_mmap_threshold is not None:
        os.environ["MALLOC_MMAP_THRESHOLD_"] = str(args.malloc_mmap_threshold)  # the ranks inherit it

    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import labrun
    import netlab

    started = time.time()
    with netlab.Lab(name="soak", mode="pinned", core=1000, access=1000) as lab:
        ranks = labrun.start(lab, [os.path.abspath(__file__), "--worker", "--ops", str(args.ops),
                                   "--seed", str(args.seed)] + (["--large-reductions"] if args.large_reductions else []),
                             world=4)
        for r in range(4):
            ranks.wait_for_line(r, "SOAK-READY", 120)
        injector = Injector(lab, ranks, args.seed, LARGE_FAULT_INTERVAL_S if args.large_reductions else FAULT_INTERVAL_S)
        injector.kill_after = args.kill_after
        if not args.no_faults:
            injector.start()
        results = ranks.wait(args.deadline)
        injector.stop.set()
        if injector.is_alive():
            injector.join(10)
    per_rank, hung = [], []
    killed = getattr(injector, "killed", None)
    for res in results:
        line = next((l for l in res.stdout.splitlines() if l.startswith("SOAK-RESULT ")), None)
        if res.rank == killed:
            continue
        if line is None:
            hung.append({"rank": res.rank, "rc": res.returncode, "stderr": res.stderr[-2000:]})
        else:
            per_rank.append(json.loads(line[len("SOAK-RESULT "):]))
    lat = [x for r in per_rank for x in r["error_latency"]]
    summary = {
        "command": "sudo .venv/bin/python benchmarks/soak.py " + " ".join(sys.argv[1:]),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                 text=True).stdout.strip(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(time.time() - started, 1), "ops_planned": args.ops, "group_timeout_s": GROUP_TIMEOUT_S,
        "malloc": (f"MALLOC_MMAP_THRESHOLD_={args.malloc_mmap_threshold} (fixed mmap threshold)"
                   if args.malloc_mmap_threshold is not None else "glibc's default (a dynamic mmap threshold)"),
        "faults": {} if args.no_faults else injector.counts,
        "ops_checked": sum(r["ok"] + len(r["wrong"]) for r in per_rank),
        "wrong_results": [w for r in per_rank for w in r["wrong"]],
        "errors": sum(r["errors"] for r in per_rank), "generations": max([r["generations"] for r in per_rank] or [0]),
        "worst_error_latency_s": max(lat) if lat else None,
        "worst_destroy_s": max([x for r in per_rank for x in r["destroy_s"]] or [0]),
        "hung_ranks": hung,
        "samples": {r["rank"]: r["samples"] for r in per_rank},
        "growth": {r["rank"]: growth_after_warmup(r["samples"]) for r in per_rank},
        "error_messages": [m for r in per_rank for m in r.get("messages", [])][:10],
        "killed_rank": killed, "survivors_at_end": [r["alive_at_end"] for r in per_rank],
        "ops_dropped_with_a_killed_member": max([r["dropped"] for r in per_rank] or [0]),
    }
    print(json.dumps(summary, indent=1))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=1)
    if args.markdown:
        write_markdown(summary, args.markdown)
    return 0 if not summary["wrong_results"] and not hung else 1


if __name__ == "__main__":
    sys.exit(main())
