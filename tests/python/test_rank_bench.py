"""benchmarks/rank_bench.py sweep, every collective it measures (the suite's
collectives and p2p_alltoall experiments run it on the lab), on 2 ranks of
this host over loopback: maestro and gloo side by side, each result checked
after the warm-up, one RESULT line with a positive busbw per variant and
size. No root needed."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import rank_bench  # noqa: E402


@pytest.mark.parametrize("collective", rank_bench.SWEEP_COLLECTIVES)
def test_sweep_on_loopback_is_exact_for_every_variant(collective):
    variants, sizes = ["gloo", "adaptive", "adaptive@min_chunk_size=256K", "single"], [4 << 10, 1 << 20]
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
            "benchmarks/rank_bench.py", "sweep", "--collective", collective, "--sizes", "4K,1M",
            "--variants", ",".join(variants), "--budget", "0.05"]
    p = subprocess.run(argv, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                       timeout=240)
    assert p.returncode == 0, p.stderr[-4000:]
    (line,) = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    res = json.loads(line[len("RESULT "):])
    assert res["collective"] == collective and res["world"] == 2
    assert [(r["variant"], r["bytes"]) for r in res["rows"]] == [(v, s) for s in sizes for v in variants]
    factor = {"allreduce": 1.0, "allgather": 0.5, "sendrecv": 1.0, "alltoall": 0.5}[collective]  # 2 ranks
    for r in res["rows"]:
        assert r["exact"], r
        assert r["busbw_GBps"] > 0 and r["iters"] == len(r["times"]) >= 5, r
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * factor), r
