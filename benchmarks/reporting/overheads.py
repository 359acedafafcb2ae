"""The cost sections: CPU per GB and group set-up vs paths, and the per-rank
footprint (threads, descriptors, memory, set-up; subgroups; the loopback
allreduce's CPU per GB)."""
from __future__ import annotations

import statistics

from variants import is_gloo

from .common import plt, save, spread_cell, table


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
            f"memory (MB, torch included) and set-up time (s, init_process_group to the first allreduce) "
            f"{rank_launch(rec['data'])}, median "
            f"(min-max) over every rank of {launches(fp['trials'])}"
            + (f" (one above {fp['once_above']} ranks)" if fp.get("once_above") else "")
            + f"; maestro with {fp['paths']} paths "
            f"per peer{eager}.\n\n"
            + table(header, rows)
            + f"\n\nAllreduce of {size} MiB on this host (maestro's defaults: 4 loopback paths), both groups in the "
              f"same processes, timed alternately: busbw median (min-max) over the rounds, and CPU seconds (user + "
              f"system, every thread of every rank) per GB of tensor reduced.\n\n"
            + footprint_cpu_table(rec) + "\n\n" + footprint_subgroups(rec) + save(fig, out, "footprint"))


def rank_launch(d: dict) -> str:
    """How the footprint's ranks were started: what their memory holds."""
    if d.get("rank_launch") == "prefork":
        return ("of ranks started with torchrun's environment, each forked from a process that has imported torch "
                "(scripts/prefork.py; a torchrun worker also holds the modules its agent imported, so more memory)")
    return "of ranks started by torchrun"


def launches(trials: int) -> str:
    return "one launch per variant" if trials == 1 else f"{trials} interleaved launches"


def in_footprint_launch(sg: dict) -> str:
    """Which variants' subgroups were measured in their footprint launch
    (after its figures, from the state a launch of their own starts in)."""
    shared = sg.get("in_footprint_launch")
    if not shared:
        return ""
    return f" ({' and '.join(shared)}: in their footprint launch, after its figures, from the same state)"


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
            f"every rank of {launches(sg['trials'])}{in_footprint_launch(sg)}, {sg['paths']} paths per peer. "
            f"maestro as it comes "
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
