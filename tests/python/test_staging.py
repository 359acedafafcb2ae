"""The staging of device tensors through pinned host slabs, tested here on
CPU tensors with MAESTRO_STAGING=force: they take the very steps a CUDA
tensor takes (host stand-ins carved from slabs registered once, copies in
before the operation and back after it), with plain host copies instead of
the GPU's. The whole collectives / p2p / behaviour suites also run with
forced staging in scripts/test.sh --full (the sanitizer stage); the GPU half is
tests/python/test_cuda.py."""
import pytest
import torch

import cuda_workers
from launcher import matrix_tests, run_ranks

# Small pieces: the matrix's mid-size tensors take the pipelined copies too.
FORCE = {"MAESTRO_STAGING": "force", "MAESTRO_TEST_DEVICE": "cpu", "MAESTRO_CHUNK_SIZE": "16K",
         "MAESTRO_STAGING_PIECE": "64K"}

world_results, test_staged_case, test_every_rank_finished = matrix_tests(
    cuda_workers.matrix_of, cuda_workers.case_names(), [2, 3], FORCE,
    timeout=300)


def test_built_with_cuda_staging_whenever_torch_has_cuda():
    import maestro_torch

    assert maestro_torch._C.has_cuda == bool(torch.version.cuda), (maestro_torch._C.has_cuda, torch.version.cuda)


def ok_values(results):
    for rank, (status, value) in enumerate(results):
        assert status == "ok", f"rank {rank} {status}: {value}"
    return [v for _, v in results]


def test_ddp_through_forced_staging_matches_gloo():
    for v in ok_values(run_ranks(2, cuda_workers.ddp_matches_gloo, env=FORCE, timeout=180)):
        assert v["same"], v


def test_fsdp2_through_forced_staging_matches_ddp():
    for v in ok_values(run_ranks(2, cuda_workers.fsdp_matches_ddp, env=FORCE, timeout=180)):
        assert v["close"], v


@pytest.mark.parametrize("value", ["auto", "force", "off"])
def test_staging_knob_is_declared_once(value):
    import maestro_torch

    knob = {k["name"]: k for k in maestro_torch.knobs()}["staging"]
    assert knob["env"] == "MAESTRO_STAGING" and knob["default"] == "auto"
    assert maestro_torch.Options(staging=value).as_dict() == {"staging": value}
    with pytest.raises((ValueError, RuntimeError), match="MAESTRO_STAGING"):
        maestro_torch.Options(staging="sometimes")


def test_maestro_as_the_cuda_backend_only_is_found_by_maestro_torch():
    for v in ok_values(run_ranks(2, cuda_workers.maestro_for_cuda_only, timeout=120)):
        assert v == {"cpu": "ProcessGroupGloo", "cuda": "ProcessGroupMaestro", "found": "ProcessGroupMaestro",
                     "paths": True}, v
