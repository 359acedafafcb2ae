"""The bandwidth sections: point to point vs paths, chunk size, the
collectives sweeps, more spines than vNICs, point to point and all-to-all,
mid-size messages, small messages launch by launch, the tuner's algorithm
choice for small and mid-size allreduce; and the helpers of sweep records
(rank_bench.py sweep) and of interleaved trials."""
from __future__ import annotations

import statistics

from matplotlib.ticker import LogFormatter
from variants import is_gloo, is_maestro, maestro_knobs

from .common import plt, save, size_label, spread_cell, table
from .peers import best_gloo, ecmp_settings, not_measured


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
    ascending, and its rows by (variant, bytes): a variant run up to a
    smaller size (--up-to) has no row above it."""
    rows = run["rows"]
    return (list(dict.fromkeys(r["variant"] for r in rows)), sorted({r["bytes"] for r in rows}),
            {(r["variant"], r["bytes"]): r for r in rows})


def iter_busbw(row: dict) -> list[float]:
    """Each iteration's busbw (MB/s) of a sweep row: its times are the
    slowest rank's, its busbw_GBps that of their median."""
    return [row["busbw_GBps"] * 1e3 * row["seconds"] / t for t in row["times"]]


def plot_sweep(ax, run: dict, title: str, limit: float | None, spread: bool = False) -> None:
    """busbw (MB/s) vs size, a line per variant (gloo dashed), the physical
    limit dotted; spread: each point's min-max over iterations as error bars."""
    variants, all_sizes, get = sweep_grid(run)
    for i, v in enumerate(variants):
        sizes = [s for s in all_sizes if (v, s) in get]
        ys = [get[(v, s)]["busbw_GBps"] * 1e3 for s in sizes]
        style = "s--" if is_gloo(v) else "o-"
        if spread:  # each variant's bars a little aside, so that they do not hide one another
            its = [iter_busbw(get[(v, s)]) for s in sizes]
            xs = [s * 2 ** (0.12 * (i - (len(variants) - 1) / 2)) for s in sizes]
            ax.errorbar(xs, ys, yerr=[[y - min(b) for y, b in zip(ys, its)], [max(b) - y for y, b in zip(ys, its)]],
                        fmt=style, capsize=3, label=v)
        elif any(len(get[(v, s)].get("trials_busbw_GBps", ())) > 1 for s in sizes):  # passes: their min-max
            tb = [[x * 1e3 for x in get[(v, s)].get("trials_busbw_GBps", [get[(v, s)]["busbw_GBps"]])] for s in sizes]
            ax.errorbar(sizes, ys, yerr=[[y - min(b) for y, b in zip(ys, tb)], [max(b) - y for y, b in zip(ys, tb)]],
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


def not_run_note(run: dict, variants: list) -> str:
    """The peers a sweep left out on purpose (not_run), the variants it ran
    up to a smaller size only (--up-to), and why ('' when none)."""
    cells = [p for p in run.get("not_run", ()) if p not in variants]
    cells += [f"{v} above {size_label(b)}" for v, b in run.get("up_to", {}).items()]
    if not cells:
        return ""
    why = f" ({run['why_not_run']})" if run.get("why_not_run") else ""
    return f"\n\n*Not run: {', '.join(cells)}{why}.*"


def timing_note(runs) -> str:
    """How a sweep's cells were timed, from what its rows say."""
    rows = [r for run in runs for r in run["rows"]]
    cold = sorted({(r["bytes"], r["variant"]) for r in rows if r.get("warmups") == 0})
    note = ("Cells: busbw of the median of the cell's timed iterations (each timed on the slowest rank; "
            "the spread in the plots), every result checked after the cell's first call")
    if cold:
        cells = ", ".join(f"{v} at {size_label(b)}" for b, v in cold)
        note += (f"; these cells have no warm-up call, as one call of theirs takes 8 s or more (a new tensor's "
                 f"first-use costs are lost in it), and their check follows their first timed call, untimed: {cells}")
    twos = sorted({r["bytes"] for r in rows} - {r["bytes"] for r in rows if r["iters"] != 2})
    if twos:
        note += f"; {', '.join(size_label(b) for b in twos)}: 2 iterations, their mean"
    return note + "."


def busbw_cell(row: dict, spread: list | None = None) -> float | str:
    """A sweep cell's busbw (MB/s): 'median (min-max)' over the passes of a
    cell run in several (median_of_trials); else over `spread` (MB/s, e.g.
    its iterations') where given, else the number."""
    passes = [x * 1e3 for x in row.get("trials_busbw_GBps", ())]
    if len(passes) > 1:
        return spread_cell(row["busbw_GBps"] * 1e3, passes)
    return row["busbw_GBps"] * 1e3 if spread is None else spread_cell(row["busbw_GBps"] * 1e3, spread)


def cpu_table(run: dict, variants: list, sizes: list) -> str:
    """A sweep's CPU seconds per GB, a row per size (of each cell's row:
    the median pass where it ran in several), or '' where none was recorded."""
    cpu = cpu_cells([run])
    if not cpu:
        return ""
    return ("CPU seconds per GB of messages (each rank's, all its threads, over the timed iterations; "
            "the mean over ranks):\n\n"
            + table(["size"] + variants, [[size_label(s)] + [f"{cpu[(v, s)][0]:.2f}" if (v, s) in cpu else "-"
                                                             for v in variants] for s in sizes]) + "\n\n")


def passes_note(run: dict) -> str:
    """Which cells of a sweep are medians over passes ('' when none): those
    of --repeat over the --trials passes, and those of --extra-passes over
    these and its own."""
    passes = len(run.get("trials", ()))
    rep, extra = run.get("repeat"), run.get("extra_passes")
    trials = passes - (extra["passes"] if extra else 0)
    parts = []
    if rep and trials > 1:
        parts.append(f"{', '.join(rep['variants'])} up to {size_label(rep['up_to'])}: the median of "
                     f"{trials} interleaved passes")
    if extra:
        # An extra pass's cells ran in the first pass, and in the repeated ones where --repeat has them.
        again = bool(rep) and set(extra["variants"]) <= set(rep["variants"]) and extra["up_to"] <= rep["up_to"]
        parts.append(f"{', '.join(extra['variants'])} up to {size_label(extra['up_to'])} (latency-bound): "
                     f"the median of {(trials if again else 1) + extra['passes']}" + ("" if parts else " interleaved passes"))
    if not parts:
        return ""
    return f"\n\n*{'; '.join(parts)}, each pass rotating their order (min-max beside it); every other cell: one pass.*"


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
            bw = {v: get[(v, s)]["busbw_GBps"] for v in variants if (v, s) in get}
            g = best_gloo(bw)
            best = max((x for v, x in bw.items() if not is_gloo(v) and v != "single"), default=None)
            trs.append([size_label(s)] + [busbw_cell(get[(v, s)]) if v in bw else "-" for v in variants]
                       + [g[0] if g else "-", best / g[1] if g and best else "-",
                          bw["single"] / bw["gloo"] if "single" in bw and "gloo" in bw else "-"])
        parts.append(f"**{key}** ({ecmp_settings(run)})\n\n" if key.startswith("ecmp") else f"**{key}**\n\n")
        parts[-1] += (table(hdr, trs) + passes_note(run) + not_run_note(run, variants)
                      + not_measured(variants, run.get("not_run", ())) + "\n\n")
        parts[-1] += cpu_table(run, variants, sizes)
        parts[-1] += save(fig, out, "collectives_" + key.replace("/", "_"))
    return ("Collectives vs gloo (paper Fig. 10)",
            f"nccl-tests busbw on 4 ranks (the ring crosses the core twice; physical limit {limit:.0f} MB/s = the "
            f"sum of the 4 core links one crossing uses, each {rec['data']['core_mbit']} Mbit/s), every load "
            "balancing policy and the peers in the same processes: gloo (one device), gloo-4dev (one gloo device "
            "per vNIC address; one collective still takes one device) and single (maestro on one path). "
            + timing_note(rec["data"]["runs"].values()) + "\n\n"
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
            trs.append([size_label(s)] + [busbw_cell(get[(v, s)], iter_busbw(get[(v, s)])) for v in variants]
                       + [g[0] if g else "-", ad / g[1] if g and ad else "-", ad / one if ad and one else "-",
                          ad / limits[coll] if ad else "-"])
        wrong = sorted({f"{r['variant']} at {size_label(r['bytes'])}" for r in run["rows"] if r.get("exact") is False})
        parts.append(f"**{coll}** (physical limit {limits[coll]:.0f} MB/s)\n\n"
                     + table(["size"] + [f"{v} busbw MB/s" for v in variants]
                             + ["best gloo", "adaptive / best gloo", "adaptive / single", "adaptive / limit"], trs)
                     + passes_note(run) + not_measured(variants)
                     + (f"\n\n**Wrong results:** {', '.join(wrong)}." if wrong else "")
                     + ("\n\n" + cpu_table(run, variants, sizes)).rstrip())
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
            "gloo device per vNIC address, adaptive@min_chunk_size=256K = the default policy in whole 256 KiB "
            "chunks (at 64 KiB and 1 MiB also without the mid-size cut into one chunk per path) where the "
            "default cuts an exchange's messages to other hosts into 64 KiB chunks, "
            "adaptive@alltoall_window=2 = the default policy with two all-to-all "
            "steps in flight instead of every step, adaptive@exchange_window=8 = the default policy with the "
            "path window's 8 chunks of the exchange a path instead of the 2 the tuner holds across hosts "
            "(where present in the record). Every result was checked after its first call.\n\n"
            + "\n\n".join(parts) + "\n\n" + save(fig, out, "p2p_alltoall"))


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


def small_cells(d: dict) -> dict:
    """{(run, bytes): {variant: [its median busbw over a launch's passes, MB/s, one per launch]}} of the
    small-cells experiment (each run a list of launches, each launch a list of passes)."""
    cells = {}
    for key, launches in d["runs"].items():
        for passes in launches:
            per = {}
            for run in passes:
                for r in run["rows"]:
                    per.setdefault((r["bytes"], r["variant"]), []).append(r["busbw_GBps"] * 1e3)
            for (b, v), xs in per.items():
                cells.setdefault((key, b), {}).setdefault(v, []).append(statistics.median(xs))
    return cells


def launch_ratios(cell: dict, a: str, b: str) -> list[float]:
    """Launch by launch, a's median busbw over b's."""
    return [x / y for x, y in zip(cell[a], cell[b])]


def small_cell_rows(d: dict) -> list[tuple]:
    """The small-cells experiment's cells, per lab in the record's order and
    by size: (lab run, bytes, small_cells' cell, the policy's ratio to
    round_robin per launch, the twin's ratio to round_robin per launch)."""
    policy, rr, twin = d["variants"]
    cells = small_cells(d)
    return [(key, b, cells[(key, b)], launch_ratios(cells[(key, b)], policy, rr),
             launch_ratios(cells[(key, b)], twin, rr))
            for key in d["runs"] for b in sorted(b for k, b in cells if k == key)]


def sec_small_cells(rec, out):
    d = rec["data"]
    policy, rr, twin = d["variants"]
    keys = list(d["runs"])
    launches = len(d["runs"][keys[0]])
    passes = len(d["runs"][keys[0]][0])
    parts = []
    fig, axes = plt.subplots(1, len(keys), figsize=(6 * len(keys), 3.6), squeeze=False)
    for ax, key in zip(axes[0], keys):
        cells = [row[1:] for row in small_cell_rows(d) if row[0] == key]
        sizes = [b for b, *_ in cells]
        rows = []
        for i, (who, fmt) in enumerate(((policy, "o"), (twin, "s"))):
            for j, (b, _, mine, same) in enumerate(cells):
                ys = mine if who == policy else same
                ax.plot([b * 2 ** (0.12 * (i - 0.5))] * len(ys), ys, fmt, alpha=0.6, color=f"C{i}",
                        label=f"{who} / {rr}, one launch" if j == 0 else None)
                ax.plot([b * 2 ** (0.12 * (i - 0.5))], [statistics.median(ys)], "_", ms=18, color=f"C{i}")
        for b, c, mine, same in cells:
            rows.append([size_label(b)]
                        + [spread_cell(statistics.median(c[v]), c[v]) for v in (policy, rr, twin)]
                        + [spread_cell(statistics.median(mine), mine, "{:.3f}"),
                           spread_cell(statistics.median(same), same, "{:.3f}"),
                           f"{sum(x >= 1 for x in mine)} of {len(mine)}"])
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.axhline(0.95, color="red", ls=":", lw=0.8, label="5 % below round_robin")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [size_label(b) for b in sizes])
        ax.set_ylabel(f"busbw / {rr}'s, one launch")
        ax.set_title(f"{key}, 4 ranks, {launches} launches")
        ax.legend(fontsize=7)
        parts.append(f"**{key}**\n\n" + table(
            ["size"] + [f"{v} busbw MB/s" for v in (policy, rr, twin)]
            + [f"{policy} / {rr}", f"{twin} / {rr} (the same configuration)", f"launches {policy} >= {rr}"], rows))
    return ("Small messages: the default policy against round_robin, launch by launch",
            f"allgather up to 64 KiB, where a call is a millisecond or two and latency-bound. {launches} launches "
            f"per lab, each of {passes} interleaved passes over `{policy}`, `{rr}` and `{twin}`, a second group of "
            f"`{rr}`'s configuration; each pass rotates their order, and each launch the order in which the groups "
            "are made. Every cell is the median [min-max] over launches of a launch's value (a busbw: the median "
            f"of its passes; a ratio: the launch's medians divided). `{twin} / {rr}` compares two groups that "
            "differ in nothing: its spread over launches is what one launch of these cells can resolve, and the "
            f"median over launches is the figure the targets judge `{policy} / {rr}` by. The plots show each launch's "
            "ratio (dots) and their median (bars).\n\n"
            + "\n\n".join(parts) + "\n\n" + save(fig, out, "small_cells"))


def tuner_cells(trials: list) -> dict:
    """{(variant, bytes): (every timed iteration's seconds, each trial's median seconds)} of the
    tuner experiment's interleaved sweep trials in one setting."""
    cells = {}
    for run in trials:
        for r in run["rows"]:
            its, meds = cells.setdefault((r["variant"], r["bytes"]), ([], []))
            its.extend(r["times"])
            meds.append(r["seconds"])
    return cells


def tuner_roles(variants: list) -> dict:
    """Which variant of the tuner experiment is which: {"auto", "ring",
    "recursive_doubling", "gloo"} -> its name (those present)."""
    roles = {}
    for v in variants:
        algo = maestro_knobs(v).get("algo", "auto")
        roles.setdefault("gloo" if is_gloo(v) else algo, v)
    return roles


def tuner_crossover(med: dict, roles: dict, sizes: list) -> str:
    """The sentence naming a setting's crossover: the largest size at which
    recursive doubling was faster than ring (med: {(variant, bytes): median
    seconds})."""
    ring, rd = roles.get("ring"), roles.get("recursive_doubling")
    if not ring or not rd:
        return "not measured (ring and recursive_doubling are not both in the record)"
    faster = [b for b in sizes if med[(rd, b)] < med[(ring, b)]]
    if not faster:
        return f"none: ring was faster at every size measured ({size_label(sizes[0])} to {size_label(sizes[-1])})"
    top = faster[-1]
    said = (f"**{size_label(top)}** (ring / recursive_doubling {med[(ring, top)] / med[(rd, top)]:.2f})"
            + (" (the largest size measured)" if top == sizes[-1] else
               f"; ring faster from {size_label(sizes[sizes.index(top) + 1])} on"))
    below = [size_label(b) for b in sizes if b < top and b not in faster]
    return said + (f"; below it, ring was faster at {', '.join(below)}" if below else "")


def sec_tuner(rec, out):
    d = rec["data"]
    variants = d["variants"]
    roles = tuner_roles(variants)
    ring, rd, auto, gloo = (roles.get(k) for k in ("ring", "recursive_doubling", "auto", "gloo"))
    parts, crossings, wrong = [], [], []
    fig, axes = plt.subplots(1, len(d["runs"]), figsize=(5 * len(d["runs"]), 3.6), squeeze=False)
    for ax, (key, trials) in zip(axes[0], d["runs"].items()):
        cells = tuner_cells(trials)
        sizes = sorted({b for _, b in cells})
        med = {k: statistics.median(its) for k, (its, _) in cells.items()}
        label = d.get("settings", {}).get(key, key)
        cpu = cpu_cells(trials)
        rows = []
        for b in sizes:
            forced = ("-" if not ring or not rd else
                      "recursive_doubling" if med[(rd, b)] < med[(ring, b)] else "ring")
            rows.append([size_label(b)]
                        + [spread_cell(med[(v, b)] * 1e3, [x * 1e3 for x in cells[(v, b)][1]], "{:.3f}") for v in variants]
                        + [f"{med[(ring, b)] / med[(rd, b)]:.2f}" if ring and rd else "-", forced,
                           f"{med[(auto, b)] / med[(gloo, b)]:.2f}" if auto and gloo else "-"]
                        + [f"{statistics.median(cpu[(v, b)]):.3g}" if cpu.get((v, b)) else "-"
                           for v in (auto, gloo) if v])
        parts.append(f"**{key}**: {label}\n\n"
                     + table(["size"] + [f"{v} ms" for v in variants]
                             + ["ring / recursive_doubling", "faster forced", "auto / gloo"]
                             + [f"{v} CPU s/GB" for v in (auto, gloo) if v], rows))
        crossings.append(f"- {key}: {tuner_crossover(med, roles, sizes)}")
        wrong += sorted({f"{r['variant']} at {size_label(r['bytes'])} ({key})"
                         for run in trials for r in run["rows"] if r.get("exact") is False})
        for i, v in enumerate(variants):
            xs = [b * 2 ** (0.08 * (i - (len(variants) - 1) / 2)) for b in sizes]
            ys = [med[(v, b)] * 1e3 for b in sizes]
            lo = [max(0.0, y - min(cells[(v, b)][1]) * 1e3) for y, b in zip(ys, sizes)]
            hi = [max(0.0, max(cells[(v, b)][1]) * 1e3 - y) for y, b in zip(ys, sizes)]
            ax.errorbar(xs, ys, yerr=[lo, hi], fmt="s--" if is_gloo(v) else "o-", capsize=3, label=v)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(LogFormatter())  # 20, not 2 x 10^1
        ax.yaxis.set_minor_formatter(LogFormatter(minor_thresholds=(2, 0.4)))
        ax.set_xticks(sizes, [size_label(b) for b in sizes], fontsize=7, rotation=45)
        ax.set_xlabel("bytes")
        ax.set_ylabel("allreduce time (ms)")
        ax.set_title(f"{key}, {trials[0].get('world', '?')} ranks")
        ax.legend(fontsize=7)
    n = len(next(iter(d["runs"].values())))
    return ("Small and mid-size allreduce: the tuner's algorithm choice",
            "Allreduce time per variant: **" + (auto or "auto") + "** is maestro as it comes (`MAESTRO_ALGO=auto`: "
            "the tuner chooses the algorithm per operation, size, group size and transport), beside ring "
            "(reduce-scatter + allgather, 2(n-1) steps) and recursive doubling (log2(n) steps, each exchanging "
            "the whole vector) forced with `@algo=`, and gloo, in the same processes. Cells: the median over every "
            f"timed iteration of {n} interleaved trial{'s' if n != 1 else ''} (each rotates the order of the "
            "variants; an iteration is timed on the slowest rank), in ms, with the min-max of the trials' "
            "medians; the ratios are of those medians (ring / recursive_doubling above 1: recursive doubling "
            "is faster; auto / gloo below 1: maestro is faster); CPU s/GB: each rank's CPU seconds (all its "
            "threads, over the timed iterations) per GB of messages, the mean over ranks, median over trials. "
            "Every result was checked after its first call.\n\n"
            + "\n\n".join(parts)
            + "\n\nThe largest size at which recursive_doubling was faster than ring, per setting:\n\n"
            + "\n".join(crossings)
            + (f"\n\n**Wrong results:** {', '.join(wrong)}." if wrong else "")
            + "\n\n" + save(fig, out, "tuner") + reduce_table(d.get("reduce")))


def reduce_table(red: dict | None) -> str:
    """The reduce's algorithms (the tuner experiment's "reduce"): each
    size's median time per variant over the interleaved trials (min-max of
    the trials' medians), which forced algorithm was fastest, and auto
    against it and against gloo ('' for a record without it)."""
    if not red:
        return ""
    variants, trials = red["variants"], red["runs"]
    cells = tuner_cells(trials)
    sizes = sorted({b for _, b in cells})
    med = {k: statistics.median(its) for k, (its, _) in cells.items()}
    algo = {v: maestro_knobs(v).get("algo", "").partition(":")[2] for v in variants}  # "reduce:tree" -> "tree"
    forced = [v for v in variants if algo[v]]
    auto = next((v for v in variants if not algo[v] and not is_gloo(v)), None)
    gloo = next((v for v in variants if is_gloo(v)), None)
    rows = []
    for b in sizes:
        best = min(forced, key=lambda v: med[(v, b)]) if forced else None
        rows.append([size_label(b)]
                    + [spread_cell(med[(v, b)] * 1e3, [x * 1e3 for x in cells[(v, b)][1]], "{:.3f}") for v in variants]
                    + [algo[best] if best else "-",
                       f"{med[(auto, b)] / med[(best, b)]:.2f}" if auto and best else "-",
                       f"{med[(auto, b)] / med[(gloo, b)]:.2f}" if auto and gloo else "-"])
    wrong = sorted({f"{r['variant']} at {size_label(r['bytes'])}"
                    for run in trials for r in run["rows"] if r.get("exact") is False})
    return ("\n\n**reduce** into rank 0, " + red["setting"] + ": **" + (auto or "auto") + "** as it comes (the "
            "tuner: direct, every rank writing into the root at once, up to its first limit; a binomial tree up to "
            "its second; the ring above) beside each algorithm forced with `@algo=reduce:`, and gloo. Cells as "
            f"above, over {len(trials)} interleaved trial{'s' if len(trials) != 1 else ''}; auto / fastest forced "
            "at 1.00 is the tuner choosing the fastest.\n\n"
            + table(["size"] + [f"{v} ms" for v in variants] + ["fastest forced", "auto / fastest forced",
                                                                 "auto / gloo"], rows)
            + (f"\n\n**Wrong results:** {', '.join(wrong)}." if wrong else ""))
