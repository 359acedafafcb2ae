"""The evaluation suite's quick mode as a smoke test: every experiment of
benchmarks/suite.py runs on the lab, its JSON holds sane figures (positive
numbers, exact results, the injected faults seen: benchmarks/reporting/
sanity.py), and the report with its plots is generated from it. Speed is not
asserted. Needs root (the lab)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the benchmark lab needs root (network namespaces)")


def test_quick_suite_runs_every_experiment_and_reports(tmp_path):
    import suite
    from reporting.common import load
    from reporting.sanity import sanity

    data, out = tmp_path / "data", tmp_path / "report"
    out.mkdir()
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "suite.py"), "--quick", "--out", str(data)],
                         cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, run.stderr[-6000:]
    recs = load(str(data))
    assert set(recs) == set(suite.EXPERIMENTS), f"missing: {set(suite.EXPERIMENTS) - set(recs)}"
    problems = sanity(recs)
    assert not problems, "\n".join(problems)
    gen = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "report.py"), "--data", str(data),
                          "--out", str(out), "--readme", ""], capture_output=True, text=True, timeout=300)
    assert gen.returncode == 0, gen.stderr[-4000:]
    md = (out / "results.md").read_text()
    pngs = sorted(p.name for p in (out / "results").glob("*.png"))
    for name in ("p2p_paths", "chunk_size", "p2p_alltoall", "tuner", "models", "load_balance", "detection", "resiliency",
                 "failover", "latency", "overheads", "hunting", "footprint"):
        assert f"{name}.png" in pngs, pngs
        assert f"results/{name}.png" in md
    assert any(p.startswith("collectives_") for p in pngs), pngs
