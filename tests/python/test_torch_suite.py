"""PyTorch's own distributed tests (DistributedTest._DistTestBase) on maestro
beside gloo, through tests/torch_suite/: the CI subset on both backends must
show no test that gloo passes and maestro fails or skips, other than the known gaps
listed with their causes in tests/torch_suite/selection.py (and no known gap
may pass: then it is no longer one). The whole selection is
`python tests/torch_suite/run.py --write` (docs/torch_suite.md)."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUITE = os.path.join(ROOT, "tests", "torch_suite")
sys.path.insert(0, SUITE)

import errors  # noqa: E402
import selection  # noqa: E402


def test_every_skip_lift_and_known_gap_has_a_reason():
    for name, reason in selection.SKIP.items():
        assert name.startswith("test_") and reason.strip(), name
    for name, (gate, why, body_backend) in selection.LIFT.items():
        assert gate.strip() and why.strip() and body_backend in (None, "gloo"), name
    for name, (category, call, cause) in selection.KNOWN_GAPS.items():
        assert category.strip() and call.strip() and cause.strip(), name
        assert name not in selection.SKIP, f"{name}: a known gap must run, not be skipped"
    subset = selection.CI_SUBSET
    assert len(subset) == len(set(subset)) and not set(subset) & set(selection.SKIP)


def test_the_first_error_line_is_what_a_rank_raised():
    text = ("RuntimeError: Process 0 exited with error code 10 and exception:\n"
            "Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n    g()\n"
            "RuntimeError: maestro all_gather_coalesced #1 rejected on rank 0: bad\nmore detail\n\n"
            "Process 1 exited with error code 10 and exception:\nTraceback (most recent call last):\n"
            "AssertionError: other rank\n")
    assert errors.classify(text) == ("errored", "RuntimeError: maestro all_gather_coalesced #1 rejected on rank 0: bad")
    text = text.replace("RuntimeError: maestro", "AssertionError: Tensor-likes are not close! maestro")
    assert errors.classify(text)[0] == "failed"
    assert errors.classify("RuntimeError: Process 0 terminated or timed out after 120.1 seconds") == \
        ("errored", "RuntimeError: Process 0 terminated or timed out after 120.1 seconds")


def test_an_expected_failure_is_not_a_pass_and_counts_against_maestro_where_gloo_passes():
    import run

    results = {"gloo": {"a": {"outcome": "passed"}, "b": {"outcome": "xfailed", "error": "x"}},
               "maestro": {"a": {"outcome": "xfailed", "error": "AssertionError"}, "b": {"outcome": "xfailed"}}}
    regressions, _, maestro_only = run.compare(results)
    assert [r["test"] for r in regressions] == ["a"] and maestro_only == []
    assert run.counts(results["maestro"])["xfailed"] == 2 and run.counts(results["maestro"])["passed"] == 0


def test_the_recorded_doc_is_generated_from_the_recorded_data():
    import run

    rec = json.load(open(run.DATA))
    assert open(run.DOC).read() == run.render(rec), "docs/torch_suite.md is stale: python tests/torch_suite/run.py --write"


def test_ci_subset_maestro_fails_nothing_gloo_passes(tmp_path):
    out = tmp_path / "ci.json"
    proc = subprocess.run([sys.executable, os.path.join(SUITE, "run.py"), "--subset", "ci", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.exists(), proc.stderr[-6000:]
    d = json.load(open(out))["data"]
    per = {b: d["backends"][b]["counts"] for b in ("gloo", "maestro")}
    # The subset is chosen to run, every test of it on both backends: a
    # harness that let some skip (a feature set lost, a gate renamed
    # upstream) must not pass. (Recorded: 54 of 54 ran on each, all passed.)
    assert sorted(d["tests"]) == sorted(selection.CI_SUBSET) and d["selected"] == len(selection.CI_SUBSET), \
        sorted(set(d["tests"]) ^ set(selection.CI_SUBSET))
    skipped = {b: sorted(t for t, r in d["tests"].items() if r[b]["outcome"] not in
                         ("passed", "failed", "errored", "xfailed")) for b in per}
    assert skipped == {"gloo": [], "maestro": []}, (skipped, per)
    new = [f"{r['test']}: {r['outcome']}: {r['error']}" for r in d["regressions"]
           if r["test"] not in selection.KNOWN_GAPS]
    assert not new, "maestro fails or skips what gloo passes:\n" + "\n".join(new)
    assert not d["known_gaps_passing"], f"known gaps that pass now (remove from KNOWN_GAPS): {d['known_gaps_passing']}"
    assert proc.returncode == 0, proc.stderr[-6000:]
