"""The lab's shape and addresses: its Config, its nodes, which host sits on
which leaf, and the address plan (no namespaces, nothing run).

Topology (defaults: 4 hosts, 2 leaves, 4 spines, aliases = spines)::

    spines  s0 ... s{S-1}          every leaf is linked to every spine
    leaves  L0 ... L{L-1}          hosts split evenly over the leaves
    hosts   h0 ... h{H-1}          eth0 = primary address + alias addresses ("vNICs")

Addressing::

    host i          10.1.i.2/24          primary address, default gw 10.1.i.1 (its leaf)
    host i alias k  10.1.i.(10+k)/24     alias k is pinned to spine k mod S ("pinned" mode)
    leaf l - spine s  10.2.l.(4s+1)/30 (leaf side, dev "s<s>")  <->  10.2.l.(4s+2)/30 (spine side, dev "L<l>")
    leaf dev towards host i: "h<i>";  host dev: "eth0"
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass


class NetlabError(RuntimeError):
    pass


# ----------------------------------------------------------------- addressing
def host_ip(i: int) -> str:
    return f"10.1.{i}.2"


def alias_ip(i: int, k: int) -> str:
    return f"10.1.{i}.{10 + k}"


def gw_ip(i: int) -> str:
    return f"10.1.{i}.1"


def link_ips(leaf: int, spine: int) -> tuple[str, str]:
    """(leaf-side, spine-side) address of the leaf-spine link."""
    return f"10.2.{leaf}.{4 * spine + 1}", f"10.2.{leaf}.{4 * spine + 2}"


def host_net(i: int) -> str:
    """Host i's /24: its primary address and aliases."""
    return f"10.1.{i}.0/24"


def fmt_rate(mbit) -> str:
    return "none" if mbit is None else (f"{mbit:g}")


def parse_rate(s):
    if s is None or isinstance(s, (int, float)):
        return s
    if str(s).lower() in ("none", "off", "0", "unlimited"):
        return None
    return float(s)


@dataclass
class Config:
    hosts: int = 4
    leaves: int = 2
    spines: int = 4
    aliases: int | None = None     # None -> same as spines
    core: float | None = 200.0     # Mbit on every leaf-spine link (each direction); None = unshaped
    access: float | None = 1000.0  # Mbit on every host-leaf link (each direction); None = unshaped
    mode: str = "pinned"           # "pinned" | "ecmp"
    queue_ms: float = 5.0          # tbf queue depth in ms at the shaped rate (at least 64 KB)

    def normalized(self) -> "Config":
        c = Config(**asdict(self))
        if c.aliases is None:
            c.aliases = c.spines
        c.core = parse_rate(c.core)
        c.access = parse_rate(c.access)
        if c.mode not in ("pinned", "ecmp"):
            raise NetlabError(f"mode must be 'pinned' or 'ecmp', not {c.mode!r}")
        if not 1 <= c.leaves <= 255:
            raise NetlabError("leaves must be in 1..255")
        if not c.leaves <= c.hosts <= 255:
            raise NetlabError("hosts must be in leaves..255 (every leaf needs a host)")
        if not 1 <= c.spines <= 63:
            raise NetlabError("spines must be in 1..63")
        if not 0 <= c.aliases <= 240:
            raise NetlabError("aliases must be in 0..240")
        for r in (c.core, c.access):
            if r is not None and r <= 0:
                raise NetlabError("rates must be > 0 Mbit (or None)")
        if c.queue_ms <= 0:
            raise NetlabError("queue_ms must be > 0")
        return c

    # ------------------------------------------------------------ the shape
    def leaf_of(self, host: int) -> int:
        return host * self.leaves // self.hosts

    def hosts_of(self, leaf: int) -> list[int]:
        return [i for i in range(self.hosts) if self.leaf_of(i) == leaf]

    def nodes(self) -> list[str]:
        return ([f"h{i}" for i in range(self.hosts)] + [f"L{l}" for l in range(self.leaves)]
                + [f"s{s}" for s in range(self.spines)])

    def links(self) -> list[tuple[int, int]]:
        """Every (leaf, spine) link."""
        return [(l, s) for l in range(self.leaves) for s in range(self.spines)]

    def alias_spine(self, k: int) -> int:
        """Spine that alias k is pinned to (pinned mode)."""
        return k % self.spines

    def node(self, node) -> str:
        """The node name of a host index or node name, checked."""
        if isinstance(node, int):
            if not 0 <= node < self.hosts:
                raise NetlabError(f"no host {node}")
            return f"h{node}"
        if node not in self.nodes():
            raise NetlabError(f"no node {node!r} (nodes: {' '.join(self.nodes())})")
        return node

    def check_link(self, leaf, spine):
        if not (0 <= leaf < self.leaves and 0 <= spine < self.spines):
            raise NetlabError(f"no link L{leaf}-s{spine}")

    def spine_of_hop(self, addr: str) -> int:
        """The spine a route probe's answer came from: the spine side of a
        leaf-spine link (see link_ips)."""
        m = re.match(r"^10\.2\.(\d+)\.(\d+)$", addr)
        if not m or int(m.group(2)) % 4 != 2 or (int(m.group(2)) - 2) // 4 >= self.spines:
            raise NetlabError(f"{addr} is not the spine side of a lab link")
        return (int(m.group(2)) - 2) // 4

    def host_of_addr(self, addr: str) -> int:
        m = re.match(r"^10\.1\.(\d+)\.\d+$", addr)
        if not m or int(m.group(1)) >= self.hosts:
            raise NetlabError(f"{addr} is not a lab host address")
        return int(m.group(1))
