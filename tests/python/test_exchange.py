"""Reduce, gather, scatter, all_to_all and all_to_all_single on 2, 3 and 4
rank processes over four loopback paths: every dtype (bool included), sizes
0, 1, odd and several MB, every root, uneven splits (a mixture-of-experts
shuffle and its combine), non-contiguous tensors, gather_object /
scatter_object_list / all_gather_object on top; bad input refused on every
rank leaves the group usable, ranks that disagree all get an error."""
import exchange_workers
from launcher import matrix_tests

ENV = {"MAESTRO_CHUNK_SIZE": "16K", "MAESTRO_SEGMENT_SIZE": "64K"}

world_results, test_exchange, test_every_rank_finished = matrix_tests(
    exchange_workers.matrix, exchange_workers.cases(), [2, 3, 4], ENV, timeout=900)
