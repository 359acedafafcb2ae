#!/usr/bin/env python3
"""netlab -- a leaf-spine data-center network built from Linux network namespaces.

Test and benchmark lab for maestro-torch (multi-path collectives).  Python 3.11,
stdlib only, needs root.  Usable as a CLI and as a module::

    sys.path.insert(0, "scripts"); import netlab
    with netlab.Lab(hosts=4, leaves=2, spines=4, core=200) as lab:
        lab.run(0, ["ip", "addr"])
        r = lab.transfer(0, 2, seconds=1, src_addrs=lab.aliases(0))
        print(r.mbit, lab.spine_bytes())

This file is the entry point and the import path; the lab itself is the
package scripts/leafspine/, one module per concept (one-way imports, top to
bottom)::

    cli.py       the command line (netlab.py -h)
    lab.py       the Lab facade: build, tear down, processes; gc()
    faults.py    link and spine down / up
    traffic.py   transfer(), background flows, reachability probes
    flows.py     the sink and source programs traffic.py starts in the hosts
    status.py    byte counters per link and spine, status()
    routing.py   sysctls, addresses, ECMP routes, pinned tables and rules
    shaping.py   tbf shaping of core and access links
    plumbing.py  ip/tc batches, entering namespaces, veths, killing what runs inside
    state.py     the state file under /run/maestro-netlab and its lock
    topology.py  Config, nodes, the address plan, NetlabError

Python API (class Lab)::

    up() / down() / with Lab(...) as lab      build / tear down (idempotent)
    Lab.attach(prefix)                        handle on an existing lab (e.g. from the CLI)
    ns(node) host_addr(i) aliases(i) alias_addr(i, k) alias_spine(k) leaf_of(i) hosts_of(l)
    popen(node, argv, **kw) -> Popen          run inside a node's namespace (node: 0, "h0", "L1", "s2")
    run(node, argv, check=, timeout=) -> CompletedProcess (stdout/stderr captured as text)
    socket(node, ...)                         a socket created inside a node's namespace
    reachable(src, dst_addr, src_addr, timeout) -> bool   TCP handshake probe
    transfer(src, dst, seconds=|nbytes=, src_addrs=, dst_addrs=, streams=, mbit=) -> TransferResult
    background(spine, mbit, src=, dst=, proto="tcp"|"udp") -> Background (stop())
    link_down(leaf, spine, reroute=False) / link_up(leaf, spine) / spine_down(s) / spine_up(s)
    set_link_rate(leaf, spine, mbit) / set_core_rate(mbit) / set_access_rate(mbit)  (None = unshaped)
    spine_bytes() -> [bytes per spine]        link_bytes() -> {(leaf, spine): (up, down)}
    status() -> str

Topology and addresses: leafspine/topology.py; routing and the ECMP hash:
leafspine/routing.py; what ``down`` deletes (only the lab's own namespaces,
by inode): leafspine/lab.py.
"""
from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:  # the package beside this file, however this file was found
    sys.path.insert(0, _HERE)
# The API, re-exported: callers use netlab.X (the tests read NETNS_DIR and STATE_DIR too).
from leafspine.cli import main  # noqa: E402
from leafspine.lab import Lab, gc  # noqa: E402
from leafspine.plumbing import NETNS_DIR  # noqa: E402,F401
from leafspine.routing import ECMP_HASH  # noqa: E402,F401
from leafspine.state import STATE_DIR, list_labs  # noqa: E402,F401
from leafspine.topology import Config, NetlabError, alias_ip, gw_ip, host_ip, link_ips  # noqa: E402
from leafspine.traffic import Background, TransferResult  # noqa: E402

__all__ = ["Lab", "Config", "Background", "TransferResult", "NetlabError",
           "list_labs", "gc", "host_ip", "alias_ip", "gw_ip", "link_ips"]

if __name__ == "__main__":
    sys.exit(main())
