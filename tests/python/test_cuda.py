"""CUDA tensors on maestro, on a GPU: every collective and p2p op, stream
order, futures, DDP and FSDP2, the init_process_group forms, bad input.
Ranks share the GPUs there are (two ranks on one GPU work). Without a GPU
every test here is skipped with the reason -- unless MAESTRO_REQUIRE_GPU=1
(scripts/gpu_check.sh sets it), where a missing GPU fails them. The same
steps run on CPU tensors with forced staging in test_staging.py."""
import os

import pytest
import torch

import cuda_workers
from launcher import case_errors, run_ranks

REQUIRED = os.environ.get("MAESTRO_REQUIRE_GPU") == "1"
ENV = {"MAESTRO_TEST_DEVICE": "cuda"}


@pytest.fixture(autouse=True)
def gpu():
    if torch.cuda.is_available():
        return
    if REQUIRED:
        pytest.fail("MAESTRO_REQUIRE_GPU=1 but torch sees no GPU (torch.cuda.is_available() is False)")
    pytest.skip("no GPU here (torch.cuda.is_available() is False); scripts/gpu_check.sh runs these on one")


def ok_values(results):
    for rank, (status, value) in enumerate(results):
        assert status == "ok", f"rank {rank} {status}: {value}"
    return [v for _, v in results]


@pytest.fixture(scope="module", params=[2, 3], ids=lambda w: f"{w}ranks")
def world_results(request):
    if not torch.cuda.is_available():
        return request.param, []
    return request.param, run_ranks(request.param, cuda_workers.matrix, env=ENV, timeout=300)


@pytest.mark.parametrize("case", cuda_workers.case_names())
def test_cuda_case(world_results, case):
    errors = case_errors(world_results, case)
    assert not errors, "\n".join(errors)


def test_cuda_ddp_matches_gloo():
    for v in ok_values(run_ranks(2, cuda_workers.ddp_matches_gloo, env=ENV, timeout=240)):
        assert v["same"] and v["device"].startswith("cuda"), v


def test_cuda_fsdp2_matches_ddp():
    for v in ok_values(run_ranks(2, cuda_workers.fsdp_matches_ddp, env=ENV, timeout=240)):
        assert v["close"], v


@pytest.mark.parametrize("backend", ["maestro", "cuda:maestro", "cpu:gloo,cuda:maestro"])
def test_init_forms_put_cuda_tensors_on_maestro(backend):
    for v in ok_values(run_ranks(2, cuda_workers.init_forms, backend, env=ENV, timeout=180)):
        assert v["ok"] and v["backend"] == "ProcessGroupMaestro", v


def test_staging_off_refuses_cuda_tensors_clearly_and_the_group_goes_on():
    for v in ok_values(run_ranks(2, cuda_workers.staging_off_refuses, env={**ENV, "MAESTRO_STAGING": "off"},
                                 timeout=180)):
        assert "MAESTRO_STAGING=off refuses CUDA tensors" in v["error"], v
        assert v["ok"], v
