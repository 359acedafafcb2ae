"""maestro on a real leaf-spine network in namespaces (scripts/netlab.py):
4 hosts on 2 leaves, 4 spines, core links 200 Mbit/s; one rank per host,
each rank's vNICs = its host's aliases. Behaviour, not speed: the paths use
every spine, a spine link cut in the middle of an allreduce changes nothing
in the results and the path comes back when the link does, discovery finds
disjoint routes under ECMP hashing, adaptive moves chunks off loaded
spines. Needs root."""
import json
import os
import sys
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import labrun  # noqa: E402
import netlab  # noqa: E402

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the lab needs root (network namespaces)")


def result_of(results):
    for r in results:
        assert r.returncode == 0, f"rank {r.rank} failed:\n{r.stderr[-4000:]}"
    # Every rank destroyed its groups, so each said goodbye on every path
    # before closing it: no rank may take another's exit for a crash.
    for r in results:
        assert "did the process exit or crash" not in r.stderr, f"rank {r.rank}:\n{r.stderr[-4000:]}"
    lines = [l for l in results[0].stdout.splitlines() if l.startswith("RESULT ")]
    assert lines, results[0].stdout[-2000:]
    return json.loads(lines[0][len("RESULT "):])


def lab(name, **kw):
    return netlab.Lab(name=f"{name}{os.getpid() % 10000}", core=200, access=1000, **kw)


def bytes_up(before, after, leaf, spines=4):
    """Bytes each spine received from `leaf` between two link_bytes() calls."""
    return [after[(leaf, s)][0] - before[(leaf, s)][0] for s in range(spines)]


def paths_to_the_right(res):
    """Each core-crossing rank's paths to its ring neighbour: what a failed
    spine-coverage assertion needs to say whether discovery chose two paths on
    one spine or a path moved later (reconnect, hunt)."""
    return {rank: [{k: p[k] for k in ("path", "route", "bytes_sent", "reconnects", "hunts")}
                   for p in res["ranks"][rank][-1]["paths"] if p["peer"] == (rank + 1) % 4]
            for rank in (1, 3)}


def chunks_moved(res, **extra):
    """Chunks every rank moved off a cut or blackholed path, and what a failed
    assertion needs to trace it: each rank's resends per path, the fence
    drops, the pace, the closed paths with their reasons, and `extra`. Every
    rank is counted, not only the senders of the crossings through the link:
    which rank has a chunk in flight there when it goes (or learns of it from
    a probe first, the ring stalled upstream) is the lab's routing and the
    machine's pace, not what the tests check."""
    resent = {r: [p["resent"] for p in its[-1]["paths"]] for r, its in enumerate(res["ranks"])}
    seen = (f"resent per rank and path {resent}, fence drops {res['fence_drops']}, "
            f"{len(res['ranks'][0])} iterations, "
            + "".join(f"{k} {v}, " for k, v in extra.items())
            + f"closed paths {res['closed_paths']}")
    return sum(map(sum, resent.values())), seen


def loop_through_a_cut(l, size, seconds, down_seconds, backstop):
    """rank_bench's allreduce loop, with the L1-s1 link down for a while from
    1.5 s after it is ready (the 3->0 crossing's path via spine 1
    blackholes); MAESTRO_PATH_TIMEOUT (the backstop) far above the run's
    pace. Its RESULT."""
    ranks = labrun.start(l, ["benchmarks/rank_bench.py", "loop", "--size", size, "--seconds", str(seconds)],
                         env={"MAESTRO_PATH_TIMEOUT": str(backstop)})
    ranks.wait_for_line(0, "READY", 120)
    time.sleep(1.5)
    l.link_down(1, 1)
    time.sleep(down_seconds)
    l.link_up(1, 1)
    return result_of(ranks.wait(300))


def test_pinned_paths_use_every_spine():
    with lab("tp", mode="pinned") as l:
        before = l.link_bytes()
        res = result_of(labrun.run(l, ["benchmarks/rank_bench.py", "loop", "--size", "16M", "--seconds", "0", "--min-iters", "2"],
                                   timeout=300))
        after = l.link_bytes()
    assert all(it["ok"] for rank in res["ranks"] for it in rank)
    # L0 -> spines carries the 1->2 crossing: each of its 4 paths is pinned
    # to its own spine, so every spine carries a real share.
    up = bytes_up(before, after, 0)
    assert min(up) > 0.1 * sum(up), f"bytes L0->spine per spine: {up}"
    # The ranks are processes of one machine, but each in its own network
    # namespace (its host): the payloads cross the network, none is copied
    # between them in memory. One allreduce's crossing alone is 3/2 x 16 MiB.
    assert sum(up) >= 24 * 2**20, f"only {sum(up)} bytes crossed L0->spines"


def test_spine_link_cut_mid_allreduce_fails_over_and_recovers():
    # The backstop (MAESTRO_PATH_TIMEOUT) is set far above the run's pace:
    # only the traffic itself -- the network acknowledging none of the cut
    # path's bytes -- can close the path in time.
    backstop = 30
    with lab("tf", mode="pinned") as l:
        res = loop_through_a_cut(l, "16M", 12, 4, backstop)
    ranks = res["ranks"]
    assert all(it["ok"] for rank in ranks for it in rank), "every result stays exact"
    # Rank 3 sends to rank 0 over 4 paths, path 1 via spine 1: it went down,
    # came back, and carried data again afterwards.
    def path1(it):
        return next(p for p in it["paths"] if p["peer"] == 0 and p["path"] == 1)
    states = [path1(it)["state"] for it in ranks[3]]
    assert "down" in states, f"the cut path was never seen down: {states}"
    last = path1(ranks[3][-1])
    assert last["state"] == "up" and last["reconnects"] >= 1, last
    when_back = max(i for i, s in enumerate(states) if s == "down") + 1
    assert when_back < len(states), "the path never came back up"
    assert path1(ranks[3][-1])["bytes_sent"] > path1(ranks[3][when_back])["bytes_sent"], \
        "the path came back but carried nothing"
    moved, seen = chunks_moved(res)
    assert moved > 0, "no chunk was moved off the cut path: " + seen
    # No iteration (barrier, allreduce, the loop's own check) waited for the
    # backstop: a liveness bound with a wide margin, not a speed target
    # (the failover experiment measures the stall: a few hundred ms).
    starts = [it["start"] for it in ranks[0]]
    cycles = [b - a for a, b in zip(starts, starts[1:])]
    assert max(cycles) < backstop / 6, f"an iteration took {max(cycles):.1f} s: the path was not closed by its traffic"


def test_mid_size_collectives_are_exact_across_hosts_and_through_a_spine_link_cut():
    # A 1 MiB allreduce over the 4 hosts has 256 KiB ring steps: each is cut
    # into 64 KiB messages of one chunk (a ring across hosts whose blocks are
    # at most one smallest chunk per path), forwarded chunk by chunk. Sizes
    # below, inside and above that range, then a spine link cut while 1 MiB
    # allreduces run: every result exact, the cut path's chunks moved. An
    # all-to-all's blocks go to the other hosts in 64 KiB chunks.
    with lab("tm", mode="pinned") as l:
        for coll in ("allreduce", "allgather", "alltoall"):
            res = result_of(labrun.run(l, ["benchmarks/rank_bench.py", "sweep", "--collective", coll, "--sizes",
                                           "192K,772K,1M,2M", "--variants", "adaptive,round_robin",
                                           "--budget", "0.2"], timeout=300))
            wrong = [(r["variant"], r["bytes"]) for r in res["rows"] if not r["exact"]]
            assert not wrong, f"{coll}: wrong results at {wrong}"
        res = loop_through_a_cut(l, "1M", 8, 3, 30)
    its = res["ranks"]
    assert all(it["ok"] for rank in its for it in rank), "every result stays exact"
    # The loop ran through the cut (the link is down from about 1.5 s to
    # 4.5 s into it) and on after it: how many allreduces fit in 8 s is the
    # machine's pace, not what this test checks.
    starts = [it["start"] for it in its[0]]
    assert any(2 < s < 4 for s in starts), f"no allreduce started while the link was down: {starts}"
    assert any(s > 5 for s in starts), f"no allreduce started after the link came back: {starts}"
    cycles = [b - a for a, b in zip(starts, starts[1:])]
    assert max(cycles) < 5, f"an iteration took {max(cycles):.1f} s: the path was not closed by its traffic"
    moved, seen = chunks_moved(res)
    assert moved > 0, "no chunk was moved off the cut path: " + seen


def test_a_brief_blackhole_moves_chunks_and_their_late_originals_are_dropped():
    # A link that drops everything for 0.16 s, now and then: long enough for
    # the network to acknowledge none of a path's bytes for the suspicion
    # limit (about 0.12 s), so its chunks are withdrawn and sent again on the
    # other paths, and short enough that TCP then delivers the originals
    # (the path is not closed). Each arrives after the peer heard of the
    # fence: dropped, never landing after its copy, and every result exact.
    with lab("tb", mode="pinned") as l:
        ranks = labrun.start(l, ["benchmarks/rank_bench.py", "loop", "--size", "16M", "--seconds", "12"])
        ranks.wait_for_line(0, "READY", 120)
        time.sleep(1)
        pulses = []  # how long the link was down: the sleep and the `ip` commands
        for _ in range(8):
            t0 = time.monotonic()
            l.link_down(1, 1)  # L1-s1: the 3->0 and 1->2 crossings' paths via spine 1
            time.sleep(0.16)
            l.link_up(1, 1)
            pulses.append(round(time.monotonic() - t0, 3))
            time.sleep(1)
        res = result_of(ranks.wait(300))
    assert all(it["ok"] for rank in res["ranks"] for it in rank), "every result stays exact"
    moved, seen = chunks_moved(res, pulses=pulses)
    assert moved > 0, "no chunk was moved off the blackholed paths: " + seen
    # The receivers of those crossings dropped late originals: the pulses
    # ended before the paths were found dead, so TCP delivered them.
    assert sum(res["fence_drops"]) > 0, "no late original was dropped: " + seen


def test_spine_link_cut_while_idle_is_found_by_probes_alone():
    # No chunk is in flight when the link goes: only the probes cross the
    # cut paths, so only an unanswered probe can show they are dead (a path
    # left "up" would swallow a control message sent on it and count in the
    # scheduler). Every other path stays up; the cut ones come back with the
    # link, and an allreduce afterwards is exact.
    timeout = 1  # MAESTRO_PATH_TIMEOUT: an idle path is declared down after twice this
    with lab("ti", mode="pinned") as l, tempfile.TemporaryDirectory() as signals:
        ranks = labrun.start(l, ["tests/python/idle_cut_worker.py", signals, "1", "30"],
                             env={"MAESTRO_PATH_TIMEOUT": str(timeout)})
        for r in range(4):
            ranks.wait_for_line(r, "READY", 120)
        l.link_down(0, 1)  # L0-s1
        open(os.path.join(signals, "cut"), "w").close()
        try:
            for r in range(4):
                ranks.wait_for_line(r, "DETECTED", 60)
        except (RuntimeError, TimeoutError) as e:
            pytest.fail(f"{e}\n" + "\n".join(f"rank {r.rank}:\n{r.stderr[-3000:]}" for r in ranks.wait(10)))
        l.link_up(0, 1)
        open(os.path.join(signals, "restored"), "w").close()
        results = ranks.wait(120)
    for r in results:
        assert r.returncode == 0, f"rank {r.rank} failed:\n{r.stderr[-4000:]}"
    res = [json.loads(next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))[len("RESULT "):])
           for r in results]
    for rank, x in enumerate(res):
        assert all(x["ok"]), f"rank {rank}: an allreduce was wrong: {x}"
        assert x["others_stayed_up"], f"rank {rank}: a path that was not cut went down: {x['states_when_detected']}"
        # 2 x path timeout after the first unanswered probe (one probe interval at most).
        assert x["detected_s"] < 2 * timeout + 3, f"rank {rank}: the cut paths took {x['detected_s']:.1f} s to be seen down"


def test_ecmp_discovery_picks_disjoint_spines():
    with lab("te", mode="ecmp") as l:
        res = result_of(labrun.run(l, ["benchmarks/rank_bench.py", "discover", "--trials", "3"], timeout=600))
    for rank in (1, 3):  # the ring's two core crossings: 1->2 and 3->0
        for t in res["trials"][rank]:
            assert t["ok"]
            hops = t["hops_to_right"]
            assert all(hops) and len(set(hops)) == 4, f"rank {rank}: paths to the right via {hops}"
    # The probes' word is checked against the bytes: data on discovered paths
    # really crosses every spine, in both crossings (L0 -> spines carries
    # 1->2, L1 -> spines 3->0). Two paths hashed onto one spine leave another
    # spine's link idle.
    with lab("tv", mode="ecmp") as l:
        before = l.link_bytes()
        res = result_of(labrun.run(l, ["benchmarks/rank_bench.py", "loop", "--size", "16M", "--seconds", "0",
                                       "--min-iters", "2", "--discovery"], timeout=300))
        after = l.link_bytes()
    assert all(it["ok"] for rank in res["ranks"] for it in rank)
    for leaf in (0, 1):
        up = bytes_up(before, after, leaf)
        assert min(up) > 0.1 * sum(up), \
            f"bytes L{leaf}->spine per spine on discovered paths: {up}; paths: {paths_to_the_right(res)}"


def test_ecmp_defaults_find_disjoint_spines_by_themselves():
    # No knob: discovery=auto sees routers between the ranks and runs
    # discovery, so the paths are placed on distinct spines as with
    # MAESTRO_DISCOVERY=ttl (and path hunting is on).
    with lab("td", mode="ecmp") as l:
        before = l.link_bytes()
        res = result_of(labrun.run(l, ["benchmarks/rank_bench.py", "loop", "--size", "16M", "--seconds", "0",
                                       "--min-iters", "2"], env={"MAESTRO_DEBUG": "INFO"}, timeout=300))
        after = l.link_bytes()
    assert all(it["ok"] for rank in res["ranks"] for it in rank)
    for rank in (1, 3):
        hops = [p["route"] for p in res["ranks"][rank][-1]["paths"] if p["peer"] == (rank + 1) % 4]
        assert all(hops) and len(set(hops)) == 4, f"rank {rank}: paths to the right via {hops}"
    for leaf in (0, 1):
        up = bytes_up(before, after, leaf)
        assert min(up) > 0.1 * sum(up), \
            f"bytes L{leaf}->spine per spine with default settings: {up}; paths: {paths_to_the_right(res)}"


def test_ecmp_defaults_open_a_path_per_spine_where_spines_outnumber_vnics():
    # 8 spines, 4 aliases per host, no knob: the set-up's route probes count 8
    # core hops, so paths=auto opens 8 paths per peer (2 flows per vNIC, each
    # on its own source port) and discovery puts one on each spine.
    with lab("tn", spines=8, aliases=4, mode="ecmp") as l:
        before = l.link_bytes()
        results = labrun.run(l, ["benchmarks/rank_bench.py", "loop", "--size", "16M", "--seconds", "0",
                                 "--min-iters", "2"], env={"MAESTRO_DEBUG": "INFO"}, timeout=300)
        res = result_of(results)
        after = l.link_bytes()
    assert all(it["ok"] for rank in res["ranks"] for it in rank)
    for r in results:
        assert "8 paths per peer (auto: route probes found 8 core hops" in r.stderr, r.stderr[-3000:]
    for rank in (1, 3):
        hops = [p["route"] for p in res["ranks"][rank][-1]["paths"] if p["peer"] == (rank + 1) % 4]
        assert len(hops) == 8 and all(hops) and len(set(hops)) == 8, f"rank {rank}: paths to the right via {hops}"
    for leaf in (0, 1):
        up = bytes_up(before, after, leaf, spines=8)
        assert min(up) > 0.04 * sum(up), f"bytes L{leaf}->spine per spine with default settings: {up}"


def test_every_group_of_a_job_keeps_discovery():
    # Routers answer only a few ICMP probes a second per destination (Linux:
    # a burst of 6, then 1 a second). A job that makes group after group
    # must not read their silence as "no routers" and turn discovery off:
    # what the first group probed holds for the later ones.
    with lab("tg", hosts=2, leaves=2, spines=8, aliases=4, mode="pinned") as l:
        res = result_of(labrun.run(l, ["benchmarks/rank_bench.py", "setup", "--paths", "4", "--iters", "8"],
                                   timeout=300))
    routes = res["rows"][0]["routes_to_the_right"]
    assert len(routes) == 8
    for i, hops in enumerate(routes):
        assert len(hops) == 4 and all(hops), f"group {i + 1} of 8 ran without discovery: {hops} (all: {routes})"


def test_adaptive_moves_chunks_off_loaded_spines():
    with lab("ta", mode="pinned") as l:
        bgs = [l.background(spine=s, mbit=170, proto="udp") for s in (2, 3)]
        try:
            res = result_of(labrun.run(l, ["benchmarks/rank_bench.py", "loop", "--size", "16M", "--seconds", "0",
                                           "--min-iters", "3"], env={"MAESTRO_POLICY": "adaptive"}, timeout=300))
        finally:
            for b in bgs:
                b.stop()
    # Background runs h1 -> h3 through spines 2 and 3: rank 1's paths 2 and 3
    # to rank 2 share those links and must carry less than paths 0 and 1.
    last = res["ranks"][1][-1]["paths"]
    sent = {p["path"]: p["bytes_sent"] for p in last if p["peer"] == 2}
    assert sent[2] + sent[3] < 0.6 * (sent[0] + sent[1]), f"bytes per path to rank 2: {sent}"
