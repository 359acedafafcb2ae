"""The sections on how paths are chosen: latency-aware path choice, and
disjoint path discovery under ECMP."""
from __future__ import annotations

import statistics

from variants import is_gloo

from .common import plt, save, table


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
