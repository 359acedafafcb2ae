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
    note = under_load_note(rows)
    return ("Latency-aware path choice (paper Fig. 12f)",
            "Saturating TCP background fills the shaper queues of spines 0-2; spine 3 stays idle. Small messages "
            "(a 64-byte allreduce) and control messages (barrier tokens, operation descriptors) take the lowest-RTT "
            f"path under the policies that read RTT: adaptive (the default) and latency. {note}\n\n"
            + table(["variant", "barrier ms", "64-byte allreduce ms", "probe RTT per path (ms)"],
                    [[r["variant"], r["barrier_s"] * 1e3, r["tiny_allreduce_s"] * 1e3, r.get("rtt_ms", "")] for r in rows])
            + "\n\n" + save(fig, out, "latency") + quiet_latency(rec["data"].get("quiet")))


# The maestro policies that send small and control messages on the
# lowest-RTT path (scheduler.h), and those that ignore RTT.
RTT_POLICIES = ("adaptive", "latency")


def under_load_note(rows: list) -> str:
    """The default policy's barrier under background beside the best
    maestro policy that ignores RTT and gloo ('' when a side is missing)."""
    by = {r["variant"]: r["barrier_s"] for r in rows}
    blind = {v: t for v, t in by.items() if not is_gloo(v) and v not in RTT_POLICIES}
    gloo = {v: t for v, t in by.items() if is_gloo(v)}
    if "adaptive" not in by or not blind:
        return ""
    name, t = min(blind.items(), key=lambda kv: kv[1])
    note = (f"The default policy's barrier takes {by['adaptive'] * 1e3:.3g} ms: **{t / by['adaptive']:.1f}x faster** "
            f"than the best policy that ignores RTT ({name}, {t * 1e3:.3g} ms)")
    if gloo:
        g, tg = min(gloo.items(), key=lambda kv: kv[1])
        note += f" and {tg / by['adaptive']:.1f}x faster than {g} ({tg * 1e3:.3g} ms)"
    return note + ". "


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
