"""A flow-level simulator of ring allreduce on a leaf-spine fabric, to project
maestro beyond the 4-rank lab: busbw as a fraction of ideal vs ranks, vs the
number of paths k, with failed spine links, over Monte Carlo seeds of the
ECMP hash (and of the placement where it is random).

    python benchmarks/fabric_sim.py                       # everything: docs/results/data/fabric_sim.json
    python benchmarks/fabric_sim.py --seeds 20 --out /tmp/fs.json   # quicker, elsewhere
    python benchmarks/fabric_sim.py --ranks 256 --spines 8 --policies gloo,maestro --only scale
    python benchmarks/fabric_sim.py --fabrics 16x25:packed --only scale,k      # one scenario

The default grid (--fabrics) has three cases:

* fast core, packed and scattered: core links as fast as access links (100
  Gbit/s), 16 spines (1:1) and 8 (2:1). Packed, one flow fills a NIC, so
  multipath has nothing to add; scattered, ECMP collisions decide.
* slow core, packed: each core link a quarter of the access link, so one
  flow cannot fill a NIC, the lab's case (1 Gbit/s access, 200 Mbit/s spine
  links) at scale. 400 Gbit/s NICs on a fabric of 100 Gbit/s links (or 100G
  NICs on 25G uplinks); fractions of ideal depend only on the ratio, so it is
  modelled as 100 and 25. 16 spines is 4:1 oversubscribed (a leaf with 16
  NICs at 400G and 16 uplinks at 100G); 64 spines is 1:1, a 12.8 Tbit/s
  leaf split into 16 x 400G down and 64 x 100G up, with 64-leaf spines.

The model, and why:

* Fabric: a two-tier leaf-spine Clos (a two-level fat-tree). `ranks_per_leaf`
  hosts per leaf, one rank per host, each host on one access link; every leaf
  has one link to every spine. Links are full duplex: each direction is its
  own capacity. Oversubscription = (ranks per leaf x access) / (spines x
  core). Three-tier fat-trees (pods) are not modelled.
* Placement: `packed` puts ranks leaf by leaf (rank r on leaf r // ranks_per_
  leaf), as a topology-aware scheduler does; `scattered` is a random
  permutation of the ranks over the hosts (a fragmented cluster, or a
  scheduler that ignores topology). The ring is in rank order (r -> r+1),
  as gloo's and maestro's rings are. Packed, the ring crosses the core once
  per leaf, so each leaf has one crossing flow out and one in.
* A ring step: every rank sends size/n to its successor; the step ends when
  its last flow finishes. Every one of the 2(n-1) steps of an allreduce moves
  the same amounts over the same connections (a connection keeps its path), so
  one step is simulated: busbw = (size/n) / step time, independent of the
  size in this fluid model (no latency term: it holds for bandwidth-bound
  sizes).
* Rates: max-min fair between connections (TCP/QP fairness), computed by
  water-filling and recomputed whenever a pair finishes, so flows that finish
  early free capacity for the rest.
* Intra-leaf flows use only the two access links; crossing flows use the
  source's access uplink, one leaf->spine link, that spine's link down to the
  destination leaf, and the destination's access downlink.
* ECMP: each connection picks a spine by a uniform hash over the live uplinks
  of its leaf, excluding spines whose link down to the destination leaf has
  failed (routing withdraws them).
* Policies:
    gloo     one connection per peer.
    k-even   k connections per peer, each carrying size/k, hashed
             independently (NCCL's NCCL_IB_QPS_PER_CONNECTION, E-ECMP); the pair
             finishes with its slowest connection.
    maestro  k paths per peer placed by discovery: candidates hashed one by
             one (at most `candidates` x k, like MAESTRO_CANDIDATES), the first
             k distinct spines kept, earlier duplicates filling the rest when
             fewer are found; the adaptive split sends the pair's data to
             whichever of its paths has rate, so the pair finishes when its
             data is moved at the sum of its paths' rates.
    defaults maestro as it comes (MAESTRO_PATHS=auto), given `vnics` vNICs
             per host: every rank's route survey hashes probes towards its
             ring neighbour in rounds (one per vNIC, then twice as many,
             until a round finds no new spine, at most 64 probes; none
             where the neighbour shares its leaf), the group takes one path
             per spine the largest survey found when that is more than the
             vNICs (at most 16), else one per vNIC; then as maestro with
             that k. The same rule as the engine's (autoPathCount,
             surveyDone).
    spray    ideal packet spraying: every flow split evenly over all the live
             spines between its leaves.
* Ideal: the busbw of the same fabric and placement with `spray` and no
  failures (per seed; for packed placement it is the access rate as long as
  a leaf's spines together are at least as fast as one access link, slow
  core links included).
* Failures: `failed` leaf-spine links down in both directions, on the leaf of
  rank 0 (as the lab's resiliency experiment cuts its leaf's links), or on
  random leaves with --failure-spread random.
* Transport efficiency: the fraction of link rate a transport's payload gets
  (headers, ACKs, congestion control). Projections use 1 (fractions of ideal
  do not depend on it); the lab validation uses the one measured point to
  point in docs/results/data/p2p_paths.json, one number per transport.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
import time
from dataclasses import dataclass

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "docs", "results", "data")
POLICIES = ("gloo", "k-even", "maestro", "defaults", "spray")
# maestro's paths=auto (csrc/multipath/discovery.h): at most this many paths,
# and the route survey's probe budget.
AUTO_PATHS_MAX = 16
SURVEY_PROBES = 64
RANKS = (16, 32, 64, 128, 256, 512, 1024)
KS = (1, 2, 4, 8)
FAILED = (0, 1, 2)
# SPINESxCORE_GBPS:placement+placement, access links at --access-gbps.
FABRICS = ("16x100:scattered+packed", "8x100:scattered+packed", "16x25:packed", "64x25:packed")


@dataclass(frozen=True)
class Fabric:
    ranks: int
    ranks_per_leaf: int = 16
    spines: int = 16
    access_gbps: float = 100.0
    core_gbps: float = 100.0

    @property
    def leaves(self) -> int:
        return -(-self.ranks // self.ranks_per_leaf)

    @property
    def oversubscription(self) -> float:
        return self.ranks_per_leaf * self.access_gbps / (self.spines * self.core_gbps)

    # Link numbering: access up (host -> leaf), access down, leaf -> spine,
    # spine -> leaf, then one link of infinite capacity that pads flows using
    # fewer than four links.
    def up(self, host):
        return host

    def down(self, host):
        return self.ranks + host

    def leaf_up(self, leaf, spine):
        return 2 * self.ranks + leaf * self.spines + spine

    def spine_down(self, spine, leaf):
        return 2 * self.ranks + (self.leaves + leaf) * self.spines + spine

    @property
    def pad(self) -> int:
        return 2 * self.ranks + 2 * self.leaves * self.spines

    def capacity(self) -> np.ndarray:
        cap = np.empty(self.pad + 1)
        cap[:2 * self.ranks] = self.access_gbps
        cap[2 * self.ranks:self.pad] = self.core_gbps
        cap[self.pad] = np.inf
        return cap


# ---------------------------------------------------------------- rates

def water_fill(links: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Max-min fair rates of flows, flow i crossing links[i] (a row of link
    indices; pad with a link of infinite capacity).

    Water-filling, several bottlenecks per round: a link's fair share is its
    free capacity over its unfrozen flows; a link whose share is the smallest
    on every one of its flows' paths is their bottleneck (freezing other flows
    only raises the other links' shares), so all such links are filled at
    once, their flows frozen at that share and the rest go round again. Few
    rounds, each vectorised over all flows."""
    rate = np.zeros(len(links))
    todo = np.arange(len(links))
    rem = capacity.astype(float)
    while len(todo):
        lk = links[todo]
        counts = np.bincount(lk.ravel(), minlength=len(rem))
        share = np.full(len(rem), np.inf)
        used = counts > 0
        share[used] = rem[used] / counts[used]
        fmin = share[lk].min(axis=1)  # each flow's tightest link
        if not np.isfinite(fmin).all():
            raise ValueError("a flow crosses no finite link")
        lmin = np.full(len(rem), np.inf)
        np.minimum.at(lmin, lk.ravel(), np.repeat(fmin, lk.shape[1]))
        bottleneck = used & (share <= lmin * (1 + 1e-9))
        done = bottleneck[lk].any(axis=1)
        rate[todo[done]] = fmin[done]
        rem -= np.bincount(lk[done].ravel(), weights=np.repeat(fmin[done], lk.shape[1]), minlength=len(rem))
        todo = todo[~done]
    return rate


def step_time(links: np.ndarray, group: np.ndarray, data: np.ndarray, capacity: np.ndarray,
              batch: float = 5e-3) -> float:
    """Time until every group has moved its data. Flow i belongs to group
    group[i]; a group's data goes at the sum of its flows' rates (one flow per
    group is a plain connection; several pool their data, as maestro's
    adaptive split does). Rates are recomputed whenever groups finish; groups
    due to finish within `batch` x the elapsed time of the next one finish
    with it, which keeps the recomputations few (at 1,024 ranks: about a
    quarter of the exact count) for an error on busbw of a few tenths of
    a percent at 0.5 % (checked against batch=0)."""
    remaining = data.astype(float)
    alive = np.ones(len(links), bool)
    t = 0.0
    while alive.any():
        rate = np.zeros(len(links))
        rate[alive] = water_fill(links[alive], capacity)
        grate = np.bincount(group, weights=rate, minlength=len(data))
        pending = remaining > 0
        if (grate[pending] <= 0).any():
            return np.inf
        due = np.full(len(data), np.inf)
        due[pending] = remaining[pending] / grate[pending]
        dt = due.min()
        t += dt
        remaining[pending] -= grate[pending] * dt
        remaining[due <= dt + batch * t] = 0
        alive &= remaining[group] > 0
    return t


# ---------------------------------------------------------------- policies

def uniform_choice(rng: np.random.Generator, live: np.ndarray, draws: int) -> np.ndarray:
    """For each row of the boolean matrix `live` (pairs x spines), `draws`
    spines hashed uniformly over its True columns: shape (pairs, draws)."""
    count = live.sum(axis=1)
    pick = (rng.random((len(live), draws)) * count[:, None]).astype(int)
    cum = np.cumsum(live, axis=1)
    return (cum[:, None, :] > pick[:, :, None]).argmax(axis=2)


def discover(rng: np.random.Generator, live: np.ndarray, k: int, candidates: int) -> np.ndarray:
    """Maestro's discovery per pair: candidate connections hashed one by one
    (candidates x k at most); the first k distinct spines are kept, and when
    fewer exist the earliest duplicates fill the k paths. Shape (pairs, k)."""
    draws = uniform_choice(rng, live, candidates * k)
    n = draws.shape[1]
    onehot = draws[:, :, None] == np.arange(live.shape[1])
    first = (np.cumsum(onehot, axis=1) == 1) & onehot
    key = np.where(first.any(axis=2), 0, n) + np.arange(n)
    order = np.argsort(key, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(draws, order, axis=1)


def survey(rng: np.random.Generator, live: np.ndarray, cross: np.ndarray, vnics: int) -> np.ndarray:
    """Each pair's route survey (the engine's surveyRoutes): probes hashed
    over the pair's live spines in rounds of vnics, 2 vnics, 4 vnics, ...;
    the survey stops after a round that found no new spine or at
    SURVEY_PROBES probes. Returns the distinct spines each pair's survey saw
    (0 for a pair on one leaf: no router answers)."""
    draws = uniform_choice(rng, live, SURVEY_PROBES)
    seen = np.cumsum(draws[:, :, None] == np.arange(live.shape[1]), axis=1) > 0
    distinct = seen.sum(axis=2)  # after each probe
    ends, sent, size = [], 0, vnics
    while sent < SURVEY_PROBES:
        size = min(size, SURVEY_PROBES - sent)
        sent += size
        ends.append(sent)
        size *= 2
    counts = distinct[:, np.array(ends) - 1]  # pairs x rounds
    new = np.diff(counts, axis=1, prepend=0)
    stop = np.argmax(new == 0, axis=1)  # the first round with nothing new
    stop = np.where((new == 0).any(axis=1), stop, len(ends) - 1)
    return np.where(cross, counts[np.arange(len(counts)), stop], 0)


def auto_paths(hops: np.ndarray, vnics: int) -> int:
    """The engine's autoPathCount: one path per vNIC, or one per core hop the
    largest survey saw where that is more (at most AUTO_PATHS_MAX)."""
    seen = int(hops.max()) if len(hops) else 0
    return max(vnics, min(seen, AUTO_PATHS_MAX)) if seen > vnics else vnics


def build_flows(fab: Fabric, policy: str, k: int, candidates: int, src: np.ndarray, dst: np.ndarray,
                live_up: np.ndarray, rng: np.random.Generator, vnics: int = 4, info: dict | None = None):
    """Flows (links, group, data) of one ring step, each pair moving 1 unit.
    `info` gets the path count used ("k")."""
    sleaf, dleaf = src // fab.ranks_per_leaf, dst // fab.ranks_per_leaf
    cross = sleaf != dleaf
    live = live_up[sleaf] & live_up[dleaf]  # a link down kills both directions
    if (live[cross].sum(axis=1) == 0).any():
        return None
    npairs = len(src)
    if policy == "defaults":
        policy, k = "maestro", auto_paths(survey(rng, live, cross, vnics), vnics)
    if info is not None:
        info["k"] = k
    if policy == "gloo":
        spines, share, pooled = uniform_choice(rng, live, 1), None, False
    elif policy == "k-even":
        spines, share, pooled = uniform_choice(rng, live, k), None, False
    elif policy == "maestro":
        spines, share, pooled = discover(rng, live, k, candidates), None, True
    elif policy == "spray":
        # Every live spine, each carrying an even share; a dead one gets none.
        spines = np.broadcast_to(np.arange(fab.spines), live.shape)
        share, pooled = live / live.sum(axis=1, keepdims=True), False
    else:
        raise ValueError(f"unknown policy {policy!r}")
    width = spines.shape[1]
    if share is None:
        share = np.full((npairs, width), 1.0 / width)
    pair = np.repeat(np.arange(npairs), width)
    sp = spines.ravel()
    # Intra-leaf pairs: one flow on the access links whatever the policy
    # (their k connections would share the same two links anyway).
    keep = np.where(cross[pair], share.ravel() > 0, np.tile(np.arange(width), npairs) == 0)
    pair, sp, part = pair[keep], sp[keep], share.ravel()[keep]
    part = np.where(cross[pair], part, 1.0)
    c = cross[pair]
    links = np.full((len(pair), 4), fab.pad)
    links[:, 0] = fab.up(src[pair])
    links[:, 1] = fab.down(dst[pair])
    links[c, 2] = fab.leaf_up(sleaf[pair][c], sp[c])
    links[c, 3] = fab.spine_down(sp[c], dleaf[pair][c])
    if pooled:
        return links, pair, np.ones(npairs)
    return links, np.arange(len(pair)), part


# ---------------------------------------------------------------- one run

@dataclass
class Trial:
    """What one seed draws for a configuration: the placement and the failed
    links, shared by every policy (paired comparison)."""
    host_of_rank: np.ndarray
    live_up: np.ndarray  # leaves x spines: leaf-spine link up


def draw_trial(fab: Fabric, seed: int, placement: str, failed: int, spread: str) -> Trial:
    rng = np.random.default_rng([seed, fab.ranks, 1])
    host = np.arange(fab.ranks) if placement == "packed" else rng.permutation(fab.ranks)
    live = np.ones((fab.leaves, fab.spines), bool)
    if failed:
        if spread == "leaf0":
            leaf0 = host[0] // fab.ranks_per_leaf
            live[leaf0, rng.choice(fab.spines, failed, replace=False)] = False
        else:
            live.ravel()[rng.choice(live.size, failed, replace=False)] = False
    return Trial(host, live)


def busbw(fab: Fabric, trial: Trial, policy: str, k: int = 4, candidates: int = 8, seed: int = 0,
          efficiency: float = 1.0, vnics: int = 4, info: dict | None = None) -> float:
    """Allreduce busbw (Gbit/s) of one seed: (size/n) / ring step time."""
    src = trial.host_of_rank
    dst = np.roll(src, -1)
    rng = np.random.default_rng([seed, fab.ranks, 2])
    flows = build_flows(fab, policy, k, candidates, src, dst, trial.live_up, rng, vnics, info)
    if flows is None:
        return 0.0
    return efficiency / step_time(*flows, fab.capacity())


def quantiles(xs) -> dict:
    xs = np.asarray(xs, float)
    return {"median": float(np.median(xs)), "p10": float(np.percentile(xs, 10)),
            "p90": float(np.percentile(xs, 90)), "min": float(xs.min()), "max": float(xs.max())}


def monte_carlo(fab: Fabric, policies, *, ks=(4,), failed=0, placement="scattered", spread="leaf0", seeds=100,
                candidates=8, vnics=4) -> list[dict]:
    """Rows (policy, k) with busbw and fraction of ideal over seeds; the
    defaults' row has k "auto" and the path counts it chose ("paths")."""
    rows = {(p, k): [] for p in policies
            for k in (ks if p in ("k-even", "maestro") else ("auto",) if p == "defaults" else (1,))}
    chosen = {key: [] for key in rows}
    ideal = []
    for seed in range(seeds):
        trial = draw_trial(fab, seed, placement, failed, spread)
        ideal.append(busbw(fab, draw_trial(fab, seed, placement, 0, spread), "spray", seed=seed))
        for (p, k), out in rows.items():
            info = {}
            out.append(busbw(fab, trial, p, k, candidates, seed, vnics=vnics, info=info))
            chosen[(p, k)].append(info.get("k", k))
    ideal = np.array(ideal)
    return [dict({"policy": p, "k": k, "busbw_gbps": quantiles(v), "fraction": quantiles(np.array(v) / ideal),
                  "ideal_gbps": quantiles(ideal)}, **({"paths": quantiles(chosen[(p, k)])} if p == "defaults" else {}))
            for (p, k), v in rows.items()]


def summary(seeds: int, candidates: int, vnics: int) -> dict:
    """The headline case: maestro's defaults at 1,024 ranks, 16 spines, 1:1
    (core links as fast as access links), scattered placement; and with 2
    failed leaf-spine links (on rank 0's leaf)."""
    fab = Fabric(1024, 16, 16, 100.0, 100.0)
    out = {"ranks": fab.ranks, "spines": fab.spines, "placement": "scattered", "policy": "maestro defaults"}
    for failed in (0, 2):
        row = monte_carlo(fab, ("defaults",), failed=failed, placement="scattered", seeds=seeds,
                          candidates=candidates, vnics=vnics)[0]
        key = "fraction_of_ideal" if failed == 0 else f"fraction_of_ideal_{failed}_failed_links"
        out[key] = round(row["fraction"]["median"], 3)
        out[f"{key}_p10"] = round(row["fraction"]["p10"], 3)
        out["paths" if failed == 0 else f"paths_{failed}_failed_links"] = row["paths"]["median"]
    out.update(vnics=vnics, seeds=seeds)
    return out


# ---------------------------------------------------------------- the lab

def lab_efficiency(p2p: dict) -> dict:
    """Payload rate / link rate per transport, point to point on the lab
    (docs/results/data/p2p_paths.json): gloo's one flow over one core link,
    and maestro's paths over as many core links while their sum stays under
    the access link (the median over those path counts)."""
    d = p2p["data"]
    core, access = d["core_mbit"] / 1e3, d["access_mbit"] / 1e3
    gloo = next(r for r in d["rows"] if r["variant"] == "gloo")
    maestro = [r["gbps"] / (r["paths"] * core) for r in d["rows"]
               if r["variant"] != "gloo" and r["paths"] * core < access]
    return {"gloo": gloo["gbps"] / core, "maestro": float(np.median(maestro))}


def validate(seeds: int, candidates: int) -> dict:
    """The simulator against the lab's recorded 64 MiB allreduce in ECMP mode
    (its fastest iteration, and its median beside it):
    4 hosts on 2 leaves, 4 spines, 200 Mbit/s core, 1 Gbit/s access, packed,
    the ring crossing the core twice; gloo, single (maestro with one path) and
    adaptive (maestro, 4 paths, discovery)."""
    with open(os.path.join(DATA, "collectives.json")) as f:
        col = json.load(f)
    with open(os.path.join(DATA, "p2p_paths.json")) as f:
        eff = lab_efficiency(json.load(f))
    d = col["data"]
    fab = Fabric(ranks=4, ranks_per_leaf=2, spines=4, access_gbps=d["access_mbit"] / 1e3,
                 core_gbps=d["core_mbit"] / 1e3)
    run = d["runs"]["ecmp/allreduce"]
    size = 64 << 20
    # The fluid model gives the rate the fabric allows. A run's fastest
    # iteration is the closest measurement of that; its median also carries
    # the host's noise and TCP's loss recoveries, which moved this very cell
    # (same code, same lab) from 91.9 to 83.7 MB/s between two records. The
    # test holds the fastest to 10 %; the table shows the median beside it.
    rows_at = {r["variant"]: r for r in run["rows"] if r["bytes"] == size}
    # busbw scales with 1 / time: the row's busbw is at its median time ("seconds").
    measured = {v: r["busbw_GBps"] * 1e3 * r["seconds"] / min(r["times"]) for v, r in rows_at.items()}
    median = {v: r["busbw_GBps"] * 1e3 for v, r in rows_at.items()}
    rows = compare(fab, (("gloo", "gloo", 1, "gloo"), ("single", "maestro", 1, "maestro"),
                         ("adaptive", "maestro", 4, "maestro")), measured, median, eff, seeds, candidates)
    out = {"fabric": fabric_dict(fab), "bytes": size, "source": "docs/results/data/collectives.json "
           "runs['ecmp/allreduce'], recorded " + col["date"] + " at maestro " + col["machine"]["maestro_commit"],
           "efficiency": eff, "rows": rows}
    spines = os.path.join(DATA, "spines.json")
    if os.path.exists(spines):
        with open(spines) as f:
            out["spines"] = validate_spines(json.load(f), eff, seeds, candidates)
    return out


def compare(fab: Fabric, variants, measured: dict, median: dict, eff: dict, seeds: int, candidates: int,
            vnics: int = 4) -> list[dict]:
    """Simulated rows (MB/s, packed, no failures) against measured ones:
    (lab variant, sim policy, k, transport) each."""
    rows = []
    for variant, policy, k, transport in variants:
        info = {}
        sims = [busbw(fab, draw_trial(fab, s, "packed", 0, "leaf0"), policy, k, candidates, s, eff[transport],
                      vnics=vnics, info=info) * 1e3 / 8 for s in range(seeds)]
        q = quantiles(sims)
        ratio = q["median"] / measured[variant]
        rows.append({"variant": variant, "policy": policy, "k": info.get("k", k), "efficiency": eff[transport],
                     "sim_MBps": q, "measured_MBps": measured[variant], "ratio": ratio,
                     "measured_median_MBps": median[variant], "ratio_to_median": q["median"] / median[variant],
                     "within_10pct": bool(abs(ratio - 1) <= 0.10)})
    return rows


def validate_spines(rec: dict, eff: dict, seeds: int, candidates: int) -> dict:
    """The simulator's defaults (paths=auto) against the lab with more
    spines than vNICs (docs/results/data/spines.json: 4 hosts on 2 leaves,
    8 spines, 4 aliases, ECMP), 64 MiB allreduce: the fastest iteration of
    any trial, and the median over trials beside it."""
    d = rec["data"]
    fab = Fabric(ranks=4, ranks_per_leaf=2, spines=d["spines"], access_gbps=d["access_mbit"] / 1e3,
                 core_gbps=d["core_mbit"] / 1e3)
    size = max(r["bytes"] for run in d["runs"] for r in run["rows"])
    at = [r for run in d["runs"] for r in run["rows"] if r["bytes"] == size]
    measured = {v: max(r["busbw_GBps"] * 1e3 * r["seconds"] / min(r["times"]) for r in at if r["variant"] == v)
                for v in d["variants"]}
    median = {v: float(np.median([r["busbw_GBps"] * 1e3 for r in at if r["variant"] == v])) for v in d["variants"]}
    rows = compare(fab, (("gloo", "gloo", 1, "gloo"), ("adaptive@paths=4", "maestro", 4, "maestro"),
                         ("adaptive", "defaults", "auto", "maestro")), measured, median, eff, seeds, candidates,
                   vnics=d["aliases"])
    return {"fabric": fabric_dict(fab), "bytes": size, "source": "docs/results/data/spines.json, recorded "
            + rec["date"] + " at maestro " + rec["machine"]["maestro_commit"], "rows": rows}


# ---------------------------------------------------------------- CLI

def fabric_dict(fab: Fabric) -> dict:
    return {"ranks": fab.ranks, "ranks_per_leaf": fab.ranks_per_leaf, "spines": fab.spines,
            "leaves": fab.leaves, "access_gbps": fab.access_gbps, "core_gbps": fab.core_gbps,
            "oversubscription": fab.oversubscription}


def fabric_spec(s: str) -> tuple:
    """'16x25:packed' -> (16, 25.0, ('packed',)); without ':...' both placements."""
    shape, _, places = s.partition(":")
    spines, _, core = shape.partition("x")
    placements = tuple(places.split("+")) if places else ("scattered", "packed")
    for p in placements:
        if p not in ("scattered", "packed"):
            raise argparse.ArgumentTypeError(f"unknown placement {p!r} in {s!r}")
    return int(spines), float(core), placements


def csv(kind):
    return lambda s: tuple(kind(x) for x in s.split(","))


def print_rows(title: str, rows: list[dict], key: str) -> None:
    print(f"\n{title}")
    for r in rows:
        f = r["fraction"]
        print(f"  {key}={r[key]!s:>5} {r['policy']:>8} k={r['k']}  fraction of ideal median {f['median']:.3f} "
              f"(p10 {f['p10']:.3f}, p90 {f['p90']:.3f})  busbw {r['busbw_gbps']['median']:.1f} Gbit/s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=csv(int), default=RANKS, help="rank counts for the scale sweep")
    ap.add_argument("--ranks-per-leaf", type=int, default=16)
    ap.add_argument("--fabrics", type=csv(fabric_spec), default=tuple(fabric_spec(s) for s in FABRICS),
                    help="fabrics and their placements, SPINESxCORE_GBPS[:placement+placement], comma-separated "
                         f"(default {','.join(FABRICS)})")
    ap.add_argument("--spines", type=csv(int), default=None,
                    help="instead of --fabrics: these spine counts x --core-gbps x --placements")
    ap.add_argument("--access-gbps", type=float, default=100.0)
    ap.add_argument("--core-gbps", type=float, default=100.0, help="core link rate with --spines")
    ap.add_argument("--placements", type=csv(str), default=("scattered", "packed"), help="with --spines")
    ap.add_argument("--policies", type=csv(str), default=POLICIES)
    ap.add_argument("--k", type=int, default=4, help="paths per peer for k-even and maestro in the scale sweep")
    ap.add_argument("--ks", type=csv(int), default=KS, help="k values of the k sweep")
    ap.add_argument("--failed", type=csv(int), default=FAILED, help="failed leaf-spine link counts")
    ap.add_argument("--failure-spread", choices=("leaf0", "random"), default="leaf0")
    ap.add_argument("--candidates", type=int, default=8, help="discovery candidates per path (MAESTRO_CANDIDATES)")
    ap.add_argument("--seeds", type=int, default=None, help="Monte Carlo seeds (default 100; 20 with --summary)")
    ap.add_argument("--vnics", type=int, default=4, help="vNICs per host, for the defaults (paths=auto)")
    ap.add_argument("--only", type=csv(str), default=("scale", "k", "failures", "validation"))
    ap.add_argument("--summary", action="store_true",
                    help="only the headline case (1,024 ranks, 16 spines, 1:1, scattered, maestro's defaults, and "
                         "with 2 failed links): its JSON as the last line; writes nothing")
    ap.add_argument("--out", default=os.path.join(DATA, "fabric_sim.json"))
    args = ap.parse_args(argv)
    for p in args.policies:
        if p not in POLICIES:
            ap.error(f"unknown policy {p}; known: {', '.join(POLICIES)}")
    if args.summary:
        print(json.dumps(summary(args.seeds or 20, args.candidates, args.vnics)))
        return 0
    args.seeds = args.seeds or 100
    fabrics = args.fabrics if args.spines is None else tuple((s, args.core_gbps, args.placements)
                                                             for s in args.spines)
    start = time.time()
    big = max(args.ranks)
    data = {"lab": "none: a flow-level simulation (benchmarks/fabric_sim.py), validated against the lab's records",
            "seeds": args.seeds, "candidates": args.candidates, "k": args.k, "vnics": args.vnics,
            "failure_spread": args.failure_spread,
            "ranks_per_leaf": args.ranks_per_leaf, "access_gbps": args.access_gbps,
            "fabrics": [], "scale": [], "k_sweep": [], "failures": []}
    for spines, core, placements in fabrics:
        data["fabrics"].append(dict(fabric_dict(Fabric(big, args.ranks_per_leaf, spines, args.access_gbps, core)),
                                    placements=list(placements)))
        for placement in placements:
            common = {"spines": spines, "core_gbps": core, "placement": placement}
            where = f"{spines} spines of {core:g} Gbit/s, {placement}"
            if "scale" in args.only:
                for n in args.ranks:
                    fab = Fabric(n, args.ranks_per_leaf, spines, args.access_gbps, core)
                    rows = monte_carlo(fab, args.policies, ks=(args.k,), placement=placement, seeds=args.seeds,
                                       candidates=args.candidates, vnics=args.vnics)
                    data["scale"] += [dict(r, ranks=n, **common) for r in rows]
                    print_rows(f"{where}, {n} ranks", rows, "policy")
            fab = Fabric(big, args.ranks_per_leaf, spines, args.access_gbps, core)
            if "k" in args.only:
                rows = monte_carlo(fab, args.policies, ks=args.ks, placement=placement, seeds=args.seeds,
                                   candidates=args.candidates, vnics=args.vnics)
                data["k_sweep"] += [dict(r, ranks=big, **common) for r in rows]
                print_rows(f"{where}, {big} ranks, k sweep", rows, "k")
            if "failures" in args.only:
                for failed in args.failed:
                    rows = monte_carlo(fab, args.policies, ks=(args.k,), failed=failed, placement=placement,
                                       spread=args.failure_spread, seeds=args.seeds, candidates=args.candidates,
                                       vnics=args.vnics)
                    data["failures"] += [dict(r, ranks=big, failed=failed, **common) for r in rows]
                    print_rows(f"{where}, {big} ranks, {failed} failed", rows, "policy")
    if "validation" in args.only:
        data["validation"] = validate(args.seeds, args.candidates)
        for r in data["validation"]["rows"] + data["validation"].get("spines", {}).get("rows", []):
            print(f"lab {r['variant']:>8}: sim {r['sim_MBps']['median']:.1f} MB/s, measured {r['measured_MBps']:.1f} "
                  f"MB/s, ratio {r['ratio']:.3f}, within 10 %: {r['within_10pct']}")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from suite import machine
    rel = os.path.relpath(os.path.abspath(sys.argv[0]), ROOT) if argv is None else "benchmarks/fabric_sim.py"
    args_text = " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    record = {"experiment": "fabric_sim", "status": "ok", "quick": False, "seconds": time.time() - start,
              "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "command": f"python {rel}" + (f" {args_text}" if args_text else ""), "machine": machine(), "data": data}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
    print(f"\nwrote {args.out} in {time.time() - start:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
