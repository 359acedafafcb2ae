"""Every collective x reduce op x dtype x size (0, 1, not divisible by
ranks x chunks, several MB) on 2, 3 and 4 rank processes over four loopback
paths, compared exactly with a reference. One process group per world size
runs the whole matrix; each case is reported as its own test."""
import workers
from launcher import matrix_tests

# Small chunks and segments make the matrix exercise many chunks per
# message, many segments per block and scratch-slot reuse at modest sizes.
ENV = {"MAESTRO_CHUNK_SIZE": "16K", "MAESTRO_SEGMENT_SIZE": "64K"}

world_results, test_collective, test_every_rank_finished = matrix_tests(
    workers.matrix, workers.cases(), [2, 3, 4], ENV, timeout=900)
