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
