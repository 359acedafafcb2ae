"""benchmarks/report.py and its parts (benchmarks/reporting/): the headline
compares maestro with the best gloo of each row and names it; records without
the newer peers are reported as such; docs/performance.md's tables are the data's."""
import copy
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "docs", "results", "data")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import report  # noqa: E402
import suite  # noqa: E402
from reporting import headline, link_events, overheads, path_choice, peers, performance, sweeps, training  # noqa: E402
from reporting.common import load  # noqa: E402
from reporting.sanity import sanity  # noqa: E402


def test_best_gloo_picks_the_best_gloo_variant_only():
    bw = {"gloo": 23.0, "gloo-4dev": 24.5, "adaptive": 91.0, "single": 23.4}
    assert peers.best_gloo(bw) == ("gloo-4dev", 24.5)
    seconds = {"gloo": 36.1, "gloo-4dev": 30.2, "adaptive": 9.2}
    assert peers.best_gloo(seconds, lower_is_better=True) == ("gloo-4dev", 30.2)
    assert peers.best_gloo({"gloo": 36.1, "gloo-4dev": 40.0}, lower_is_better=True) == ("gloo", 36.1)
    assert peers.best_gloo({"gloo": None, "gloo-4dev": 2.0}) == ("gloo-4dev", 2.0)
    assert peers.best_gloo({"adaptive": 91.0, "single": 23.0}) is None


def sweep_record(busbw: dict) -> dict:
    """A collectives record with one pinned 64 MiB allreduce row per variant."""
    rows = [{"variant": v, "bytes": 64 << 20, "busbw_GBps": x / 1e3, "seconds": 1.0, "iters": 5, "times": [1.0] * 5}
            for v, x in busbw.items()]
    return {"experiment": "collectives", "status": "ok", "data": {
        "physical_limit_GBps": 0.1, "runs": {"pinned/allreduce": {"rows": rows}}}}


def test_headline_compares_with_the_best_gloo_and_names_it():
    rec = sweep_record({"gloo": 20.0, "gloo-4dev": 25.0, "adaptive": 90.0, "single": 24.0})
    (row,) = headline.headline({"collectives": rec})
    assert row[2] == "25 MB/s (gloo-4dev)" and row[3] == "**3.60x**", row
    rec = sweep_record({"gloo": 30.0, "gloo-4dev": 25.0, "adaptive": 90.0})
    (row,) = headline.headline({"collectives": rec})
    assert row[2] == "30 MB/s (gloo)" and row[3] == "**3.00x**", row


def test_headline_says_which_gloo_a_record_lacks():
    (row,) = headline.headline({"collectives": sweep_record({"gloo": 20.0, "adaptive": 90.0})})
    assert row[2] == "20 MB/s (gloo); gloo-4dev not measured" and row[3] == "**4.50x**", row


def test_headline_adds_a_mid_size_row_where_the_sweep_has_1_mib():
    rec = sweep_record({"gloo": 20.0, "adaptive": 90.0, "adaptive+kernel": 91.0})
    rows = rec["data"]["runs"]["pinned/allreduce"]["rows"]
    rows += [dict(r, bytes=1 << 20, busbw_GBps=r["busbw_GBps"] / 2) for r in rows]
    big, kernel, mid = headline.headline({"collectives": rec})
    assert big[0] == "allreduce 64 MiB busbw, pinned" and "MAESTRO_TCP_CONGESTION=kernel" in kernel[0], (big, kernel)
    # The default only at 1 MiB, against the same gloo at that size.
    assert mid[0] == "allreduce 1 MiB busbw, pinned" and mid[1].startswith("45 MB/s") and mid[3] == "**4.50x**", mid


def test_collectives_show_the_spread_of_the_cells_run_in_several_passes(tmp_path):
    import suite
    row = {"variant": "adaptive", "bytes": 16 << 20, "seconds": 1.0, "iters": 3, "times": [1.0] * 3, "exact": True}
    res = {"collective": "allreduce", "world": 4, "repeat": {"variants": ["adaptive"], "up_to": 64 << 20},
           "trials": [{"order": ["gloo", "adaptive"], "rows": [{**row, "variant": "gloo", "busbw_GBps": 0.024},
                                                                {**row, "busbw_GBps": 0.088}]},
                      {"order": ["adaptive"], "rows": [{**row, "busbw_GBps": 0.092, "exact": False}]},
                      {"order": ["adaptive"], "rows": [{**row, "busbw_GBps": 0.090}]}]}
    run = suite.median_of_trials(res)
    ad = run["rows"][1]
    assert ad["busbw_GBps"] == 0.090 and ad["trials_busbw_GBps"] == [0.088, 0.092, 0.090]
    assert ad["exact"] is False  # a wrong pass is not hidden by the median
    assert sweeps.busbw_cell(ad) == "90.0 (88.0-92.0)" and sweeps.busbw_cell(run["rows"][0]) == 24.0
    assert "adaptive up to 64 MiB: the median of 3 interleaved passes" in sweeps.passes_note(run)
    assert sweeps.passes_note({"rows": run["rows"]}) == ""
    # Extra passes of the small cells: counted beside the repeated ones, on
    # top of them where --repeat covers those cells, else of the first pass.
    more = {**res, "trials": res["trials"] + [{"order": ["adaptive"], "rows": []}] * 4,
            "extra_passes": {"variants": ["adaptive"], "up_to": 64 << 10, "passes": 4}}
    assert ("*adaptive up to 64 MiB: the median of 3 interleaved passes; adaptive up to 64 KiB (latency-bound): "
            "the median of 7, each pass rotating") in sweeps.passes_note(more)
    alone = {**more, "repeat": None, "trials": more["trials"][:1] + more["trials"][3:]}
    assert "*adaptive up to 64 KiB (latency-bound): the median of 5 interleaved passes, each" in sweeps.passes_note(alone)
    rec = {"experiment": "collectives", "status": "ok",
           "data": {"physical_limit_GBps": 0.1, "core_mbit": 200, "runs": {"pinned/allreduce": run}}}
    _, text = sweeps.sec_collectives(rec, str(tmp_path))
    assert "| 90.0 (88.0-92.0) |" in text and "the median of 3 interleaved passes" in text


def test_latency_under_load_puts_the_default_beside_the_policies_that_ignore_rtt_and_gloo():
    rows = [{"variant": v, "barrier_s": t} for v, t in
            (("latency", 0.0007), ("adaptive", 0.0006), ("round_robin", 0.012), ("single", 0.0145),
             ("gloo", 0.0123), ("gloo-4dev", 0.013))]
    note = path_choice.under_load_note(rows)
    assert "0.6 ms: **20.0x faster** than the best policy that ignores RTT (round_robin, 12 ms)" in note
    assert "20.5x faster than gloo (12.3 ms)" in note
    assert path_choice.under_load_note([r for r in rows if r["variant"] != "adaptive"]) == ""
    assert "gloo" not in path_choice.under_load_note([r for r in rows if "gloo" not in r["variant"]])


def test_sweeps_that_measured_cpu_show_it_per_size_and_variant(tmp_path):
    recs = load(DATA)
    mid = copy.deepcopy(recs["mid_size"])
    for trials in mid["data"]["runs"].values():
        for trial in trials:
            for r in trial["rows"]:
                r.pop("cpu_s_per_GB", None)
    without = report.render({"mid_size": mid}, str(tmp_path))
    assert "CPU seconds per GB" not in without
    first = next(iter(mid["data"]["runs"].values()))
    for trial in first:
        for r in trial["rows"]:
            r["cpu_s_per_GB"] = [1.0, 2.0, 3.0, 4.0]  # the mean over ranks: 2.5
    md = report.render({"mid_size": mid}, str(tmp_path))
    assert md.count("CPU seconds per GB") == 1 and "| 2.50 [2.50-2.50] |" in md, md


def without_peers(recs: dict, peers=("gloo-4dev", "single")) -> dict:
    """The records as the suite wrote them before it measured `peers`."""
    recs = copy.deepcopy(recs)
    for run in recs["collectives"]["data"]["runs"].values():
        run["rows"] = [r for r in run["rows"] if r["variant"] not in peers]
        for key in ("not_run", "why_not_run", "up_to"):
            run.pop(key, None)
    for key, run in recs["models"]["data"]["runs"].items():
        run["rows"] = [r for r in run["rows"] if r["variant"] not in peers]
        if key.endswith("/buckets"):
            run.pop("not_run", None)
            run.pop("why_not_run", None)
    lb = recs["load_balance"]["data"]["runs"]
    for p in peers:
        lb.pop(p, None)
    return recs


def test_records_without_the_new_peers_say_so(tmp_path):
    recs = without_peers(load(DATA))
    recs["load_balance"]["data"]["runs"].pop("gloo", None)
    md = report.render(recs, str(tmp_path))
    # The 4 sweeps of collectives and the 2 bucket tables of models; the 2
    # DDP tables, which leave gloo and single out on purpose, lack gloo-4dev
    # only; load balance without any gloo.
    assert md.count("*Not measured in this record: gloo-4dev, single (") == 6, md
    assert md.count("*Not measured in this record: gloo-4dev (") == 2, md
    assert md.count("*Not measured in this record: gloo, gloo-4dev, single (") == 1, md
    assert "| nan" not in md and "| inf" not in md
    lb = headline.headline(recs)[-1]
    assert lb[0].startswith("allreduce busbw with background") and lb[2] == "not measured" and lb[3] == "-", lb


def test_collectives_say_which_peers_ran_up_to_a_smaller_size_or_not_at_all(tmp_path):
    recs = load(DATA)
    col = copy.deepcopy(recs["collectives"])
    why = "a peer runs on one path"
    pinned, ecmp = col["data"]["runs"]["pinned/allreduce"], col["data"]["runs"]["ecmp/allreduce"]
    top = max(r["bytes"] for r in pinned["rows"])
    pinned["rows"] = [r for r in pinned["rows"] if not (r["variant"] in ("gloo-4dev", "single") and r["bytes"] == top)]
    pinned.update(up_to={"gloo-4dev": top // 4, "single": top // 4}, not_run=[], why_not_run=why)
    ecmp["rows"] = [r for r in ecmp["rows"] if r["variant"] != "gloo-4dev"
                    and not (r["variant"] in ("gloo", "single") and r["bytes"] == top)]
    ecmp.update(up_to={"gloo": top // 4, "single": top // 4}, not_run=["gloo-4dev"], why_not_run=why)
    _, body = sweeps.sec_collectives(col, str(tmp_path))
    assert "*Not run: gloo-4dev above 64 MiB, single above 64 MiB (a peer runs on one path).*" in body, body
    assert "*Not run: gloo-4dev, gloo above 64 MiB, single above 64 MiB (a peer runs on one path).*" in body, body
    ecmp_part = body[body.index("**ecmp/allreduce**"):body.index("**ecmp/allgather**")]
    assert "gloo-4dev" not in ecmp_part.replace("Not run: gloo-4dev,", ""), ecmp_part
    assert "Not measured" not in body.replace(body[body.index("**pinned/allgather**"):body.index("**ecmp/allreduce**")], "")
    # The largest size's row: the cells not run are "-", the ratio to single too.
    last = [l for l in ecmp_part.splitlines() if l.startswith("| 256 MiB")][0].split(" | ")
    assert last[-3:] == ["-", "-", "- |"], last


def test_ddp_beside_the_fastest_gloo_only_says_why_the_others_did_not_run(tmp_path):
    recs = load(DATA)
    mod = copy.deepcopy(recs["models"])
    ddp = mod["data"]["runs"]["vgg19/ddp"]
    ddp["rows"] = [r for r in ddp["rows"] if r["variant"] in ("adaptive", "gloo-4dev")]
    ddp["not_run"], ddp["why_not_run"] = ["gloo", "single"], "DDP runs beside the gloo whose bucket sync was fastest"
    _, body = training.sec_models(mod, str(tmp_path))
    assert body.count("*Not run here: gloo, single (DDP runs beside the gloo whose bucket sync was fastest).*") == 1
    vgg_ddp = body[body.index("**vgg19** under DDP"):body.index("**bert-large** under DDP")]
    assert "Not measured" not in vgg_ddp and "`--backend gloo --gloo-devices vnics`" in vgg_ddp
    assert "gloo with `--backend gloo`" not in vgg_ddp, vgg_ddp
    row = next(r for r in headline.headline({"models": mod}) if r[0] == "vgg19 exposed comm (DDP) per iteration")
    assert row[2].endswith("(gloo-4dev)"), row


def test_footprint_says_how_many_launches_each_figure_is_over(tmp_path):
    recs = load(DATA)
    fp = copy.deepcopy(recs["footprint"])
    fp["data"]["footprint"].update(trials=2, once_above=8)
    fp["data"]["subgroups"]["trials"] = 1
    fp["data"]["subgroups"].pop("in_footprint_launch", None)  # a record from before that field
    fp["data"].pop("rank_launch", None)  # and before this one: its ranks were torchrun's
    md = report.render({"footprint": fp}, str(tmp_path))
    assert "over every rank of 2 interleaved launches (one above 8 ranks);" in md, md
    assert "over every rank of one launch per variant, " in md, md
    assert "of ranks started by torchrun, median" in md, md
    # Ranks forked from the prefork server: the report says what their memory holds.
    fp["data"]["rank_launch"] = "prefork"
    md = report.render({"footprint": fp}, str(tmp_path))
    assert "each forked from a process that has imported torch" in md and "started by torchrun" not in md, md
    # Subgroups measured in the footprint's own launches say so.
    fp["data"]["subgroups"]["in_footprint_launch"] = ["gloo", "maestro"]
    md = report.render({"footprint": fp}, str(tmp_path))
    assert ("over every rank of one launch per variant (gloo and maestro: in their footprint launch, after its "
            "figures, from the same state), ") in md, md


def test_load_balance_with_gloo_peers_has_no_path_shares(tmp_path):
    recs = load(DATA)
    lb = copy.deepcopy(recs["load_balance"])
    for peer in ("gloo", "gloo-4dev"):  # whatever the record has: this test makes its own
        lb["data"]["runs"].pop(peer, None)
    run = lb["data"]["runs"]["adaptive"]
    gloo = copy.deepcopy(run)
    for rank in gloo["ranks"]:
        for it in rank:
            it.pop("paths", None)
            it["seconds"] *= 3  # a third of adaptive's busbw
    lb["data"]["runs"]["gloo-4dev"] = gloo
    _, body = training.sec_load_balance(lb, str(tmp_path))
    line = next(l for l in body.splitlines() if l.startswith("| gloo-4dev |"))
    assert line.endswith("| - | - | - | - |"), line
    row = headline.headline({"load_balance": lb})[0]
    assert "(gloo-4dev); gloo not measured" in row[2] and row[3] == "**3.00x**", row


def test_performance_tables_are_generated_from_the_data(tmp_path):
    """docs/performance.md's generated blocks are what report.py makes of
    docs/results/data now (run benchmarks/report.py after changing either)."""
    doc = os.path.join(ROOT, "docs", "performance.md")
    copy_ = tmp_path / "performance.md"
    shutil.copy(doc, copy_)
    performance.update_performance(str(copy_), load(DATA))
    assert copy_.read_text() == open(doc).read(), "docs/performance.md is stale: run benchmarks/report.py"
    for name in performance.PERFORMANCE_TABLES:
        begin, end = performance.markers(name)
        block = open(doc).read().split(begin)[1].split(end)[0]
        assert "|---|" in block and "*From `" in block, (name, block)


def test_a_table_without_its_data_says_so(tmp_path):
    doc = tmp_path / "performance.md"
    shutil.copy(os.path.join(ROOT, "docs", "performance.md"), doc)
    recs = {k: v for k, v in load(DATA).items() if k != "footprint"}
    performance.update_performance(str(doc), recs)
    begin, end = performance.markers("loopback")
    block = doc.read_text().split(begin)[1].split(end)[0]
    assert "No recorded data for this table yet (footprint missing" in block and "|" not in block, block


def test_a_report_elsewhere_leaves_the_recorded_docs_alone(tmp_path):
    """As the smoke test runs it: results into a scratch folder, no README;
    docs/performance.md must stay as it is (it takes only recorded data)."""
    docs = {name: open(os.path.join(ROOT, name)).read() for name in ("docs/performance.md", "README.md")}
    data, out = tmp_path / "data", tmp_path / "report"
    shutil.copytree(DATA, data)
    (data / "footprint.json").unlink()  # data that would change the loopback table
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "report.py"), "--data", str(data),
                          "--out", str(out), "--readme", ""], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (out / "results.md").exists() and not (out / "performance.md").exists()
    for name, text in docs.items():
        assert open(os.path.join(ROOT, name)).read() == text, f"{name} was rewritten"


def p2p_alltoall_record(exact: bool = True) -> dict:
    """A p2p_alltoall record as the suite writes it: sendrecv and alltoall
    sweeps, every peer, two sizes, five iterations each."""
    busbw = {"gloo": 24.0, "gloo-4dev": 20.0, "adaptive": 90.0, "single": 22.5}
    runs = {}
    for coll, scale in (("sendrecv", 1.0), ("alltoall", 0.6)):
        rows = []
        for size in (64 << 10, 16 << 20):
            for v, x in busbw.items():
                med = x * scale / 1e3  # GB/s
                seconds = size / (med * 1e9)
                rows.append({"variant": v, "bytes": size, "seconds": seconds, "algbw_GBps": med, "busbw_GBps": med,
                             "iters": 5, "times": [seconds * f for f in (0.8, 0.9, 1.0, 1.1, 1.25)],
                             "exact": exact or v != "adaptive"})
        runs[coll] = {"collective": coll, "world": 4, "rows": rows}
    machine = {"cpu": "test", "cores": 2, "memory_GiB": 8, "kernel": "6", "python": "3", "torch": "2",
               "maestro_commit": "abc"}
    return {"experiment": "p2p_alltoall", "status": "ok", "quick": True, "seconds": 54.0, "date": "2026-01-01T00:00:00",
            "command": "scripts/bench.sh --quick --only p2p_alltoall", "machine": machine,
            "data": {"lab": "4 hosts, 2 leaves, 4 spines, pinned", "core_mbit": 200, "access_mbit": 1000,
                     "physical_limit_GBps": {"sendrecv": 0.1, "alltoall": 0.075}, "runs": runs}}


def test_p2p_alltoall_renders_a_table_per_collective_and_one_plot(tmp_path):
    recs = {"p2p_alltoall": p2p_alltoall_record()}
    assert sanity(recs) == []
    md = report.render(recs, str(tmp_path))
    assert "## Point to point and all-to-all vs gloo" in md
    assert "**sendrecv** (physical limit 100 MB/s)" in md and "**alltoall** (physical limit 75 MB/s)" in md
    # median (min-max) over the iterations: busbw = median * median time / time
    line = next(l for l in md.splitlines() if l.startswith("| 16 MiB |"))
    assert line.startswith("| 16 MiB | 24.0 (19.2-30.0) | 20.0 (16.0-25.0) | 90.0 (72.0-112.5) | 22.5 (18.0-28.1) |"), \
        line
    # best gloo, adaptive / best gloo, adaptive / single, adaptive / limit (90 of 100 MB/s)
    assert line.endswith("| gloo | 3.75 | 4 | 0.9 |"), line
    assert md.count("| 64 KiB |") == 2 and "Not measured" not in md and "Wrong results" not in md
    assert md.count("results/p2p_alltoall.png") == 1 and (tmp_path / "results" / "p2p_alltoall.png").exists()


def test_p2p_alltoall_cells_run_in_several_passes_are_their_median_pass(tmp_path):
    # The suite runs the default's all-to-all in 3 passes and keeps the
    # median pass (suite.median_of_trials): its cell shows the passes'
    # spread, and a note says which cells are medians of passes.
    rec = p2p_alltoall_record()
    run = rec["data"]["runs"]["alltoall"]
    first = [dict(r, cpu_s_per_GB=[1.0, 2.0, 3.0, 4.0]) for r in run["rows"]]
    again = [dict(r, busbw_GBps=r["busbw_GBps"] * f) for f in (0.9, 1.1) for r in first if r["variant"] == "adaptive"]
    run.update({"trials": [{"rows": first}, {"rows": again[:2]}, {"rows": again[2:]}],
                "repeat": {"variants": ["adaptive"], "up_to": 16 << 20}})
    rec["data"]["runs"]["alltoall"] = suite.median_of_trials(run)
    _, body = sweeps.sec_p2p_alltoall(rec, str(tmp_path))
    tables = body.split("**alltoall** (physical limit")
    line = next(l for l in tables[1].splitlines() if l.startswith("| 16 MiB |"))
    assert "| 54.0 (48.6-59.4) |" in line and "| 13.5 (10.8-16.9) |" in line, line
    assert "*adaptive up to 16 MiB: the median of 3 interleaved passes" in tables[1], tables[1]
    assert "interleaved passes" not in tables[0], "sendrecv ran once"
    # CPU per GB beside the busbw, the mean over ranks, where it was recorded.
    assert "CPU seconds per GB" in tables[1] and "CPU seconds per GB" not in tables[0], body
    cpu_row = [l for l in tables[1].splitlines() if l.startswith("| 16 MiB |")][-1]
    assert cpu_row == "| 16 MiB | 2.50 | 2.50 | 2.50 | 2.50 |", cpu_row


def test_p2p_alltoall_wrong_results_and_missing_peers_are_reported(tmp_path):
    rec = p2p_alltoall_record(exact=False)
    for run in rec["data"]["runs"].values():
        run["rows"] = [r for r in run["rows"] if r["variant"] != "gloo-4dev"]
    problems = sanity({"p2p_alltoall": rec})
    assert len(problems) == 4 and all("adaptive" in p and "the result was wrong" in p for p in problems), problems
    _, body = sweeps.sec_p2p_alltoall(rec, str(tmp_path))
    assert body.count("**Wrong results:** adaptive at 16 MiB, adaptive at 64 KiB.") == 2, body
    assert body.count("*Not measured in this record: gloo-4dev (") == 2, body


def test_spines_compares_auto_with_one_path_per_vnic_over_interleaved_trials(tmp_path):
    # Three trials; busbw (MB/s) per variant and trial: the median is the
    # middle trial's, the spread the trials' min-max.
    trial_busbw = {"adaptive": (110.0, 112.0, 104.0), "adaptive@paths=4": (80.0, 78.0, 82.0),
                   "gloo": (22.0, 23.0, 24.0)}
    runs = []
    for t in range(3):
        runs.append({"collective": "allreduce", "world": 4, "rows": [
            {"variant": v, "bytes": 64 << 20, "busbw_GBps": b[t] / 1e3, "seconds": 1.0, "times": [1.0],
             "exact": True} for v, b in trial_busbw.items()]})
    rec = dict(p2p_alltoall_record(), experiment="spines", data={
        "lab": "4 hosts, 2 leaves, 8 spines, 4 aliases per host, ECMP", "core_mbit": 200, "access_mbit": 1000,
        "spines": 8, "aliases": 4, "physical_limit_GBps": 0.125, "variants": list(trial_busbw), "runs": runs})
    assert sanity({"spines": rec}) == []
    md = report.render({"spines": rec}, str(tmp_path))
    assert "## More spines than vNICs (paths=auto)" in md and "physical limit 125 MB/s" in md
    line = next(l for l in md.splitlines() if l.startswith("| 64 MiB |"))
    assert line == ("| 64 MiB | 110.0 (104.0-112.0) | 80.0 (78.0-82.0) | 23.0 (22.0-24.0) | 0.88 | 0.64 | 1.38 "
                    "| 4.78 |"), line
    assert (tmp_path / "results" / "spines.png").exists()
    runs[1]["rows"][0]["exact"] = False
    assert sanity({"spines": rec}) == ["spines: adaptive 67108864 B: the result was wrong"]


def test_ecmp_rows_say_whether_the_defaults_ran_discovery():
    rec = sweep_record({"gloo": 24.0, "adaptive": 90.0})
    run = rec["data"]["runs"].pop("pinned/allreduce")
    rec["data"]["runs"]["ecmp/allreduce"] = run
    assert peers.ecmp_label(run) == "ecmp + discovery"  # a record that asked for it (no routes recorded)
    run["routes"] = {"adaptive": {"1": ["", ""], "2": ["10.2.0.2", "10.2.0.6"]}}
    assert peers.ecmp_label(run) == "ecmp, defaults (discovery auto)"
    assert "2 distinct spines for 2 paths (rank 2)" in peers.ecmp_settings(run)
    run["routes"]["single"] = {"1": [""], "2": [""]}
    assert peers.ecmp_label(run) == "ecmp, defaults (no discovery)"
    assert "did NOT run" in peers.ecmp_settings(run)
    (row,) = headline.headline({"collectives": rec})
    assert row[0] == "allreduce 64 MiB busbw, ecmp, defaults (no discovery)", row


def test_readme_names_the_one_commit_of_a_record(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{headline.BEGIN}\nold\n{headline.END}\nrest\n")
    machine = {"maestro_commit": "abc1234"}
    recs = {"collectives": {**sweep_record({"gloo": 24.0, "adaptive": 90.0}), "command": "scripts/bench.sh",
                            "date": "2026-11-23T10:00:00", "machine": machine}}
    headline.update_readme(str(readme), recs)
    assert "From `scripts/bench.sh` at maestro abc1234, on 2026-11-23;" in readme.read_text()
    recs["hunting"] = {**recs["collectives"], "command": "scripts/bench.sh --only hunting",
                       "machine": {"maestro_commit": "def5678"}}
    headline.update_readme(str(readme), recs)
    text = readme.read_text()
    assert "`scripts/bench.sh --only hunting` at maestro def5678 (2 commits)" in text and "rest" in text


def test_core_share_is_cpu_seconds_per_gb_times_the_rate():
    row = {"paths": 4, "gbps": 0.8, "cpu_s_per_GB": [0.5, 2.0]}  # 0.1 GB/s
    assert abs(overheads.core_share(row, 0) - 0.05) < 1e-12
    assert abs(overheads.core_share(row, 1) - 0.20) < 1e-12


def _loop_iters(spec):
    """Iterations from (start, seconds, ok) triples, with one path snapshot each."""
    return [{"start": a, "seconds": s, "ok": ok,
             "paths": [{"peer": 1, "path": 0, "state": st, "reconnects": rc}]} for a, s, ok, st, rc in spec]


def test_failover_events_measure_the_stall_across_each_event_on_the_slowest_rank():
    fast = [(0.0, 0.1, True, "up", 0), (0.1, 0.1, True, "up", 0), (0.2, 0.1, True, "up", 0)]
    # The event at 0.35 s: rank 1's operation from 0.3 s takes 0.4 s (rank 0's only 0.2).
    r0 = _loop_iters(fast + [(0.3, 0.2, True, "down", 0), (0.7, 0.1, True, "down", 0), (1.5, 0.12, True, "up", 1),
                             (1.7, 0.12, True, "up", 1)])
    r1 = _loop_iters(fast + [(0.3, 0.4, True, "up", 0), (0.7, 0.1, False, "up", 0), (1.5, 0.12, True, "up", 0),
                             (1.7, 0.12, True, "up", 0)])
    d = {"events": [{"t": 0.35, "event": "blackhole"}], "ranks": [r0, r1]}
    (e,) = link_events.failover_events(d)
    assert e["event"] == "blackhole"
    assert e["before_s"] == pytest.approx(0.1)
    assert e["stall_s"] == pytest.approx(0.4)   # the slowest rank's, of the operation across the event
    assert e["after_s"] == pytest.approx(0.12)  # from 1 s after the event on
    assert e["exact"] is False                  # rank 1's result at 0.7 s was wrong
    # Between the operation at 0.7 s (0.1 s) and the next at 1.5 s: 0.7 s of
    # waiting that no operation's own time shows; none before the event.
    assert e["wait_s"] == pytest.approx(0.7)
    assert e["wait_before_s"] == pytest.approx(0.0)
    # Rank 0's path went down and was reconnected: one of two paths closed.
    assert link_events.paths_closed({"ranks": [r0, r1]}) == (1, 2)
    # The same from `loop --snapshots changes`, which keeps a path table only
    # where a state changed (and the first and last): the same count.
    sparse = [[dict(it) for it in r] for r in (r0, r1)]
    for r, full in zip(sparse, (r0, r1)):
        for i in range(1, len(r) - 1):
            if full[i]["paths"] == full[i - 1]["paths"]:
                del r[i]["paths"]
    assert any("paths" not in it for r in sparse for it in r)
    assert link_events.paths_closed({"ranks": sparse}) == (1, 2)
    # Under background load a closed path is a false alarm, and the text says so.
    load = {"ranks": [r0, r1], "udp_mbit": {"0": 100}, "tcp_spines": [1]}
    assert link_events.under_load(load).startswith("**False alarms under load**"), link_events.under_load(load)
    calm = {"ranks": [r1, r1], "udp_mbit": {"0": 100}, "tcp_spines": [1]}
    assert link_events.under_load(calm).startswith("No false alarm under load: "), link_events.under_load(calm)
    # Where the run kept why its paths were closed, the closing side's reason
    # is listed; the far side's "reset by peer" is not a reason.
    load["closed_paths"] = [
        [{"peer": 1, "path": 0, "reconnects": 1, "errors": 1, "last_error": "2 resends unanswered (blackholed path?)"}],
        [{"peer": 0, "path": 0, "reconnects": 1, "errors": 1, "last_error": "receive failed: Connection reset by peer"}]]
    text = link_events.under_load(load)
    assert text.endswith("\n- rank 0 to rank 1, path 0: 2 resends unanswered (blackholed path?)"), text
    assert "reset by peer" not in text


def tuner_record() -> dict:
    """A tuner record as the suite writes it: two settings, each two
    interleaved sweep trials (rank_bench.py sweep's RESULT) in rotated
    order, three sizes. A cell's iterations are its base time x (0.8, 1.0,
    1.2) in the first trial and x (0.9, 1.1, 1.3) in the second: the median
    over every iteration is base x 1.05, the trials' medians base and base
    x 1.1."""
    variants = ["adaptive", "adaptive@algo=ring", "adaptive@algo=recursive_doubling", "gloo"]
    base_ms = {  # (auto, ring, recursive doubling, gloo) per size
        "lab": {4 << 10: (1.0, 1.6, 1.0, 5.0), 64 << 10: (1.5, 1.8, 1.5, 5.0), 1 << 20: (20.0, 20.0, 30.0, 65.0)},
        "loopback-8": {4 << 10: (2.0, 2.0, 3.0, 10.0), 64 << 10: (3.0, 3.0, 4.0, 12.0),
                       1 << 20: (10.0, 10.0, 20.0, 40.0)}}
    worlds = {"lab": 4, "loopback-8": 8}
    runs = {}
    for key, cells in base_ms.items():
        n = worlds[key]
        runs[key] = []
        for trial, factors in enumerate(((0.8, 1.0, 1.2), (0.9, 1.1, 1.3))):
            order = variants[trial:] + variants[:trial]
            rows = []
            for size, bases in cells.items():
                for v in order:
                    times = [bases[variants.index(v)] / 1e3 * f for f in factors]
                    med = times[1]
                    rows.append({"variant": v, "bytes": size, "seconds": med, "algbw_GBps": size / med / 1e9,
                                 "busbw_GBps": size / med / 1e9 * 2 * (n - 1) / n, "iters": len(times),
                                 "times": times, "exact": True, "cpu_s_per_GB": [1.0] * n})
            runs[key].append({"collective": "allreduce", "world": n, "rows": rows, "routes": {}})
    settings = {"lab": "4 ranks on the pinned lab (4 hosts, 2 leaves, 4 spines)",
                "loopback-8": "8 ranks on this host over loopback"}
    return dict(p2p_alltoall_record(), experiment="tuner", command="scripts/bench.sh --only tuner", data={
        "lab": "4 hosts, 2 leaves, 4 spines, pinned; and this host's loopback", "core_mbit": 200,
        "access_mbit": 1000, "variants": variants, "settings": settings, "runs": runs})


def test_tuner_tables_show_each_algorithm_and_name_the_crossover(tmp_path):
    rec = tuner_record()
    assert sanity({"tuner": rec}) == []
    md = report.render({"tuner": rec}, str(tmp_path))
    assert "## Small and mid-size allreduce: the tuner's algorithm choice" in md
    header = ("| size | adaptive ms | adaptive@algo=ring ms | adaptive@algo=recursive_doubling ms | gloo ms "
              "| ring / recursive_doubling | faster forced | auto / gloo | adaptive CPU s/GB | gloo CPU s/GB |")
    assert md.count(header) == 2, md
    assert "**lab**: 4 ranks on the pinned lab" in md and "**loopback-8**: 8 ranks on this host over loopback" in md
    lab, loop = md.split("**loopback-8**")
    # median over every iteration (base x 1.05), the trials' medians' min-max (base, base x 1.1); ring /
    # recursive_doubling and auto / gloo of the medians
    assert ("| 64 KiB | 1.575 (1.500-1.650) | 1.890 (1.800-1.980) | 1.575 (1.500-1.650) | 5.250 (5.000-5.500) "
            "| 1.20 | recursive_doubling | 0.30 | 1 | 1 |") in lab, lab
    assert ("| 1 MiB | 21.000 (20.000-22.000) | 21.000 (20.000-22.000) | 31.500 (30.000-33.000) "
            "| 68.250 (65.000-71.500) | 0.67 | ring | 0.31 | 1 | 1 |") in lab, lab
    assert "| 4 KiB | 2.100 (2.000-2.200) | 2.100 (2.000-2.200) | 3.150 (3.000-3.300) |" in loop, loop
    assert "- lab: **64 KiB** (ring / recursive_doubling 1.20); ring faster from 1 MiB on\n" in md, md
    assert "- loopback-8: none: ring was faster at every size measured (4 KiB to 1 MiB)\n" in md, md
    assert "Wrong results" not in md
    assert md.count("results/tuner.png") == 1 and (tmp_path / "results" / "tuner.png").exists()


def test_tuner_reduce_table_names_the_fastest_algorithm_and_auto_against_it(tmp_path):
    rec = tuner_record()
    variants = ["adaptive", "adaptive@algo=reduce:direct", "adaptive@algo=reduce:tree", "adaptive@algo=reduce:ring",
                "gloo"]
    base_ms = {16 << 10: (1.0, 1.0, 1.2, 2.0, 4.0), 64 << 10: (1.1, 3.4, 1.1, 2.5, 5.0)}
    trials = []
    for trial in range(3):
        order = variants[trial:] + variants[:trial]
        rows = [{"variant": v, "bytes": b, "seconds": ms[variants.index(v)] / 1e3,
                 "times": [ms[variants.index(v)] / 1e3] * 3, "exact": v != "adaptive@algo=reduce:ring" or b != 16 << 10}
                for b, ms in base_ms.items() for v in order]
        trials.append({"collective": "reduce", "world": 4, "rows": rows})
    rec["data"]["reduce"] = {"variants": variants, "setting": "4 ranks on the pinned lab", "runs": trials}
    md = report.render({"tuner": rec}, str(tmp_path))
    assert ("| 64 KiB | 1.100 (1.100-1.100) | 3.400 (3.400-3.400) | 1.100 (1.100-1.100) | 2.500 (2.500-2.500) "
            "| 5.000 (5.000-5.000) | tree | 1.00 | 0.22 |") in md, md
    assert "| 16 KiB | 1.000 (1.000-1.000) | 1.000 (1.000-1.000) | 1.200 (1.200-1.200) |" in md
    assert "| direct | 1.00 | 0.25 |" in md
    assert "**Wrong results:** adaptive@algo=reduce:ring at 16 KiB." in md
    assert sweeps.reduce_table(None) == ""


def test_tuner_crossover_and_sanity_name_what_is_off():
    rec = tuner_record()
    variants = rec["data"]["variants"]
    roles = sweeps.tuner_roles(variants)
    assert roles == {"auto": "adaptive", "ring": "adaptive@algo=ring",
                     "recursive_doubling": "adaptive@algo=recursive_doubling", "gloo": "gloo"}
    sizes = [4 << 10, 64 << 10, 1 << 20]
    med = {(v, b): 1.0 for v in variants for b in sizes}
    med[(roles["recursive_doubling"], 4 << 10)] = 1.5   # ring faster at 4 KiB,
    med[(roles["recursive_doubling"], 64 << 10)] = 0.5  # recursive doubling at 64 KiB,
    med[(roles["recursive_doubling"], 1 << 20)] = 0.8   # and at the largest size
    assert sweeps.tuner_crossover(med, roles, sizes) == ("**1 MiB** (ring / recursive_doubling 1.25) (the largest "
                                                         "size measured); below it, ring was faster at 4 KiB")
    assert sweeps.tuner_crossover(med, {"ring": "adaptive@algo=ring"}, sizes).startswith("not measured")
    lab = rec["data"]["runs"]["lab"]
    lab[1]["rows"] = [r for r in lab[1]["rows"] if not (r["variant"] == "gloo" and r["bytes"] == 4 << 10)]
    lab[0]["rows"][0]["exact"] = False
    wrong = lab[0]["rows"][0]
    assert sanity({"tuner": rec}) == [
        "tuner: lab gloo 4096 B: timed in 1 of 2 trials",
        f"tuner: lab {wrong['variant']} {wrong['bytes']} B: the result was wrong"]


def small_cells_record() -> dict:
    """A small-cells record as the suite writes it: per lab, three launches
    of two interleaved passes each over the default policy, round_robin and
    its twin. Pass busbws (MB/s) are the launch's base x (0.9, 1.1), so a
    launch's median is its base."""
    base = {  # per launch: (adaptive, round_robin, round_robin#2) at 64 KiB; 4 KiB is a tenth
        "pinned/allgather": [(30.0, 20.0, 22.0), (32.0, 40.0, 40.0), (25.0, 28.0, 28.0)],
        "ecmp/allgather": [(20.0, 40.0, 40.0), (20.0, 40.0, 40.0), (20.0, 40.0, 40.0)]}
    variants = ["adaptive", "round_robin", "round_robin#2"]
    runs = {}
    for key, launches in base.items():
        runs[key] = []
        for i, bws in enumerate(launches):
            order = variants[i:] + variants[:i]
            passes = []
            for j, f in enumerate((0.9, 1.1)):
                rows = [{"variant": v, "bytes": size, "busbw_GBps": bws[variants.index(v)] * scale * f / 1e3,
                         "seconds": 1e-3, "iters": 20, "times": [1e-3] * 20, "exact": True}
                        for size, scale in ((4 << 10, 0.1), (64 << 10, 1.0)) for v in order[j:] + order[:j]]
                passes.append({"collective": "allgather", "world": 4, "rows": rows, "routes": {}, "order": order})
            runs[key].append(passes)
    return dict(p2p_alltoall_record(), experiment="small_cells", command="scripts/bench.sh --only small_cells",
                data={"lab": "4 hosts, 2 leaves, 4 spines", "core_mbit": 200, "access_mbit": 1000,
                      "variants": variants, "runs": runs})


def test_small_cells_judge_the_policy_by_the_median_launch_beside_the_same_configuration_twice(tmp_path):
    rec = small_cells_record()
    assert sanity({"small_cells": rec}) == []
    md = report.render({"small_cells": rec}, str(tmp_path))
    assert "## Small messages: the default policy against round_robin, launch by launch" in md
    pinned, ecmp = md.split("**ecmp/allgather**")
    # busbw: the median [min-max] over launches of each launch's median; ratios: per launch, then their
    # median (0.893: not the ratio of the busbw medians, 30 / 28)
    assert ("| 64 KiB | 30.0 (25.0-32.0) | 28.0 (20.0-40.0) | 28.0 (22.0-40.0) | 0.893 (0.800-1.500) "
            "| 1.000 (1.000-1.100) | 1 of 3 |") in pinned, pinned
    assert "| 4 KiB | 3.0 (2.5-3.2) |" in pinned, pinned
    assert "| 64 KiB | 20.0 (20.0-20.0) | 40.0 (40.0-40.0) | 40.0 (40.0-40.0) | 0.500 (0.500-0.500) " in ecmp, ecmp
    assert "0 of 3" in ecmp
    assert md.count("results/small_cells.png") == 1 and (tmp_path / "results" / "small_cells.png").exists()
    # a launch that timed a variant in fewer cells, or a wrong result, is reported
    broken = copy.deepcopy(rec)
    broken["data"]["runs"]["pinned/allgather"][1][0]["rows"][0]["exact"] = False
    for run in broken["data"]["runs"]["ecmp/allgather"][2]:
        run["rows"] = [r for r in run["rows"] if (r["variant"], r["bytes"]) != ("round_robin#2", 4 << 10)]
    bad = sanity({"small_cells": broken})
    assert any("the result was wrong" in b for b in bad) and any("timed in 2 of 3 launches" in b for b in bad), bad


def test_a_small_cells_shortfall_within_what_the_twin_reads_from_1_is_not_resolved():
    assert performance.small_cell_verdict(0.96, 0.90) == "met"
    assert performance.small_cell_verdict(0.93, 0.97) == "not resolved: 0.020 below, the twin 0.030 from 1"
    assert performance.small_cell_verdict(0.93, 1.03).startswith("not resolved")  # a twin ahead counts as far
    assert performance.small_cell_verdict(0.93, 1.01) == "**missed**"
    text, used = performance.perf_small_cells({"small_cells": small_cells_record()})
    assert used == ["small_cells"]
    assert "| pinned/allgather 64 KiB | 0.893 [0.800-1.500] | 1.000 [1.000-1.100] | **missed** |" in text, text
    assert "| ecmp/allgather 4 KiB | 0.500 [0.500-0.500] | 1.000 [1.000-1.000] | **missed** |" in text, text
    assert text.index("pinned/allgather 4 KiB") < text.index("pinned/allgather 64 KiB") < text.index("ecmp/")
