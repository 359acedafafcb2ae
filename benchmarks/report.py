"""Turn the suite's JSON (benchmarks/suite.py) into docs/results.md: a table
and a PNG plot per experiment, with the command that produced it and the
machine it ran on; the headline table at the top of README.md (between its
results markers); and the tables of docs/performance.md (between its
generated markers), each with the commands and commits of its data. Every
number comes from the JSON.

    python benchmarks/report.py [--data docs/results/data] [--out docs] [--readme README.md]
                                [--performance OUT/performance.md]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import fabric_sim_report  # noqa: E402
import gpu_report  # noqa: E402
from variants import is_gloo, is_maestro, maestro_policy  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
MBYTE = 1e6
# The peers of maestro in the collectives, models and load_balance
# experiments (benchmarks/suite.py): gloo with one device, gloo with one
# device per vNIC address, maestro on one path. Records made before the suite
# measured them lack some; the report says which instead of showing numbers.
GLOO_PEERS = ("gloo", "gloo-4dev")
PEERS = GLOO_PEERS + ("single",)


def routed(run: dict) -> bool | None:
    """Whether discovery ran in every maestro group of a sweep (some path of
    the group has a probed route), or None for records made before sweeps
    recorded their routes (they asked for discovery explicitly)."""
    groups = run.get("routes")
    if groups is None:
        return None
    return all(any(r for paths in peers.values() for r in paths) for peers in groups.values())


def ecmp_settings(run: dict) -> str:
    """How maestro's groups of an ECMP sweep found their routes."""
    found = routed(run)
    if found is None:
        return "ECMP mode: maestro groups use MAESTRO_DISCOVERY=ttl"
    if not found:
        return "ECMP mode, maestro's defaults: discovery did NOT run in every maestro group"
    variant = "adaptive" if "adaptive" in run["routes"] else next(iter(run["routes"]))
    crossing = sorted((peer, paths) for peer, paths in run["routes"][variant].items() if any(paths))
    spines = ", ".join(f"{len({r for r in paths if r})} distinct spines for {len(paths)} paths (rank {peer})"
                       for peer, paths in crossing)
    return (f"ECMP mode, maestro's defaults: discovery ran by itself (auto); {variant}'s paths from rank 0 to the "
            f"ranks across the core took {spines}")


def ecmp_label(run: dict | None) -> str:
    """The ECMP rows' name in the headline and targets tables."""
    found = routed(run) if run else None
    if found is None:
        return "ecmp + discovery"
    return "ecmp, defaults (discovery auto)" if found else "ecmp, defaults (no discovery)"


def best_gloo(values: dict, lower_is_better: bool = False) -> tuple[str, float] | None:
    """(variant, value) of the best gloo configuration among `values`
    ({variant: figure}, None = no figure), or None when no gloo variant has
    one. Higher is better (bandwidth) unless lower_is_better (seconds)."""
    figures = {v: x for v, x in values.items() if is_gloo(v) and x is not None}
    if not figures:
        return None
    pick = (min if lower_is_better else max)(figures, key=figures.get)
    return pick, figures[pick]


def missing_peers(variants) -> list[str]:
    return [p for p in PEERS if p not in variants]


def not_measured(variants) -> str:
    """A note naming the peers a record lacks ('' when it has them all)."""
    missing = missing_peers(variants)
    return (f"\n\n*Not measured in this record: {', '.join(missing)} (a run of the current suite adds "
            f"{'it' if len(missing) == 1 else 'them'}).*" if missing else "")


def gloo_cell(best: tuple[str, float] | None, variants, fmt: str) -> str:
    """The headline's gloo column: the best gloo figure and which gloo it was,
    and the gloo peers the record lacks."""
    missing = [p for p in GLOO_PEERS if p not in variants]
    text = f"{fmt.format(best[1])} ({best[0]})" if best else "not measured"
    return text + (f"; {', '.join(missing)} not measured" if best and missing else "")


def load(folder: str) -> dict:
    out = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".json"):
            with open(os.path.join(folder, name)) as f:
                rec = json.load(f)
            out[rec["experiment"]] = rec
    return out


def table(header: list[str], rows: list[list]) -> str:
    def cell(x):
        if isinstance(x, float):
            return f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"
        return str(x)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def provenance(rec: dict) -> str:
    m = rec["machine"]
    return (f"\n*Measured {rec['date']} with `{rec['command']}` ({'quick' if rec['quick'] else 'full'} mode, "
            f"{rec['seconds']:.0f} s) on {m['cores']} cores ({m['cpu']}), {m['memory_GiB']} GiB, Linux {m['kernel']}, "
            f"torch {m['torch']}, maestro {m['maestro_commit']}"
            + (f", host load average {m['load_at_start']} at the start" if "load_at_start" in m else "")
            + f". Lab: {rec['data'].get('lab', '')}.*\n")


def save(fig, out: str, name: str) -> str:
    path = os.path.join(out, "results", f"{name}.png")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"![{name}](results/{name}.png)"


def busbw_of_iter(it: dict, nbytes: int, world: int) -> float:
    return nbytes / it["seconds"] * 2 * (world - 1) / world / MBYTE


# ---------------------------------------------------------------- sections

def sec_p2p_paths(rec, out):
    rows = rec["data"]["rows"]
    maestro = [r for r in rows if not is_gloo(r["variant"])]
    gloos = [r for r in rows if is_gloo(r["variant"])]
    gloo = next(r for r in gloos if r["variant"] == "gloo")
    one = next((r for r in maestro if r["paths"] == 1), maestro[0])
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot([r["paths"] for r in maestro], [r["gbps"] for r in maestro], "o-", label="maestro")
    for r, ls in zip(gloos, ("--", "-.")):
        ax.axhline(r["gbps"], color="gray", ls=ls, label=f"{r['variant']} (one flow per collective)")
    ax.axhline(rec["data"]["access_mbit"] / 1000, color="red", ls=":", label="access link")
    ax.set_xlabel("paths")
    ax.set_ylabel("Gbit/s")
    ax.set_title("Point-to-point bandwidth vs paths (64 KiB chunks)")
    ax.legend(fontsize=8)
    body = table(["paths", "Gbit/s", "x one path", "x gloo"],
                 [[r["paths"], r["gbps"], r["gbps"] / one["gbps"], r["gbps"] / gloo["gbps"]] for r in maestro]
                 + [[r["variant"], r["gbps"], r["gbps"] / one["gbps"], r["gbps"] / gloo["gbps"]] for r in gloos])
    multi = [r["variant"] for r in gloos if r["variant"] != "gloo"]
    peers = (f" {multi[0]} (one gloo device per alias) is no faster: a broadcast is one collective, and gloo puts "
             "a whole collective on one device." if multi else "")
    return ("Point-to-point bandwidth vs number of paths (paper Fig. 8)",
            f"Rank 0 writes 64 KiB chunks to rank 1 across the core ({rec['data']['core_mbit']} Mbit/s per "
            f"spine link, {rec['data']['access_mbit']} Mbit/s access): bandwidth grows with each path until the "
            f"access link saturates.{peers}\n\n{body}\n\n{save(fig, out, 'p2p_paths')}")


def sec_chunk_size(rec, out):
    rows = rec["data"]["rows"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.6))
    a1.boxplot([[t * 1e3 for t in r["chunk_times_s"]] for r in rows], showfliers=True, flierprops={"markersize": 2})
    a1.set_xticks(range(1, len(rows) + 1), [f"{r['chunk'] / 1024:g}K" for r in rows])
    a1.set_yscale("log")
    a1.set_ylabel("chunk completion time (ms)")
    a1.set_xlabel("chunk size")
    a2.plot([r["chunk"] / 1024 for r in rows], [r["busbw_GBps"] * 1e3 for r in rows], "o-")
    a2.set_xscale("log")
    a2.set_xlabel("chunk size (KiB)")
    a2.set_ylabel("allreduce busbw (MB/s)")
    body = table(["chunk", "busbw MB/s", "median chunk ms", "p90 chunk ms", "p99 chunk ms"],
                 [[f"{r['chunk'] / 1024:g} KiB", r["busbw_GBps"] * 1e3, statistics.median(r["chunk_times_s"]) * 1e3,
                   sorted(r["chunk_times_s"])[int(0.9 * len(r["chunk_times_s"]))] * 1e3,
                   sorted(r["chunk_times_s"])[int(0.99 * len(r["chunk_times_s"]))] * 1e3] for r in rows])
    best = max(rows, key=lambda r: r["busbw_GBps"])
    return ("Chunk size (paper Fig. 9)",
            f"Allreduce of {rec['data']['bytes'] >> 20} MiB on 4 ranks; per-chunk completion times (post to ACK) of "
            f"every rank. Best throughput on this lab: **{best['chunk'] / 1024:g} KiB** chunks.\n\n{body}\n\n"
            f"{save(fig, out, 'chunk_size')}")


def sweep_grid(run: dict) -> tuple[list[str], list[int], dict]:
    """A sweep's (rank_bench.py sweep) variants in run order, its sizes
    ascending, and its rows by (variant, bytes)."""
    rows = run["rows"]
    return (list(dict.fromkeys(r["variant"] for r in rows)), sorted({r["bytes"] for r in rows}),
            {(r["variant"], r["bytes"]): r for r in rows})


def iter_busbw(row: dict) -> list[float]:
    """Each iteration's busbw (MB/s) of a sweep row: its times are the
    slowest rank's, its busbw_GBps that of their median."""
    return [row["busbw_GBps"] * 1e3 * row["seconds"] / t for t in row["times"]]


def spread_cell(med: float, values: list[float], fmt: str = "{:.1f}") -> str:
    """'median (min-max)'."""
    return f"{fmt.format(med)} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def plot_sweep(ax, run: dict, title: str, limit: float | None, spread: bool = False) -> None:
    """busbw (MB/s) vs size, a line per variant (gloo dashed), the physical
    limit dotted; spread: each point's min-max over iterations as error bars."""
    variants, sizes, get = sweep_grid(run)
    for i, v in enumerate(variants):
        ys = [get[(v, s)]["busbw_GBps"] * 1e3 for s in sizes]
        style = "s--" if is_gloo(v) else "o-"
        if spread:  # each variant's bars a little aside, so that they do not hide one another
            its = [iter_busbw(get[(v, s)]) for s in sizes]
            xs = [s * 2 ** (0.12 * (i - (len(variants) - 1) / 2)) for s in sizes]
            ax.errorbar(xs, ys, yerr=[[y - min(b) for y, b in zip(ys, its)], [max(b) - y for y, b in zip(ys, its)]],
                        fmt=style, capsize=3, label=v)
        else:
            ax.plot(sizes, ys, style, label=v)
    if limit is not None:
        ax.axhline(limit, color="red", ls=":", label="physical limit")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bytes")
    ax.set_ylabel("busbw (MB/s)")
    ax.set_title(title)
    ax.legend(fontsize=8)


def sec_collectives(rec, out):
    limit = rec["data"]["physical_limit_GBps"] * 1e3
    parts = []
    for key, run in rec["data"]["runs"].items():
        variants, sizes, get = sweep_grid(run)
        fig, ax = plt.subplots(figsize=(6.5, 3.8))
        plot_sweep(ax, run, key, limit)
        hdr = (["size"] + [f"{v} busbw MB/s" for v in variants]
               + ["best gloo", "best maestro policy / best gloo", "single / gloo"])
        trs = []
        for s in sizes:
            bw = {v: get[(v, s)]["busbw_GBps"] for v in variants}
            g = best_gloo(bw)
            best = max((x for v, x in bw.items() if not is_gloo(v) and v != "single"), default=None)
            trs.append([size_label(s)] + [x * 1e3 for x in bw.values()]
                       + [g[0] if g else "-", best / g[1] if g and best else "-",
                          bw["single"] / bw["gloo"] if "single" in bw and "gloo" in bw else "-"])
        parts.append(f"**{key}** ({ecmp_settings(run)})\n\n" if key.startswith("ecmp") else f"**{key}**\n\n")
        parts[-1] += table(hdr, trs) + not_measured(variants) + "\n\n"
        cpu = cpu_cells([run])
        if cpu:
            parts[-1] += ("CPU seconds per GB of messages (each rank's, all its threads, over the timed iterations; "
                          "the mean over ranks):\n\n"
                          + table(["size"] + variants, [[size_label(s)] + [f"{cpu[(v, s)][0]:.2f}" if (v, s) in cpu
                                                                           else "-" for v in variants]
                                                        for s in sizes]) + "\n\n")
        parts[-1] += save(fig, out, "collectives_" + key.replace("/", "_"))
    return ("Collectives vs gloo (paper Fig. 10)",
            f"nccl-tests busbw on 4 ranks (the ring crosses the core twice; physical limit {limit:.0f} MB/s = the "
            f"sum of the 4 core links one crossing uses, each {rec['data']['core_mbit']} Mbit/s), every load "
            "balancing policy and the peers in the same processes: gloo (one device), gloo-4dev (one gloo device "
            "per vNIC address; one collective still takes one device) and single (maestro on one path).\n\n"
            + "\n\n".join(parts))


def spines_cells(d: dict) -> dict:
    """{(variant, bytes): busbw MB/s of each trial} of the spines experiment."""
    return trial_cells(d["runs"], 1e3)


def sec_spines(rec, out):
    d = rec["data"]
    limit = d["physical_limit_GBps"] * 1e3
    cells = spines_cells(d)
    variants = d["variants"]
    sizes = sorted({b for _, b in cells})
    med = {k: statistics.median(v) for k, v in cells.items()}
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    errorbar_trials(ax, cells, variants, sizes, 0.12, lambda v: "s--" if is_gloo(v) else "o-")
    ax.axhline(limit, color="red", ls=":", label="physical limit")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bytes")
    ax.set_ylabel("busbw (MB/s)")
    ax.set_title("allreduce, 8 spines, 4 vNICs per host, ECMP")
    ax.legend(fontsize=8)
    trs = []
    for s in sizes:
        trs.append([size_label(s)] + [spread_cell(med[(v, s)], cells[(v, s)]) for v in variants]
                   + [f"{med[(v, s)] / limit:.2f}" for v in variants if is_maestro(v)]
                   + [f"{med[('adaptive', s)] / med[('adaptive@paths=4', s)]:.2f}",
                      f"{med[('adaptive', s)] / med[('gloo', s)]:.2f}"])
    hdr = (["size"] + [f"{v} busbw MB/s" for v in variants] + [f"{v} / limit" for v in variants if is_maestro(v)]
           + ["adaptive / adaptive@paths=4", "adaptive / gloo"])
    return ("More spines than vNICs (paths=auto)",
            f"nccl-tests busbw of allreduce on 4 ranks, {d['lab']} (the ring crosses the core twice; physical limit "
            f"{limit:.0f} MB/s: the access link of {d['access_mbit']} Mbit/s, below the {d['spines']} core links of "
            f"{d['core_mbit']} Mbit/s that one crossing can use). **adaptive** is maestro as it comes: "
            "MAESTRO_PATHS=auto counts the spines with the set-up's route probes and opens one path per spine; "
            "**adaptive@paths=4** is one path per vNIC, the count before auto; both run discovery (auto). Median "
            f"(min-max) over {len(d['runs'])} interleaved trials, each rotating the order of the variants.\n\n"
            + table(hdr, trs) + "\n\n" + save(fig, out, "spines"))


def sec_p2p_alltoall(rec, out):
    d = rec["data"]
    limits = {k: x * 1e3 for k, x in d["physical_limit_GBps"].items()}
    fig, axes = plt.subplots(1, len(d["runs"]), figsize=(6 * len(d["runs"]), 3.8), squeeze=False)
    parts = []
    for ax, (coll, run) in zip(axes[0], d["runs"].items()):
        plot_sweep(ax, run, f"pinned {coll}", limits.get(coll), spread=True)
        variants, sizes, get = sweep_grid(run)
        trs = []
        for s in sizes:
            bw = {v: get[(v, s)]["busbw_GBps"] * 1e3 for v in variants}
            g = best_gloo(bw)
            ad, one = bw.get("adaptive"), bw.get("single")
            trs.append([size_label(s)] + [spread_cell(bw[v], iter_busbw(get[(v, s)])) for v in variants]
                       + [g[0] if g else "-", ad / g[1] if g and ad else "-", ad / one if ad and one else "-"])
        wrong = sorted({f"{r['variant']} at {size_label(r['bytes'])}" for r in run["rows"] if r.get("exact") is False})
        parts.append(f"**{coll}** (physical limit {limits[coll]:.0f} MB/s)\n\n"
                     + table(["size"] + [f"{v} busbw MB/s" for v in variants]
                             + ["best gloo", "adaptive / best gloo", "adaptive / single"], trs)
                     + not_measured(variants)
                     + (f"\n\n**Wrong results:** {', '.join(wrong)}." if wrong else ""))
    return ("Point to point and all-to-all vs gloo",
            f"nccl-tests style on 4 ranks of the pinned lab ({d['core_mbit']} Mbit/s per core link, "
            f"{d['access_mbit']} Mbit/s access), the peers in the same processes, timed alternately. **sendrecv**: "
            "every rank sends `size` bytes to rank+1 and receives as many from rank-1, both posted with "
            "batch_isend_irecv; busbw = algbw. The ring crosses the core twice in opposite directions (1 -> 2, "
            "3 -> 0): the limit is the 4 core links of one crossing. **alltoall**: all_to_all_single of `size` "
            "bytes per rank (its own share included) in equal splits; busbw = algbw x 3/4. Each direction of the "
            "core carries `size` bytes whatever the algorithm (2 ranks x 2 remote ranks x size/4), so busbw is at "
            "most 3/4 of the 4 core links. Cells: busbw median (min-max) over the iterations, each timed on the "
            "slowest rank; adaptive = maestro's default policy, single = maestro on one path, gloo-4dev = one "
            "gloo device per vNIC address. Every result was checked after the warm-up.\n\n"
            + "\n\n".join(parts) + "\n\n" + save(fig, out, "p2p_alltoall"))


def size_label(nbytes: int) -> str:
    return f"{nbytes / 1024:g} KiB" if nbytes < 1 << 20 else f"{nbytes >> 20} MiB"


def trial_cells(trials: list, scale: float) -> dict:
    """{(variant, bytes): [busbw_GBps x scale, one per trial]} of interleaved sweep trials."""
    cells = {}
    for run in trials:
        for r in run["rows"]:
            cells.setdefault((r["variant"], r["bytes"]), []).append(r["busbw_GBps"] * scale)
    return cells


def errorbar_trials(ax, cells: dict, variants: list, sizes: list, step: float, fmt) -> None:
    """Each variant's median over trials vs size, its min-max as error bars,
    the variants' points a little aside so that they do not hide one another;
    fmt(variant) is the line style."""
    for i, v in enumerate(variants):
        xs = [b * 2 ** (step * (i - (len(variants) - 1) / 2)) for b in sizes]
        ys = [statistics.median(cells[(v, b)]) for b in sizes]
        lo = [y - min(cells[(v, b)]) for y, b in zip(ys, sizes)]
        hi = [max(cells[(v, b)]) - y for y, b in zip(ys, sizes)]
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt=fmt(v), capsize=3, label=v)


def cpu_cells(trials: list) -> dict:
    """{(variant, bytes): [CPU seconds per GB, the mean over ranks, one per trial]} of sweep trials
    that recorded it (rank_bench's cpu_s_per_GB), else {}."""
    cells = {}
    for run in trials:
        for r in run["rows"]:
            if r.get("cpu_s_per_GB"):
                cells.setdefault((r["variant"], r["bytes"]), []).append(statistics.mean(r["cpu_s_per_GB"]))
    return cells


def mid_size_cells(d: dict) -> dict:
    """{(collective, variant, bytes): [busbw as a fraction of the limit, one per trial]}."""
    return {(coll, v, b): xs for coll, trials in d["runs"].items()
            for (v, b), xs in trial_cells(trials, 1 / d["physical_limit_GBps"]).items()}


def sec_mid_size(rec, out):
    d = rec["data"]
    cells = mid_size_cells(d)
    variants = d["variants"]
    sizes = sorted({b for _, _, b in cells})
    policies = [v for v in variants if "@" not in v]
    parts = []
    fig, axes = plt.subplots(1, len(d["runs"]), figsize=(6 * len(d["runs"]), 3.6), squeeze=False)
    for ax, coll in zip(axes[0], d["runs"]):
        rows = []
        for b in sizes:
            med = {v: statistics.median(cells[(coll, v, b)]) for v in variants}
            rows.append([size_label(b)]
                        + [f"{med[v]:.2f} [{min(cells[(coll, v, b)]):.2f}-{max(cells[(coll, v, b)]):.2f}]"
                           for v in variants]
                        + [f"{med[p] / med[p + '@min_chunk_size=256K']:.2f}" for p in policies])
        errorbar_trials(ax, {(v, b): xs for (c, v, b), xs in cells.items() if c == coll}, variants, sizes, 0.08,
                        lambda v: "o--" if "@" in v else "o-")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [size_label(b) for b in sizes])
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("busbw / physical limit")
        ax.set_title(f"{coll}, pinned, 4 ranks")
        ax.legend(fontsize=7)
        parts.append(f"**{coll}**\n\n" + table(["size"] + variants + [f"{p}: cut / whole" for p in policies], rows))
        cpu = cpu_cells(d["runs"][coll])
        if cpu:
            parts.append(f"{coll}, CPU seconds per GB of messages (each rank's, all its threads, over the timed "
                         "iterations; the mean over ranks, median [min-max] over trials):\n\n"
                         + table(["size"] + variants,
                                 [[size_label(b)] + [f"{statistics.median(cpu[(v, b)]):.2f} "
                                                     f"[{min(cpu[(v, b)]):.2f}-{max(cpu[(v, b)]):.2f}]"
                                                     if (v, b) in cpu else "-" for v in variants]
                                  for b in sizes]))
    trials = len(next(iter(d["runs"].values())))
    return ("Mid-size messages: one chunk per path",
            f"busbw as a fraction of the physical limit ({d['physical_limit_GBps'] * 1e3:.0f} MB/s), median "
            f"[min-max] of {trials} interleaved trials (each rotates the order of the variants). The defaults cut "
            "a message shorter than one chunk per path (4 x 256 KiB) into one chunk per path, none under 64 KiB "
            "(`MAESTRO_MIN_CHUNK_SIZE=auto`), and a ring whose blocks are at most one 64 KiB chunk per path (here "
            "above 256 KiB and up to 1 MiB) sends them in 64 KiB messages, each forwarded as it lands; "
            "`@min_chunk_size=256K` keeps whole 256 KiB chunks and whole blocks, as before. A 4-rank ring sends "
            "blocks of a quarter of the message: at 256 KiB they are 64 KiB, one chunk either way.\n\n"
            + "\n\n".join(parts) + "\n\n" + save(fig, out, "mid_size"))


def sec_models(rec, out):
    runs = rec["data"]["runs"]
    parts, labels, vals = [], [], {}
    for key, run in runs.items():
        model, mode = key.split("/")
        rows = {r["variant"]: r for r in run["rows"]}
        if mode == "buckets":
            g = best_gloo({v: r["sync_s"] for v, r in rows.items()}, lower_is_better=True)
            trs = [[v, r["sync_s"], (1 - r["sync_s"] / g[1]) * 100 if g and not is_gloo(v) else ""]
                   for v, r in rows.items()]
            parts.append(f"**{model}**, gradient buckets only ({run['parameters'] / 1e6:.1f} M parameters, "
                         f"{run['rows'][0]['buckets']} DDP buckets)\n\n"
                         + table(["backend", "sync s / iteration", f"% less than {g[0] if g else 'gloo'} (best gloo)"],
                                 trs) + not_measured(rows))
            label = f"{model}\n(sync)"
            for v, r in rows.items():
                vals.setdefault(v, {})[label] = r["sync_s"]
            labels.append(label)
        else:
            # New records: benchmarks/train.py's runs, exposed comm = backward's
            # wait for the gradient sync after its last gradient, measured in the
            # step. Older records (no exposed_comm_method) stored iteration -
            # compute there.
            measured = all("exposed_comm_method" in r for r in rows.values())
            g = best_gloo({v: r["exposed_comm_s"] for v, r in rows.items()}, lower_is_better=True)
            trs = [[v, r["iteration_s"], r["compute_s"], max(0.0, r["iteration_s"] - r["compute_s"])]
                   + ([r["exposed_comm_s"], r["samples_per_s"]] if measured else [])
                   + [(1 - r["exposed_comm_s"] / g[1]) * 100 if g and g[1] and not is_gloo(v) else ""]
                   for v, r in rows.items()]
            what = "exposed comm" if measured else "iteration − compute"
            if measured:
                r0 = run["rows"][0]
                how = (f"4 ranks sharing 2 cores, batch {r0['batch']} per rank ({r0['input']}): `{run['command']}`; "
                       "gloo with `--backend gloo`, gloo-4dev with `--backend gloo --gloo-devices vnics`, single "
                       "with `--policy single`; "
                       "exposed comm = backward's wait for the gradient sync after its last gradient, measured in "
                       "the step; compute = forward and backward under no_sync")
            else:
                how = "forward and backward on 4 ranks sharing 2 cores; compute = the same under no_sync"
            parts.append(f"**{model}** under DDP ({how})\n\n"
                         + table(["backend", "iteration s", "compute s", "iteration − compute s"]
                                 + (["exposed comm s", "samples/s"] if measured else [])
                                 + [f"% less {what} than {g[0] if g else 'gloo'} (best gloo)"], trs)
                         + not_measured(rows))
    fig, ax = plt.subplots(figsize=(6, 3.4))
    width = 0.8 / max(1, len(vals))
    for i, (v, ys) in enumerate(vals.items()):
        xs = [x for x, label in enumerate(labels) if label in ys]
        ax.bar([x + i * width for x in xs], [ys[labels[x]] for x in xs], width, label=v)
    ax.set_xticks([x + width * (len(vals) - 1) / 2 for x in range(len(labels))], labels)
    ax.set_ylabel("seconds per iteration")
    ax.legend()
    return ("Models (paper Fig. 11)", "Gradient synchronisation per iteration on 4 ranks of the pinned lab.\n\n"
            + "\n\n".join(parts) + "\n\n" + save(fig, out, "models"))


def path_bytes(iters: list, peer: int) -> dict:
    first, last = iters[0]["paths"], iters[-1]["paths"]
    f = {p["path"]: p["bytes_sent"] for p in first if p["peer"] == peer}
    return {p["path"]: p["bytes_sent"] - f[p["path"]] for p in last if p["peer"] == peer}


def sec_load_balance(rec, out):
    d = rec["data"]
    residual = d["residual_mbit"]
    share_res = [r / sum(residual) for r in residual]
    trs, shares = [], {}
    bws = load_balance_busbw(d)
    for policy, run in d["runs"].items():
        if "paths" in run["ranks"][1][0]:  # maestro: rank 1 writes to rank 2 across the loaded spines
            b = path_bytes(run["ranks"][1], 2)
            tot = sum(b.values()) or 1
            shares[policy] = [b[p] / tot for p in sorted(b)]
        cells = [f"{s:.2f}" for s in shares[policy]] if policy in shares else ["-"] * 4  # gloo: no per-path counts
        bw = bws.get(policy)
        trs.append([policy, bw if bw else "-", bw / (sum(residual) / 8) if bw else "-", *cells])
    ad = next((r for r in trs if r[0] == "adaptive"), None)
    rr = next((r for r in trs if r[0] == "round_robin"), None)
    g = best_gloo(bws)
    fig, ax = plt.subplots(figsize=(6, 3.4))
    width = 0.8 / (len(shares) + 1)
    ax.bar([s - 0.4 + width / 2 for s in range(4)], share_res, width, label="residual capacity", color="black")
    for i, (p, sh) in enumerate(shares.items()):
        ax.bar([s - 0.4 + width * (i + 1.5) for s in range(4)], sh, width, label=p)
    ax.set_xticks(range(4), [f"spine {s}\n({d['background_mbit'].get(str(s), 0)} Mbit bg)" for s in range(4)])
    ax.set_ylabel("share of bytes")
    ax.legend(fontsize=8)
    note = ""
    if ad and rr:
        note = (f"adaptive reaches **{ad[2]:.2f} x the residual capacity** and **{ad[1] / rr[1]:.2f} x round_robin**"
                + (f", **{ad[1] / g[1]:.2f} x {g[0]}** (the best gloo). " if g else ". "))
    return ("Load balance under background traffic (paper Fig. 12c)",
            f"Allreduces of {next(iter(d['runs'].values()))['bytes'] >> 20} MiB in a loop; UDP background at "
            f"{', '.join(f'{m} Mbit/s on spine {s}' for s, m in d['background_mbit'].items())} "
            f"(h1 to h3); the ring's 1-to-2 crossing shares those links. Residual capacity "
            f"{sum(residual)} Mbit/s = {sum(residual) / 8:.1f} MB/s. {note}\n\n"
            + table(["variant", "busbw MB/s", "x residual", *[f"spine {s} share" for s in range(4)]],
                    trs + [["residual capacity", sum(residual) / 8, 1.0, *[f"{s:.2f}" for s in share_res]]])
            + not_measured(d["runs"]) + "\n\n" + save(fig, out, "load_balance"))


def load_balance_busbw(d: dict) -> dict:
    """{variant: median busbw MB/s of rank 1's iterations after the first};
    a variant with no iteration after the first has none (sanity() says so)."""
    return {v: statistics.median(busbw_of_iter(x, run["bytes"], run["world"]) for x in run["ranks"][1][1:])
            for v, run in d["runs"].items() if run["ranks"][1][1:]}


def timeline(rec, out, name, title, text):
    d = rec["data"]
    its = d["iters"]
    t = [it["start"] for it in its]
    bw = [busbw_of_iter(it, d["bytes"], d["world"]) for it in its]
    # Rank 1 -> 2 crosses the core from leaf 0, whose spine links the
    # experiments cut and restore.
    up = [sum(1 for p in it["paths"] if p["peer"] == 2 and p["state"] == "up") for it in d["ranks"][1]]
    fig, ax = plt.subplots(figsize=(7, 3.4))
    ax.plot(t, bw, ".-", label="allreduce busbw")
    ax.set_xlabel("seconds")
    ax.set_ylabel("busbw (MB/s)")
    ax2 = ax.twinx()
    ax2.step(t, up, where="post", color="green", alpha=0.5, label="paths up (rank 1 -> 2, across the core)")
    ax2.set_ylim(0, 5)
    ax2.set_ylabel("paths up")
    # Align event times (measured from READY) with iteration starts.
    for e in d["events"]:
        ax.axvline(e["t"], color="red", ls=":")
        ax.text(e["t"], max(bw) * 0.95, e["event"], rotation=90, fontsize=7, va="top")
    ax.set_title(title)
    phases, bounds = [], [0.0] + [e["t"] for e in d["events"]] + [1e9]
    for i in range(len(bounds) - 1):
        sel = [b for tt, b in zip(t, bw) if bounds[i] <= tt < bounds[i + 1]]
        okp = all(it["ok"] for tt, it in zip(t, its) if bounds[i] <= tt < bounds[i + 1])
        label = "start" if i == 0 else d["events"][i - 1]["event"]
        if sel:
            phases.append([f"after {label}", len(sel), statistics.median(sel), max(it["seconds"] for tt, it in zip(t, its)
                                                                                 if bounds[i] <= tt < bounds[i + 1]), okp])
    allok = all(it["ok"] for r in d["ranks"] for it in r)
    return (title, text + f" Every result exact on every rank: **{allok}**.\n\n"
            + table(["phase", "iterations", "median busbw MB/s", "slowest iteration s", "all exact"], phases)
            + "\n\n" + save(fig, out, name))


def sec_detection(rec, out):
    return timeline(rec, out, "detection", "Path detection (paper Fig. 12d)",
                    "Training (16 MiB allreduces in a loop) starts with the L0 links to spines 1-3 down, so only one "
                    "path per crossing connects; the links come up one by one and each path is reconnected and used "
                    "as soon as it answers.")


def sec_resiliency(rec, out):
    return timeline(rec, out, "resiliency", "Resiliency (paper Fig. 12e)",
                    "The L0 links to spines 3, 2 and 1 are cut one by one during training (blackholes: the paths "
                    "stall and are found from their own traffic, see Failover below); their chunks move to the "
                    "remaining paths.")


def env_label(d: dict) -> str:
    """The knobs a link-timeline record ran with ("defaults" if none); a
    record from before they were kept ran with MAESTRO_PATH_TIMEOUT=1."""
    env = d.get("env", {"MAESTRO_PATH_TIMEOUT": "1"})
    return ", ".join(f"{k}={v}" for k, v in env.items()) or "defaults"


def failover_events(d: dict, settle: float = 1.0) -> list[dict]:
    """Per event of a failover record: the median operation before it (since
    the previous event's settling), the stall (the longest operation running
    within `settle` s after it; every operation timed on its slowest rank),
    the median operation after it (until the next event), whether every
    result in between was exact, and the longest wait between two operations
    (the loop's barrier and check: what the operations' own times leave out)
    across the event, beside the median one before it."""
    n = min(len(r) for r in d["ranks"])
    its = [{"start": d["ranks"][0][i]["start"], "seconds": max(r[i]["seconds"] for r in d["ranks"]),
            "ok": all(r[i]["ok"] for r in d["ranks"])} for i in range(n)]
    events = d["events"]
    out = []
    for k, e in enumerate(events):
        t = e["t"]
        lo = events[k - 1]["t"] + settle if k else 0.0
        hi = events[k + 1]["t"] if k + 1 < len(events) else 1e18
        before = [x["seconds"] for x in its if lo <= x["start"] and x["start"] + x["seconds"] <= t]
        across = [x for x in its if x["start"] + x["seconds"] >= t and x["start"] <= t + settle]
        after = [x["seconds"] for x in its if t + settle < x["start"] < hi]
        window = [x for x in its if lo <= x["start"] < hi]
        # Rank 0's cycle from one operation's start to the next, less the
        # slowest rank's time of the operation.
        waits = [(x["start"], y["start"] - x["start"] - x["seconds"]) for x, y in zip(its, its[1:])]
        waits_before = [w for s, w in waits if lo <= s and s + w <= t]
        waits_across = [w for (s, w), y in zip(waits, its[1:]) if y["start"] >= t and s <= t + settle]
        out.append({"wait_s": max(waits_across, default=None),
                    "wait_before_s": statistics.median(waits_before) if waits_before else None,"event": e["event"], "t": t, "before_s": statistics.median(before) if before else None,
                    "stall_s": max((x["seconds"] for x in across), default=None),
                    "after_s": statistics.median(after) if after else None, "iterations": len(window),
                    "exact": all(x["ok"] for x in window)})
    return out


def sec_failover(rec, out):
    d = rec["data"]
    by_event = {}
    for e in failover_events(d):
        by_event.setdefault(e["event"], []).append(e)
    n = min(len(r) for r in d["ranks"])
    t = [d["ranks"][0][i]["start"] for i in range(n)]
    op = [max(r[i]["seconds"] for r in d["ranks"]) * 1e3 for i in range(n)]
    fig, ax = plt.subplots(figsize=(8, 3.4))
    ax.plot(t, op, ".-", lw=0.8, ms=3, label="allreduce (slowest rank)")
    ax.set_yscale("log")
    ax.set_xlabel("seconds")
    ax.set_ylabel("operation time (ms)")
    for e in d["events"]:
        ax.axvline(e["t"], color="red" if "restore" not in e["event"] else "green", ls=":")
        ax.text(e["t"], max(op), e["event"], rotation=90, fontsize=6, va="top")
    ax.set_title("Failover: each operation's time against wall time")

    def ms(xs):
        xs = [x * 1e3 for x in xs if x is not None]
        if not xs:
            return "-"
        return spread_cell(statistics.median(xs), xs, "{:.0f}") if len(xs) > 1 else f"{xs[0]:.0f}"
    rows = [[ev, len(es), ms([e["before_s"] for e in es]), ms([e["stall_s"] for e in es]),
             ms([e["after_s"] for e in es]),
             f"{ms([e['wait_s'] for e in es])} ({ms([e['wait_before_s'] for e in es])} before)",
             all(e["exact"] for e in es)] for ev, es in by_event.items()]
    allok = all(it["ok"] for r in d["ranks"] for it in r)
    quiet = "\n\n" + under_load(d["background"]) if "background" in d else ""
    return ("Failover: a blackholed link and a link-down",
            f"Allreduces of {d['bytes'] >> 20} MiB back to back on 4 ranks ({d['lab']}); each operation is timed on "
            "its slowest rank. The stall is the longest operation running within 1 s after the event; median "
            "(min-max) over the rounds; the wait is the longest time between two operations across the event (the "
            "loop's barrier and its check of the result), beside the median wait before it. A blackholed path is set "
            "aside once the network has acknowledged none of its bytes for a few round trips, and its chunks in "
            "flight move to the other paths at once (a fence: the peer drops their originals if they still come); it "
            "is closed once TCP's own resends go unanswered too (csrc/multipath/path_health.h). Every result exact "
            f"on every rank: **{allok}**.\n\n"
            + table(["event", "rounds", "op before (ms)", "stall (ms)", "op after (ms)", "wait between ops (ms)",
                     "all exact"], rows)
            + quiet + "\n\n" + save(fig, out, "failover"))


def under_load(b: dict) -> str:
    """The failover loop run with background traffic on every spine: how many
    paths it closed (the detector's false alarms), its pace, exactness."""
    closed, paths = paths_closed(b)
    ops = sorted(max(r[i]["seconds"] for r in b["ranks"]) for i in range(min(len(r) for r in b["ranks"])))
    verdict = "No false alarm under load" if closed == 0 else "**False alarms under load**"
    return (f"{verdict}: the same loop for {b['ranks'][0][-1]['start']:.0f} s with UDP "
            f"background on every spine ({', '.join(f'{m} Mbit/s on spine {sp}' for sp, m in b['udp_mbit'].items())}) "
            f"and saturating TCP on spines {' and '.join(map(str, b['tcp_spines']))}: **{closed} of {paths} paths "
            f"closed**, {len(ops)} operations (median {ops[len(ops) // 2] * 1e3:.0f} ms, slowest "
            f"{ops[-1] * 1e3:.0f} ms), every result exact: **{all(it['ok'] for r in b['ranks'] for it in r)}**."
            + close_reasons(b))


def close_reasons(run: dict) -> str:
    """Why each path the run closed was closed (the closing side's last error),
    where the run recorded it."""
    lines = [f"rank {rank} to rank {c['peer']}, path {c['path']}: {c['last_error']}"
             for rank, closed in enumerate(run.get("closed_paths") or []) for c in closed
             if c["last_error"] and "by the peer" not in c["last_error"] and "reset by peer" not in c["last_error"]]
    return "".join(f"\n- {line}" for line in lines)


def paths_closed(run: dict) -> tuple[int, int]:
    """(paths seen down or reconnected during a loop run, paths), over every
    rank's (peer, path) in its per-iteration snapshots (every iteration's, or
    only those where a path's state changed: `loop --snapshots changes`)."""
    closed, paths = set(), set()
    for rank, its in enumerate(run["ranks"]):
        first = {(p["peer"], p["path"]): p for p in its[0]["paths"]}
        for it in its:
            for p in it.get("paths", ()):
                key = (rank, p["peer"], p["path"])
                paths.add(key)
                if p["state"] == "down" or p["reconnects"] > first.get((p["peer"], p["path"]), p)["reconnects"]:
                    closed.add(key)
    return len(closed), len(paths)


def hunting_runs(d: dict) -> dict:
    """Per variant: the steady-state busbw of each trial (median over the
    iterations of the run's second half, when any hunting is over) and the
    paths re-opened by the end, over both ranks."""
    out = {}
    for run in d["runs"]:
        its = run["iters"]
        half = its[-1]["start"] / 2
        bw = statistics.median(busbw_of_iter(x, run["bytes"], run["world"]) for x in its if x["start"] >= half)
        hunts = sum(p.get("hunts", 0) for r in run["ranks"] for p in r[-1]["paths"])
        ok = all(it["ok"] for r in run["ranks"] for it in r)
        out.setdefault(run["variant"], []).append({"busbw": bw, "hunts": hunts, "ok": ok, "run": run})
    return out


def sec_hunting(rec, out):
    d = rec["data"]
    runs = hunting_runs(d)
    base = statistics.median(t["busbw"] for t in runs.get("unloaded", [{"busbw": float("nan")}]))
    rows = []
    for variant, trials in runs.items():
        bws = [t["busbw"] for t in trials]
        m = statistics.median(bws)
        rows.append([variant, len(trials), f"{m:.1f} [{min(bws):.1f}-{max(bws):.1f}]", f"{m / base:.2f}",
                     f"{m / (d['physical_limit_GBps'] * 1e3):.2f}",
                     statistics.median(t["hunts"] for t in trials), all(t["ok"] for t in trials)])
    fig, ax = plt.subplots(figsize=(7, 3.4))
    for i, (variant, trials) in enumerate(runs.items()):
        for k, t in enumerate(trials):
            its = t["run"]["iters"]
            ax.plot([x["start"] for x in its], [busbw_of_iter(x, t["run"]["bytes"], t["run"]["world"]) for x in its],
                    color=f"C{i}", alpha=0.8 if k == 0 else 0.35, lw=1, label=variant if k == 0 else None)
    ax.axhline(d["physical_limit_GBps"] * 1e3, color="black", ls=":", lw=1, label="physical limit")
    ax.set_xlabel("seconds after the group is up (background starts then)")
    ax.set_ylabel("busbw (MB/s)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.set_title("2 of 4 paths' spines heated after set-up")
    h, n = runs.get("hunting"), runs.get("no hunting")
    note = ""
    if h and n:
        mh, mn = statistics.median(t["busbw"] for t in h), statistics.median(t["busbw"] for t in n)
        note = (f"With hunting, maestro keeps **{mh / base:.2f} of its unloaded busbw** ({mh:.1f} vs {base:.1f} MB/s) "
                f"and reaches **{mh / mn:.2f} x maestro without hunting**. ")
    return ("Path hunting",
            f"{d['lab']}; 64 MiB allreduces in a loop. As soon as the group is up, UDP background at "
            f"{d['background_mbit']} Mbit/s (of {d['core_mbit']}) starts on the spines two of the four paths took, "
            "in each direction (rank 0's outgoing routes from h1 to h3, rank 1's from h3 to h1). Discovery cannot "
            "see that coming; hunting re-opens a path that stays below 0.6 of its siblings' median for 3 s of busy "
            "time from a source port whose probed route avoids the other paths' spines. Steady state = median "
            "busbw over the second half of each run; trials interleaved, spread = [min-max] over trials. "
            f"{note}\n\n"
            + table(["variant", "trials", "busbw MB/s", "x unloaded", "x physical limit", "paths re-opened",
                     "all exact"], rows)
            + "\n\n" + save(fig, out, "hunting"))


def sec_latency(rec, out):
    rows = rec["data"]["rows"]
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    ax.bar([r["variant"] for r in rows], [r["barrier_s"] * 1e3 for r in rows])
    ax.set_ylabel("barrier (ms)")
    lat = next((r for r in rows if r["variant"] == "latency"), None)
    others = [r for r in rows if r["variant"] != "latency" and not is_gloo(r["variant"])]
    note = ""
    if lat and others:
        note = (f"The latency policy's barrier is **{min(r['barrier_s'] for r in others) / lat['barrier_s']:.1f} x "
                f"faster** than the next best maestro policy. ")
    return ("Latency-aware path choice (paper Fig. 12f)",
            "Saturating TCP background fills the shaper queues of spines 0-2; spine 3 stays idle. Small messages "
            f"(barrier tokens, a 64-byte allreduce) take the lowest-RTT path under the latency policy. {note}\n\n"
            + table(["variant", "barrier ms", "64-byte allreduce ms", "probe RTT per path (ms)"],
                    [[r["variant"], r["barrier_s"] * 1e3, r["tiny_allreduce_s"] * 1e3, r.get("rtt_ms", "")] for r in rows])
            + "\n\n" + save(fig, out, "latency"))


def core_share(row: dict, side: int) -> float:
    """Fraction of one core a rank of a point-to-point row kept busy (0:
    sender, 1: receiver): its CPU seconds per GB times the GB per second."""
    return row["cpu_s_per_GB"][side] * row["gbps"] / 8


def sec_overheads(rec, out):
    d = rec["data"]
    p2p = [r for r in d["p2p"]["rows"] if not is_gloo(r["variant"])]
    setup = d["setup"]["rows"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.4))
    a1.plot([r["paths"] for r in p2p], [max(r["cpu_s_per_GB"]) for r in p2p], "o-", label="busier rank")
    a1.set_xlabel("paths")
    a1.set_ylabel("CPU s per GB moved")
    a2.plot([r["paths"] for r in setup], [r["setup_s"] * 1e3 for r in setup], "o-")
    a2.set_xlabel("paths")
    a2.set_ylabel("group set-up (ms)")
    def per_path(r):  # the receiving rank's, the busier one
        return core_share(r, 1) / r["paths"]
    worst = max(p2p, key=per_path)
    return ("Overheads (paper Fig. 13, Table 3)",
            "CPU time of each rank process (all threads) per GB transferred point to point at line rate, and the "
            "time to create a group (rendezvous, connections) vs the number of paths. The share of a core is that "
            "CPU time per second at the measured rate (CPU s/GB x GB/s). The receiving rank, the busier one, uses "
            f"at most **{per_path(worst) * 100:.1f} % of a core per path** (with "
            f"{worst['paths']} path{'s' if worst['paths'] > 1 else ''}; the paper's budget: about 6 %).\n\n"
            + table(["paths", "Gbit/s", "CPU s/GB sender", "CPU s/GB receiver", "core share sender",
                     "core share receiver", "receiver per path"],
                    [[r["paths"], r["gbps"], r["cpu_s_per_GB"][0], r["cpu_s_per_GB"][1],
                      f"{core_share(r, 0) * 100:.1f} %", f"{core_share(r, 1) * 100:.1f} %",
                      f"{per_path(r) * 100:.1f} %"] for r in p2p]) + "\n\n"
            + table(["paths", "set-up ms"], [[r["paths"], r["setup_s"] * 1e3] for r in setup])
            + "\n\n" + save(fig, out, "overheads"))


def sec_discovery(rec, out):
    trials = rec["data"]["trials"]
    n = rec["data"]["world"]
    res = []
    for rank in range(n):
        for t in trials[rank]:
            hops = [h for h in t["hops_to_right"] if h]
            res.append((rank, len(set(hops)), t["setup_s"], t["ok"]))
    crossing = [r for r in res if r[0] in (1, 3)]  # ranks whose right neighbour is across the core
    good = sum(1 for r in crossing if r[1] == 4)
    return ("Disjoint path discovery under ECMP (paper §4.1)",
            f"In ECMP mode (no pinning) each fresh group runs discovery; a trial succeeds when the 4 paths of a "
            f"core crossing (ranks 1->2 and 3->0) take 4 distinct spines. **{good} of {len(crossing)} "
            f"({100 * good / max(1, len(crossing)):.0f} %)** succeeded; median group set-up "
            f"{statistics.median(r[2] for r in res):.2f} s; every allreduce correct: {all(r[3] for r in res)}.\n")


def sec_footprint(rec, out):
    fp = rec["data"]["footprint"]
    # maestro-eager (every pair connected at start-up) where the record has it.
    variants = [v for v in ("maestro", "maestro-eager", "gloo") if any(r["backend"] == v for r in fp["runs"])]
    rows, series = [], {}
    for world in fp["worlds"]:
        row = [world]
        for backend in variants:
            runs = [r for r in fp["runs"] if r["world"] == world and r["backend"] == backend]
            ranks = [x for r in runs for x in r["ranks"]]

            def spread(key, fmt="{:.0f}"):
                vals = [x[key] for x in ranks]
                med = statistics.median(vals)
                return med, (fmt.format(med) if min(vals) == max(vals)
                             else f"{fmt.format(med)} ({fmt.format(min(vals))}-{fmt.format(max(vals))})")
            cells = {k: spread(k) for k in ("threads", "fds", "rss_MB")}
            cells["setup_s"] = spread("setup_s", "{:.2f}")
            row += [cells[k][1] for k in ("threads", "fds", "rss_MB", "setup_s")]
            for k in ("threads", "fds"):
                series.setdefault((backend, k), []).append(cells[k][0])
        rows.append(row)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    styles = {"maestro": "o-", "maestro-eager": "^:", "gloo": "s--"}
    for ax, k, label in ((axes[0], "threads", "threads per rank"), (axes[1], "fds", "open descriptors per rank")):
        for backend in variants:
            ax.plot(fp["worlds"], series[(backend, k)], styles[backend], label=backend)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("ranks")
        ax.set_ylabel(label)
        ax.legend()
    size = rec["data"]["cpu"]["runs"][0]["bytes"] >> 20 if rec["data"]["cpu"]["runs"] else 0
    header = ["ranks"] + [f"{v} {k}" for v in variants for k in ("threads", "fds", "RSS MB", "set-up s")]
    eager = ("; maestro as it comes connects a rank's ring neighbours and barrier partners (2^k ranks away) at "
             "start-up and any other pair on first use, maestro-eager (MAESTRO_CONNECT=eager) every pair at start-up"
             if "maestro-eager" in variants else "")
    return ("Footprint and CPU cost per rank (loopback)",
            f"Per rank, after one small allreduce in a fresh group: threads, open file descriptors, resident "
            f"memory (MB, torch included) and set-up time (s, init_process_group to the first allreduce), median "
            f"(min-max) over every rank of {fp['trials']} interleaved launches; maestro with {fp['paths']} paths "
            f"per peer{eager}.\n\n"
            + table(header, rows)
            + f"\n\nAllreduce of {size} MiB on this host (maestro's defaults: 4 loopback paths), both groups in the "
              f"same processes, timed alternately: busbw median (min-max) over the rounds, and CPU seconds (user + "
              f"system, every thread of every rank) per GB of tensor reduced.\n\n"
            + footprint_cpu_table(rec) + "\n\n" + footprint_subgroups(rec) + save(fig, out, "footprint"))


def footprint_subgroups(rec: dict) -> str:
    """What a 2-D DeviceMesh's row and column groups add to a rank, where the
    record has it."""
    sg = rec["data"].get("subgroups")
    if not sg:
        return ""
    variants = [v for v in ("maestro", "maestro-own", "gloo") if any(r["backend"] == v for r in sg["runs"])]
    rows = []
    for world in sg["worlds"]:
        row = [f"{world} ({world // 4} x 4)"]
        for backend in variants:
            ranks = [x for r in sg["runs"] if r["world"] == world and r["backend"] == backend for x in r["ranks"]]
            for key, fmt in (("fds_added", "{:.0f}"), ("threads_added", "{:.0f}"), ("setup_s", "{:.2f}")):
                vals = [x[key] for x in ranks]
                row.append(spread_cell(statistics.median(vals), vals, fmt))
        rows.append(row)
    header = ["ranks (mesh)"] + [f"{v} {k}" for v in variants for k in ("+fds", "+threads", "set-up s")]
    return (f"Subgroups: what the two groups of a 2-D DeviceMesh (`init_device_mesh(\"cpu\", (n/4, 4))`: each "
            f"rank in a row and a column group) add to a rank once each has run an allreduce, median (min-max) over "
            f"every rank of {sg['trials']} interleaved launches, {sg['paths']} paths per peer. maestro as it comes "
            f"runs its subgroups on the default group's paths (a descriptor is added only where a subgroup needs a "
            f"pair the default group had not connected); maestro-own (MAESTRO_SHARE_PATHS=0) gives each subgroup "
            f"paths of its own. Set-up: from init_device_mesh to the end of the last subgroup's allreduce.\n\n"
            + table(header, rows) + "\n\n")


def footprint_cpu_table(rec: dict) -> str:
    """The loopback allreduce of the footprint experiment: busbw and CPU per GB
    reduced, maestro vs gloo, per world size."""
    rows = []
    for run in rec["data"]["cpu"]["runs"]:
        med = {b: {k: statistics.median(r[k] for r in run["backends"][b]) for k in ("busbw_GBps", "cpu_s_per_GB")}
               for b in ("maestro", "gloo")}
        bw = {b: [r["busbw_GBps"] for r in run["backends"][b]] for b in ("maestro", "gloo")}
        rows.append([run["world"], spread_cell(med["maestro"]["busbw_GBps"], bw["maestro"], "{:.2f}"),
                     spread_cell(med["gloo"]["busbw_GBps"], bw["gloo"], "{:.2f}"),
                     f"**{med['maestro']['busbw_GBps'] / med['gloo']['busbw_GBps']:.2f}x**",
                     med["maestro"]["cpu_s_per_GB"], med["gloo"]["cpu_s_per_GB"]])
    return table(["ranks", "maestro busbw GB/s", "gloo busbw GB/s", "maestro vs gloo", "maestro CPU s/GB",
                  "gloo CPU s/GB"], rows)


SECTIONS = {"p2p_paths": sec_p2p_paths, "chunk_size": sec_chunk_size, "collectives": sec_collectives,
            "spines": sec_spines,
            "mid_size": sec_mid_size, "p2p_alltoall": sec_p2p_alltoall, "models": sec_models, "load_balance": sec_load_balance,
            "detection": sec_detection, "resiliency": sec_resiliency, "failover": sec_failover,
            "latency": sec_latency,
            "overheads": sec_overheads, "discovery": sec_discovery, "hunting": sec_hunting,
            "footprint": sec_footprint, "fabric_sim": fabric_sim_report.section, "gpu": gpu_report.section}


# ---------------------------------------------------------------- docs/performance.md

def markers(name: str) -> tuple[str, str]:
    return f"<!-- generated:{name} -->", f"<!-- /generated:{name} -->"


def runs_of(recs: dict, names) -> dict:
    """{(command, maestro commit, date): [record names]}: the runs that made
    the records `names`, in their order."""
    runs = {}
    for n in names:
        r = recs[n]
        runs.setdefault((r["command"], r["machine"]["maestro_commit"], r["date"][:10]), []).append(n)
    return runs


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
            bw = allreduce_busbw(col["data"]["runs"][f"{mode}/allreduce"], 64 << 20)
            g = best_gloo(bw)
            cells = [f"{v}: {bw[v]:.1f} MB/s = {bw[v] / limit:.2f} x limit"
                     + (f", **{bw[v] / g[1]:.2f}x** the best gloo" if g else "")
                     for v in ("adaptive", congestion_variant(bw)) if v in bw]
            label = ecmp_label(col["data"]["runs"][f"{mode}/allreduce"]) if mode == "ecmp" else mode
            rows.append([f"{label}, 64 MiB allreduce busbw",
                         "; ".join(cells + [f"best gloo {gloo_cell(g, bw, '{:.1f} MB/s')}"]), target])
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


def congestion_variant(variants) -> str:
    """The variant the collectives run times beside the default's
    congestion control: adaptive+kernel (the kernel's default), or in
    records before it, adaptive+cubic."""
    return next((v for v in ("adaptive+kernel", "adaptive+cubic") if v in variants), "adaptive+kernel")


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


PERFORMANCE_TABLES = {"loopback": perf_loopback, "targets": perf_targets, "congestion": perf_congestion}


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


# ---------------------------------------------------------------- sanity

def sanity(recs: dict) -> list[str]:
    """What a smoke run must show (not speed): every experiment ran, every
    figure is a positive number, every checked result was exact, and the
    fault experiments saw what they injected."""
    bad = []

    def positive(name, what, x):
        if not (isinstance(x, (int, float)) and x > 0 and x == x and x != float("inf")):
            bad.append(f"{name}: {what} = {x!r}, expected a positive number")

    for name, rec in recs.items():
        if rec["status"] != "ok":
            bad.append(f"{name}: {rec['status']}: {rec['data'].get('error', '')[-300:]}")
            continue
        d = rec["data"]
        try:
            if name in ("p2p_paths",):
                for r in d["rows"]:
                    positive(name, f"{r['variant']} Gbit/s", r["gbps"])
            elif name == "chunk_size":
                for r in d["rows"]:
                    positive(name, f"{r['chunk']} busbw", r["busbw_GBps"])
                    positive(name, f"{r['chunk']} chunk samples", len(r["chunk_times_s"]))
                    positive(name, f"{r['chunk']} smallest chunk time", min(r["chunk_times_s"]))
            elif name == "mid_size":
                for (coll, v, b), xs in mid_size_cells(d).items():
                    for x in xs:
                        positive(name, f"{coll} {v} {b} B busbw", x)
                for coll, trials in d["runs"].items():
                    for run in trials:
                        for r in run["rows"]:
                            if not r["exact"]:
                                bad.append(f"{name}: {coll} {r['variant']} {r['bytes']} B: the result was wrong")
            elif name == "spines":
                for run in d["runs"]:
                    for r in run["rows"]:
                        positive(name, f"{r['variant']} {r['bytes']} B busbw", r["busbw_GBps"])
                        if not r["exact"]:
                            bad.append(f"{name}: {r['variant']} {r['bytes']} B: the result was wrong")
            elif name in ("collectives", "p2p_alltoall"):
                for key, run in d["runs"].items():
                    for r in run["rows"]:
                        positive(name, f"{key} {r['variant']} {r['bytes']} B busbw", r["busbw_GBps"])
                        if r.get("exact") is False:  # records before rank_bench checked results have none
                            bad.append(f"{name}: {key} {r['variant']} {r['bytes']} B: the result was wrong")
            elif name == "models":
                for key, run in d["runs"].items():
                    for r in run["rows"]:
                        positive(name, f"{key} {r['variant']} seconds", r.get("sync_s", r.get("iteration_s")))
                        # benchmarks/train.py on maestro; single uses path 0 only
                        if r.get("path_bytes_sent") is not None and r["variant"] != "single":
                            positive(name, f"{key} {r['variant']} bytes on its least used path",
                                     min(r["path_bytes_sent"]))
            elif name == "load_balance":
                for policy, run in d["runs"].items():
                    its = run["ranks"][1][1:]
                    positive(name, f"{policy} iterations", len(its))
                    positive(name, f"{policy} busbw", statistics.median(busbw_of_iter(x, run["bytes"], run["world"])
                                                                          for x in its))
                    if not all(it["ok"] for r in run["ranks"] for it in r):
                        bad.append(f"{name}: {policy}: an allreduce result was wrong")
            elif name in ("detection", "resiliency"):
                positive(name, "iterations", len(d["iters"]))
                if not all(it["ok"] for r in d["ranks"] for it in r):
                    bad.append(f"{name}: an allreduce result was wrong")
                if len(d["events"]) != 3:
                    bad.append(f"{name}: {len(d['events'])} of 3 link events happened during the run")
                down = sum(1 for r in d["ranks"] for p in r[-1]["paths"] if p["state"] == "down")
                if name == "detection" and down:
                    bad.append(f"detection: {down} paths still down at the end (every link was up)")
                if name == "resiliency" and not down:
                    bad.append("resiliency: no path was seen down after 3 links were cut")
            elif name == "failover":
                if len(d["events"]) != 4 * d["rounds"]:
                    bad.append(f"{name}: {len(d['events'])} of {4 * d['rounds']} link events happened during the run")
                for e in failover_events(d):
                    positive(name, f"stall at {e['event']}", e["stall_s"])
                    if not e["exact"]:
                        bad.append(f"{name}: an allreduce result was wrong around {e['event']}")
                # The blackholed link's paths (rank 1 -> 2 crosses it) went down and were moved off.
                if not any(p["state"] == "down" for it in d["ranks"][1] for p in it["paths"] if p["peer"] == 2):
                    bad.append(f"{name}: no path of rank 1 to rank 2 was seen down after L0-s3 was blackholed")
            elif name == "latency":
                for r in d["rows"]:
                    positive(name, f"{r['variant']} barrier", r["barrier_s"])
            elif name == "overheads":
                for r in d["p2p"]["rows"]:
                    positive(name, f"{r['variant']} Gbit/s", r["gbps"])
                for r in d["setup"]["rows"]:
                    positive(name, f"set-up with {r['paths']} paths", r["setup_s"])
            elif name == "footprint":
                for r in d["footprint"]["runs"]:
                    for x in r["ranks"]:
                        positive(name, f"{r['backend']} x{r['world']} threads", x["threads"])
                        positive(name, f"{r['backend']} x{r['world']} set-up", x["setup_s"])
                for r in d.get("subgroups", {}).get("runs", []):
                    for x in r["ranks"]:
                        positive(name, f"subgroups {r['backend']} x{r['world']} set-up", x["setup_s"])
                for run in d["cpu"]["runs"]:
                    for b, rounds in run["backends"].items():
                        for r in rounds:
                            positive(name, f"{b} x{run['world']} busbw", r["busbw_GBps"])
                            positive(name, f"{b} x{run['world']} CPU s/GB", r["cpu_s_per_GB"])
            elif name == "hunting":
                runs = hunting_runs(d)
                for variant, trials in runs.items():
                    for t in trials:
                        positive(name, f"{variant} busbw", t["busbw"])
                        if not t["ok"]:
                            bad.append(f"{name}: {variant}: an allreduce result was wrong")
                if not any(t["hunts"] for t in runs.get("hunting", [])):
                    bad.append("hunting: no path was re-opened with hunting on, under background on two spines")
                if any(t["hunts"] for t in runs.get("no hunting", []) + runs.get("unloaded", [])):
                    bad.append("hunting: a path was re-opened with hunting off, or without background")
            elif name == "discovery":
                trials = [t for r in d["trials"] for t in r]
                positive(name, "trials", len(trials))
                if not all(t["ok"] for t in trials):
                    bad.append("discovery: an allreduce after discovery was wrong")
        except (KeyError, IndexError, TypeError, ValueError) as e:
            bad.append(f"{name}: malformed record ({type(e).__name__}: {e})")
    return bad


# ---------------------------------------------------------------- headline

def headline(recs: dict) -> list[list]:
    """The README's rows: maestro (the default policy) against the best gloo
    configuration measured for that row, named."""
    rows = []
    col = recs.get("collectives")
    if col and col["status"] == "ok":
        limit = col["data"]["physical_limit_GBps"] * 1e3
        for mode in ("pinned", "ecmp"):
            run = col["data"]["runs"].get(f"{mode}/allreduce")
            if not run:
                continue
            sizes = {r["bytes"] for r in run["rows"]}
            top = 64 << 20 if 64 << 20 in sizes else max(sizes)  # 64 MiB: the headline size
            # and 1 MiB, a mid-size message (FSDP shards, small buckets): the default only
            for size in [top] + ([1 << 20] if 1 << 20 in sizes and top != 1 << 20 else []):
                get = {r["variant"]: r["busbw_GBps"] * 1e3 for r in run["rows"] if r["bytes"] == size}
                g = best_gloo(get)
                other = congestion_variant(get)
                shown = [("adaptive", "")]
                if size == top:
                    shown.append((other, f", MAESTRO_TCP_CONGESTION={maestro_policy(other)[1]}"))
                for variant, how in shown:
                    if variant not in get:
                        continue
                    m = get[variant]
                    rows.append([f"allreduce {size_label(size)} busbw, " + (ecmp_label(run) if mode == "ecmp" else mode)
                                 + how, f"{m:.0f} MB/s ({m / limit:.0%} of {limit:.0f})", gloo_cell(g, get, "{:.0f} MB/s"),
                                 f"**{m / g[1]:.2f}x**" if g else "-", "≥ 2x on collectives"])
    sp = recs.get("spines")
    if sp and sp["status"] == "ok":
        limit = sp["data"]["physical_limit_GBps"] * 1e3
        cells = spines_cells(sp["data"])
        size = max(b for _, b in cells)
        get = {v: statistics.median(xs) for (v, b), xs in cells.items() if b == size}
        g = best_gloo(get)
        if "adaptive" in get:
            m = get["adaptive"]
            rows.append([f"allreduce {size >> 20} MiB busbw, ECMP, {sp['data']['spines']} spines and "
                         f"{sp['data']['aliases']} vNICs, defaults (paths=auto)",
                         f"{m:.0f} MB/s ({m / limit:.0%} of {limit:.0f}); "
                         f"{m / get['adaptive@paths=4']:.2f}x one path per vNIC" if "adaptive@paths=4" in get else
                         f"{m:.0f} MB/s ({m / limit:.0%} of {limit:.0f})",
                         gloo_cell(g, get, "{:.0f} MB/s"), f"**{m / g[1]:.2f}x**" if g else "-",
                         "≥ 2x on collectives"])
    mod = recs.get("models")
    if mod and mod["status"] == "ok":
        for key, run in mod["data"]["runs"].items():
            field = "sync_s" if key.endswith("buckets") else "exposed_comm_s"
            r = {x["variant"]: x[field] for x in run["rows"]}
            g = best_gloo(r, lower_is_better=True)
            if "adaptive" not in r or not g:
                continue
            m = r["adaptive"]
            what = "gradient sync" if key.endswith("buckets") else "exposed comm (DDP)"
            rows.append([f"{key.split('/')[0]} {what} per iteration", f"{m:.2f} s", gloo_cell(g, r, "{:.2f} s"),
                         f"**{(1 - m / g[1]) * 100:.0f} % less**", "up to 66.7 % less transport time"])
    lb = recs.get("load_balance")
    if lb and lb["status"] == "ok":
        bws = load_balance_busbw(lb["data"])
        g = best_gloo(bws)
        if "adaptive" in bws:
            m = f"{bws['adaptive']:.0f} MB/s (adaptive)"
            if "round_robin" in bws:
                m += f"; {bws['adaptive'] / bws['round_robin']:.2f}x round_robin"
            rows.append(["allreduce busbw with background on 3 spines", m, gloo_cell(g, bws, "{:.0f} MB/s"),
                         f"**{bws['adaptive'] / g[1]:.2f}x**" if g else "-", "load follows residual capacity"])
    return rows


HEADLINE = ["maestro", "best gloo (which)", "maestro vs best gloo", "paper's claim"]


def render(recs: dict, out: str) -> str:
    head = headline(recs)
    md = ["# Results", "",
          "Generated by `benchmarks/report.py` from the JSON that `scripts/bench.sh` (benchmarks/suite.py) wrote to "
          "`docs/results/data/`; every number below comes from those files. The lab is the namespace leaf-spine "
          "network of `scripts/netlab.py` (4 hosts on 2 leaves, 4 spines unless said otherwise, core links "
          "200 Mbit/s, access links 1 Gbit/s, one rank per host, each rank's vNICs = its host's aliases).", ""]
    if head:
        md += ["## Headline", "", "Maestro's default policy against the best gloo configuration measured for each "
               "row (gloo with one device, or gloo-4dev: one device per vNIC address), named beside its figure.", "",
               table(["measure"] + HEADLINE, head), ""]
    for name, fn in SECTIONS.items():
        rec = recs.get(name)
        if rec is None:
            continue
        if rec["status"] != "ok":
            md += [f"## {name}", "", f"This experiment failed: `{rec['data'].get('error', '')[-400:]}`",
                   provenance(rec), ""]
            continue
        title, body = fn(rec, out)
        md += [f"## {title}", "", body, provenance(rec), ""]
    return "\n".join(md)


def update_readme(readme: str, recs: dict) -> None:
    text = open(readme).read()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{readme}: markers {BEGIN} / {END} not found")
    # A simulation and the GPU machine's loopback: not the lab's headline.
    recs = {k: r for k, r in recs.items() if k not in ("fabric_sim", "gpu")}
    rows = headline(recs)
    runs = runs_of(recs, recs)
    commands = list(dict.fromkeys((cmd, c) for cmd, c, _ in runs))
    commits = list(dict.fromkeys(c for _, c in commands))
    if len(commits) == 1:  # one run at one commit, as a record should be
        source = ", ".join(f"`{cmd}`" for cmd, _ in commands) + f" at maestro {commits[0]}"
    else:
        source = "; ".join(f"`{cmd}` at maestro {c}" for cmd, c in commands) + f" ({len(commits)} commits)"
    dates = sorted({d for _, _, d in runs})
    block = (f"{BEGIN}\n" + table(["measure (namespace leaf-spine lab, 4 ranks)"] + HEADLINE, rows)
             + f"\n\nFrom {source}, on {dates[0] if dates[0] == dates[-1] else dates[0] + ' to ' + dates[-1]}; "
               f"details, plots and commands in [docs/results.md](docs/results.md).\n{END}")
    start, end = text.index(BEGIN), text.index(END) + len(END)
    open(readme, "w").write(text[:start] + block + text[end:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=os.path.join(ROOT, "docs", "results", "data"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs"), help="results.md and results/*.png go here")
    ap.add_argument("--readme", default=os.path.join(ROOT, "README.md"), help="README to update ('' = none)")
    ap.add_argument("--performance", help="performance notes whose generated tables to update (default: "
                                           "OUT/performance.md where it exists, as docs/performance.md does; '' = none)")
    args = ap.parse_args()
    if args.performance is None:  # a report into another folder leaves docs/performance.md alone
        beside = os.path.join(args.out, "performance.md")
        args.performance = beside if os.path.exists(beside) else ""
    return generate(args.data, args.out, args.readme, args.performance)


def generate(data: str, out: str, readme: str, performance: str = "") -> int:
    """results.md and plots under `out` from the JSON in `data`; the headline
    into `readme` and the tables of `performance` unless they are ''."""
    recs = load(data)
    if not recs:
        print(f"no results in {data}", file=sys.stderr)
        return 1
    for problem in sanity(recs):
        print(f"warning: {problem}", file=sys.stderr)
    os.makedirs(out, exist_ok=True)
    md = render(recs, out)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(md)
    if readme:
        update_readme(readme, recs)
    if performance:
        update_performance(performance, recs)
    print(f"wrote {os.path.join(out, 'results.md')} ({len(recs)} experiments)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
