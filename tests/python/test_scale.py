"""Groups larger than the lab: 16 and 32 rank processes on this host, 2
loopback paths each, run every collective exactly; and what a rank holds
stays O(1) in threads (one event loop drives every path) and, in
descriptors, the paths to the peers it connects at start-up: its ring
neighbours and the barrier's log2(n) partners each way -- not the full
mesh (none of these cases needs another pair)."""
import pytest

import scenarios
from launcher import run_ranks

CASES = ["allreduce-sum-float32-100003", "allreduce-max-int64-1", "allreduce-avg-bfloat16-1048583",
         "reduce_scatter-sum-float32-1", "reduce_scatter_tensor-min-int32-100003",
         "all_gather-float32-100003", "all_gather_into_tensor-int8-1", "broadcast-float64-100003",
         "broadcast-root0", "barrier", "allreduce_coalesced", "allreduce-noncontiguous"]
# At 32 ranks only small tensors: each rank builds every rank's data to check
# its result, and 32 torch processes already take most of this host's memory.
SMALL = ["allreduce-sum-float32-1", "allreduce-max-int64-1", "reduce_scatter-sum-float32-1",
         "reduce_scatter_tensor-min-int32-1", "all_gather-float32-1", "all_gather_into_tensor-int8-1",
         "broadcast-float64-1", "broadcast-root0", "barrier", "allreduce_coalesced"]
PATHS = 2
ENV = {"MAESTRO_VNICS": "127.0.0.1,127.0.0.2", "OMP_NUM_THREADS": "1"}
# Per rank beyond the sockets of the mesh: python's own, a listener per vNIC,
# the event loop's epoll and eventfd, the store.
OTHER_FDS = 20
MAX_THREADS = 20


@pytest.mark.parametrize("world,cases", [(16, CASES), (32, SMALL)], ids=["16", "32"])
def test_every_collective_at_scale(world, cases):
    results = run_ranks(world, scenarios.scale, cases, env=ENV, timeout=600)
    for rank, (status, value) in enumerate(results):
        assert status == "ok", f"rank {rank} {status}: {value}"
        assert not value["failures"], f"rank {rank}: {value['failures']}"
        assert value["threads"] <= MAX_THREADS, f"rank {rank}: {value['threads']} threads: {value['thread_names']}"
        paths = PATHS * len(talks_to(rank, world))
        assert value["fds"] <= paths + OTHER_FDS, f"rank {rank}: {value['fds']} descriptors for {paths} paths"
    print(f"{world} ranks: threads {max(v['threads'] for _, v in results)}, "
          f"descriptors {max(v['fds'] for _, v in results)} (full mesh: {PATHS * (world - 1)} paths)")


def talks_to(rank, world):
    """The peers a rank connects to at start-up: the ring's neighbours and the
    dissemination barrier's partners, rank +- 2^k."""
    peers, dist = set(), 1
    while dist < world:
        peers |= {(rank + dist) % world, (rank - dist) % world}
        dist *= 2
    return peers - {rank}
