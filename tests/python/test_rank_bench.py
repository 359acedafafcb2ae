"""benchmarks/rank_bench.py sweep, every collective it measures (the suite's
collectives and p2p_alltoall experiments run it on the lab), on 2 ranks of
this host over loopback: maestro and gloo side by side, each result checked
after the warm-up, one RESULT line with a positive busbw per variant and
size. No root needed."""
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import rank_bench  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import labrun  # noqa: E402


def sweep(*args):
    """rank_bench.py sweep ARGS on 2 ranks of this host over loopback, started
    as torchrun starts its workers (labrun.run_local): (exit code, rank 0's
    stdout, every rank's stderr), the worse exit code of the two."""
    ranks = labrun.run_local(2, [os.path.join(ROOT, "benchmarks", "rank_bench.py"), "sweep", *args], timeout=240)
    return (max(ranks, key=lambda r: abs(r.returncode)).returncode, ranks[0].stdout,
            "".join(r.stderr for r in ranks))


@pytest.mark.parametrize("collective", rank_bench.SWEEP_COLLECTIVES)
def test_sweep_on_loopback_is_exact_for_every_variant(collective):
    variants, sizes = ["gloo", "adaptive", "adaptive@min_chunk_size=256K", "single"], [4 << 10, 1 << 20]
    rc, out, err = sweep("--collective", collective, "--sizes", "4K,1M",
                         "--variants", ",".join(variants), "--budget", "0.05")
    assert rc == 0, err[-4000:]
    (line,) = [l for l in out.splitlines() if l.startswith("RESULT ")]
    res = json.loads(line[len("RESULT "):])
    assert res["collective"] == collective and res["world"] == 2
    assert [(r["variant"], r["bytes"]) for r in res["rows"]] == [(v, s) for s in sizes for v in variants]
    factor = {"allreduce": 1.0, "allgather": 0.5, "sendrecv": 1.0, "alltoall": 0.5, "reduce": 1.0}[collective]  # 2 ranks
    for r in res["rows"]:
        assert r["exact"], r
        assert r["busbw_GBps"] > 0 and r["iters"] == len(r["times"]) >= 3, r  # 1M: 3 where they agree
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * factor), r
        # every rank's paths over the timed iterations, by rank: maestro's only, each with what it sent
        # and resent; a small reduce goes straight (or by the tree) to its root, rank 0, which only receives
        if r["variant"] == "gloo":
            assert "path_bytes" not in r, r
            continue
        senders = ["1"] if collective == "reduce" and r["bytes"] <= 64 << 10 else ["0", "1"]
        assert sorted(r["path_bytes"]) == senders, r
        for rank, paths in r["path_bytes"].items():
            assert paths and all(sent > 0 and retx >= 0 for sent, retx in paths.values()), r
            assert all(k.split("/")[0] == str(1 - int(rank)) for k in paths), r  # each rank's one peer


def test_a_long_cell_runs_no_warm_up_and_is_still_checked():
    # 64 MiB after 16 MiB, whose rate says a call is long (here: anything
    # over 10 ms): no warm-up call, so the result is checked after the first
    # timed call (an allreduce in place: checked after any later call it
    # would be wrong, so the check is where it must be).
    rc, out, err = sweep("--collective", "allreduce", "--sizes", "16M,64M",
                         "--variants", "gloo,adaptive", "--budget", "0.05", "--long-call-s", "0.01")
    assert rc == 0, err[-4000:]
    (line,) = [l for l in out.splitlines() if l.startswith("RESULT ")]
    rows = json.loads(line[len("RESULT "):])["rows"]
    assert [(r["bytes"], r["warmups"]) for r in rows] == [(16 << 20, 1), (16 << 20, 1), (64 << 20, 0), (64 << 20, 0)]
    assert all(r["exact"] for r in rows), rows


def test_trials_rotate_the_variants_in_one_launch_and_up_to_leaves_larger_cells_out():
    # The suite's trials in one launch (--trials): each pass rotates the
    # order, every pass has every cell, each checked; --up-to: single stops
    # at 4 KiB, in every pass.
    rc, out, err = sweep("--collective", "allgather", "--sizes", "4K,64K",
                         "--variants", "gloo,adaptive,single", "--budget", "0.02", "--trials", "3",
                         "--up-to", "single=4K")
    assert rc == 0, err[-4000:]
    (line,) = [l for l in out.splitlines() if l.startswith("RESULT ")]
    res = json.loads(line[len("RESULT "):])
    assert "rows" not in res and res["up_to"] == {"single": 4 << 10}
    orders = [["gloo", "adaptive", "single"], ["adaptive", "single", "gloo"], ["single", "gloo", "adaptive"]]
    assert [t["order"] for t in res["trials"]] == orders
    for t, order in zip(res["trials"], orders):
        assert [(r["bytes"], r["variant"]) for r in t["rows"]] == (
            [(4 << 10, v) for v in order] + [(64 << 10, v) for v in order if v != "single"])
        assert all(r["exact"] and r["busbw_GBps"] > 0 for r in t["rows"]), t
    import suite
    runs = suite.per_trial(res)
    assert [r["order"] for r in runs] == orders and all(r["collective"] == "allgather" for r in runs)
    assert [r["rows"] for r in runs] == [t["rows"] for t in res["trials"]]


def test_repeat_runs_only_its_variants_up_to_its_size_after_the_first_pass_and_the_median_is_a_pass():
    # --repeat: the passes after the first run only adaptive and single, up
    # to 4 KiB, in rotating order; --extra-passes: then 2 more of adaptive
    # alone at 4 KiB; median_of_trials keeps the first pass's cells, each its
    # median pass's row with every pass's busbw beside it.
    rc, out, err = sweep("--collective", "allreduce", "--sizes", "4K,64K",
                         "--variants", "gloo,adaptive,single", "--budget", "0.02", "--trials", "3",
                         "--repeat", "adaptive,single:4K", "--extra-passes", "adaptive:4K:2")
    assert rc == 0, err[-4000:]
    (line,) = [l for l in out.splitlines() if l.startswith("RESULT ")]
    res = json.loads(line[len("RESULT "):])
    assert res["repeat"] == {"variants": ["adaptive", "single"], "up_to": 4 << 10}
    assert res["extra_passes"] == {"variants": ["adaptive"], "up_to": 4 << 10, "passes": 2}
    assert [t["order"] for t in res["trials"]] == [["gloo", "adaptive", "single"], ["single", "adaptive"],
                                                   ["adaptive", "single"], ["adaptive"], ["adaptive"]]
    assert [[(r["bytes"], r["variant"]) for r in t["rows"]] for t in res["trials"][1:]] == [
        [(4 << 10, "single"), (4 << 10, "adaptive")], [(4 << 10, "adaptive"), (4 << 10, "single")],
        [(4 << 10, "adaptive")], [(4 << 10, "adaptive")]]
    import suite
    merged = suite.median_of_trials(res)
    assert [(r["variant"], r["bytes"]) for r in merged["rows"]] == [
        (v, s) for s in (4 << 10, 64 << 10) for v in ("gloo", "adaptive", "single")]
    for r in merged["rows"]:
        n = {"adaptive": 5, "single": 3}.get(r["variant"], 1) if r["bytes"] == 4 << 10 else 1
        assert len(r["trials_busbw_GBps"]) == n and r["exact"], r
        assert r["busbw_GBps"] == sorted(r["trials_busbw_GBps"])[(n - 1) // 2]


def test_path_deltas_count_what_each_path_sent_and_a_reconnected_one_from_zero():
    before = {"1/0": (100, 10), "1/1": (50, 5), "1/2": (7, 0)}
    after = {"1/0": (300, 12), "1/1": (80, 2), "1/2": (7, 0), "2/0": (40, 0)}
    assert rank_bench.path_deltas(before, after) == {"1/0": [200, 2], "1/1": [30, 2], "2/0": [40, 0]}


def test_repeat_needs_a_size_and_swept_variants():
    assert rank_bench.parse_repeat("", ["gloo"]) == ([], 0)
    assert rank_bench.parse_repeat("adaptive,single:64M", ["adaptive", "single"]) == (["adaptive", "single"],
                                                                                       64 << 20)
    for spec, why in (("adaptive", "expected VARIANT,...:SIZE"), ("adaptive:", "expected VARIANT,...:SIZE"),
                      ("latency:4K", "--repeat names ['latency'], which are not among --variants")):
        with pytest.raises(SystemExit, match=why.replace("[", r"\[").replace("]", r"\]")):
            rank_bench.parse_repeat(spec, ["adaptive"])


def test_extra_passes_need_a_size_a_count_and_swept_variants():
    assert rank_bench.parse_extra_passes("", ["gloo"]) == ([], 0, 0)
    assert rank_bench.parse_extra_passes("adaptive,single:64K:4", ["adaptive", "single"]) == (
        ["adaptive", "single"], 64 << 10, 4)
    for spec, why in (("adaptive:64K", "expected VARIANT,...:SIZE:PASSES"),
                      ("adaptive:64K:0", "expected VARIANT,...:SIZE:PASSES"),
                      ("adaptive:64K:x", "expected VARIANT,...:SIZE:PASSES"),
                      (":64K:2", "--extra-passes ':64K': expected VARIANT,...:SIZE"),
                      ("latency:4K:2", "--extra-passes names ['latency'], which are not among --variants")):
        with pytest.raises(SystemExit, match=why.replace("[", r"\[").replace("]", r"\]")):
            rank_bench.parse_extra_passes(spec, ["adaptive"])


def test_up_to_naming_a_variant_not_swept_is_refused():
    rc, out, err = sweep("--sizes", "4K", "--variants", "gloo", "--up-to", "single=4K")
    assert rc != 0
    assert "--up-to names ['single'], which are not among --variants ['gloo']" in err


class _Clock:
    """time.perf_counter for rank_bench: each fn() of timed() advances it by
    the next of the durations given."""

    def __init__(self, durations):
        self.now, self.durations = 0.0, list(durations)

    def perf_counter(self):
        return self.now

    def step(self):
        self.now += self.durations.pop(0)


@pytest.fixture
def one_rank_group():
    import torch.distributed as dist
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("durations, settle, ran", [
    ([1.0, 1.01, 1.02, 5.0, 5.0], 3, 3),       # the first three agree: stop there
    ([1.0, 2.0, 1.0, 2.0, 1.0], 3, 5),         # never settles: every iteration runs
    ([1.3, 1.0, 1.0, 1.0, 1.0], 3, 5),         # an outlier is not dropped: it keeps the spread open
    ([1.0, 1.2, 1.0, 1.01, 1.0, 1.0], 3, 6),  # settled only without the second: runs out
    ([17.0, 17.3, 20.0], 2, 2),                # the 256 MiB floor: two that agree
    ([1.0, 1.0, 1.0, 1.0, 1.0], None, 5),      # no settle: the whole budget
])
def test_timed_stops_early_only_where_the_spread_is_settled(monkeypatch, one_rank_group, durations, settle, ran):
    clock = _Clock(durations)
    monkeypatch.setattr(rank_bench, "time", clock)
    times = rank_bench.timed(clock.step, None, len(durations), settle)
    assert times == pytest.approx(durations[:ran])


def test_sweep_cells_settle_only_at_their_floor():
    # (most, settle) for a sweep's budget of 2 s at the 50 MB/s estimate
    assert rank_bench.iterations_for(4 << 10, 2.0, 50e6) == (20, None)      # cheap: the budget runs out
    assert rank_bench.iterations_for(1 << 20, 2.0, 50e6) == (20, None)
    assert rank_bench.iterations_for(64 << 20, 2.0, 50e6) == (5, 3)
    assert rank_bench.iterations_for(256 << 20, 2.0, 50e6) == (2, None)   # above 64 MiB: two, their mean


def test_small_cells_warm_up_for_a_fifth_of_a_second_and_large_ones_once():
    # at the 50 MB/s estimate: 64 KiB takes 1.3 ms, 4 MiB 84 ms, 16 MiB 0.34 s
    assert rank_bench.warmups_for(4 << 10, 50e6) == 10
    assert rank_bench.warmups_for(64 << 10, 50e6) == 10
    assert rank_bench.warmups_for(4 << 20, 50e6) == 2
    assert rank_bench.warmups_for(16 << 20, 50e6) == 1
    assert rank_bench.warmups_for(256 << 20, 50e6) == 1
    # none where the variant's call is expected to take 8 s or more (gloo at
    # 256 MiB on the lab: 17 s); maestro's 4.4 s there keeps its warm-up
    assert rank_bench.warmups_for(256 << 20, 50e6, expected_s=17.0) == 0
    assert rank_bench.warmups_for(256 << 20, 50e6, expected_s=4.4) == 1
    assert rank_bench.warmups_for(64 << 20, 50e6, expected_s=4.2) == 1


def test_a_cell_without_warm_up_checks_after_its_first_timed_call_untimed(monkeypatch, one_rank_group):
    clock = _Clock([1.0, 5.0, 1.0, 1.0])
    monkeypatch.setattr(rank_bench, "time", clock)
    seen = []
    times = rank_bench.timed(clock.step, None, 3, after_first=lambda: seen.append(clock.now) or clock.step())
    # the check ran once, after the first call, and its time (the 5 s)
    # counts in no iteration
    assert seen == [1.0] and times == pytest.approx([1.0, 1.0, 1.0])
