"""Link shaping: a tbf qdisc at both ends of a leaf-spine link (core) or a
host-leaf link (access), each direction shaped at the sending device."""
from __future__ import annotations

from .plumbing import batch_job, run_parallel
from .topology import NetlabError

GSO_SKB_MAX = 65536 + 4096  # a full GSO skb with its headers, rounded up


def tbf(dev, mbit, queue_ms) -> str:
    """The tc command shaping dev to mbit (None: removing its shaper)."""
    if mbit is None:
        return f"qdisc del dev {dev} root"
    # >= 1 ms of traffic, and >= one whole GSO skb: a 64 KiB TCP payload
    # plus its headers is a little over 65536 bytes, and tbf splits any skb
    # larger than its burst into MTU-sized packets -- which multiplies the
    # packets every later hop must forward and made the lab CPU-bound
    # (softirq ~60% of both cores at 200 Mbit) well below its link rates.
    burst = max(int(mbit * 125), GSO_SKB_MAX)
    queue = max(int(mbit * 125 * queue_ms), GSO_SKB_MAX)  # queue_ms deep, >= one GSO skb
    return f"qdisc replace dev {dev} root tbf rate {mbit:g}mbit burst {burst} limit {burst + queue}"


def core_cmds(cfg, pairs, mbit) -> dict:
    """{node: [tc commands]} shaping the leaf-spine links `pairs`."""
    per = {}
    for l, s in pairs:
        per.setdefault(f"L{l}", []).append(tbf(f"s{s}", mbit, cfg.queue_ms))
        per.setdefault(f"s{s}", []).append(tbf(f"L{l}", mbit, cfg.queue_ms))
    return per


def access_cmds(cfg, mbit) -> dict:
    """{node: [tc commands]} shaping every host-leaf link."""
    per = {}
    for i in range(cfg.hosts):
        per.setdefault(f"h{i}", []).append(tbf("eth0", mbit, cfg.queue_ms))
        per.setdefault(f"L{cfg.leaf_of(i)}", []).append(tbf(f"h{i}", mbit, cfg.queue_ms))
    return per


def initial_cmds(cfg) -> dict:
    """The commands shaping a new lab: core and access at their configured
    rates (nothing to delete yet)."""
    per = core_cmds(cfg, cfg.links(), cfg.core)
    for n, cmds in access_cmds(cfg, cfg.access).items():
        per.setdefault(n, []).extend(cmds)
    return {n: [x for x in cmds if not x.startswith("qdisc del")] for n, cmds in per.items()}


def apply(prefix, per_ns: dict):
    """per_ns: {node: [tc commands]}; deletes may fail harmlessly (no qdisc)."""
    jobs = [batch_job("tc", prefix + n, cmds, force=True) for n, cmds in per_ns.items() if cmds]
    errs = run_parallel(jobs, check=False)
    bad = [ln for e in errs for ln in e.split("\n") if ln.strip()
           and not ln.startswith("Command failed") and "Cannot delete qdisc" not in ln]
    if bad:
        raise NetlabError("tc failed: " + "; ".join(bad))
