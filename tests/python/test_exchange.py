"""Reduce, gather, scatter, all_to_all and all_to_all_single on 2, 3 and 4
rank processes over four loopback paths: every dtype (bool included), sizes
0, 1, odd and several MB, every root, uneven splits (a mixture-of-experts
shuffle and its combine), non-contiguous tensors, gather_object /
scatter_object_list / all_gather_object on top; bad input refused on every
rank leaves the group usable, ranks that disagree all get an error."""
import pytest

import exchange_workers
from launcher import case_errors, run_ranks

WORLDS = [2, 3, 4]
CASES = exchange_workers.cases()
ENV = {"MAESTRO_CHUNK_SIZE": "16K", "MAESTRO_SEGMENT_SIZE": "64K"}


@pytest.fixture(scope="module", params=WORLDS, ids=lambda w: f"{w}ranks")
def world_results(request):
    world = request.param
    return world, run_ranks(world, exchange_workers.matrix, CASES, env=ENV, timeout=900)


@pytest.mark.parametrize("case", CASES)
def test_exchange(world_results, case):
    errors = case_errors(world_results, case)
    assert not errors, "\n".join(errors)


def test_every_rank_finished(world_results):
    world, results = world_results
    for rank, (status, value) in enumerate(results):
        assert status == "ok", f"rank {rank}: {value}"
        assert set(CASES) <= set(value), "cases missing from the report"
