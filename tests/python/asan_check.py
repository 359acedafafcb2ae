"""Run by scripts/test.sh before the Python tests it runs with the extension
built under ASan+UBSan (its name keeps it out of the plain test run): a
sanitizer run that had loaded the ordinary build, or that had no live ASan
runtime, would pass without checking anything."""
import os

from launcher import run_ranks


def where_and_asan(rank, world):
    import torch
    import torch.distributed as dist

    import maestro_torch

    dist.init_process_group("maestro")
    t = torch.full((1 << 16,), float(rank + 1))
    dist.all_reduce(t)
    exact = bool((t == world * (world + 1) / 2).all())
    dist.destroy_process_group()
    with open("/proc/self/maps") as f:
        runtimes = sorted({line.split()[-1] for line in f if "libasan" in line or "libubsan" in line})
    return {"extension": maestro_torch._C.__file__, "runtimes": runtimes, "exact": exact}


def test_every_rank_runs_the_sanitized_extension_with_asan_live():
    want = os.environ.get("MAESTRO_EXPECT_EXTENSION")
    assert want, "MAESTRO_EXPECT_EXTENSION is not set: run this through scripts/test.sh"
    for rank, (status, v) in enumerate(run_ranks(2, where_and_asan, timeout=180)):
        assert status == "ok", f"rank {rank} {status}: {v}"
        assert v["extension"].startswith(want + os.sep), f"rank {rank} loaded {v['extension']}, not the build in {want}"
        assert any("libasan" in r for r in v["runtimes"]), f"rank {rank}: no ASan runtime mapped ({v['runtimes']})"
        assert any("libubsan" in r for r in v["runtimes"]), f"rank {rank}: no UBSan runtime mapped ({v['runtimes']})"
        assert v["exact"], f"rank {rank}: wrong allreduce"
