"""Every collective x reduce op x dtype x size (0, 1, not divisible by
ranks x chunks, several MB) on 2, 3 and 4 rank processes over four loopback
paths, compared exactly with a reference. One process group per world size
runs the whole matrix; each case is reported as its own test."""
import pytest

import workers
from launcher import case_errors, run_ranks

WORLDS = [2, 3, 4]
CASES = workers.cases()

# Small chunks and segments make the matrix exercise many chunks per
# message, many segments per block and scratch-slot reuse at modest sizes.
ENV = {"MAESTRO_CHUNK_SIZE": "16K", "MAESTRO_SEGMENT_SIZE": "64K"}


@pytest.fixture(scope="module", params=WORLDS, ids=lambda w: f"{w}ranks")
def world_results(request):
    world = request.param
    results = run_ranks(world, workers.matrix, CASES, env=ENV, timeout=900)
    return world, results



@pytest.mark.parametrize("case", CASES)
def test_collective(world_results, case):
    errors = case_errors(world_results, case)
    assert not errors, "\n".join(errors)


def test_every_rank_finished(world_results):
    world, results = world_results
    for rank, (status, value) in enumerate(results):
        assert status == "ok", f"rank {rank}: {value}"
        assert set(CASES) <= set(value), "cases missing from the report"
