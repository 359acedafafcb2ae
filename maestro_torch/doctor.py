"""maestro doctor: before a job, on each host, check what makes maestro slow
or broken, and say how to fix it.

    python -m maestro_torch.doctor                       # this host's set-up
    python -m maestro_torch.doctor --peer 10.0.2.11      # and the routes to a peer host
    python -m maestro_torch.doctor --peer 10.0.2.11 --json

It reads the same MAESTRO_* environment a job would (so run it where the job
runs, with the job's variables) and checks: the knobs parse; the vNICs (the
addresses the paths start from) exist on this host and how many there are;
with --peer, that each vNIC routes to the peer and how many distinct core
hops TTL-limited probes from it find (what discovery would find); the
descriptor and locked-memory limits; the TCP congestion control the paths
get; the RDMA devices, their ports, GIDs and MTU; whether ranks on this host
can use the single copy between processes.

Each line is OK, INFO, WARN (slower than it could be) or FAIL (a job would
fail, or run a single path where it asked for several). The exit status is 1
when something FAILs, else 0.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import ipaddress
import json
import os
import resource
import socket
import sys

from . import _C, vnic

OK, INFO, WARN, FAIL = "OK", "INFO", "WARN", "FAIL"
SYS_NET = "/sys/class/net"
# Descriptors one rank needs per peer and path (a socket each way at most),
# and what the process needs besides.
FDS_PER_PATH, FDS_BASE = 2, 64
# MAESTRO_PATHS=auto opens at most this many paths per peer (kAutoPathsMax).
AUTO_PATHS_MAX = 16
# A registration cache below this caps how much tensor memory stays
# registered for verbs (MAESTRO_REG_CACHE_BYTES=auto takes half the limit).
MEMLOCK_WANTED = 1 << 30


@dataclasses.dataclass
class Finding:
    check: str
    level: str
    text: str
    fix: str = ""


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _is_local(addr: str) -> bool:
    """Whether this host owns addr (binding to it succeeds)."""
    family = socket.AF_INET6 if ipaddress.ip_address(addr).version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.bind((addr, 0))
            return True
        except OSError:
            return False


def _free_port(addr: str) -> int:
    """A source port the kernel would hand out on addr now (each probe's 5-tuple differs by it)."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


@functools.lru_cache(maxsize=None)  # several checks ask; each answer lists every interface's addresses
def _device_of(addr: str) -> str | None:
    """The interface that carries a local address."""
    for ifname in sorted(os.listdir(SYS_NET)):
        try:
            if any(str(a.ip) == addr for a in vnic.interface_addresses(ifname)):
                return ifname
        except vnic.VnicError:
            continue
    return None


def check_knobs(config: dict, out: list[Finding]) -> bool:
    try:
        config.update(_C.resolve_config({}))
    except Exception as e:  # noqa: BLE001 - the knob parser's message is the finding
        out.append(Finding("knobs", FAIL, str(e), "fix the MAESTRO_* variable it names (python -m maestro_torch.doctor "
                                                 "reads the same environment as a job)"))
        return False
    changed = [k["env"] + "=" + config[k["name"]] for k in _C.knobs() if os.environ.get(k["env"]) is not None]
    out.append(Finding("knobs", OK, "every MAESTRO_* variable parses" +
                       (f" ({', '.join(changed)})" if changed else " (none set: the defaults)")))
    return True


def check_vnics(config: dict, out: list[Finding]) -> list[str]:
    """The vNIC addresses a multi-host job would use (as the backend chooses them)."""
    if config.get("vnics"):
        addrs = [a for a in config["vnics"].split(",") if a]
        missing = [a for a in addrs if not _is_local(a)]
        if missing:
            out.append(Finding("vnics", FAIL, f"MAESTRO_VNICS names {', '.join(missing)}, not an address of this "
                                              f"host: the job fails at start",
                               f"add the aliases first (maestro-vnic add <ifname> {' '.join(missing)}) or fix "
                               f"MAESTRO_VNICS"))
            return [a for a in addrs if a not in missing]
        source = "MAESTRO_VNICS"
    elif config.get("ifname"):
        try:
            addrs = [str(a.ip) for a in vnic.interface_addresses(config["ifname"])]
        except vnic.VnicError as e:
            out.append(Finding("vnics", FAIL, f"MAESTRO_IFNAME: {e}", "set MAESTRO_IFNAME to the interface that "
                                                                    "carries the aliases"))
            return []
        source = f"MAESTRO_IFNAME={config['ifname']}"
    else:
        out.append(Finding("vnics", WARN, "neither MAESTRO_VNICS nor MAESTRO_IFNAME is set: ranks on one host use "
                                          "4 loopback paths, but between hosts every peer gets a single path",
                           "add IP aliases (maestro-vnic add <ifname> --count 3) and export MAESTRO_IFNAME=<ifname> "
                           "or MAESTRO_VNICS=<the addresses>"))
        return []
    if len(addrs) < 2:
        out.append(Finding("vnics", WARN, f"{source} gives {len(addrs)} address(es) ({', '.join(addrs) or 'none'}): "
                                          f"{'a single path' if addrs else 'no path'} per peer",
                           "add IP aliases on the interface (maestro-vnic add <ifname> --count 3)"))
    else:
        out.append(Finding("vnics", OK, f"{len(addrs)} vNICs from {source}: {', '.join(addrs)}"))
    for addr in addrs:
        dev = _device_of(addr)
        if dev is None:
            continue
        # The kernel applies the stricter of the interface's and "all"'s.
        rp = max(_read(f"/proc/sys/net/ipv4/conf/{dev}/rp_filter") or "0",
                 _read("/proc/sys/net/ipv4/conf/all/rp_filter") or "0")
        if rp == "1" and ipaddress.ip_address(addr).version == 4:
            nets = {a.network for a in vnic.interface_addresses(dev) if a.version == 4}
            if len(nets) > 1:
                out.append(Finding("vnics", WARN, f"{dev} has addresses in {len(nets)} subnets and strict reverse-path "
                                                  f"filtering (rp_filter=1): replies to some vNICs may be dropped",
                                   f"keep the aliases in the interface's own subnet, or sysctl "
                                   f"net.ipv4.conf.{dev}.rp_filter=2"))
                break
    return addrs


def check_master_addr(out: list[Finding]) -> None:
    """torchrun's c10d rendezvous sets MASTER_ADDR to the first node's host
    name; where /etc/hosts maps it to 127.0.1.1, other hosts cannot reach it."""
    master = os.environ.get("MASTER_ADDR")
    if not master:
        return
    try:
        ips = sorted({a[4][0] for a in socket.getaddrinfo(master, None, type=socket.SOCK_STREAM)})
    except socket.gaierror as e:
        out.append(Finding("master-addr", FAIL, f"MASTER_ADDR={master} does not resolve here: {e}",
                           "set MASTER_ADDR to an address or name every host resolves"))
        return
    loop = [ip for ip in ips if ipaddress.ip_address(ip).is_loopback]
    if loop and len(loop) == len(ips):
        out.append(Finding("master-addr", WARN, f"MASTER_ADDR={master} resolves to {', '.join(loop)} here: fine when "
                                                f"every rank runs on this host, but ranks on other hosts cannot "
                                                f"reach it, and without vNICs this host's path would start at "
                                                f"loopback",
                           "use an address the other hosts reach (torchrun --local-addr, or fix /etc/hosts' "
                           "127.0.1.1 line)"))
    else:
        out.append(Finding("master-addr", OK, f"MASTER_ADDR={master} resolves to {', '.join(ips)}"))


def check_routes(config: dict, addrs: list[str], peer: str, port: int, out: list[Finding]) -> None:
    try:
        peer_ip = socket.getaddrinfo(peer, None, type=socket.SOCK_STREAM)[0][4][0]
    except socket.gaierror as e:
        out.append(Finding("routes", FAIL, f"cannot resolve {peer}: {e}", "give the peer's address"))
        return
    sources = addrs or [None]
    routed = []
    for addr in sources:
        family = socket.AF_INET6 if ":" in peer_ip else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            try:
                if addr:
                    s.bind((addr, 0))
                s.connect((peer_ip, port))  # a route lookup: nothing is sent
                routed.append(s.getsockname()[0])
            except OSError as e:
                out.append(Finding("routes", FAIL, f"no route from {addr or 'this host'} to {peer_ip}: {e.strerror}",
                                   "add a route for the vNIC's subnet (policy routing: ip rule add from <vnic> "
                                   "table <n>) or fix MAESTRO_VNICS"))
    if len(routed) == len(sources):
        out.append(Finding("routes", OK, f"{peer_ip} is routed from " +
                           (", ".join(routed) if addrs else f"{routed[0]} (the host's own address)")))
    if not routed:
        return
    # What discovery would see: the router probe_ttl hops out on each
    # candidate's own 5-tuple (several source ports per vNIC).
    ttl, per_vnic = int(config.get("probe_ttl", "2")), int(config.get("candidates", "8"))
    def endpoint(ip: str, p: int) -> str:
        return f"[{ip}]:{p}" if ":" in ip else f"{ip}:{p}"

    endpoints = [(endpoint(a, _free_port(a)), endpoint(peer_ip, port)) for a in routed for _ in range(per_vnic)]
    hops, why = _C._probe_hops(endpoints, ttl, 1.5)
    found = sorted({h for h in hops if h})
    if not found:
        reason = why or "the peer is nearer, or the routers send no time-exceeded"
        out.append(Finding("discovery", INFO, f"no router answered {ttl} hops out towards {peer_ip} ({reason}): "
                                              f"discovery (auto) stays off and the paths rely on their vNICs' hashes",
                           "if the fabric's core is further out, set MAESTRO_PROBE_TTL"))
    elif len(found) == 1:
        out.append(Finding("discovery", WARN, f"all {len(endpoints)} probes towards {peer_ip} crossed one core hop "
                                              f"({found[0]}, {ttl} hops out): the paths will share it",
                           "check that the fabric spreads flows by 5-tuple (ECMP hashing on ports), or set "
                           "MAESTRO_PROBE_TTL to the hop where the routes split"))
    else:
        auto = ""
        if config.get("paths", "auto") in ("auto", "0") and not config.get("weights") and len(found) > len(routed):
            # MAESTRO_PATHS=auto: one path per core hop where there are more
            # of them than vNICs (autoPathCount in the engine).
            config["_auto_paths"] = min(len(found), AUTO_PATHS_MAX)
            auto = f": MAESTRO_PATHS=auto will open {config['_auto_paths']} paths per peer"
        out.append(Finding("discovery", OK, f"{len(found)} distinct core hops {ttl} hops out towards {peer_ip} "
                                            f"({', '.join(found)}) from {len(endpoints)} probes{auto}"))


def check_limits(config: dict, addrs: list[str], verbs_devices: list[str], out: list[Finding]) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = config.get("paths", "auto")
    paths = int(wanted) if wanted not in ("auto", "0", "") else config.get("_auto_paths") or len(addrs) or 4
    usable = hard if hard != resource.RLIM_INFINITY else 1 << 20  # maestro raises the soft limit to the hard one
    peers = max(0, (usable - FDS_BASE) // (FDS_PER_PATH * paths))
    level = OK if peers >= 1023 else WARN
    out.append(Finding("nofile", level, f"descriptor limit {soft} (hard {hard if hard != resource.RLIM_INFINITY else 'unlimited'}): "
                                        f"room for about {peers} peers at {paths} paths each",
                       "" if level == OK else "raise it: ulimit -n, LimitNOFILE= in a systemd unit, --ulimit "
                                              "nofile= for a container"))
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY:
        out.append(Finding("memlock", OK, "locked-memory limit unlimited"))
    elif verbs_devices:
        out.append(Finding("memlock", WARN if soft >= MEMLOCK_WANTED else FAIL,
                           f"locked-memory limit {soft >> 20} MiB: verbs pins every registered tensor, and the "
                           f"registration cache gets half of it",
                           "raise it: ulimit -l unlimited, LimitMEMLOCK=infinity, --ulimit memlock=-1 for a container"))
    else:
        out.append(Finding("memlock", INFO, f"locked-memory limit {soft >> 20} MiB (only verbs needs more; no RDMA "
                                            f"device here)"))


def check_congestion(config: dict, out: list[Finding]) -> None:
    setting = config.get("tcp_congestion", "auto")
    try:
        choice, why = _C._congestion_choice(setting)
    except Exception as e:  # noqa: BLE001
        out.append(Finding("congestion", FAIL, str(e), "pick one the kernel offers, or unset MAESTRO_TCP_CONGESTION"))
        return
    level = WARN if choice == "reno" else OK
    out.append(Finding("congestion", level, f"TCP paths use {choice or 'the kernel default'}: {why}",
                       "load tcp_cubic (modprobe tcp_cubic) and allow it (net.ipv4.tcp_allowed_congestion_control)"
                       if level == WARN else ""))


def rdma_devices() -> list[str]:
    return sorted(os.listdir(vnic.SYS_IB)) if os.path.isdir(vnic.SYS_IB) else []


def check_verbs(config: dict, addrs: list[str], devices: list[str], out: list[Finding]) -> None:
    wanted = config.get("transport", "auto")
    if not devices:
        out.append(Finding("verbs", FAIL if wanted == "verbs" else INFO, "no RDMA device: the paths are TCP",
                           "load the RDMA driver (or rdma link add ... type rxe for Soft-RoCE), or unset "
                           "MAESTRO_TRANSPORT=verbs" if wanted == "verbs" else ""))
        return
    if not _C.has_verbs:
        out.append(Finding("verbs", FAIL if wanted == "verbs" else WARN,
                           f"RDMA device(s) {', '.join(devices)} present, but this build of maestro has no verbs "
                           f"transport", "install rdma-core's headers (libibverbs-dev) and rebuild the extension"))
        return
    for dev in devices:
        for port in sorted(os.listdir(f"{vnic.SYS_IB}/{dev}/ports")):
            base = f"{vnic.SYS_IB}/{dev}/ports/{port}"
            state, mtu = _read(f"{base}/state"), _read(f"{base}/active_mtu")
            active = state.endswith("ACTIVE")
            out.append(Finding("verbs", OK if active else WARN, f"{dev} port {port}: {state or '?'}, MTU {mtu or '?'}",
                               "" if active else "bring the port up (its Ethernet link, or the subnet manager)"))
    ifnames = sorted({d for d in (_device_of(a) for a in addrs) if d})
    gids = {}
    for ifname in ifnames:
        gids.update(vnic.roce_gids(ifname))
    without = [a for a in addrs if a not in gids]
    if addrs and without:
        out.append(Finding("verbs", FAIL if wanted == "verbs" else INFO,
                           f"no RoCEv2 GID for {', '.join(without)}: transport auto uses tcp",
                           "add the aliases on the interface the RDMA device sits on; the GIDs follow"))
    elif addrs:
        out.append(Finding("verbs", OK, "a RoCEv2 GID for every vNIC: " +
                           ", ".join(f"{a} ({gids[a][0]} #{gids[a][1]})" for a in addrs)))


def check_mtu(addrs: list[str], out: list[Finding]) -> None:
    for ifname in sorted({d for d in (_device_of(a) for a in addrs) if d}):
        mtu = _read(f"{SYS_NET}/{ifname}/mtu")
        if mtu:
            out.append(Finding("mtu", INFO, f"{ifname}: MTU {mtu}" + (" (jumbo frames cut the per-packet cost)"
                                                                      if int(mtu) <= 1500 else "")))


def check_single_copy(config: dict, out: list[Finding]) -> None:
    if config.get("tcp_single_copy", "auto") == "0":
        out.append(Finding("single-copy", INFO, "MAESTRO_TCP_SINGLE_COPY=0: ranks of one host copy through sockets"))
        return
    scope = _read("/proc/sys/kernel/yama/ptrace_scope")
    if scope in ("", "0") or (scope == "1" and os.geteuid() == 0):
        out.append(Finding("single-copy", OK, "ranks of one host may read each other's memory: one copy between them"))
    else:
        out.append(Finding("single-copy", INFO, f"kernel.yama.ptrace_scope={scope}: ranks of one host go through the "
                                                f"socket (two copies) instead of the single copy",
                           "sysctl kernel.yama.ptrace_scope=0, or run the ranks as root / with CAP_SYS_PTRACE"))


def diagnose(peer: str | None = None, port: int = 29500) -> list[Finding]:
    out: list[Finding] = []
    config: dict = {}
    if not check_knobs(config, out):
        return out
    addrs = check_vnics(config, out)
    check_master_addr(out)
    if peer:
        check_routes(config, addrs, peer, port, out)
    devices = rdma_devices()
    check_limits(config, addrs, devices, out)
    check_congestion(config, out)
    check_verbs(config, addrs, devices, out)
    check_mtu(addrs, out)
    check_single_copy(config, out)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m maestro_torch.doctor", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer", help="another host of the job (address or name): check the routes and core hops to it")
    ap.add_argument("--port", type=int, default=29500, help="the TCP port the probes aim at (default 29500; they "
                                                            "stop at a router, a closed port is fine)")
    ap.add_argument("--json", action="store_true", help="one JSON object per finding, one per line")
    args = ap.parse_args(argv)
    findings = diagnose(args.peer, args.port)
    for f in findings:
        if args.json:
            print(json.dumps(dataclasses.asdict(f)))
        else:
            print(f"{f.level:5} {f.check:12} {f.text}" + (f"\n{'':19}fix: {f.fix}" if f.fix else ""))
    failed = sum(f.level == FAIL for f in findings)
    if not args.json:
        print(f"\n{failed} problem(s) that stop or cripple a job" if failed else "\nnothing blocks a job here")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
