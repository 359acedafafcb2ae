"""What a lab shows: the bytes that crossed each leaf-spine link (read at
the spine), per spine, and the human-readable status of the CLI's
``netlab.py status``. Each function reads a Lab (lab.py)."""
from __future__ import annotations

from .plumbing import in_netns, read_netdev
from .topology import NetlabError, fmt_rate, gw_ip, host_ip, link_ips


def link_bytes(lab) -> dict:
    """{(leaf, spine): (bytes leaf->spine, bytes spine->leaf)} read at the spine
    (so only what actually crossed the link, after the leaf's shaper)."""
    c = lab.cfg
    st = lab._state()
    data = in_netns(lab._targets([f"s{s}" for s in range(c.spines)], st), lambda name: read_netdev())
    out = {}
    for s in range(c.spines):
        devs = data[f"{lab.prefix}s{s}"]
        for l in range(c.leaves):
            rx, tx = devs.get(f"L{l}", (0, 0))
            out[(l, s)] = (rx, tx)
    return out


def spine_bytes(cfg, lb: dict) -> list[int]:
    """Bytes each spine forwarded (the tx bytes of its leaf-facing devices),
    from link_bytes."""
    return [sum(lb[(l, s)][1] for l in range(cfg.leaves)) for s in range(cfg.spines)]


def status(lab) -> str:
    """Human-readable topology, addresses, rates, link states, counters."""
    st = lab._state()
    c = lab.cfg
    lines = [f"lab {lab.prefix}  mode={c.mode}  hosts={c.hosts} leaves={c.leaves} "
             f"spines={c.spines} aliases={c.aliases} queue={c.queue_ms:g}ms  [{st['status']}]",
             f"  state {lab.state_path}  owner pid {st.get('owner_pid') or '-'}",
             f"hosts (access links {fmt_rate(st['access'])} Mbit):"]
    for i in range(c.hosts):
        al = " ".join(f"{a}" + (f"(s{c.alias_spine(k)})" if c.mode == "pinned" else "")
                      for k, a in enumerate(lab.aliases(i)))
        lines.append(f"  h{i:<3} ns {lab.ns(i):<14} leaf L{c.leaf_of(i)}  addr {host_ip(i)}  "
                     f"gw {gw_ip(i)}  aliases {al or '-'}")
    try:
        lb = link_bytes(lab)
    except (NetlabError, OSError):
        lb = {}
    lines.append("leaf-spine links (rate Mbit each direction; bytes up=leaf->spine down=spine->leaf):")
    for l, s in c.links():
        info = st["links"].get(f"{l},{s}", {})
        down = info.get("down")
        up_b, dn_b = lb.get((l, s), (0, 0))
        a, b = link_ips(l, s)
        lines.append(f"  L{l}-s{s}  {a:<12} <-> {b:<12} rate {fmt_rate(info.get('rate')):>6}  "
                     f"{'DOWN(' + down + ')' if down else 'up':<16} up {up_b:>12} down {dn_b:>12}")
    if lb:
        lines.append("spine bytes: " + "  ".join(f"s{s}={b}" for s, b in enumerate(spine_bytes(c, lb))))
    if st["background"]:
        lines.append("background flows:")
        for b, info in st["background"].items():
            lines.append(f"  {b}: spine s{info['spine']} h{info['src']}->h{info['dst']} "
                         f"{info['proto']} {fmt_rate(info['mbit'])} Mbit port {info['port']} "
                         f"pids {info['pids']}")
    return "\n".join(lines)
