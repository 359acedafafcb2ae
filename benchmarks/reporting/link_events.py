"""The sections of runs with link events: path detection, resiliency,
failover (a blackhole and a link-down, and the same loop under background
traffic), and path hunting."""
from __future__ import annotations

import statistics

from .common import busbw_of_iter, plt, save, spread_cell, table


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
