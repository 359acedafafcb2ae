"""The generated tables of docs/performance.md (between its
``<!-- generated:NAME -->`` markers), each with the commands and commits of
its data."""
from __future__ import annotations

import statistics

from .common import runs_of, size_label, table
from .link_events import env_label
from .overheads import footprint_cpu_table
from .peers import best_gloo, congestion_variant, ecmp_label, gloo_cell
from .sweeps import small_cell_rows
from .training import load_balance_busbw


def markers(name: str) -> tuple[str, str]:
    return f"<!-- generated:{name} -->", f"<!-- /generated:{name} -->"


def provenance_line(recs: dict, names: list[str]) -> str:
    """The commands, commits and dates of the records `names`, one entry per
    run, each with its data files."""
    runs = runs_of(recs, names)
    return "*From " + "; ".join(
        f"`{cmd}` at maestro {commit}, {date} ({', '.join(f'`results/data/{n}.json`' for n in files)})"
        for (cmd, commit, date), files in runs.items()) + ".*"


def recorded(recs: dict, name: str) -> dict:
    rec = recs.get(name)
    if rec is None or rec["status"] != "ok":
        raise LookupError(name)
    return rec


def allreduce_busbw(run: dict, size: int) -> dict:
    """{variant: busbw MB/s} of a sweep at one size."""
    return {r["variant"]: r["busbw_GBps"] * 1e3 for r in run["rows"] if r["bytes"] == size}


def cut_iterations(d: dict) -> list[float]:
    """Seconds of the iteration (rank 0's) each link event fell into, or the
    next one when it fell between two."""
    its = d["iters"]
    return [next(it["seconds"] for it in its if e["t"] < it["start"] + it["seconds"]) for e in d["events"]]


def first_use_after_up(d: dict) -> list[float]:
    """For each "spine s up" event: seconds from it to the end of the first
    iteration in which rank 1's path s to rank 2 (alias s, pinned to spine s)
    carried bytes."""
    its = d["ranks"][1]
    sent = [{p["path"]: p["bytes_sent"] for p in it["paths"] if p["peer"] == 2} for it in its]
    out = []
    for e in d["events"]:
        s = int(e["event"].split()[1])
        out.append(next(it["start"] + it["seconds"] - e["t"] for i, it in enumerate(its)
                        if i and sent[i][s] > sent[i - 1][s] and it["start"] + it["seconds"] >= e["t"]))
    return out


def perf_loopback(recs: dict) -> tuple[str, list[str]]:
    return footprint_cpu_table(recorded(recs, "footprint")), ["footprint"]


def perf_targets(recs: dict) -> tuple[str, list[str]]:
    rows, used = [], []
    col = recs.get("collectives")
    if col and col["status"] == "ok":
        used.append("collectives")
        limit = col["data"]["physical_limit_GBps"] * 1e3
        for mode, target in (("pinned", ">= 0.90 x limit, >= 3.5x gloo"), ("ecmp", ">= 0.85 x limit")):
            run = col["data"]["runs"][f"{mode}/allreduce"]
            bw = allreduce_busbw(run, 64 << 20)
            g = best_gloo(bw)
            cells = [f"{v}: {bw[v]:.1f} MB/s = {bw[v] / limit:.2f} x limit"
                     + (f", **{bw[v] / g[1]:.2f}x** the best gloo" if g else "")
                     for v in ("adaptive", congestion_variant(bw)) if v in bw]
            label = ecmp_label(run) if mode == "ecmp" else mode
            rows.append([f"{label}, 64 MiB allreduce busbw",
                         "; ".join(cells + [f"best gloo {gloo_cell(g, bw, '{:.1f} MB/s', run.get('not_run', ()))}"]),
                         target])
    dis = recs.get("discovery")
    if dis and dis["status"] == "ok":
        used.append("discovery")
        trials = dis["data"]["trials"]
        crossing = [t for rank in (1, 3) for t in trials[rank]]  # ranks whose right neighbour is across the core
        good = sum(1 for t in crossing if len({h for h in t["hops_to_right"] if h}) == 4)
        setup = statistics.median(t["setup_s"] for r in trials for t in r)
        rows.append(["discovery: distinct spines per crossing",
                     f"{good} of {len(crossing)} trials ({100 * good / max(1, len(crossing)):.0f} %), median group "
                     f"set-up {setup:.1f} s", ">= 95 % of trials"])
    lb = recs.get("load_balance")
    if lb and lb["status"] == "ok":
        used.append("load_balance")
        d = lb["data"]
        bws, res = load_balance_busbw(d), sum(d["residual_mbit"]) / 8
        bg = "/".join(str(m) for m in d["background_mbit"].values())
        cell = f"adaptive {bws['adaptive']:.1f} MB/s = {bws['adaptive'] / res:.2f} x residual ({res:.1f} MB/s)"
        if "round_robin" in bws:
            cell += f"; round_robin {bws['round_robin']:.1f}: **{bws['adaptive'] / bws['round_robin']:.2f}x**"
        cell += f"; best gloo {gloo_cell(best_gloo(bws), bws, '{:.1f} MB/s')}"
        rows.append([f"UDP background {bg} Mbit/s on spines {', '.join(d['background_mbit'])}, 64 MiB", cell,
                     ">= 0.90 x residual, >= 1.5x round_robin"])
    cut, det = recs.get("resiliency"), recs.get("detection")
    if cut and cut["status"] == "ok" and det and det["status"] == "ok":
        used += ["resiliency", "detection"]
        d = cut["data"]
        exact = all(it["ok"] for r in d["ranks"] + det["data"]["ranks"] for it in r)
        hit = cut_iterations(d)
        fastest = min(it["seconds"] for it in d["iters"] if it["start"] + it["seconds"] < d["events"][0]["t"])
        back = first_use_after_up(det["data"])
        rows.append([f"spine link cut mid-allreduce ({d['bytes'] >> 20} MiB loop)",
                     f"every result exact: {'yes' if exact else '**no**'}; the iterations hit by a cut take {min(hit):.2f}-{max(hit):.2f} s "
                     f"({env_label(d)}) vs {fastest:.2f} s with every path up; a restored link's path carries "
                     f"data in an iteration that ends {min(back):.2f}-{max(back):.2f} s after the link is up",
                     "correct, no hang, time reported"])
    if not rows:
        raise LookupError("collectives, discovery, load_balance, resiliency and detection")
    return table(["criterion", "measured", "target"], rows), used


CONGESTION_LABELS = {"adaptive": "adaptive (MAESTRO_TCP_CONGESTION=auto, the default)",
                     "adaptive+kernel": "adaptive+kernel (MAESTRO_TCP_CONGESTION=kernel, the kernel's default)",
                     "adaptive+cubic": "adaptive+cubic (MAESTRO_TCP_CONGESTION=cubic)"}


def perf_congestion(recs: dict) -> tuple[str, list[str]]:
    """adaptive (MAESTRO_TCP_CONGESTION=auto, the default: cubic where the
    kernel's default is bbr) and adaptive+kernel (the kernel's default), per
    size from 4 MiB: each one's spread of iterations and median busbw."""
    runs = recorded(recs, "collectives")["data"]["runs"]
    rows, other = [], None
    spread = {}  # variant -> the largest slowest / fastest iteration of any size
    ratios = {}  # size -> default / other, per mode
    for mode in ("pinned", "ecmp"):
        run = runs[f"{mode}/allreduce"]
        get = {(r["variant"], r["bytes"]): r for r in run["rows"]}
        other = congestion_variant({r["variant"] for r in run["rows"]})
        for size in sorted({r["bytes"] for r in run["rows"] if r["bytes"] >= 4 << 20}):
            pair = [get.get((v, size)) for v in ("adaptive", other)]
            if None in pair:
                continue
            for v, r in zip(("adaptive", other), pair):
                spread[v] = max(spread.get(v, 0.0), max(r["times"]) / min(r["times"]))
            ratio = pair[0]["busbw_GBps"] / pair[1]["busbw_GBps"]
            ratios.setdefault(size, []).append(f"{mode} {ratio:.2f}x")
            rows.append([f"{mode} {size_label(size)} ({pair[0]['iters']})"]
                        + [f"{min(r['times']):.3f}-{max(r['times']):.3f}, busbw {r['busbw_GBps'] * 1e3:.1f} MB/s"
                           for r in pair]
                        + [f"{ratio:.2f}x"])
    other = other or "adaptive+kernel"
    text = table(["allreduce (iterations)", CONGESTION_LABELS["adaptive"] + " iterations, s",
                  CONGESTION_LABELS[other] + " iterations, s", "default / other"], rows)
    if spread:
        text += (f"\n\nThe slowest iteration of any size took {spread['adaptive']:.1f} times the fastest under the "
                 f"default and {spread[other]:.1f} times under {other}; default over {other}, median busbw: "
                 + "; ".join(f"{size_label(s)} {', '.join(v)}" for s, v in sorted(ratios.items())) + ".")
    return text, ["collectives"]


def small_cell_verdict(mine: float, same: float, target: float = 0.95) -> str:
    """Whether a cell's median ratio meets `target`, where the twin's median
    ratio (`same`, two groups of one configuration) says how far from the
    truth that statistic reads: a ratio below the target by no more than
    the twin reads from 1 is not resolved, one further below is missed."""
    if mine >= target:
        return "met"
    error = abs(1 - same)
    if mine >= target - error:
        return f"not resolved: {target - mine:.3f} below, the twin {error:.3f} from 1"
    return "**missed**"


def perf_small_cells(recs: dict) -> tuple[str, list[str]]:
    """The small cells launch by launch: per lab and size, the default
    policy over round_robin and round_robin's twin over round_robin, the
    median [min-max] over launches, and the verdict on the 5 % target."""
    d = recorded(recs, "small_cells")["data"]
    policy, rr, twin = d["variants"]
    rows = []
    for key, b, _, mine, same in small_cell_rows(d):
        mid, mid_same = statistics.median(mine), statistics.median(same)
        rows.append([f"{key} {size_label(b)}", f"{mid:.3f} [{min(mine):.3f}-{max(mine):.3f}]",
                     f"{mid_same:.3f} [{min(same):.3f}-{max(same):.3f}]", small_cell_verdict(mid, mid_same)])
    launches = len(next(iter(d["runs"].values())))
    return table([f"cell ({launches} launches)", f"{policy} / {rr}", f"{twin} / {rr} (the same configuration)",
                  f">= 0.95 x {rr} (the median launch)"], rows), ["small_cells"]


PERFORMANCE_TABLES = {"loopback": perf_loopback, "targets": perf_targets, "congestion": perf_congestion,
                      "small_cells": perf_small_cells}


def update_performance(path: str, recs: dict) -> None:
    """Fill every generated block of docs/performance.md from the records."""
    text = open(path).read()
    for name, fn in PERFORMANCE_TABLES.items():
        begin, end = markers(name)
        if begin not in text or end not in text:
            raise SystemExit(f"{path}: markers {begin} / {end} not found")
        try:
            body, used = fn(recs)
            body += "\n\n" + provenance_line(recs, used)
        except LookupError as e:
            body = f"*No recorded data for this table yet ({e} missing in results/data/).*"
        start, stop = text.index(begin) + len(begin), text.index(end)
        text = text[:start] + "\n" + body + "\n" + text[stop:]
    open(path, "w").write(text)
