"""Link faults: a leaf-spine link down (a silent blackhole, or withdrawn
routes as a converged routing protocol would leave them) and back up, one
link or a whole spine. Each function acts on a Lab (lab.py) and records the
link's state in its state file."""
from __future__ import annotations

from .plumbing import run_cmd
from .routing import sync_routes


def link_down(lab, leaf: int, spine: int, reroute: bool = False):
    """Take the leaf-spine link down.

    reroute=False (default): the spine end goes down.  The leaf only loses
      carrier and keeps using its routes through the link
      (ignore_routes_with_linkdown=0), the spine loses its routes to the leaf
      and drops into its blackhole route: every flow pinned or hashed onto
      the link is blackholed, in both directions, silently.
    reroute=True: both ends go down and the routes through the link are
      withdrawn at every leaf (as a converged routing protocol would): ECMP
      hashes over the remaining spines and flows pinned to this spine fall
      back to ECMP.
    """
    lab.cfg.check_link(leaf, spine)
    if lab._state()["links"][f"{leaf},{spine}"]["down"]:
        link_up(lab, leaf, spine)
    P = lab.prefix
    run_cmd(["ip", "-n", f"{P}s{spine}", "link", "set", f"L{leaf}", "down"])
    if reroute:
        run_cmd(["ip", "-n", f"{P}L{leaf}", "link", "set", f"s{spine}", "down"])
    links = lab._update(lambda st: (st["links"][f"{leaf},{spine}"].update(
        down="reroute" if reroute else "blackhole"), st["links"])[1])
    if reroute:
        sync_routes(lab.cfg, P, links, range(lab.cfg.leaves), [])


def link_up(lab, leaf: int, spine: int):
    """Bring the leaf-spine link back and re-add every route the kernel (or
    link_down) removed: pinned tables, ECMP routes, spine routes."""
    lab.cfg.check_link(leaf, spine)
    P = lab.prefix
    run_cmd(["ip", "-n", f"{P}s{spine}", "link", "set", f"L{leaf}", "up"])
    run_cmd(["ip", "-n", f"{P}L{leaf}", "link", "set", f"s{spine}", "up"])
    # forget neighbours that failed to resolve while the link was down (else the
    # first packets wait for the ARP retransmit timer, ~1 s)
    run_cmd(["ip", "-n", f"{P}L{leaf}", "neigh", "flush", "dev", f"s{spine}"], check=False)
    run_cmd(["ip", "-n", f"{P}s{spine}", "neigh", "flush", "dev", f"L{leaf}"], check=False)
    links = lab._update(lambda st: (st["links"][f"{leaf},{spine}"].update(down=None),
                                    st["links"])[1])
    sync_routes(lab.cfg, P, links, range(lab.cfg.leaves), [spine])


def spine_down(lab, spine: int, reroute: bool = False):
    """All links of one spine down (see link_down)."""
    for l in range(lab.cfg.leaves):
        link_down(lab, l, spine, reroute)


def spine_up(lab, spine: int):
    for l in range(lab.cfg.leaves):
        link_up(lab, l, spine)
