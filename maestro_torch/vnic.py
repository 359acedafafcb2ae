"""maestro-vnic: add, list and remove the IP aliases ("virtual NICs") that
maestro's paths start from.

    maestro-vnic list eth0
    maestro-vnic add eth0 10.1.0.11 10.1.0.12 10.1.0.13     # or: add eth0 --count 3
    maestro-vnic add eth0 --count 3 --dry-run               # print the ip commands only
    maestro-vnic remove eth0 10.1.0.12

Aliases are added in the interface's own subnet (with its prefix length), so
routing treats them like the primary address; where an RDMA device sits on
the interface, `list` shows each address's RoCEv2 GID index (what the verbs
transport's QPs use). add/remove need CAP_NET_ADMIN (root); --dry-run and
list do not. Then: export MAESTRO_VNICS=<the aliases> (list prints it).
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import os
import subprocess
import sys

SYS_IB = "/sys/class/infiniband"


class VnicError(Exception):
    pass


def _ip_json(*args) -> list:
    try:
        out = subprocess.run(["ip", "-j", *args], check=True, capture_output=True, text=True).stdout
    except FileNotFoundError as e:
        raise VnicError("the `ip` command (iproute2) is not installed") from e
    except subprocess.CalledProcessError as e:
        raise VnicError(e.stderr.strip() or f"ip {' '.join(args)} failed") from e
    return json.loads(out or "[]")


def interface_addresses(ifname: str) -> list[ipaddress.IPv4Interface | ipaddress.IPv6Interface]:
    """The interface's addresses with their prefixes, primary first."""
    if not os.path.exists(f"/sys/class/net/{ifname}"):
        known = ", ".join(sorted(os.listdir("/sys/class/net")))
        raise VnicError(f"no interface named {ifname!r} in this network namespace (interfaces: {known})")
    out = []
    for link in _ip_json("addr", "show", "dev", ifname):
        for a in link.get("addr_info", []):
            if a.get("family") in ("inet", "inet6") and a.get("scope") != "link":
                out.append(ipaddress.ip_interface(f"{a['local']}/{a['prefixlen']}"))
    return out


def roce_gids(ifname: str) -> dict[str, tuple[str, int]]:
    """{address: (rdma device, RoCEv2 GID index)} for the RDMA devices on ifname."""
    result: dict[str, tuple[str, int]] = {}
    if not os.path.isdir(SYS_IB):
        return result
    for dev in sorted(os.listdir(SYS_IB)):
        ports = f"{SYS_IB}/{dev}/ports"
        for port in sorted(os.listdir(ports)):
            base = f"{ports}/{port}"
            for idx in sorted(os.listdir(f"{base}/gids"), key=int):
                try:
                    ndev = open(f"{base}/gid_attrs/ndevs/{idx}").read().strip()
                    kind = open(f"{base}/gid_attrs/types/{idx}").read().strip()
                    gid = open(f"{base}/gids/{idx}").read().strip()
                except OSError:
                    continue
                if ndev != ifname or kind != "RoCE v2":
                    continue
                raw = bytes.fromhex(gid.replace(":", ""))
                addr = ipaddress.IPv6Address(raw)
                ip = str(addr.ipv4_mapped) if addr.ipv4_mapped else str(addr)
                result.setdefault(ip, (dev, int(idx)))
    return result


def _subnet_of(ifname: str, addr: ipaddress._BaseAddress, addrs) -> ipaddress._BaseNetwork:
    for a in addrs:
        if a.version == addr.version and addr in a.network:
            return a.network
    nets = ", ".join(str(a.network) for a in addrs) or "none"
    raise VnicError(f"{addr} is outside {ifname}'s subnets ({nets}): an alias must be in the interface's own "
                    f"subnet so that it is routed like the primary address")


def plan_add(ifname: str, wanted: list[str], count: int | None) -> list[list[str]]:
    addrs = interface_addresses(ifname)
    if not addrs:
        raise VnicError(f"{ifname} has no address: give it its primary address first")
    present = {a.ip for a in addrs}
    targets: list[ipaddress._BaseAddress] = []
    for w in wanted:
        try:
            ip = ipaddress.ip_address(w.split("/")[0])
        except ValueError as e:
            raise VnicError(f"{w!r} is not an IP address") from e
        targets.append(ip)
    if count:
        primary = addrs[0]
        ip = primary.ip
        while len(targets) < len(wanted) + count:
            ip = ip + 1
            if ip not in primary.network or ip == primary.network.broadcast_address:
                raise VnicError(f"{primary.network} has no room for {count} more addresses after {primary.ip}")
            if ip not in present and ip not in targets:
                targets.append(ip)
    if not targets:
        raise VnicError("nothing to add: give addresses or --count N")
    cmds = []
    for ip in targets:
        net = _subnet_of(ifname, ip, addrs)
        if ip in present:
            raise VnicError(f"{ip} is already an address of {ifname}")
        cmds.append(["ip", "addr", "add", f"{ip}/{net.prefixlen}", "dev", ifname])
    return cmds


def plan_remove(ifname: str, wanted: list[str]) -> list[list[str]]:
    addrs = interface_addresses(ifname)
    by_ip = {str(a.ip): a for a in addrs}
    cmds = []
    for w in wanted:
        a = by_ip.get(w.split("/")[0])
        if a is None:
            raise VnicError(f"{w} is not an address of {ifname}")
        if a == addrs[0]:
            raise VnicError(f"{w} is {ifname}'s primary address; removing it would also remove its aliases")
        cmds.append(["ip", "addr", "del", f"{a.ip}/{a.network.prefixlen}", "dev", ifname])
    return cmds


def describe(ifname: str) -> str:
    addrs = interface_addresses(ifname)
    gids = roce_gids(ifname)
    lines = [f"{ifname}: {len(addrs)} address(es)" + ("" if gids else " (no RDMA device on this interface)")]
    for i, a in enumerate(addrs):
        gid = gids.get(str(a.ip))
        where = f"  {gid[0]} RoCEv2 GID index {gid[1]}" if gid else ("  no RoCEv2 GID" if gids else "")
        lines.append(f"  {'primary' if i == 0 else 'alias  '} {str(a):24}{where}")
    aliases = [str(a.ip) for a in addrs[1:]] or [str(a.ip) for a in addrs]
    lines.append(f"export MAESTRO_VNICS={','.join(aliases)}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="maestro-vnic", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("list", help="addresses of an interface, with RoCEv2 GID indexes")
    p.add_argument("ifname")
    p = sub.add_parser("add", help="add aliases in the interface's subnet")
    p.add_argument("ifname")
    p.add_argument("addresses", nargs="*")
    p.add_argument("--count", type=int, help="add N aliases: the next free addresses after the primary one")
    p.add_argument("--dry-run", action="store_true", help="print the ip commands, change nothing")
    p = sub.add_parser("remove", help="remove aliases")
    p.add_argument("ifname")
    p.add_argument("addresses", nargs="+")
    p.add_argument("--dry-run", action="store_true", help="print the ip commands, change nothing")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "list":
            print(describe(args.ifname))
            return 0
        cmds = plan_add(args.ifname, args.addresses, args.count) if args.cmd == "add" else \
            plan_remove(args.ifname, args.addresses)
        for c in cmds:
            print(" ".join(c))
            if not args.dry_run:
                r = subprocess.run(c, capture_output=True, text=True)
                if r.returncode != 0:
                    hint = " (needs root / CAP_NET_ADMIN)" if "not permitted" in r.stderr.lower() else ""
                    raise VnicError(f"{' '.join(c)} failed: {r.stderr.strip()}{hint}")
        if not args.dry_run:
            print(describe(args.ifname))
        return 0
    except VnicError as e:
        print(f"maestro-vnic: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
