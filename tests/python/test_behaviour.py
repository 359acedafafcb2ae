"""How the backend behaves for a user: clear errors on every rank and no
hang when ranks disagree or misuse it, registration, options, statistics."""
import os
import subprocess
import sys

import pytest
import torch

import scenarios
from launcher import run_ranks


def ok_values(results):
    for rank, (status, value) in enumerate(results):
        assert status == "ok", f"rank {rank} {status}: {value}"
    return [v for _, v in results]


@pytest.mark.parametrize("world, late", [(2, -1), (3, -1), (3, 0), (3, 2)])
def test_mismatched_shapes_fail_on_every_rank(world, late):
    # late: a rank that starts 3 s after the others have failed and left.
    # Ranks 1 and 2 (0 and 1) found the mismatch and relayed their abort
    # before they were connected to it, so it learns of the mismatch only
    # from the goodbye of a rank it needs, which carries that rank's failure.
    values = ok_values(run_ranks(world, scenarios.mismatched_shapes, late, timeout=120))
    for rank, v in enumerate(values):
        assert "different tensors" in v["error"] and "999" in v["error"], f"rank {rank}: {v['error']!r}"
        assert v["seconds"] < 20, "an error must not wait for the timeout"
        assert "unusable after an earlier failure" in v["later"], v["later"]


def test_mismatched_collectives_fail_on_every_rank():
    for rank, v in enumerate(ok_values(run_ranks(2, scenarios.mismatched_collectives, timeout=120))):
        assert "broadcast" in v["error"] and "allreduce" in v["error"], f"rank {rank}: {v['error']!r}"


def test_mismatched_dtypes_fail_on_every_rank():
    for rank, v in enumerate(ok_values(run_ranks(2, scenarios.mismatched_dtype, timeout=120))):
        assert "float32" in v["error"] and "float64" in v["error"], f"rank {rank}: {v['error']!r}"


@pytest.mark.parametrize("late", [-1, 0])
def test_a_rank_rejecting_its_input_fails_every_rank(late):
    # late=0: rank 0 starts when the others have failed and left; it learns
    # the reason from the goodbye of rank 2, which it meets first.
    values = ok_values(run_ranks(3, scenarios.one_rank_rejects_its_input, late, timeout=120))
    for rank, v in enumerate(values):
        assert "UInt32 is not supported" in v["error"], f"rank {rank}: {v['error']!r}"
        assert "rejected on rank 2" in v["error"], v["error"]
        assert v["seconds"] < 20


def test_sparse_tensor_is_a_clear_error():
    for v in ok_values(run_ranks(2, scenarios.sparse_tensor, timeout=120)):
        assert "maestro supports dense (strided) tensors only" in v["error"], v["error"]


@pytest.mark.parametrize("rooted, expect", [("gather", "gather: an output tensor has 3 elements but the input has 2"),
                                            ("scatter", "scatter: an input tensor has 3 elements but the output has 2")])
def test_tensor_lists_that_do_not_fit_are_clear_errors_on_every_rank(rooted, expect):
    world = 3
    values = ok_values(run_ranks(world, scenarios.bad_lists, rooted, timeout=120))
    for rank, v in enumerate(values):
        assert "maestro all_gather #1 rejected on rank " in v["allgather"], v["allgather"]
        assert "all_gather: an output tensor has 3 elements but the input has 2" in v["allgather"], v["allgather"]
        assert "reduce_scatter: an input tensor has 3 elements but the output has 2" in v["reduce_scatter"], \
            v["reduce_scatter"]
        # Each rank refused its own calls before anything moved: the group goes on.
        assert v["later"] == "" and v["result"] == [float(sum(range(world)))] * 2, v
        # Only the root has the list: it refuses, and the others hear why.
        assert expect in v["rooted"] and "rejected on rank 0" in v["rooted"], (rank, v["rooted"])


@pytest.mark.parametrize("world", [2, 3])
def test_unsupported_reduce_op_is_a_clear_error_and_the_group_goes_on(world):
    for v in ok_values(run_ranks(world, scenarios.unsupported_op, timeout=120)):
        assert "BAND is defined for integer and bool tensors only" in v["error"], v["error"]
        assert "PREMUL_SUM is defined for floating-point tensors only, not Char" in v["error2"], v["error2"]
        assert v["later"] == "" and v["later2"] == "", (v["later"], v["later2"])
        assert v["result"] == [float(sum(range(world)))] * 4
        assert v["broadcast"] == [float(world - 1)] * 3


@pytest.mark.parametrize("world,skipper", [(2, 1), (4, 2)])
def test_a_rank_that_skips_a_collective_is_named_on_every_other(world, skipper):
    """In a ring of 4 only ranks 1 and 3 wait on rank 2's data; rank 0 waits
    on rank 3. Every rank's error must still name rank 2 as the one that
    never entered the allreduce (the ranks that timed out mark it in the
    store), within the group timeout (3 s) plus that wait (2 s)."""
    values = ok_values(run_ranks(world, scenarios.skipped_collective, skipper, timeout=120))
    for rank, v in enumerate(values):
        if rank == skipper:
            continue
        assert "timed out" in v["error"], v["error"]
        assert f"rank {skipper} did not enter allreduce #" in v["error"], f"rank {rank}: {v['error']}"
        # Liveness bound with margin for a loaded machine.
        assert v["seconds"] < 3 + 2 + 6, f"rank {rank}: {v['seconds']:.1f} s"


def test_a_calls_own_timeout_overrides_the_groups():
    values = ok_values(run_ranks(2, scenarios.per_call_timeout, timeout=120))
    assert "timed out" in values[0]["error"] and "rank 1" in values[0]["error"], values[0]["error"]
    assert 1.5 < values[0]["seconds"] < 8, values[0]["seconds"]


@pytest.mark.parametrize("case,world", [("timeout", 3), ("peer_exits", 2)])
def test_work_future_result_says_success_timeout_or_comm_error(case, world, tmp_path):
    import json

    results = run_ranks(world, scenarios.future_results, case, timeout=120,
                        env={"MAESTRO_DUMP": str(tmp_path / "record-{rank}.json")})
    values = ok_values(results if case == "timeout" else results[:-1])  # the rank that exits returns nothing
    codes = values[0]["codes"]
    for rank, v in enumerate(values):
        assert v["success"] == codes["SUCCESS"] and v["value_ok"], f"rank {rank}: {v}"
    failing = values[:world - 1]
    for rank, v in enumerate(values):
        assert 0 < v["duration_ms"] < 60_000 and v["hooks_after_success"] == [], f"rank {rank}: {v}"
    for rank, v in enumerate(values):
        assert v["record"] == [(1, "maestro:all_reduce", 4000, "completed")], f"rank {rank}: {v}"
    # The flight record each failing rank wrote as its group failed; none from a rank that did not fail.
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"record-{r}.json" for r in range(world - 1)]
    for rank, v in enumerate(failing):
        record = json.loads((tmp_path / f"record-{rank}.json").read_text())
        assert (record["rank"], record["size"]) == (rank, world)
        ops = record["ops"]
        assert [op["state"] for op in ops][-1] == "failed" and ops[-1]["bytes"] == 40, ops
        assert ops[-1]["error"] in v["wait_error"], (ops[-1], v["wait_error"])
        assert ops[-1]["queued"] <= ops[-1]["started"] <= ops[-1]["ended"], ops[-1]
        assert record["paths"] and all("bytes_sent" in p for p in record["paths"]), record["paths"]
    for rank, v in enumerate(failing):
        # The hook ran before the failed Work completed; the unregistered one never.
        assert v["hooks_when_failed"] == ["hook 7"], f"rank {rank}: {v}"
        assert 0 < v["failed_duration_ms"] <= v["since_start_ms"], f"rank {rank}: {v}"
    if case == "timeout":
        assert values[-1]["hooks_after_success"] == []  # the rank that skipped the call never failed
        assert all(v["failed_duration_ms"] > 1500 for v in failing), failing  # at least its 2 s deadline, nearly
        # The rank whose deadline runs out first says TIMEOUT and aborts the
        # operation on the others, which then fail with its error (COMM_ERROR)
        # unless their own deadline ran out first.
        assert all(v["failed"] in (codes["TIMEOUT"], codes["COMM_ERROR"]) for v in failing), failing
        assert any(v["failed"] == codes["TIMEOUT"] for v in failing), failing
        assert all("timed out" in v["wait_error"] for v in failing), failing
    else:
        for rank, v in enumerate(failing):
            assert v["failed"] == codes["COMM_ERROR"], f"rank {rank}: {v}"
            assert "rank 1" in v["wait_error"], v["wait_error"]


@pytest.mark.parametrize("flags", ["default", "abort"])
def test_the_survivors_of_a_rank_that_exits_shrink_the_group_and_go_on(flags):
    world = 3
    values = ok_values(run_ranks(world, scenarios.shrink_after_a_rank_exits, flags, timeout=180)[:-1])
    for rank, v in enumerate(values):
        assert "rank 2" in v["failed"], f"rank {rank}: {v}"
        assert (v["rank"], v["size"], v["backend"]) == (rank, world - 1, "maestro"), f"rank {rank}: {v}"
        assert v["exact"] == [True] * 3 and v["peers"] == [1 - rank] and v["paths_up"], f"rank {rank}: {v}"
        assert v["seconds"] < 30, f"rank {rank}: {v}"  # a liveness bound: it measured well under a second


def test_metrics_are_json_lines_per_rank_and_group_until_the_end(tmp_path):
    import json

    env = {"MAESTRO_METRICS": str(tmp_path / "m-{rank}-{group}.jsonl"), "MAESTRO_METRICS_INTERVAL": "0.2"}
    values = ok_values(run_ranks(2, scenarios.metrics_lines, env=env, timeout=120))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m-0-0.jsonl", "m-0-1.jsonl", "m-1-0.jsonl",
                                                           "m-1-1.jsonl"]
    for rank in range(2):
        lines = [json.loads(line) for line in (tmp_path / f"m-{rank}-0.jsonl").read_text().splitlines()]
        assert len(lines) >= 4 * 3, len(lines)  # 4 paths; a record per monitor tick (0.5 s) over 2.5 s, and the last
        assert {(x["rank"], x["group"], x["peer"]) for x in lines} == {(rank, 0, 1 - rank)}
        assert set(lines[0]) >= {"time", "state", "bytes_sent", "resent", "rtt_s", "throughput_bps", "hunts"}
        times = [x["time"] for x in lines]
        assert times == sorted(times) and times[-1] - times[0] > 1
        # The last record (written as the group goes) holds at least what
        # path_stats() said last, per path.
        final = {}
        for x in lines:
            final[x["path"]] = x["bytes_sent"]
        assert all(final[int(p)] >= b > 0 for p, b in values[rank]["bytes_sent"].items()), (final, values[rank])
        sub = [json.loads(line) for line in (tmp_path / f"m-{rank}-1.jsonl").read_text().splitlines()]
        assert sub and {x["group"] for x in sub} == {1} and max(x["bytes_sent"] for x in sub) > 0


def test_set_timeout_on_a_subgroup_bounds_its_calls_and_leaves_the_world_alone():
    values = ok_values(run_ranks(3, scenarios.set_timeout_on_a_subgroup, timeout=120))
    assert "timed out" in values[0]["error"] and "rank 1" in values[0]["error"], values[0]
    assert 1.5 < values[0]["seconds"] < 10, values[0]  # 2 s, plus the wait that names the absent rank
    assert all(v["world_ok"] for v in values), values


def test_abort_runs_the_abort_hooks_once_and_a_failing_hook_does_not_stop_the_others():
    for rank, v in enumerate(ok_values(run_ranks(2, scenarios.abort_hooks, timeout=120))):
        assert v["before"] == [] and v["after"] == [True], f"rank {rank}: {v}"
        assert v["duration_error"] == "", f"rank {rank}: {v}"


@pytest.mark.parametrize("how", ["exit", "destroy", "crash"])
def test_a_script_that_ends_without_destroy_is_not_taken_for_a_crash(how):
    """A rank whose script just ends (as under Lightning, which never
    destroys the group) says goodbye at the interpreter's exit: its peer
    logs no warning, as after destroy_process_group. One that crashes
    (os._exit) is still reported as one -- the positive control."""
    import datetime

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=60))
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1")
    worker = os.path.join(os.path.dirname(__file__), "exit_worker.py")
    procs = [subprocess.Popen([sys.executable, worker, str(r), "2", str(store.port), how], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "DONE" in outs[0][0], outs[0]
    peer_log = outs[0][1]
    if how == "crash":
        assert "did the process exit or crash?" in peer_log, peer_log
    else:
        assert "WARN" not in peer_log and "ERROR" not in peer_log, peer_log


def test_a_rank_that_exits_fails_the_others_quickly():
    results = run_ranks(2, scenarios.peer_exits, timeout=120)
    status, value = results[0]
    assert status == "ok", value
    assert "rank 1" in value["error"] and "exit or crash" in value["error"], value["error"]


def test_unknown_knob_value_fails_every_rank_clearly():
    results = run_ranks(2, scenarios.bad_knob, env={"MAESTRO_POLICY": "fastest"}, timeout=120)
    for rank, v in enumerate(ok_values(results)):
        assert "MAESTRO_POLICY='fastest' is not one of" in v["error"], f"rank {rank}: {v['error']!r}"


@pytest.mark.parametrize("env,ours,theirs", [
    ("MAESTRO_CHUNK_SIZE=64K", "chunk_size=auto", "chunk_size=65536"),
    # Both sides cut a mid-size message the same way only with the same floor.
    ("MAESTRO_MIN_CHUNK_SIZE=16K", "min_chunk_size=auto", "min_chunk_size=16384"),
    ("MAESTRO_PATHS=2", "paths=auto", "paths=2"),
    ("MAESTRO_POLICY=round_robin", "policy=adaptive", "policy=round_robin"),
    ("MAESTRO_HUNT=off", "hunt=auto", "hunt=off"),
])
def test_group_wide_knob_differing_between_ranks_fails_every_rank(env, ours, theirs):
    name, value = env.split("=")
    results = run_ranks(2, scenarios.bad_knob, rank_env={1: {name: value}}, timeout=120)
    for rank, v in enumerate(ok_values(results)):
        assert "must be the same on every rank" in v["error"], f"rank {rank}: {v['error']!r}"
        assert ours in v["error"] and theirs in v["error"], v["error"]


def test_verbs_requested_without_an_rdma_device_fails_clearly():
    import maestro_torch

    if os.path.isdir("/sys/class/infiniband") and os.listdir("/sys/class/infiniband"):
        pytest.skip("this host has an RDMA device")
    results = run_ranks(2, scenarios.verbs_without_device, env={"MAESTRO_TRANSPORT": "verbs"}, timeout=120)
    for rank, v in enumerate(ok_values(results)):
        if maestro_torch._C.has_verbs:
            assert "MAESTRO_TRANSPORT=verbs, but no RDMA device" in v["error"], f"rank {rank}: {v['error']!r}"
        else:
            assert "has no verbs transport" in v["error"], f"rank {rank}: {v['error']!r}"


def test_options_validate_at_construction():
    import maestro_torch

    with pytest.raises(TypeError, match="unknown maestro option"):
        maestro_torch.Options(chunk_sise="1M")
    with pytest.raises(Exception, match="MAESTRO_CHUNK_SIZE"):
        maestro_torch.Options(chunk_size="12345")
    o = maestro_torch.Options(vnics=["127.0.0.1", "127.0.0.2"], busy_poll=True, paths=2)
    assert o.as_dict() == {"vnics": "127.0.0.1,127.0.0.2", "busy_poll": "1", "paths": "2"}
    names = {k["name"] for k in maestro_torch.knobs()}
    assert {"paths", "chunk_size", "policy", "vnics", "transport"} <= names
    assert all(k["env"].startswith("MAESTRO_") for k in maestro_torch.knobs())


# Names and paths: checked where they are used (the interface when the group
# starts, the files when they are first written).
FREE_FORM_KNOBS = {"ifname", "metrics", "dump"}


@pytest.mark.parametrize("bad", ["not-a-valid-value!", "-5"])
def test_every_knob_rejects_a_bad_value_naming_its_variable(bad):
    import maestro_torch

    knobs = maestro_torch.knobs()
    assert FREE_FORM_KNOBS <= {k["name"] for k in knobs}
    for k in knobs:
        if k["name"] in FREE_FORM_KNOBS:
            continue
        with pytest.raises(Exception) as e:
            maestro_torch._C.resolve_config({k["name"]: bad})
        assert k["env"] in str(e.value) and f"Options({k['name']}=" in str(e.value), (k["name"], str(e.value))


def test_listeners_take_distinct_ports_from_the_port_range():
    lo, hi = 24000, 24099  # below the ephemeral range, so no connection of the machine holds one
    values = ok_values(run_ranks(2, scenarios.listening_ports, env={"MAESTRO_PORT_RANGE": f"{lo}-{hi}"}, timeout=120))
    for rank, v in enumerate(values):
        assert v["ok"], f"rank {rank}: wrong allreduce"
        assert len(v["listening"]) == 4, f"rank {rank}: one listener per vNIC: {v['listening']}"
        assert all(lo <= port <= hi for _, port in v["listening"]), f"rank {rank}: {v['listening']}"
    # The ranks share their vNIC addresses (one host): never a port.
    both = [tuple(x) for v in values for x in v["listening"]]
    assert len(both) == len(set(both)), both
    # Positive control: without the range the kernel picks ephemeral ports, outside it.
    for v in ok_values(run_ranks(2, scenarios.listening_ports, timeout=120)):
        assert not any(lo <= port <= hi for _, port in v["listening"]), v["listening"]


def test_a_port_range_too_narrow_fails_every_rank_naming_it():
    # One port for two ranks listening on the same four addresses.
    results = run_ranks(2, scenarios.bad_knob, env={"MAESTRO_PORT_RANGE": "24100-24100"}, timeout=120)
    errors = [v["error"] for v in ok_values(results)]
    assert any("every port of MAESTRO_PORT_RANGE=24100-24100 (1) is in use" in e for e in errors), errors
    assert all(e for e in errors), f"every rank fails: {errors}"


def test_entry_point_registers_without_import():
    for v in ok_values(run_ranks(2, scenarios.entry_point_without_import, timeout=120)):
        assert v["ok"]


def test_cpu_device_string():
    for v in ok_values(run_ranks(2, scenarios.device_string, timeout=120)):
        assert v["ok"] and v["transport"] == "tcp"


def test_options_and_subgroups():
    values = ok_values(run_ranks(3, scenarios.options_and_subgroups, timeout=120))
    for rank, v in enumerate(values):
        assert v["world_paths"] == 2 and v["world_ok"]
        if rank in (0, 2):
            assert v["sub_ok"] and v["sub_paths"] == 3
            assert v["sub_stats_peers"] == [2 - rank], "the subgroup's peer is the other member"


def test_split_group_makes_a_maestro_group_of_the_ranks_listed():
    values = ok_values(run_ranks(4, scenarios.split_group, timeout=120))
    for rank, v in enumerate(values):
        first = rank < 2
        assert v["splits"] and v["paths"] == 2, v
        assert (v["rank"], v["size"]) == ((rank, 2) if first else (3 - rank, 2)), v
        assert v["sum"] == [1.0 if first else 5.0] and v["broadcast"] == [0.0 if first else 3.0], v
        assert v["not_listed"], "a rank the list leaves out gets no group"
        assert "split: rank 7 is not a rank of this group of 4" in v["bad"], v["bad"]
        assert v["world_ok"]


def test_subgroups_send_on_the_default_groups_paths():
    values = ok_values(run_ranks(4, scenarios.shared_paths, timeout=180))
    for rank, v in enumerate(values):
        assert not v["errors"], v["errors"]
        assert set(v["sums"]) == {"world", "row", "col", "dp", "tp"}
        channels = v["channels"]
        assert channels["world"] == 0
        others = [channels[k] for k in ("row", "col", "dp", "tp")]
        assert all(c > 0 for c in others) and len(set(others)) == 4, channels
        # Four groups, every pair already connected by the default group.
        assert v["added_sockets"] == 0, f"rank {rank}: {v['added_sockets']} sockets for its subgroups"
        other = rank ^ 1
        assert {(p, g) for p, g, _ in v["row_stats"]} == {(other % 2, other)}, v["row_stats"]
        assert all(state == "up" for _, _, state in v["row_stats"])
        assert "on the paths of its parent group (shared paths, channel" in v["describe"]


def _ranks_may_read_each_other() -> bool:
    """Two processes of one user may read each other's memory unless Yama's
    ptrace_scope forbids it (1 and up, for a non-root user)."""
    try:
        scope = open("/proc/sys/kernel/yama/ptrace_scope").read().strip()
    except OSError:
        scope = "0"  # no Yama
    return os.geteuid() == 0 or scope == "0"


@pytest.mark.parametrize("single_copy", ["auto", "off"])
def test_each_path_carries_a_fair_share_of_a_large_allreduce(single_copy):
    values = ok_values(run_ranks(2, scenarios.path_share, single_copy, timeout=180))
    for rank, v in enumerate(values):
        assert v["ok"]
        sent = [s["bytes_sent"] for s in v["stats"]]
        assert len(sent) == 4 and all(s["state"] == "up" for s in v["stats"])
        total = sum(sent)
        assert total >= 64 * 2**20, f"rank {rank} sent {total} bytes for a 64 MiB allreduce"
        for p, b in enumerate(sent):
            assert abs(b - total / 4) <= 0.05 * total / 4, f"rank {rank} path {p}: {b} of {total} bytes"
        for s in v["stats"]:  # the path's own TCP counters, and the congestion control asked for
            assert s["congestion"] == "reno", s
            counters = s["path_counters"]
            if single_copy == "off" or not _ranks_may_read_each_other():
                # Off, or refused (Yama): the fallback, which the test below proves on its own.
                assert counters.get("single_copy_bytes_sent", 0) == 0, s
                assert counters["tcp_bytes_sent"] >= s["bytes_sent"], s
            else:
                # Both ranks are processes of this host: once a path's offer
                # is accepted (at set-up), its payloads go by reference.
                by_reference = counters["single_copy_bytes_sent"]
                assert by_reference >= 0.9 * s["bytes_sent"], s
                assert counters["tcp_bytes_sent"] + by_reference >= s["bytes_sent"], s


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run each rank as a user of its own")
def test_ranks_that_may_not_read_each_other_keep_payloads_on_the_socket_and_say_why():
    values = ok_values(run_ranks(2, scenarios.single_copy_between_users, env={"MAESTRO_DEBUG": "INFO"}, timeout=120))
    for rank, v in enumerate(values):
        assert v["ok"], f"rank {rank}: wrong sums"
        assert all(b == 0 for b in v["by_reference"]) and sum(v["bytes_sent"]) >= 4 << 20, f"rank {rank}: {v}"
        said = [line for line in v["log"].splitlines() if "single copy is not used" in line]
        assert len(said) == 1 and f"rank {1 - rank}" in said[0] and "another user" in said[0], v["log"][-3000:]


def test_info_logging_prints_knobs_and_path_table():
    values = ok_values(run_ranks(2, scenarios.info_logging, env={"MAESTRO_DEBUG": "INFO"}, timeout=120))
    for rank, v in enumerate(values):
        log = v["log"]
        assert f"maestro[{rank}] INFO" in log
        for knob in ("MAESTRO_CHUNK_SIZE=262144", "MAESTRO_POLICY=", "MAESTRO_PATHS=", "MAESTRO_VNICS="):
            assert knob in log, f"{knob} missing from the INFO log:\n{log}"
        # What the automatic knobs chose, in the set-up line.
        assert "chunks of 262144 bytes" in log, log
        assert "tuner (2 ranks, one host, tcp, 4 paths; MAESTRO_ALGO=auto)" in log, log
        assert ", congestion control " in log, log
        assert "single copy: rank " in log, "the same-host single copy is not announced"
        assert "127.0.0.4" in log and "sent MB" in log, "path table missing"
        assert "path statistics at shutdown" in log


@pytest.mark.parametrize("world", [2, 3])
def test_the_tuners_choices_and_a_forced_algorithm_are_exact_and_described(world):
    for rank, v in enumerate(ok_values(run_ranks(world, scenarios.algorithms, timeout=180))):
        assert v["wrong"] == [], f"rank {rank}: {v['wrong']}"
        d = v["describe"]
        assert f"tuner ({world} ranks, one host, tcp" in d["auto"], d["auto"]
        assert "allreduce: recursive_doubling up to 262144 bytes, ring above\n" in d["auto"], d["auto"]
        assert "MAESTRO_ALGO=auto" in d["auto"], d["auto"]
        assert "-- forced: ring at every size" in d["ring"], d["ring"]
        assert "MAESTRO_ALGO=allreduce:recursive_doubling" in d["recursive_doubling"], d["recursive_doubling"]


def test_a_bad_algorithm_fails_every_rank_naming_the_ones_there_are():
    results = run_ranks(2, scenarios.bad_knob, env={"MAESTRO_ALGO": "allreduce:tree"}, timeout=120)
    for rank, v in enumerate(ok_values(results)):
        assert "MAESTRO_ALGO='allreduce:tree': 'tree' is not an algorithm of allreduce" in v["error"], v["error"]
        assert "allreduce: ring, recursive_doubling; reduce: ring, direct, tree" in v["error"], v["error"]


def test_ddp_matches_gloo():
    maestro = ok_values(run_ranks(2, scenarios.ddp_training, "maestro", timeout=180))
    gloo = ok_values(run_ranks(2, scenarios.ddp_training, "gloo", timeout=180))
    for rank in range(2):
        for m, g in zip(maestro[rank], gloo[rank]):
            torch.testing.assert_close(torch.tensor(m), torch.tensor(g), rtol=1e-5, atol=1e-6)
    for m0, m1 in zip(maestro[0], maestro[1]):
        assert m0 == m1, "DDP replicas must stay identical"


def test_a_shut_down_group_says_so_and_stops_once():
    for rank, v in enumerate(ok_values(run_ranks(2, scenarios.after_shutdown, timeout=120))):
        assert v["alive"] == [False, False, False], f"rank {rank}: a concurrent stop hung"
        assert v["stop_errors"] == [], v["stop_errors"]
        for key in ("path_stats", "describe", "paths", "cache", "allreduce"):
            assert "shut down" in v[key], f"rank {rank} {key}: {v[key]!r}"


def test_a_peer_frozen_mid_transfer_fails_the_operation_and_destroy_returns():
    # A peer silent on every path (SIGSTOP): no path is "heard elsewhere", so
    # no path-level rule can judge it; the peer timeout (3 s here, 10 s by
    # default) must, long before the group's 60 s timeout.
    results = run_ranks(2, scenarios.frozen_peer, env={"MAESTRO_PEER_TIMEOUT": "3"}, timeout=120)
    status, v = results[0]
    assert status == "ok", v
    assert "rank 1 has answered nothing on any of its" in v["error"], v["error"]
    assert "MAESTRO_PEER_TIMEOUT=3 s" in v["error"], v["error"]
    # 3 s of unanswered probes, the first sent up to one probe interval
    # (0.5 s) before or after the freeze; the upper bound is a liveness bound
    # with margin for a loaded host.
    assert 3 - 0.5 < v["failed_after"] < 3 + 5, f"the error came {v['failed_after']:.1f} s after the freeze"
    assert v["destroyed_after"] < 5, f"destroy_process_group took {v['destroyed_after']:.1f} s"
    assert results[1][0] in ("ok", "error"), results[1]  # rank 1 woke up and ended, either way


@pytest.mark.parametrize("op", ["allreduce", "recv"])
def test_a_peer_frozen_before_it_enters_the_operation_fails_it_at_the_peer_timeout(op):
    # Nothing is in flight to the stopped peer (what was sent to it arrived
    # and was confirmed; it never sent its own descriptor): the operation's
    # wait on it is what the peer timeout guards.
    stops_after = 1.5
    results = run_ranks(2, scenarios.peer_frozen_between_operations, op, stops_after,
                        env={"MAESTRO_PEER_TIMEOUT": "3"}, timeout=120)
    status, v = results[0]
    assert status == "ok", v
    assert "rank 1 has answered nothing on any of its" in v["error"], v["error"]
    # 3 s of unanswered probes, the first up to one probe interval (0.5 s)
    # before the stop; the upper bound is a liveness bound with margin for a
    # loaded host, far below the group's 60 s.
    took = v["failed_after"] - stops_after
    assert 3 - 0.5 < took < 3 + 10, f"the error came {took:.1f} s after the peer stopped"
    assert results[1][0] in ("ok", "error"), results[1]  # rank 1 woke up and ended, either way


def test_a_peer_frozen_for_less_than_the_peer_timeout_costs_only_the_freeze():
    # Frozen for 3 s, longer than the path timeout (2 s), shorter than the
    # default peer timeout (10 s): no path is closed as blackholed, no
    # operation fails, every result is exact on both ranks.
    results = run_ranks(2, scenarios.frozen_peer, 3.0, timeout=120)
    for rank, v in enumerate(ok_values(results)):
        assert v["error"] == "", f"rank {rank}: {v['error']}"
        assert v["wrong"] == [], f"rank {rank}: wrong results in rounds {v['wrong']}"
    assert results[0][1]["frozen_for"] >= 3.0, results[0][1]


@pytest.mark.parametrize("how,bound", [("abort", 5), ("destroy", 10 + 5)])
def test_stopping_the_group_does_not_wait_for_the_timeout(how, bound):
    status, v = run_ranks(2, scenarios.stop_while_waiting, how, timeout=120)[0]
    assert status == "ok", v
    assert v["stopped_after"] < bound, f"{how} took {v['stopped_after']:.1f} s (group timeout 60 s)"
    assert "aborted" in v["error"] or "shut down" in v["error"], v["error"]


def test_temporaries_are_staged_not_registered_on_every_call():
    for rank, v in enumerate(ok_values(run_ranks(2, scenarios.temporaries_are_not_registered, timeout=120))):
        assert v["ok"], f"rank {rank}: wrong results"
        # Only `dense` is registered (once): 80 operations, 20 of them on temporaries before.
        assert v["misses"] <= 2, f"rank {rank}: {v['misses']} registrations for 80 operations"


def test_idle_registrations_stay_under_the_byte_bound():
    for rank, v in enumerate(ok_values(run_ranks(2, scenarios.registrations_bounded_in_bytes, timeout=120))):
        assert v["ok"], f"rank {rank}: wrong results"
        assert max(v["bytes_after_each"]) <= 1 << 20, f"rank {rank}: {v}"
        assert v["stats"]["evictions"] >= 4 and v["stats"]["hits"] == 0, f"rank {rank}: {v}"


def test_registrations_of_freed_tensors_go_while_the_group_is_idle():
    for rank, v in enumerate(ok_values(run_ranks(2, scenarios.registrations_of_freed_tensors_go, timeout=120))):
        assert v["ok"], f"rank {rank}: wrong results"
        assert v["held"]["entries"] == 4, f"rank {rank}: {v}"
        assert v["after"]["entries"] == 0 and v["after"]["bytes"] == 0, \
            f"rank {rank}: registrations of freed tensors were kept while idle: {v}"
        # README: "goes within half a second while the group is idle". The
        # bound adds the poll step (0.1 s) and margin for a loaded machine.
        assert v["seconds"] < 0.5 + 1.0, f"rank {rank}: the registrations went after {v['seconds']} s"


def test_monitored_barrier_names_the_ranks_that_did_not_come():
    values = ok_values(run_ranks(4, scenarios.monitored_barrier, timeout=180))
    for rank, v in enumerate(values):
        assert v["pass"] == "", f"rank {rank}: {v['pass']}"
        assert v["after"] == [6.0] * 3, f"rank {rank}: the group must go on"
        assert v["first_seconds"] < 15 and v["all_seconds"] < 15, f"rank {rank}: {v}"
    r0, r1 = values[0], values[1]
    # gloo's wording (torch's tests and log scrapers match it).
    assert "Rank 2 failed to pass monitoredBarrier in 2000 ms" in r0["first"], r0["first"]
    assert "Ranks 2, 3 failed to pass monitoredBarrier in 2000 ms" in r0["all"], r0["all"]
    for key in ("first", "all"):  # rank 1 came in time: rank 0 tells it who did not
        assert "Rank(s) 2, 3 failed to pass monitoredBarrier" in r1[key], r1[key]
        for late in values[2:]:
            assert "did not hear from rank 0" in late[key], late[key]
