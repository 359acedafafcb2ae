"""Point to point on 2 and 3 rank processes over four loopback paths: every
dtype and size through isend/irecv, blocking send/recv, tags matched in
order, recv from any source, either side posting first, non-contiguous
tensors, batch_isend_irecv, many messages beside collectives; bad ranks,
mismatched sizes and unmatched messages are clear errors, never hangs."""
import p2p_workers
from launcher import matrix_tests, run_ranks

ENV = {"MAESTRO_CHUNK_SIZE": "16K"}

world_results, test_p2p, test_every_rank_finished = matrix_tests(
    p2p_workers.matrix, p2p_workers.cases(), [2, 3], ENV, timeout=600)


def test_unmatched_messages_time_out_and_leave_the_group_usable():
    results = run_ranks(2, p2p_workers.unmatched, timeout=120)
    for rank, (status, value) in enumerate(results):
        assert status == "ok", f"rank {rank} {status}: {value}"
    r0, r1 = results[0][1], results[1][1]
    assert "timed out" in r0["recv"] and "rank 1" in r0["recv"], r0["recv"]
    assert "timed out" in r0["send"] and "did not post a matching recv" in r0["send"], r0["send"]
    assert r0["seconds"] < 15
    assert r0["after"] == r1["after"] == [1.0] * 4
    assert "gave up its send" in r1["late"], r1["late"]
    assert r0["peer_gone"], "a recv from a rank that exited must fail"
    assert r0["peer_gone_seconds"] < 15


def test_recv_from_any_source_takes_a_message_from_a_rank_not_yet_connected():
    # 6 ranks: rank 0's start-up partners are 1, 2, 4, 5 (ring and barrier); 3 is a stranger.
    results = run_ranks(6, p2p_workers.anysource_from_a_stranger, timeout=180)
    values = [v for status, v in results]
    assert all(status == "ok" for status, _ in results), results
    r0 = values[0]
    assert 3 not in r0["before"] and 3 in r0["after"], r0
    assert r0["source"] == 3 and r0["ok"], r0
