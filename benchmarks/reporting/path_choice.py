"""The sections on how paths are chosen: latency-aware path choice, and
disjoint path discovery under ECMP."""
from __future__ import annotations

import statistics

from variants import is_gloo

from .common import plt, save, spread_cell, table


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
            + "\n\n" + save(fig, out, "latency") + quiet_latency(rec["data"].get("quiet")))


def quiet_latency(quiet) -> str:
    """The same times without background, beside gloo: on the lab and on
    loopback, median (min-max) over the interleaved trials."""
    if not quiet:
        return ""
    body, lines = [], []
    for where, label, said in (("lab", "lab", "on the lab"), ("loopback", "loopback (4 ranks on this host)", "on loopback")):
        trials = quiet.get(where) or []
        if not trials:
            continue
        per = {}
        for rows in trials:
            for r in rows:
                per.setdefault(r["variant"], {"barrier": [], "tiny": []})
                per[r["variant"]]["barrier"].append(r["barrier_s"] * 1e3)
                per[r["variant"]]["tiny"].append(r["tiny_allreduce_s"] * 1e3)
        med = {v: {k: statistics.median(x) for k, x in d.items()} for v, d in per.items()}
        gloo = med.get("gloo")
        for v, d in per.items():
            ratios = [f"{gloo[k] / med[v][k]:.2f}" if gloo and not is_gloo(v) else "" for k in ("barrier", "tiny")]
            body.append([label, v, spread_cell(med[v]["barrier"], d["barrier"], "{:.3f}"),
                         spread_cell(med[v]["tiny"], d["tiny"], "{:.3f}"), *ratios])
        if gloo and "adaptive" in med:
            lines.append(f"{said} the default policy's barrier takes {med['adaptive']['barrier']:.3f} ms "
                         f"against gloo's {gloo['barrier']:.3f}, its 64-byte allreduce {med['adaptive']['tiny']:.3f} "
                         f"against {gloo['tiny']:.3f}")
    n = max(len(quiet.get("lab") or []), len(quiet.get("loopback") or []))
    said = "; ".join(lines)
    return ("\n\nWithout background traffic, beside gloo (before the background starts, on the same lab; and on 4 "
            f"ranks of this host over loopback): median (min-max) over {n} interleaved trials, each the median of "
            "its iterations. " + (said[:1].upper() + said[1:] + "." if said else "") + "\n\n"
            + table(["where", "variant", "barrier ms", "64-byte allreduce ms", "barrier: gloo / this",
                     "allreduce: gloo / this"], body))


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
