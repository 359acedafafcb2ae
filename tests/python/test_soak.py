"""benchmarks/soak.py's summary, without the lab: what it says about memory
must tell a warm-up from a leak."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import soak  # noqa: E402


def samples(rss, fds=lambda i: 30):
    return [[i * 250, rss(i), fds(i)] for i in range(41)]  # 10,000 operations


def test_a_warm_up_that_levels_off_is_not_growth():
    g = soak.growth_after_warmup(samples(lambda i: 500 + min(i, 8) * 10))
    assert g["first"][1] == 500 and g["warm"][1] == 580 and g["last"][1] == 580
    assert g["rss_mb_per_kop"] == 0 and g["fds_per_kop"] == 0


def test_a_leak_after_the_warm_up_is_its_slope():
    g = soak.growth_after_warmup(samples(lambda i: 500 + 2 * i, lambda i: 30 + i))
    assert g["rss_mb_per_kop"] == 8.0  # 2 MB per 250 operations
    assert g["fds_per_kop"] == 4.0


def test_too_few_samples_say_nothing():
    assert soak.growth_after_warmup([[0, 500, 30], [250, 501, 30]]) == {}


def test_markdown_has_each_ranks_growth_and_the_plot(tmp_path):
    (tmp_path / "results").mkdir()
    s = {"command": "sudo .venv/bin/python benchmarks/soak.py --ops 10000", "commit": "abc1234",
         "date": "2026-11-25T10:00:00+00:00", "seconds": 500.0, "ops_planned": 10000, "group_timeout_s": 20,
         "faults": {"link_flap": 3}, "ops_checked": 100, "wrong_results": [], "errors": 1, "generations": 2,
         "worst_error_latency_s": 1.5, "worst_destroy_s": 0.01, "hung_ranks": [], "killed_rank": None,
         "survivors_at_end": [[0, 1]], "ops_dropped_with_a_killed_member": 0, "error_messages": [],
         "samples": {"0": samples(lambda i: 500 + min(i, 8) * 10)},
         "growth": {"0": soak.growth_after_warmup(samples(lambda i: 500 + min(i, 8) * 10))}}
    out = tmp_path / "soak.md"
    soak.write_markdown(s, str(out))
    text = out.read_text()
    assert "| rank 0: RSS MB at the start / after the first quarter / at the end; growth since | " \
           "500 / 580 / 580; +0.00 MB per 1,000 operations |" in text
    assert "![soak RSS](results/soak_rss.png)" in text
    assert (tmp_path / "results" / "soak_rss.png").stat().st_size > 0


def test_a_wrong_result_is_recorded_with_its_index_rank_and_extent():
    import torch

    want = torch.arange(10)
    got = want.clone()
    got[3:6] = -1
    p = {"kind": "all_reduce", "n": 10, "dtype": "int64", "op": "min", "group": None}
    w = soak._wrong(torch, p, 2885, 2, 0, got, want)
    assert (w["index"], w["rank"], w["generation"], w["op"]) == (2885, 2, 0, "min")
    assert (w["elements_wrong"], w["first_wrong"], w["last_wrong"]) == (3, 3, 5)
    assert w["got_want_at_first"] == [-1, 3]
    assert "op" not in soak._wrong(torch, {**p, "kind": "reduce_scatter"}, 2885, 2, 0, got, want)


def test_large_reductions_draw_only_large_world_reductions():
    drawn = [soak.plan(1, i, large_reductions=True) for i in range(200)]
    assert {p["kind"] for p in drawn} == {"all_reduce", "reduce_scatter"}
    assert all(p["group"] is None and p["dtype"] == "int64" and p["op"] == "sum" for p in drawn)
    assert all(2 ** 21 <= p["n"] <= 2 ** 23 for p in drawn)
    assert soak.plan(1, 7) != soak.plan(1, 7, large_reductions=True)  # the main run's plan is its own


def test_a_reduce_scatter_block_of_the_inputs_is_the_slice_of_the_whole_input():
    import torch

    p = {"dtype": "int64"}
    whole = soak._input(torch, p, 5, 2, 4000)
    assert torch.equal(soak._input(torch, p, 5, 2, 1000, start=2000), whole[2000:3000])


def test_markdown_has_the_large_reductions_run_when_it_is_recorded(tmp_path):
    import json

    (tmp_path / "results").mkdir()
    assert soak.large_reductions_markdown(str(tmp_path / "results")) == []
    run = {"command": "sudo .venv/bin/python benchmarks/soak.py --large-reductions --ops 200", "commit": "abc1234",
           "date": "2026-12-02T10:00:00+00:00", "ops_checked": 800, "wrong_results": [], "errors": 0,
           "hung_ranks": [], "faults": {"link_flap": 76, "socket_destroyed": 64, "rank_frozen": 80, "rank_killed": 0},
           "seconds": 584.4}
    (tmp_path / "results" / soak.LARGE_REDUCTIONS).write_text(json.dumps(run))
    text = "\n".join(soak.large_reductions_markdown(str(tmp_path / "results")))
    assert "## Large reductions under faults" in text
    assert ("| `sudo .venv/bin/python benchmarks/soak.py --large-reductions --ops 200` at abc1234, 2026-12-02 | 800 | "
            "0 | 0 | 0 | 76 link flap, 64 socket destroyed, 80 rank frozen | 584.4 |") in text
