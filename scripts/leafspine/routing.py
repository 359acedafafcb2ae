"""Routing: the sysctls of hosts and routers, every node's addresses, routes
and policy rules, and the routes re-synced after a link goes down or up.

Leaves hold one ECMP route per remote host over all spines, hashed on the
5-tuple (fib_multipath_hash_policy=3 with the 5-tuple fields; see ECMP_HASH
for why not policy 1), plus one table per spine (100+s) with routes to the
remote hosts through that spine.  In ``pinned`` mode policy rules ``from
alias(i,k)`` (at host i's leaf) and ``to alias(i,k)`` (at the other leaves)
select table 100+(k mod S), so alias k crosses spine k in both directions.
In ``ecmp`` mode there are no such rules: the hash alone decides.  Spines
have a route per host and a ``blackhole 10.1.0.0/16`` fallback, so a downed
link drops silently (no ICMP).
"""
from __future__ import annotations

import os

from .plumbing import batch_job, run_parallel
from .topology import NetlabError, alias_ip, gw_ip, host_ip, host_net, link_ips

TABLE_BASE = 100          # table of spine s = TABLE_BASE + s
PREF_FLOW = 50            # per-flow pinning rules (background traffic)
PREF_FROM = 100           # pinned mode: from alias
PREF_TO = 101             # pinned mode: to alias
SPINE_FALLBACK = "10.1.0.0/16"

# The leaves' ECMP hash: the 5-tuple from the packet's headers, as a switch
# computes it. Policy 1 ("L4") is not that here: it returns the hash already
# on the skb when there is one, and a TCP socket stamps its packets with its
# own random flow hash (sk_txhash), which a veth carries into the router's
# namespace. A connection's spine would then be a per-socket random draw (two
# connections on one 5-tuple taking different spines, and TCP re-rolls it
# after a retransmission timeout), which no discovery by 5-tuple can learn.
# Policy 3 with the 5-tuple fields (Linux >= 5.12) dissects the headers.
_FIVE_TUPLE = 0x01 | 0x02 | 0x04 | 0x10 | 0x20  # src ip, dst ip, ip proto, src port, dst port
ECMP_HASH = ({"net.ipv4.fib_multipath_hash_policy": 3, "net.ipv4.fib_multipath_hash_fields": _FIVE_TUPLE}
             if os.path.exists("/proc/sys/net/ipv4/fib_multipath_hash_fields")
             else {"net.ipv4.fib_multipath_hash_policy": 1})

# Set before any veth exists, so "default" applies to every device.
_COMMON = {"net.ipv6.conf.all.disable_ipv6": 1, "net.ipv6.conf.default.disable_ipv6": 1,
           "net.ipv4.conf.all.rp_filter": 0, "net.ipv4.conf.default.rp_filter": 0}
_ROUTER = dict(_COMMON, **{"net.ipv4.ip_forward": 1,
                           "net.ipv4.conf.all.ignore_routes_with_linkdown": 0,
                           "net.ipv4.conf.default.ignore_routes_with_linkdown": 0})
SYSCTLS = {"h": _COMMON, "L": dict(_ROUTER, **ECMP_HASH), "s": _ROUTER}  # by node kind


def build_jobs(cfg, prefix) -> list:
    """One ip batch per namespace (run_parallel jobs): addresses, routes,
    rules of every host, leaf and spine."""
    P = prefix
    jobs = []
    for i in range(cfg.hosts):
        cmds = ["link set lo up", f"addr add {host_ip(i)}/24 dev eth0"]
        cmds += [f"addr add {alias_ip(i, k)}/24 dev eth0" for k in range(cfg.aliases)]
        cmds += ["link set eth0 up", f"route add default via {gw_ip(i)} dev eth0"]
        jobs.append(batch_job("ip", f"{P}h{i}", cmds))
    for l in range(cfg.leaves):
        cmds = ["link set lo up"]
        for i in cfg.hosts_of(l):
            cmds += [f"addr add {gw_ip(i)}/24 dev h{i}", f"link set h{i} up"]
        for s in range(cfg.spines):
            cmds += [f"addr add {link_ips(l, s)[0]}/30 dev s{s}", f"link set s{s} up"]
        cmds += leaf_routes(cfg, l, range(cfg.spines), range(cfg.spines))
        if cfg.mode == "pinned":
            cmds += pinned_rules(cfg, l)
        jobs.append(batch_job("ip", f"{P}L{l}", cmds))
    for s in range(cfg.spines):
        cmds = ["link set lo up"]
        for l in range(cfg.leaves):
            cmds += [f"addr add {link_ips(l, s)[1]}/30 dev L{l}", f"link set L{l} up"]
        cmds += spine_routes(cfg, s, range(cfg.leaves))
        cmds.append(f"route add blackhole {SPINE_FALLBACK}")
        jobs.append(batch_job("ip", f"{P}s{s}", cmds))
    return jobs


def pinned_rules(cfg, l) -> list[str]:
    """Leaf l's rules sending alias k through spine k mod S, both ways."""
    cmds = []
    for i in range(cfg.hosts):
        for k in range(cfg.aliases):
            t = TABLE_BASE + cfg.alias_spine(k)
            if cfg.leaf_of(i) == l:
                cmds.append(f"rule add from {alias_ip(i, k)} lookup {t} pref {PREF_FROM}")
            else:
                cmds.append(f"rule add to {alias_ip(i, k)} lookup {t} pref {PREF_TO}")
    return cmds


def _via(l, s, table=None) -> str:
    return f"via {link_ips(l, s)[1]} dev s{s}" + (f" table {TABLE_BASE + s}" if table else "")


def _ecmp_route(dst, l, spines) -> str:
    if len(spines) == 1:
        return f"route replace {dst} {_via(l, spines[0])}"
    return f"route replace {dst} " + " ".join(f"nexthop {_via(l, s)}" for s in spines)


def leaf_routes(cfg, l, ecmp_spines, pinned_spines) -> list[str]:
    """Route commands (replace) at leaf l: ECMP over ecmp_spines + pinned tables."""
    cmds = []
    ecmp_spines = list(ecmp_spines)
    for j in range(cfg.hosts):
        if cfg.leaf_of(j) == l:
            continue
        dst = host_net(j)
        if ecmp_spines:
            cmds.append(_ecmp_route(dst, l, ecmp_spines))
        for s in pinned_spines:
            cmds.append(f"route replace {dst} {_via(l, s, table=True)}")
    return cmds


def spine_routes(cfg, s, leaves) -> list[str]:
    cmds = []
    for l in leaves:
        for i in cfg.hosts_of(l):
            cmds.append(f"route replace {host_net(i)} via {link_ips(l, s)[0]} dev L{l}")
    return cmds


def sync_routes(cfg, prefix, links, leaves, spines):
    """Make the routes of the given leaves/spines match the link states
    (links: the state file's {"l,s": {"down": None|"blackhole"|"reroute"}})."""
    jobs = []
    for l in leaves:
        cmds = []
        for j in range(cfg.hosts):
            lj = cfg.leaf_of(j)
            if lj == l:
                continue
            dst = host_net(j)
            usable = [s for s in range(cfg.spines) if links[f"{l},{s}"]["down"] != "reroute"
                      and links[f"{lj},{s}"]["down"] != "reroute"]
            cmds.append(_ecmp_route(dst, l, usable) if usable else f"route del {dst}")
            for s in range(cfg.spines):
                cmds.append(f"route replace {dst} {_via(l, s, table=True)}" if s in usable
                            else f"route del {dst} table {TABLE_BASE + s}")
        if cmds:
            jobs.append(batch_job("ip", f"{prefix}L{l}", cmds, force=True))
    for s in spines:
        cmds = spine_routes(cfg, s, [l for l in range(cfg.leaves) if not links[f"{l},{s}"]["down"]])
        if cmds:
            jobs.append(batch_job("ip", f"{prefix}s{s}", cmds, force=True))
    errs = run_parallel(jobs, check=False)
    bad = [ln for e in errs for ln in e.split("\n")
           if "RTNETLINK" in ln and "No such process" not in ln]
    if bad:
        raise NetlabError("route sync failed: " + "; ".join(bad))
