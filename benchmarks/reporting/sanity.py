"""What a smoke run must show (not speed), per experiment: every figure a
positive number, every checked result exact, and the fault experiments
seeing what they injected."""
from __future__ import annotations

import statistics

from .common import busbw_of_iter
from .link_events import failover_events, hunting_runs
from .sweeps import mid_size_cells, small_cells, tuner_cells


def _exact(name, label, runs, bad):
    """Every row of the sweep results `runs` exact, or a line in `bad` per wrong one."""
    for run in runs:
        for r in run["rows"]:
            if not r["exact"]:
                bad.append(f"{name}: {label} {r['variant']} {r['bytes']} B: the result was wrong")


def _p2p_paths(name, d, positive, bad):
    for r in d["rows"]:
        positive(name, f"{r['variant']} Gbit/s", r["gbps"])


def _chunk_size(name, d, positive, bad):
    for r in d["rows"]:
        positive(name, f"{r['chunk']} busbw", r["busbw_GBps"])
        positive(name, f"{r['chunk']} chunk samples", len(r["chunk_times_s"]))
        positive(name, f"{r['chunk']} smallest chunk time", min(r["chunk_times_s"]))


def _mid_size(name, d, positive, bad):
    for (coll, v, b), xs in mid_size_cells(d).items():
        for x in xs:
            positive(name, f"{coll} {v} {b} B busbw", x)
    for coll, trials in d["runs"].items():
        _exact(name, coll, trials, bad)


def _small_cells(name, d, positive, bad):
    # Every variant timed at every size in every launch, every result exact.
    for (key, b), cell in small_cells(d).items():
        for v in d["variants"]:
            xs = cell.get(v, [])
            if len(xs) != len(d["runs"][key]):
                bad.append(f"{name}: {key} {v} {b} B: timed in {len(xs)} of {len(d['runs'][key])} launches")
            for x in xs:
                positive(name, f"{key} {v} {b} B busbw", x)
    for key, launches in d["runs"].items():
        _exact(name, key, [run for passes in launches for run in passes], bad)


def _spines(name, d, positive, bad):
    for run in d["runs"]:
        for r in run["rows"]:
            positive(name, f"{r['variant']} {r['bytes']} B busbw", r["busbw_GBps"])
            if not r["exact"]:
                bad.append(f"{name}: {r['variant']} {r['bytes']} B: the result was wrong")


def _tuner(name, d, positive, bad):
    # Every variant timed at every size of each setting, in every trial.
    for key, trials in d["runs"].items():
        sizes = sorted({r["bytes"] for run in trials for r in run["rows"]})
        cells = tuner_cells(trials)
        for v in d["variants"]:
            for b in sizes:
                its, meds = cells.get((v, b), ([], []))
                if len(meds) != len(trials):
                    bad.append(f"{name}: {key} {v} {b} B: timed in {len(meds)} of {len(trials)} trials")
                for x in meds:
                    positive(name, f"{key} {v} {b} B seconds", x)
                positive(name, f"{key} {v} {b} B timed iterations", len(its))
        _exact(name, key, trials, bad)


def _collectives(name, d, positive, bad):
    for key, run in d["runs"].items():
        for r in run["rows"]:
            positive(name, f"{key} {r['variant']} {r['bytes']} B busbw", r["busbw_GBps"])
            if r.get("exact") is False:  # records before rank_bench checked results have none
                bad.append(f"{name}: {key} {r['variant']} {r['bytes']} B: the result was wrong")


def _models(name, d, positive, bad):
    for key, run in d["runs"].items():
        for r in run["rows"]:
            positive(name, f"{key} {r['variant']} seconds", r.get("sync_s", r.get("iteration_s")))
            # benchmarks/train.py on maestro; single uses path 0 only
            if r.get("path_bytes_sent") is not None and r["variant"] != "single":
                positive(name, f"{key} {r['variant']} bytes on its least used path",
                         min(r["path_bytes_sent"]))


def _load_balance(name, d, positive, bad):
    for policy, run in d["runs"].items():
        its = run["ranks"][1][1:]
        positive(name, f"{policy} iterations", len(its))
        positive(name, f"{policy} busbw", statistics.median(busbw_of_iter(x, run["bytes"], run["world"])
                                                              for x in its))
        if not all(it["ok"] for r in run["ranks"] for it in r):
            bad.append(f"{name}: {policy}: an allreduce result was wrong")


def _detection(name, d, positive, bad):
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


def _failover(name, d, positive, bad):
    if len(d["events"]) != 4 * d["rounds"]:
        bad.append(f"{name}: {len(d['events'])} of {4 * d['rounds']} link events happened during the run")
    for e in failover_events(d):
        positive(name, f"stall at {e['event']}", e["stall_s"])
        if not e["exact"]:
            bad.append(f"{name}: an allreduce result was wrong around {e['event']}")
    # The blackholed link's paths (rank 1 -> 2 crosses it) went down and were moved off.
    if not any(p["state"] == "down" for it in d["ranks"][1] for p in it["paths"] if p["peer"] == 2):
        bad.append(f"{name}: no path of rank 1 to rank 2 was seen down after L0-s3 was blackholed")


def _latency(name, d, positive, bad):
    for r in d["rows"]:
        positive(name, f"{r['variant']} barrier", r["barrier_s"])
    for where, trials in (d.get("quiet") or {}).items():
        for rows in trials:
            for r in rows:
                positive(name, f"{where} {r['variant']} barrier", r["barrier_s"])
                positive(name, f"{where} {r['variant']} 64-byte allreduce", r["tiny_allreduce_s"])


def _overheads(name, d, positive, bad):
    for r in d["p2p"]["rows"]:
        positive(name, f"{r['variant']} Gbit/s", r["gbps"])
    for r in d["setup"]["rows"]:
        positive(name, f"set-up with {r['paths']} paths", r["setup_s"])


def _footprint(name, d, positive, bad):
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


def _hunting(name, d, positive, bad):
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


def _discovery(name, d, positive, bad):
    trials = [t for r in d["trials"] for t in r]
    positive(name, "trials", len(trials))
    if not all(t["ok"] for t in trials):
        bad.append("discovery: an allreduce after discovery was wrong")


# experiment -> its check(name, data, positive, bad)
CHECKS = {"p2p_paths": _p2p_paths, "chunk_size": _chunk_size, "mid_size": _mid_size, "tuner": _tuner,
          "small_cells": _small_cells,
          "spines": _spines, "collectives": _collectives, "p2p_alltoall": _collectives, "models": _models,
          "load_balance": _load_balance, "detection": _detection, "resiliency": _detection,
          "failover": _failover, "latency": _latency, "overheads": _overheads, "footprint": _footprint,
          "hunting": _hunting, "discovery": _discovery}


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
        check = CHECKS.get(name)
        try:
            if check:
                check(name, rec["data"], positive, bad)
        except (KeyError, IndexError, TypeError, ValueError) as e:
            bad.append(f"{name}: malformed record ({type(e).__name__}: {e})")
    return bad
