"""The rank side of the evaluation (one process per lab host, started by
scripts/labrun.py from benchmarks/suite.py or the lab tests). Every
subcommand compares side by side in one run: the backends/variants it
measures are process groups created together and timed alternately, so
machine noise hits them alike. Rank 0 prints "READY" once groups are up and
one "RESULT <json>" line at the end.

    python benchmarks/rank_bench.py sweep --collective allreduce --sizes 4K,1M --variants gloo,gloo-4dev,adaptive,single
    python benchmarks/rank_bench.py sweep --collective sendrecv --sizes 64K,16M --variants gloo,adaptive,single
    python benchmarks/rank_bench.py p2p --size 64M --paths 1,2,4,8
    python benchmarks/rank_bench.py chunks --size 64M --chunks 12800,51200
    python benchmarks/rank_bench.py barrier --variants latency,round_robin
    python benchmarks/rank_bench.py models --model vgg19
    python benchmarks/rank_bench.py setup --paths 1,2,4,8
    python benchmarks/rank_bench.py discover --trials 20
    python benchmarks/rank_bench.py loop --size 16M --seconds 12
"""
from __future__ import annotations

import argparse
import datetime
import faulthandler
import functools
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import maestro_torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gloo_devices  # noqa: E402
from allreduce_bench import parse_size  # noqa: E402
from variants import MAESTRO_POLICIES, configuration, gloo_device_count, is_gloo, is_maestro, maestro_knobs, maestro_policy  # noqa: E402


def log(msg: str) -> None:
    if dist.get_rank() == 0:
        print(msg, file=sys.stderr, flush=True)


SETTLED = 0.05  # timed(): a spread (slowest - fastest) within 5 % of the median is settled
GROUP_TIMEOUT = datetime.timedelta(seconds=300)  # set from --timeout


def new_group(**kw):
    """dist.new_group with the run's timeout (new_group's default is 30 min)."""
    return dist.new_group(timeout=GROUP_TIMEOUT, **kw)


def make_group(variant: str, extra: dict | None = None):
    """A process group for `variant` (benchmarks/variants.py), maestro's
    with the given extra Options; gloo-<n>dev takes its addresses from
    MAESTRO_VNICS (benchmarks/gloo_devices.py)."""
    if configuration(variant) == "gloo":
        return new_group(backend="gloo")
    devices = gloo_device_count(variant)
    if devices is not None:
        addrs = gloo_devices.parse("vnics")
        if len(addrs) < devices:
            raise SystemExit(f"variant {variant}: {devices} devices, but MAESTRO_VNICS has {len(addrs)} addresses")
        gloo_devices.register()
        return new_group(backend=gloo_devices.BACKEND, pg_options=gloo_devices.options(addrs[:devices]))
    policy, congestion = maestro_policy(variant)
    opts = dict(extra or {}, **maestro_knobs(variant), policy=policy)
    if congestion:
        opts["tcp_congestion"] = congestion
    return new_group(backend="maestro", pg_options=maestro_torch.Options(**opts))


def maestro_extra(args) -> dict:
    out = {}
    if getattr(args, "discovery", False):
        out["discovery"] = "ttl"
    return out


def timed(fn, group, iters: int, settle: int | None = None, tol: float = SETTLED,
          after_first=None) -> list[float]:
    """Run fn() iters times; the slowest rank's time of each. With settle,
    stop early once settle iterations have run and the slowest and fastest
    so far are within tol of their median: fewer repetitions where the
    spread is already small (every rank takes the same decision, from the
    slowest rank's times). after_first() runs, untimed, after the first
    call (a cell with no warm-up checks its result there)."""
    times = []
    for i in range(iters):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if i == 0 and after_first is not None:
            after_first()
        if settle is not None and settle <= i + 1 < iters:
            worst = torch.tensor(times, dtype=torch.float64)
            dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # over the world group (bookkeeping)
            w = worst.tolist()
            if (max(w) - min(w)) <= tol * statistics.median(w):
                return w
    worst = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # over the world group (bookkeeping)
    return worst.tolist()


def cpu_s_per_GB(cpu0: float, nbytes: int) -> list[float]:
    """Each rank's CPU seconds since cpu0 (time.process_time(): all its
    threads, the backend's included) per GB of `nbytes` moved, gathered over
    the world group (bookkeeping)."""
    cpus = [None] * dist.get_world_size()
    dist.all_gather_object(cpus, time.process_time() - cpu0)
    return [c / (nbytes / 1e9) for c in cpus]


def iterations_for(size: int, budget_s: float, est_Bps: float, hi: int = 20) -> tuple[int, int]:
    """(most, settle) for timed(): how many iterations a sweep cell may run,
    and after how many it stops if their spread is within SETTLED."""
    # At least 3 where the spread is small: the median of two samples is
    # their mean. Up to 5 up to 64 MiB (the size the headline figures are
    # stated at): in pinned runs some 64 MiB iterations take 1.2 s instead of
    # 1.08 s, one slow iteration (a TCP loss recovery, a busy core) moved a
    # figure by 5 %, and the median of 3 gave 0.85 to 0.93 of the limit
    # across four runs; such a cell's spread is above SETTLED, so it runs 5.
    # Above 64 MiB 2, the figure their mean (both are recorded): one
    # iteration of gloo at 256 MiB takes 17 s, and those cells were a third
    # of the collectives experiment's time at 3.
    # Cells cheaper than that run their budget out (settle None): it is the
    # large cells, at the floor, that take a sweep's time.
    lo, settle = (5, 3) if size <= 64 << 20 else (2, None)
    most = max(lo, min(hi, calls_within(budget_s, size, est_Bps)))
    return most, settle if most == lo else None


def calls_within(seconds: float, size: int, est_Bps: float) -> int:
    """Calls of `size` bytes at est_Bps that fit in `seconds` (a call counts
    at least 0.1 ms)."""
    return int(seconds / max(size / est_Bps, 1e-4))


WARM_BYTES = 16 << 20  # warmups_for(): a cell this large gives its variant's rate for the next one
LONG_CALL_S = 8.0      # warmups_for(): a call expected to take this long needs no warm-up call


def warmups_for(size: int, est_Bps: float, seconds: float = 0.2, most: int = 10, expected_s: float = 0.0,
                long_call_s: float = LONG_CALL_S) -> int:
    """Calls of a sweep cell before it is timed: as many as fit in `seconds`
    at est_Bps, 1 to `most` (the same count on every rank). One call of a
    small message leaves the TCP congestion windows where a fresh or idle
    connection has them (the first cell of a sweep runs on connections just
    opened, some lazily by that call): on the pinned lab, the first of six
    interleaved 64 KiB trials had medians 1.5-2x the other five's, for
    maestro (4 paths per peer, 12 connections) and gloo alike.
    None where the variant's call is expected to take long_call_s or more
    (expected_s: its last cell of WARM_BYTES or more, scaled to this size):
    a new tensor's first-use costs are a few tenths of a second at 256 MiB
    (maestro's first 64 and 256 MiB calls read up to 15 % slow on the lab,
    at 1.1 and 4.4 s a call), lost in a call of gloo's 17 s at 256 MiB, and
    one more such call is what a warm-up would cost."""
    if expected_s >= long_call_s:
        return 0
    return max(1, min(most, calls_within(seconds, size, est_Bps)))


def emit(result: dict) -> None:
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(result), flush=True)


# ---------------------------------------------------------------- sweep

SWEEP_COLLECTIVES = ("allreduce", "allgather", "sendrecv", "alltoall", "reduce")
SWEEP_EST_BPS = 50e6  # the rate a sweep plans its warm-up and iterations with (bytes/s)


# Position-dependent data, so that a chunk landing at another chunk's
# offset, or from another rank, is caught: element i of rank r's input is
# r * P + i % P (P = 4099, prime, so no chunk or block size is a multiple of
# it; exact in float32 up to 4,000 ranks).
PATTERN_PERIOD = 4099


@functools.lru_cache(maxsize=16)
def sweep_pattern(count: int, offset: int = 0) -> torch.Tensor:
    """(i + offset) % P for i < count, float32; cached: every variant of a
    cell uses the same (at 256 MiB making it took a second of CPU per
    variant and rank), and no caller writes to it (they derive tensors)."""
    return ((torch.arange(count, dtype=torch.int64) + offset) % PATTERN_PERIOD).to(torch.float32)


def sweep_op(collective: str, size: int, g):
    """One cell of a sweep, as nccl-tests counts it: (fn, factor, exact).
    fn() runs the collective once on group g with `size` bytes (allreduce,
    reduce into the group's rank 0: the tensor; allgather: the gathered
    output; sendrecv: what each rank sends to rank+1 and receives from
    rank-1, posted together with batch_isend_irecv; alltoall: what each
    rank sends, its own share included, in equal splits); busbw = algbw *
    factor; exact() says whether the output holds what one fn() gives
    (checked after the cell's first call)."""
    rank, n = dist.get_rank(), dist.get_world_size()  # every group of the sweep spans the world
    P = PATTERN_PERIOD
    pattern = sweep_pattern
    if collective == "allreduce":
        count = max(size // 4, 1)
        t = pattern(count) + rank
        want = pattern(count) * n + n * (n - 1) // 2
        return (lambda: dist.all_reduce(t, group=g)), 2 * (n - 1) / n, lambda: bool(torch.equal(t, want))
    if collective == "reduce":  # into rank 0: only its tensor is defined after (gloo writes the others)
        count = max(size // 4, 1)
        t = pattern(count) + rank
        want = pattern(count) * n + n * (n - 1) // 2
        return (lambda: dist.reduce(t, dst=dist.get_global_rank(g, 0), group=g)), 1.0, \
            lambda: rank != 0 or bool(torch.equal(t, want))
    if collective == "sendrecv":
        count = max(size // 4, 1)
        x, got = pattern(count) + rank * P, torch.empty(count)
        right, left = (rank + 1) % n, (rank - 1) % n

        def exchange():
            ops = [dist.P2POp(dist.isend, x, right, g), dist.P2POp(dist.irecv, got, left, g)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
        return exchange, 1.0, lambda: bool(torch.equal(got, pattern(count) + left * P))
    # allgather and alltoall: rank r's block j of the output comes from rank j.
    block = max(size // 4 // n, 1)
    if collective == "allgather":
        x = pattern(block) + rank * P
        out = torch.empty(block * n)
        fn = lambda: dist.all_gather_into_tensor(out, x, group=g)  # noqa: E731
        expected = torch.cat([pattern(block) + j * P for j in range(n)])
    else:  # alltoall, equal splits: block j of rank r's input goes to rank j
        x = torch.cat([pattern(block, offset=j) + rank * P for j in range(n)])
        out = torch.empty(block * n)
        fn = lambda: dist.all_to_all_single(out, x, group=g)  # noqa: E731
        expected = torch.cat([pattern(block, offset=rank) + j * P for j in range(n)])
    return fn, (n - 1) / n, lambda: bool(torch.equal(out, expected))


def cmd_sweep(args):
    """nccl-tests style: one collective (sweep_op) over message sizes, busbw
    and algbw per variant, and whether each variant's result was exact."""
    n = dist.get_world_size()
    variants = args.variants.split(",")
    # The largest size a variant runs (--up-to): its larger cells are not run.
    up_to = {v: parse_size(s) for v, s in (kv.split("=", 1) for kv in args.up_to.split(",") if kv)}
    unknown = sorted(set(up_to) - set(variants))
    if unknown:
        raise SystemExit(f"--up-to names {unknown}, which are not among --variants {variants}")
    repeat, repeat_up_to = parse_repeat(args.repeat, variants)
    extra, extra_up_to, extra_passes = parse_extra_passes(args.extra_passes, variants)
    groups = {v: make_group(v, maestro_extra(args)) for v in variants}
    # Rank 0's probed route (its first core hop) of every path per peer of
    # each maestro group; empty where discovery did not run, or where the
    # peer is on the same leaf (no core hop). MAESTRO_DISCOVERY=auto runs it
    # where routers answer: what the report says of an ECMP run's settings
    # comes from here.
    routes = {}
    for v, g in groups.items():
        if is_maestro(v):
            for s in maestro_torch.path_stats(g):
                routes.setdefault(v, {}).setdefault(str(s["peer"]), []).append(s["route"])
    log("READY")
    ready = time.monotonic()
    rate = {}  # variant -> seconds per byte of its last cell of WARM_BYTES or more
    trials = []
    passes = args.trials + extra_passes
    def capped(names: list, top: int) -> dict:  # each of names' largest size, at most top
        return {v: min(up_to.get(v, top), top) for v in names}

    for trial in range(passes):
        # Each trial rotates the order of the variants: a sweep measures them one after another.
        if trial >= args.trials:  # an extra pass: only its variants, up to its size
            pool, limits = extra, capped(extra, extra_up_to)
        elif trial and repeat:  # a later pass: only the repeated variants, up to their size
            pool, limits = repeat, capped(repeat, repeat_up_to)
        else:
            pool, limits = variants, up_to
        k = trial % len(pool)
        order = pool[k:] + pool[:k]
        if passes > 1:
            log(f"  trial {trial + 1}/{passes}: {','.join(order)}")
        trials.append({"order": order, "rows": sweep_trial(args, groups, order, limits, rate, ready)})
    out = {"collective": args.collective, "world": n, "routes": routes}
    if up_to:
        out["up_to"] = up_to
    if repeat:
        out["repeat"] = {"variants": repeat, "up_to": repeat_up_to}
    if extra_passes:
        out["extra_passes"] = {"variants": extra, "up_to": extra_up_to, "passes": extra_passes}
    # One trial: its rows, as before; more: each trial's order and rows.
    emit({**out, "rows": trials[0]["rows"]} if passes == 1 else {**out, "trials": trials})


def parse_repeat(spec: str, variants: list, flag: str = "--repeat") -> tuple[list, int]:
    """--repeat "adaptive,round_robin:64M" -> (["adaptive", "round_robin"], 64 MiB); ([], 0) when empty.
    Refused: no size, or a variant that is not swept."""
    if not spec:
        return [], 0
    names, colon, size = spec.rpartition(":")
    if not colon or not names or not size:
        raise SystemExit(f"{flag} {spec!r}: expected VARIANT,...:SIZE")
    repeat = names.split(",")
    unknown = sorted(set(repeat) - set(variants))
    if unknown:
        raise SystemExit(f"{flag} names {unknown}, which are not among --variants {variants}")
    return repeat, parse_size(size)


def parse_extra_passes(spec: str, variants: list) -> tuple[list, int, int]:
    """--extra-passes "adaptive,round_robin:64K:4" -> (["adaptive", "round_robin"], 64 KiB, 4);
    ([], 0, 0) when empty. Refused: no size or count, or a variant that is not swept."""
    if not spec:
        return [], 0, 0
    head, colon, count = spec.rpartition(":")
    if not colon or ":" not in head or not count.isdigit() or int(count) < 1:
        raise SystemExit(f"--extra-passes {spec!r}: expected VARIANT,...:SIZE:PASSES")
    names, size = parse_repeat(head, variants, "--extra-passes")
    return names, size, int(count)


def path_counters(variant: str, g) -> dict:
    """A maestro group's paths on this rank: {"peer/path": (bytes sent, TCP bytes retransmitted)};
    {} for gloo."""
    if not is_maestro(variant):
        return {}
    return {f"{s['peer']}/{s['path']}": (s["bytes_sent"], s.get("path_counters", {}).get("tcp_bytes_retrans", 0))
            for s in maestro_torch.path_stats(g)}


def path_deltas(before: dict, after: dict) -> dict:
    """{"peer/path": [bytes sent, bytes retransmitted]} between two path_counters, the paths
    that sent anything; a path that reconnected in between (its connection's counters began
    again) counts from zero."""
    out = {}
    for k, (sent, retx) in after.items():
        s0, r0 = before.get(k, (0, 0))
        d = [sent - s0, retx - r0 if retx >= r0 else retx]
        if d[0] > 0:
            out[k] = d
    return out


def sweep_trial(args, groups: dict, order: list, up_to: dict, rate: dict, ready: float) -> list:
    """One pass of a sweep over its sizes, each size over the variants in
    `order`: the rows (rate: each variant's seconds per byte of its last
    cell of WARM_BYTES or more, kept from pass to pass)."""
    rows = []
    for size in [parse_size(s) for s in args.sizes.split(",")]:
        for v in order:
            if size > up_to.get(v, size):
                continue
            g = groups[v]
            began = time.monotonic() - ready
            fn, factor, exact = sweep_op(args.collective, size, g)
            # The result is checked after the first call: the warm-up's
            # (registration, connections ramp-up), or the first timed one's
            # where the cell needs no warm-up (its check is not timed).
            checked, check_cpu = [], [0.0]

            def check():
                c0 = time.process_time()
                checked.append(exact())
                check_cpu[0] += time.process_time() - c0
            warmups = warmups_for(size, SWEEP_EST_BPS, expected_s=rate.get(v, 0.0) * size,
                                  long_call_s=args.long_call_s)
            if warmups:
                fn()
                check()
            for _ in range(warmups - 1):
                fn()
            cpu0, check_cpu[0] = time.process_time(), 0.0  # a check inside the timed loop is not the collective's
            most, settle = iterations_for(size, args.budget, SWEEP_EST_BPS)
            paths0 = path_counters(v, g)
            times = timed(fn, g, most, settle, after_first=None if warmups else check)
            paths = path_deltas(paths0, path_counters(v, g))
            every = [None] * dist.get_world_size()
            dist.all_gather_object(every, paths)  # over the world group (bookkeeping)
            paths = {str(r): p for r, p in enumerate(every) if p}
            cpu = cpu_s_per_GB(cpu0 + check_cpu[0], size * len(times))
            ok = torch.tensor([float(checked[0])])
            dist.all_reduce(ok, op=dist.ReduceOp.MIN)  # over the world group (bookkeeping)
            med = statistics.median(times)
            if size >= WARM_BYTES:
                rate[v] = med / size
            rows.append({"variant": v, "bytes": size, "seconds": med, "algbw_GBps": size / med / 1e9,
                         "busbw_GBps": size / med / 1e9 * factor, "iters": len(times), "warmups": warmups,
                         # when the cell began and how long it took, warm-up and check included (rank 0's
                         # clock, from READY): where a sweep's time goes
                         "began_s": began, "took_s": time.monotonic() - ready - began,
                         "times": times, "exact": bool(ok.item()),
                         # per rank, over the timed iterations (their barriers included)
                         "cpu_s_per_GB": cpu,
                         # every rank's paths over the timed iterations (maestro), by rank: what each
                         # carried and resent (rank 0's alone would not show a ring link that crosses the core)
                         **({"path_bytes": paths} if paths else {})})
            log(f"  {args.collective} {size:>10} B {v:12} {size / med / 1e9 * factor * 1e3:8.1f} MB/s busbw"
                + ("" if ok.item() else "  WRONG RESULT"))
    return rows


# ---------------------------------------------------------------- p2p

def cmd_p2p(args):
    """Point-to-point bandwidth vs number of paths: rank 0 writes to rank 1
    (a 2-rank broadcast is exactly one chain of one-sided writes), with
    MAESTRO_CHUNK_SIZE=64K as the paper's 64 KiB perftest writes; gloo beside
    it (and gloo with one device per vNIC address: a broadcast is one
    collective, so it takes one device). Also the CPU time each process spent
    per transferred GB."""
    size = parse_size(args.size)
    paths = [int(p) for p in args.paths.split(",")]
    groups = {f"maestro-{k}": new_group(backend="maestro", pg_options=maestro_torch.Options(
        paths=k, chunk_size="64K", policy="round_robin")) for k in paths}
    for peer in args.peers.split(","):
        groups[peer] = make_group(peer)
    log("READY")
    t = torch.ones(size // 4)
    rows = []
    for name, g in groups.items():
        fn = lambda: dist.broadcast(t, src=0, group=g)  # noqa: E731
        fn()
        cpu0 = time.process_time()
        times = timed(fn, g, args.iters)
        cpu = cpu_s_per_GB(cpu0, size * len(times))
        med = statistics.median(times)
        rows.append({"variant": name, "paths": 1 if is_gloo(name) else int(name.split("-")[1]), "bytes": size,
                     "seconds": med, "gbps": size * 8 / med / 1e9,
                     "cpu_s_per_GB": cpu})
        log(f"  p2p {name:12} {size * 8 / med / 1e9:6.3f} Gbit/s")
    emit({"rows": rows})


# ---------------------------------------------------------------- chunks

def cmd_chunks(args):
    """Chunk size: allreduce throughput and the distribution of per-chunk
    completion times (post to ACK) for each chunk size."""
    n = dist.get_world_size()
    size = parse_size(args.size)
    chunks = [int(c) for c in args.chunks.split(",")]
    groups = {c: new_group(backend="maestro", pg_options=maestro_torch.Options(chunk_size=c)) for c in chunks}
    log("READY")
    t = torch.ones(size // 4)
    rows = []
    for c, g in groups.items():
        dist.all_reduce(t, group=g)
        maestro_torch.backend_of(g).chunk_times(clear=True)
        times = timed(lambda: dist.all_reduce(t, group=g), g, args.iters)
        samples = maestro_torch.backend_of(g).chunk_times(clear=True)
        everyone = [None] * n
        dist.all_gather_object(everyone, samples)
        med = statistics.median(times)
        rows.append({"chunk": c, "seconds": med, "busbw_GBps": size / med / 1e9 * 2 * (n - 1) / n,
                     "chunk_times_s": [x for s in everyone for x in s][:20000]})
        log(f"  chunk {c:>7} {size / med / 1e9 * 2 * (n - 1) / n * 1e3:7.1f} MB/s busbw")
    emit({"bytes": size, "rows": rows})


# ---------------------------------------------------------------- barrier

def cmd_barrier(args):
    """Latency-aware path choice: barrier and tiny-allreduce times per policy."""
    variants = args.variants.split(",")
    groups = {v: make_group(v) for v in variants}
    log("READY")
    time.sleep(args.settle)  # probes measure each path's RTT meanwhile
    rows = []
    tiny = torch.ones(16)
    for v, g in groups.items():
        for _ in range(3):
            dist.barrier(group=g)
        b = timed(lambda: dist.barrier(group=g), g, args.iters)
        a = timed(lambda: dist.all_reduce(tiny, group=g), g, args.iters)
        row = {"variant": v, "barrier_s": statistics.median(b), "tiny_allreduce_s": statistics.median(a)}
        if is_maestro(v):  # its paths' probe RTTs
            row["rtt_ms"] = [round(s["rtt_s"] * 1e3, 2) for s in maestro_torch.path_stats(g)]
        rows.append(row)
        log(f"  {v:12} barrier {row['barrier_s'] * 1e3:7.2f} ms  64-byte allreduce {row['tiny_allreduce_s'] * 1e3:7.2f} ms")
    emit({"rows": rows})


# ---------------------------------------------------------------- models

def ddp_buckets(numels: list[int], cap_bytes: int = 25 << 20, first_cap_bytes: int = 1 << 20,
                elem: int = 4) -> list[int]:
    """Element counts of DDP's gradient buckets: parameters in reverse order
    (gradients become ready back to front), the first bucket capped at 1 MiB,
    the others at `cap_bytes`; a larger parameter is a bucket of its own."""
    buckets, cur, cap = [], 0, first_cap_bytes
    for n in reversed(numels):
        if cur and (cur + n) * elem > cap:
            buckets.append(cur)
            cur, cap = 0, cap_bytes
        cur += n
    if cur:
        buckets.append(cur)
    return buckets


def cmd_models(args):
    """A model's gradient synchronisation alone, maestro vs gloo: its gradient
    buckets (DDP's 25 MB buckets, in DDP's reverse order, over the parameter
    shapes of benchmarks/train.py's model) allreduced as DDP would, with no
    forward or backward. The training itself is benchmarks/train.py, which
    the suite runs on the lab for the DDP figures."""
    import train

    n = dist.get_world_size()
    variants = args.variants.split(",")
    groups = {v: make_group(v) for v in variants}
    numels = [int(torch.Size(s).numel()) for s in train.parameter_shapes(args.model)]
    log(f"READY {args.model}: {sum(numels) / 1e6:.1f} M parameters")
    rows = []
    cap = 25 << 20  # DDP's bucket_cap_mb default
    buckets = ddp_buckets(numels, cap_bytes=cap)
    tensors = [torch.ones(b) for b in buckets]
    # The warm-up bucket: the largest of at most the cap (a full bucket)
    warm = max((x for x in tensors if x.numel() * 4 <= cap), key=lambda x: x.numel(), default=tensors[0])
    for v, g in groups.items():
        def sync():
            works = [dist.all_reduce(x, group=g, async_op=True) for x in tensors]
            for w in works:
                w.wait()
        if not args.no_warmup:
            # The warm-up is one full bucket's allreduce alone (the largest
            # of at most the 25 MB cap): it opens the connections and grows
            # their windows as a whole sync's first buckets would (a whole
            # sync is 9 to 86 s, such a bucket 1 s on gloo). Not the
            # largest bucket: VGG19's is one 411 MB parameter, 26 s on gloo.
            # The other buckets' registration on first use stays in the
            # timed sync, as in a DDP job's first step.
            dist.all_reduce(warm, group=g)
        times = timed(sync, g, args.iters)
        rows.append({"variant": v, "sync_s": statistics.median(times), "buckets": len(buckets),
                     "bytes": sum(buckets) * 4, "warmup": "none" if args.no_warmup else f"a bucket of {warm.numel() * 4 / 1e6:.0f} MB"})
        log(f"  {args.model} {v:10} gradient sync {statistics.median(times):7.2f} s ({len(buckets)} buckets)")
    emit({"model": args.model, "parameters": sum(numels), "world": n, "buckets_only": True, "rows": rows})


# ---------------------------------------------------------------- setup

def cmd_setup(args):
    """Connection set-up cost vs number of paths: the time to create a group."""
    rows = []
    right = (dist.get_rank() + 1) % dist.get_world_size()
    log("READY")
    for k in [int(p) for p in args.paths.split(",")]:
        samples, routes = [], []
        for _ in range(args.iters):
            dist.barrier()
            t0 = time.perf_counter()
            g = new_group(backend="maestro", pg_options=maestro_torch.Options(paths=k))
            dist.barrier(group=g)
            samples.append(time.perf_counter() - t0)
            # The core hop discovery found for each path to the right ("" where it did not run).
            routes.append([s["route"] for s in maestro_torch.path_stats(g) if s["peer"] == right])
            dist.destroy_process_group(g)
        worst = torch.tensor(samples, dtype=torch.float64)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        rows.append({"paths": k, "setup_s": statistics.median(worst.tolist()), "each_s": worst.tolist(),
                     "routes_to_the_right": routes})
        log(f"  set-up with {k} paths: {rows[-1]['setup_s'] * 1e3:.0f} ms")
    emit({"rows": rows})


# ---------------------------------------------------------------- discover

def cmd_discover(args):
    """Disjoint path discovery trials (ECMP mode): a fresh group with
    MAESTRO_DISCOVERY=ttl again and again; each time the core hops of the
    paths to the ring's right neighbour (the data direction), the set-up
    time, and whether an allreduce on it is correct."""
    rank, n = dist.get_rank(), dist.get_world_size()
    right = (rank + 1) % n
    log("READY")
    trials = []
    for _ in range(args.trials):
        t0 = time.time()
        g = new_group(backend="maestro", pg_options=maestro_torch.Options(discovery="ttl"))
        setup = time.time() - t0
        t = torch.full((4096,), float(rank))
        dist.all_reduce(t, group=g)
        hops = [s["route"] for s in maestro_torch.path_stats(g) if s["peer"] == right]
        dist.barrier(group=g)
        dist.destroy_process_group(g)
        trials.append({"setup_s": setup, "ok": bool(torch.all(t == sum(range(n)))), "hops_to_right": hops})
    everyone = [None] * n
    dist.all_gather_object(everyone, trials)
    emit({"world": n, "trials": everyone})


# ---------------------------------------------------------------- loop

def cmd_loop(args):
    """Allreduces for a while, every result checked exactly, with per-iteration
    times and path-state snapshots (failover, path detection, resiliency)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    maestro = args.backend == "maestro"
    g = new_group(backend="maestro", pg_options=maestro_torch.Options(**maestro_extra(args))) if maestro else \
        make_group(args.backend)
    elems = parse_size(args.size) // 4
    base = torch.arange(elems, dtype=torch.int64) % 1000
    expected = (n * base + n * (n - 1) // 2).to(torch.float32)
    dist.barrier(group=g)
    if maestro:
        # Each rank's outgoing core hop of every path (discovery), for
        # experiments that load the routes the paths took.
        routes = {}
        for s in maestro_torch.path_stats(g):
            routes.setdefault(str(s["peer"]), []).append(s["route"])
        print("ROUTES " + json.dumps(routes), flush=True)
    log("READY")
    print("READY", flush=True)
    iters = []
    start = time.time()
    last_paths, last_states = None, None
    while True:
        t = (base + rank).to(torch.float32)
        dist.barrier(group=g)
        t0 = time.time()
        dist.all_reduce(t, group=g)
        it = {"start": t0 - start, "seconds": time.time() - t0, "ok": bool(torch.equal(t, expected))}
        if maestro:
            last_paths = [{k: s[k] for k in ("peer", "path", "state", "bytes_sent", "resent", "reconnects", "hunts",
                                             "route")}
                          for s in maestro_torch.path_stats(g)]
            # --snapshots changes: only where a path went down, came back or
            # was re-opened (and the first and last), so that a run of many
            # minutes stays small.
            states = [(p["state"], p["reconnects"], p["hunts"]) for p in last_paths]
            if args.snapshots == "every" or states != last_states:
                it["paths"] = last_paths
            last_states = states
        iters.append(it)
        # Every rank stops at the same iteration.
        go = torch.tensor([1.0 if time.time() - start < args.seconds or len(iters) < args.min_iters else 0.0])
        dist.all_reduce(go, op=dist.ReduceOp.MIN, group=g)
        if go.item() == 0:
            break
    if maestro:
        iters[-1]["paths"] = last_paths
    everyone = [None] * n
    dist.all_gather_object(everyone, iters)
    # Why each path that was closed was closed (its last error), and the
    # loss its connection recovered from: what a false alarm is traced by.
    closed = [{k: s[k] for k in ("peer", "path", "reconnects", "errors", "last_error", "path_counters")}
              for s in maestro_torch.path_stats(g) if s["errors"] or s["reconnects"]] if maestro else []
    closes = [None] * n
    dist.all_gather_object(closes, closed)
    # Writes this rank dropped because their sender had withdrawn them from a
    # path it set aside and sent them again elsewhere (TCP fences).
    dropped = sum(s["path_counters"].get("writes_dropped_by_fence", 0) for s in maestro_torch.path_stats(g)) \
        if maestro else 0
    drops = [None] * n
    dist.all_gather_object(drops, dropped)
    emit({"world": n, "bytes": elems * 4, "iters": iters, "ranks": everyone, "closed_paths": closes,
          "fence_drops": drops})


def main():
    faulthandler.register(__import__("signal").SIGUSR1)  # `kill -USR1 <pid>` dumps every thread's stack
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--timeout", type=float, default=300, help="group timeout, seconds")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("sweep")
    p.add_argument("--collective", choices=SWEEP_COLLECTIVES, default="allreduce")
    p.add_argument("--long-call-s", type=float, default=LONG_CALL_S,
                   help="a cell whose call is expected to take this long runs no warm-up call (tests make it short)")
    p.add_argument("--sizes", default="4K,64K,1M,16M")
    p.add_argument("--variants", default="gloo," + ",".join(MAESTRO_POLICIES),
                   help="comma-separated: maestro policies (+congestion control), gloo, gloo-<n>dev")
    p.add_argument("--budget", type=float, default=2.0, help="seconds per size and variant")
    p.add_argument("--discovery", action="store_true", help="maestro groups use MAESTRO_DISCOVERY=ttl")
    p.add_argument("--trials", type=int, default=1,
                   help="passes over the sizes, each rotating the order of the variants (groups made once); "
                        "above 1 the RESULT has each pass's order and rows under `trials`")
    p.add_argument("--up-to", default="", help="VARIANT=SIZE,...: the largest size a variant runs")
    p.add_argument("--repeat", default="",
                   help="VARIANT,...:SIZE: the passes after the first (--trials) run only these variants, up to "
                        "SIZE (the others' cells once: a median over passes where it is worth their time)")
    p.add_argument("--extra-passes", default="",
                   help="VARIANT,...:SIZE:N: N more passes after the --trials ones, of only these variants up to "
                        "SIZE (latency-bound cells, whose passes spread most and cost least)")
    p = sub.add_parser("p2p")
    p.add_argument("--size", default="64M")
    p.add_argument("--paths", default="1,2,3,4,5,6,7,8")
    p.add_argument("--peers", default="gloo", help="comma-separated: gloo, gloo-<n>dev")
    p.add_argument("--iters", type=int, default=3)
    p = sub.add_parser("chunks")
    p.add_argument("--size", default="64M")
    p.add_argument("--chunks", default="12800,25600,51200,102400,204800,409600")
    p.add_argument("--iters", type=int, default=3)
    p = sub.add_parser("barrier")
    p.add_argument("--variants", default="latency,adaptive,round_robin,gloo")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--settle", type=float, default=2.0)
    p = sub.add_parser("models")
    p.add_argument("--model", choices=["vgg19", "resnet50", "bert-large"], default="vgg19")
    p.add_argument("--variants", default="adaptive,gloo",
                   help="comma-separated: maestro policies, gloo, gloo-<n>dev (one device per vNIC address)")
    p.add_argument("--iters", type=int, default=2)
    p.add_argument("--no-warmup", action="store_true", help="time the first sync too (registration on first use "
                                                              "included)")
    p = sub.add_parser("setup")
    p.add_argument("--paths", default="1,2,4,8")
    p.add_argument("--iters", type=int, default=3)
    p = sub.add_parser("discover")
    p.add_argument("--trials", type=int, default=20)
    p = sub.add_parser("loop")
    p.add_argument("--size", default="16M")
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--min-iters", type=int, default=1)
    p.add_argument("--backend", default="maestro",
                   help="maestro (its Options from the MAESTRO_* environment), gloo or gloo-<n>dev")
    p.add_argument("--discovery", action="store_true")
    p.add_argument("--snapshots", choices=["every", "changes"], default="every",
                   help="path tables per iteration: every one, or only where a path's state changed (and the first "
                        "and last)")
    args = ap.parse_args()
    # The world group does the bookkeeping (barriers, timing reductions);
    # everything measured runs on groups made for it. It is gloo, except for
    # `loop`, which runs while links are cut: gloo's one connection per pair
    # may hash onto a cut spine, maestro's bookkeeping moves off it.
    world = "maestro" if args.cmd == "loop" else "gloo"
    global GROUP_TIMEOUT
    GROUP_TIMEOUT = datetime.timedelta(seconds=args.timeout)
    dist.init_process_group(world, timeout=GROUP_TIMEOUT)
    globals()["cmd_" + args.cmd](args)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
