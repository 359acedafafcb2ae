#!/usr/bin/env python3
"""netlab -- a leaf-spine data-center network built from Linux network namespaces.

Test and benchmark lab for maestro-torch (multi-path collectives).  Python 3.11,
stdlib only, needs root.  Usable as a CLI and as a module::

    sys.path.insert(0, "scripts"); import netlab
    with netlab.Lab(hosts=4, leaves=2, spines=4, core=200) as lab:
        lab.run(0, ["ip", "addr"])
        r = lab.transfer(0, 2, seconds=1, src_addrs=lab.aliases(0))
        print(r.mbit, lab.spine_bytes())

Topology (defaults: 4 hosts, 2 leaves, 4 spines, aliases = spines)::

    spines  s0 ... s{S-1}          every leaf is linked to every spine
    leaves  L0 ... L{L-1}          hosts split evenly over the leaves
    hosts   h0 ... h{H-1}          eth0 = primary address + alias addresses ("vNICs")

Addressing::

    host i          10.1.i.2/24          primary address, default gw 10.1.i.1 (its leaf)
    host i alias k  10.1.i.(10+k)/24     alias k is pinned to spine k mod S ("pinned" mode)
    leaf l - spine s  10.2.l.(4s+1)/30 (leaf side, dev "s<s>")  <->  10.2.l.(4s+2)/30 (spine side, dev "L<l>")
    leaf dev towards host i: "h<i>";  host dev: "eth0"

Routing: leaves hold one ECMP route per remote host over all spines, hashed on
the 5-tuple (fib_multipath_hash_policy=3 with the 5-tuple fields; see
ECMP_HASH for why not policy 1), plus one table per spine (100+s)
with routes to the remote hosts through that spine.  In ``pinned`` mode policy
rules ``from alias(i,k)`` (at host i's leaf) and ``to alias(i,k)`` (at the other
leaves) select table 100+(k mod S), so alias k crosses spine k in both
directions.  In ``ecmp`` mode there are no such rules: the hash alone decides.
Spines have a route per host and a ``blackhole 10.1.0.0/16`` fallback, so a
downed link drops silently (no ICMP).

Every namespace is named ``<prefix><node>`` (node = h<i>, L<l>, s<s>); the
state file ``/run/maestro-netlab/<prefix>.json`` records the namespaces this
lab created together with their nsfs inode numbers, and ``down`` deletes only
those (after checking the inode), so it never touches anything else.
Processes still running inside the lab's namespaces are killed by ``down``.
A ``with Lab(...)`` block also cleans up on exceptions, Ctrl-C, SIGTERM and
SIGHUP; a lab whose owning process was SIGKILLed is removed by ``gc``.

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

CLI: ``netlab.py up|down|status|list|gc|exec|run|linkdown|linkup|linkrate|core|
access|bg|bgstop|counters|measure`` (``netlab.py CMD -h``).  E.g.::

    netlab.py up --spines 4 --core 200            # prints the prefix, e.g. ml0-
    netlab.py exec 0 -- ip addr                   # inside h0 (the only lab, or --prefix / $NETLAB_PREFIX)
    netlab.py measure 0 2 --aliases all           # 4 pinned streams h0 -> h2
    netlab.py linkdown 0 1; netlab.py linkup 0 1  # blackhole L0-s1, then restore
    netlab.py bg --spine 1 --mbit 100 --detach    # background traffic through s1
    netlab.py down
    netlab.py run --mode ecmp -- ./bench.sh       # temporary lab around a command
"""
from __future__ import annotations

import argparse
import atexit
import ctypes
import fcntl
import json
import os
import re
import select
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass

__all__ = ["Lab", "Config", "Background", "TransferResult", "NetlabError",
           "list_labs", "gc", "host_ip", "alias_ip", "gw_ip", "link_ips"]

STATE_DIR = os.environ.get("NETLAB_STATE_DIR", "/run/maestro-netlab")
NETNS_DIR = "/run/netns"
CLONE_NEWNET = 0x40000000
SO_MAX_PACING_RATE = 47
SOL_UDP = 17
UDP_SEGMENT = 103
UDP_GRO = 104
TABLE_BASE = 100          # table of spine s = TABLE_BASE + s
PREF_FLOW = 50            # per-flow pinning rules (background traffic)
PREF_FROM = 100           # pinned mode: from alias
PREF_TO = 101             # pinned mode: to alias
SPINE_FALLBACK = "10.1.0.0/16"
GSO_SKB_MAX = 65536 + 4096  # a full GSO skb with its headers, rounded up
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$")
_SELF = os.path.abspath(__file__)


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


def _fmt_rate(mbit) -> str:
    return "none" if mbit is None else (f"{mbit:g}")


def _parse_rate(s):
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
        c.core = _parse_rate(c.core)
        c.access = _parse_rate(c.access)
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


# ------------------------------------------------------------ small helpers
def _run(argv, input=None, check=True):
    p = subprocess.run(argv, input=input, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise NetlabError(f"{' '.join(argv)} failed (rc {p.returncode}): {p.stderr.strip() or p.stdout.strip()}")
    return p


def _parallel(jobs, check=True):
    """jobs: list of (argv, stdin_text). Runs them concurrently; raises on failure."""
    procs = []
    for argv, text in jobs:
        p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        procs.append((argv, p, text))
    for argv, p, text in procs:
        try:
            p.stdin.write(text)
            p.stdin.close()
        except BrokenPipeError:
            pass
    errors = []
    for argv, p, _ in procs:
        out = p.stdout.read()
        err = p.stderr.read()
        p.stdout.close()
        p.stderr.close()
        if p.wait() != 0:
            errors.append(f"{' '.join(argv)}: rc {p.returncode}: {err.strip() or out.strip()}")
    if errors and check:
        raise NetlabError("; ".join(errors))
    return errors


_libc = None


def _setns(fd: int):
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def _in_netns(targets, fn):
    """Run fn(name) with the calling thread inside each network namespace in turn.

    targets: list of (name, expected_inode).  Runs in a fresh thread (setns only
    changes that thread), so the caller's namespace never changes.  Returns
    {name: fn(name)}.
    """
    result, err = {}, []

    def body():
        try:
            for name, ino in targets:
                fd = os.open(os.path.join(NETNS_DIR, name), os.O_RDONLY | os.O_CLOEXEC)
                try:
                    if ino is not None and os.fstat(fd).st_ino != ino:
                        raise NetlabError(f"namespace {name} is not the one this lab created")
                    _setns(fd)
                finally:
                    os.close(fd)
                result[name] = fn(name)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller
            err.append(e)

    t = threading.Thread(target=body, name="netlab-setns")
    t.start()
    t.join()
    if err:
        raise err[0]
    return result


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


def _write_sysctls(values: dict):
    for key, val in values.items():
        with open("/proc/sys/" + key.replace(".", "/"), "w") as f:
            f.write(str(val))


def _read_netdev():
    """{dev: (rx_bytes, tx_bytes)} of the calling thread's network namespace."""
    out = {}
    with open("/proc/thread-self/net/dev") as f:
        for line in f.readlines()[2:]:
            name, _, rest = line.partition(":")
            v = rest.split()
            out[name.strip()] = (int(v[0]), int(v[8]))
    return out


def _netns_inode(name):
    try:
        return os.stat(os.path.join(NETNS_DIR, name)).st_ino
    except FileNotFoundError:
        return None


def _pids_in_netns(inodes: set) -> list[int]:
    me = os.getpid()
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            if os.stat(f"/proc/{d}/ns/net").st_ino in inodes:
                pids.append(int(d))
        except OSError:
            pass
    return pids


def _kill_pids_in(inodes: set, grace=0.5):
    pids = _pids_in_netns(inodes)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in pids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 2.0)
        while pids and time.monotonic() < deadline:
            time.sleep(0.01)
            pids = [p for p in _pids_in_netns(inodes) if p in pids]
        if not pids:
            return


def _communicate(p, timeout):
    """communicate(); on timeout SIGTERM (helpers then report), then SIGKILL."""
    try:
        return p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.terminate()
        try:
            return p.communicate(timeout=2)
        except subprocess.TimeoutExpired:
            p.kill()
            return p.communicate()


def _read_line(stream, timeout, what):
    """Read one line from an unbuffered binary pipe with a timeout."""
    fd = stream.fileno()
    buf = b""
    deadline = time.monotonic() + timeout
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise NetlabError(f"timed out waiting for {what}")
        c = os.read(fd, 1)
        if not c:
            raise NetlabError(f"{what}: process exited early")
        buf += c
    return buf.decode().strip()


class _DirLock:
    """Exclusive flock on the state directory (serialises state-file updates)."""

    def __init__(self, state_dir):
        os.makedirs(state_dir, mode=0o755, exist_ok=True)
        self.fd = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def __enter__(self):
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def _load_state(path):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def _save_state(path, st):
    tmp = f"{path}.tmp{os.getpid()}.{threading.get_ident()}"
    with open(tmp, "w") as f:
        json.dump(st, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def _pid_alive(pid):
    if not pid:
        return False
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


# -------------------------------------------------------------------- results
@dataclass
class TransferResult:
    bytes: int            # payload bytes received by the sink (all streams)
    seconds: float        # first byte .. last byte at the sink
    mbit: float           # bytes*8/seconds/1e6
    streams: list         # per-stream received bytes
    sent: list            # per-stream bytes written by the source
    ok: bool              # every stream connected and finished

    def __str__(self):
        return (f"{self.mbit:.1f} Mbit/s  ({self.bytes} B in {self.seconds:.3f} s, "
                f"streams {self.streams}{'' if self.ok else ', INCOMPLETE'})")


class Background:
    """A paced flow between two hosts pinned to one spine. stop() ends it."""

    def __init__(self, lab, bid, spine, src, dst, proto, mbit, port, procs, rules):
        self.lab, self.id, self.spine, self.src, self.dst = lab, bid, spine, src, dst
        self.proto, self.mbit, self.port = proto, mbit, port
        self._procs, self._rules = procs, rules
        self.stopped = False

    def alive(self) -> bool:
        return not self.stopped and all(p.poll() is None for p in self._procs)

    def stop(self):
        if self.stopped:
            return
        self.stopped = True
        for p in self._procs:
            if p.poll() is None:
                p.terminate()
        for p in self._procs:
            try:
                p.wait(timeout=2)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            for s in (p.stdout, p.stderr, p.stdin):
                if s:
                    s.close()
        self.lab._forget_background(self.id, self._rules)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def __repr__(self):
        return (f"<Background {self.id} spine {self.spine} h{self.src}->h{self.dst} {self.proto} "
                f"{_fmt_rate(self.mbit)} Mbit {'stopped' if self.stopped else 'running'}>")


# ------------------------------------------------------------------------ lab
class Lab:
    """A leaf-spine lab.  ``Lab(...).up()`` or ``with Lab(...) as lab:``.

    name/prefix: namespace prefix ``ml-<name>-`` or exactly ``prefix``; by default
    the first free ``ml<N>-``.  Other keywords: see Config.
    """

    def __init__(self, name=None, *, prefix=None, hosts=4, leaves=2, spines=4, aliases=None,
                 core=200, access=1000, mode="pinned", queue_ms=5.0, state_dir=None):
        if name is not None and prefix is not None:
            raise NetlabError("give name or prefix, not both")
        if name is not None:
            prefix = f"ml-{name}-"
        if prefix is not None and not _NAME_RE.match(prefix):
            raise NetlabError(f"bad prefix {prefix!r}")
        self.prefix = prefix
        self.cfg = Config(hosts, leaves, spines, aliases, core, access, mode, queue_ms).normalized()
        self.state_dir = state_dir or STATE_DIR
        self._is_up = False
        self._owner = False
        self._procs: list[subprocess.Popen] = []
        self._bgs: dict[str, Background] = {}
        self._old_handlers = None
        self._bg_seq = 0

    # ------------------------------------------------------------ naming
    @property
    def state_path(self):
        return os.path.join(self.state_dir, f"{self.prefix}.json")

    def leaf_of(self, host: int) -> int:
        return host * self.cfg.leaves // self.cfg.hosts

    def hosts_of(self, leaf: int) -> list[int]:
        return [i for i in range(self.cfg.hosts) if self.leaf_of(i) == leaf]

    def nodes(self) -> list[str]:
        c = self.cfg
        return ([f"h{i}" for i in range(c.hosts)] + [f"L{l}" for l in range(c.leaves)]
                + [f"s{s}" for s in range(c.spines)])

    def _node(self, node) -> str:
        if isinstance(node, int):
            if not 0 <= node < self.cfg.hosts:
                raise NetlabError(f"no host {node}")
            return f"h{node}"
        if node not in self.nodes():
            raise NetlabError(f"no node {node!r} (nodes: {' '.join(self.nodes())})")
        return node

    def ns(self, node) -> str:
        """Namespace name of a node (int = host index, or 'h0', 'L1', 's2')."""
        return self.prefix + self._node(node)

    def host_addr(self, i: int) -> str:
        self._node(i)
        return host_ip(i)

    def aliases(self, i: int) -> list[str]:
        self._node(i)
        return [alias_ip(i, k) for k in range(self.cfg.aliases)]

    def alias_addr(self, i: int, k: int) -> str:
        """Alias k of host i."""
        self._node(i)
        if not 0 <= k < self.cfg.aliases:
            raise NetlabError(f"no alias {k} (aliases per host: {self.cfg.aliases})")
        return alias_ip(i, k)

    def alias_spine(self, k: int) -> int:
        """Spine that alias k is pinned to (pinned mode)."""
        return k % self.cfg.spines

    def spine_of_hop(self, addr: str) -> int:
        """The spine a route probe's answer came from: the spine side of a
        leaf-spine link (see link_ips)."""
        m = re.match(r"^10\.2\.(\d+)\.(\d+)$", addr)
        if not m or int(m.group(2)) % 4 != 2 or (int(m.group(2)) - 2) // 4 >= self.cfg.spines:
            raise NetlabError(f"{addr} is not the spine side of a lab link")
        return (int(m.group(2)) - 2) // 4

    def host_of_addr(self, addr: str) -> int:
        m = re.match(r"^10\.1\.(\d+)\.\d+$", addr)
        if not m or int(m.group(1)) >= self.cfg.hosts:
            raise NetlabError(f"{addr} is not a lab host address")
        return int(m.group(1))

    # ------------------------------------------------------------ state
    def _state(self):
        st = _load_state(self.state_path)
        if st is None:
            raise NetlabError(f"lab {self.prefix} is not up (no {self.state_path})")
        return st

    def _update(self, fn):
        with _DirLock(self.state_dir):
            st = self._state()
            r = fn(st)
            _save_state(self.state_path, st)
            return r

    def _targets(self, nodes, st=None):
        st = st or self._state()
        out = []
        for n in nodes:
            name = self.prefix + n
            if name not in st["namespaces"]:
                raise NetlabError(f"namespace {name} not in lab state")
            out.append((name, st["namespaces"][name]))
        return out

    @classmethod
    def attach(cls, prefix=None, state_dir=None) -> "Lab":
        """A Lab object for an existing lab (e.g. one made by ``netlab.py up``)."""
        state_dir = state_dir or STATE_DIR
        if prefix is None:
            labs = list_labs(state_dir)
            if len(labs) != 1:
                raise NetlabError(f"{len(labs)} labs exist ({' '.join(x['prefix'] for x in labs) or '-'}); "
                                  "say which (--prefix / NETLAB_PREFIX)")
            prefix = labs[0]["prefix"]
        st = _load_state(os.path.join(state_dir, f"{prefix}.json"))
        if st is None:
            raise NetlabError(f"no lab with prefix {prefix!r} in {state_dir}")
        lab = cls(prefix=prefix, state_dir=state_dir, **st["config"])
        lab._is_up = st.get("status") == "up"
        lab._owner = True
        return lab

    # ------------------------------------------------------------ build
    def up(self) -> "Lab":
        if self._is_up:
            return self
        t0 = time.monotonic()
        self._reserve()
        self._owner = True
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        self._is_up = True
        atexit.register(self._atexit)
        self.up_seconds = time.monotonic() - t0
        return self

    def _reserve(self):
        with _DirLock(self.state_dir):
            existing = set(os.listdir(NETNS_DIR)) if os.path.isdir(NETNS_DIR) else set()
            if self.prefix is None:
                n = 0
                while True:
                    p = f"ml{n}-"
                    if (not os.path.exists(os.path.join(self.state_dir, f"{p}.json"))
                            and not any(e.startswith(p) for e in existing)):
                        break
                    n += 1
                self.prefix = p
            clash = [self.prefix + n for n in self.nodes() if self.prefix + n in existing]
            if clash:
                raise NetlabError(f"namespaces already exist (not created by this lab, left alone): "
                                  f"{' '.join(clash)}")
            st = {"version": 1, "prefix": self.prefix, "status": "building",
                  "owner_pid": os.getpid(), "created": time.time(), "config": asdict(self.cfg),
                  "namespaces": {}, "links": {}, "access": self.cfg.access, "background": {}}
            try:
                fd = os.open(self.state_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                raise NetlabError(f"lab {self.prefix} already exists ({self.state_path})") from None
            with os.fdopen(fd, "w") as f:
                json.dump(st, f)

    def _build(self):
        c = self.cfg
        H, L, S = c.hosts, c.leaves, c.spines
        # 1. namespaces, one by one, each recorded (with its inode) as soon as it exists
        for n in self.nodes():
            name = self.prefix + n
            _run(["ip", "netns", "add", name])
            ino = _netns_inode(name)
            self._update(lambda st: st["namespaces"].__setitem__(name, ino))
        st = self._state()
        # 2. sysctls (before any veth exists, so "default" applies to every device)
        common = {"net.ipv6.conf.all.disable_ipv6": 1, "net.ipv6.conf.default.disable_ipv6": 1,
                  "net.ipv4.conf.all.rp_filter": 0, "net.ipv4.conf.default.rp_filter": 0}
        router = dict(common, **{"net.ipv4.ip_forward": 1,
                                 "net.ipv4.conf.all.ignore_routes_with_linkdown": 0,
                                 "net.ipv4.conf.default.ignore_routes_with_linkdown": 0})
        leaf = dict(router, **ECMP_HASH)

        def sysctls(name):
            node = name[len(self.prefix):]
            _write_sysctls({"h": common, "L": leaf, "s": router}[node[0]])
        _in_netns(self._targets(self.nodes(), st), sysctls)
        # 3. veth pairs, created directly inside the lab namespaces
        P = self.prefix
        veth = [f"link add eth0 netns {P}h{i} type veth peer name h{i} netns {P}L{self.leaf_of(i)}"
                for i in range(H)]
        veth += [f"link add s{s} netns {P}L{l} type veth peer name L{l} netns {P}s{s}"
                 for l in range(L) for s in range(S)]
        _run(["ip", "-batch", "-"], input="\n".join(veth) + "\n")
        # 4. addresses, routes, rules: one ip batch per namespace, all in parallel
        jobs = []
        for i in range(H):
            cmds = ["link set lo up", f"addr add {host_ip(i)}/24 dev eth0"]
            cmds += [f"addr add {alias_ip(i, k)}/24 dev eth0" for k in range(c.aliases)]
            cmds += ["link set eth0 up", f"route add default via {gw_ip(i)} dev eth0"]
            jobs.append((["ip", "-n", f"{P}h{i}", "-batch", "-"], "\n".join(cmds) + "\n"))
        for l in range(L):
            cmds = ["link set lo up"]
            for i in self.hosts_of(l):
                cmds += [f"addr add {gw_ip(i)}/24 dev h{i}", f"link set h{i} up"]
            for s in range(S):
                cmds += [f"addr add {link_ips(l, s)[0]}/30 dev s{s}", f"link set s{s} up"]
            cmds += self._leaf_routes(l, range(S), range(S))
            if c.mode == "pinned":
                for i in range(H):
                    for k in range(c.aliases):
                        t = TABLE_BASE + self.alias_spine(k)
                        if self.leaf_of(i) == l:
                            cmds.append(f"rule add from {alias_ip(i, k)} lookup {t} pref {PREF_FROM}")
                        else:
                            cmds.append(f"rule add to {alias_ip(i, k)} lookup {t} pref {PREF_TO}")
            jobs.append((["ip", "-n", f"{P}L{l}", "-batch", "-"], "\n".join(cmds) + "\n"))
        for s in range(S):
            cmds = ["link set lo up"]
            for l in range(L):
                cmds += [f"addr add {link_ips(l, s)[1]}/30 dev L{l}", f"link set L{l} up"]
            cmds += self._spine_routes(s, range(L))
            cmds.append(f"route add blackhole {SPINE_FALLBACK}")
            jobs.append((["ip", "-n", f"{P}s{s}", "-batch", "-"], "\n".join(cmds) + "\n"))
        _parallel(jobs)
        # 5. shaping
        links = {f"{l},{s}": {"rate": c.core, "down": None} for l in range(L) for s in range(S)}
        self._update(lambda st: st.update(links=links, access=c.access))
        per = self._core_cmds([(l, s) for l in range(L) for s in range(S)], c.core)
        for n, cmds in self._access_cmds(c.access).items():
            per.setdefault(n, []).extend(cmds)
        self._tc({n: [x for x in cmds if not x.startswith("qdisc del")] for n, cmds in per.items()})
        self._update(lambda st: st.update(status="up"))

    def _leaf_routes(self, l, ecmp_spines, pinned_spines):
        """Route commands (replace) at leaf l: ECMP over ecmp_spines + pinned tables."""
        cmds = []
        ecmp_spines = list(ecmp_spines)
        for j in range(self.cfg.hosts):
            if self.leaf_of(j) == l:
                continue
            dst = f"10.1.{j}.0/24"
            if len(ecmp_spines) == 1:
                s = ecmp_spines[0]
                cmds.append(f"route replace {dst} via {link_ips(l, s)[1]} dev s{s}")
            elif ecmp_spines:
                nh = " ".join(f"nexthop via {link_ips(l, s)[1]} dev s{s}" for s in ecmp_spines)
                cmds.append(f"route replace {dst} {nh}")
            for s in pinned_spines:
                cmds.append(f"route replace {dst} via {link_ips(l, s)[1]} dev s{s} table {TABLE_BASE + s}")
        return cmds

    def _spine_routes(self, s, leaves):
        cmds = []
        for l in leaves:
            for i in self.hosts_of(l):
                cmds.append(f"route replace 10.1.{i}.0/24 via {link_ips(l, s)[0]} dev L{l}")
        return cmds

    # ------------------------------------------------------------ shaping
    def _tbf(self, dev, mbit):
        if mbit is None:
            return f"qdisc del dev {dev} root"
        # >= 1 ms of traffic, and >= one whole GSO skb: a 64 KiB TCP payload
        # plus its headers is a little over 65536 bytes, and tbf splits any skb
        # larger than its burst into MTU-sized packets -- which multiplies the
        # packets every later hop must forward and made the lab CPU-bound
        # (softirq ~60% of both cores at 200 Mbit) well below its link rates.
        burst = max(int(mbit * 125), GSO_SKB_MAX)
        queue = max(int(mbit * 125 * self.cfg.queue_ms), GSO_SKB_MAX)  # queue_ms deep, >= one GSO skb
        return f"qdisc replace dev {dev} root tbf rate {mbit:g}mbit burst {burst} limit {burst + queue}"

    def _tc(self, per_ns: dict):
        """per_ns: {node: [tc commands]}; deletes may fail harmlessly (no qdisc)."""
        jobs = [(["tc", "-force", "-n", self.prefix + n, "-batch", "-"], "\n".join(cmds) + "\n")
                for n, cmds in per_ns.items() if cmds]
        errs = _parallel(jobs, check=False)
        bad = [ln for e in errs for ln in e.split("\n") if ln.strip()
               and not ln.startswith("Command failed") and "Cannot delete qdisc" not in ln]
        if bad:
            raise NetlabError("tc failed: " + "; ".join(bad))

    def _core_cmds(self, pairs, mbit):
        per = {}
        for l, s in pairs:
            per.setdefault(f"L{l}", []).append(self._tbf(f"s{s}", mbit))
            per.setdefault(f"s{s}", []).append(self._tbf(f"L{l}", mbit))
        return per

    def _access_cmds(self, mbit):
        per = {}
        for i in range(self.cfg.hosts):
            per.setdefault(f"h{i}", []).append(self._tbf("eth0", mbit))
            per.setdefault(f"L{self.leaf_of(i)}", []).append(self._tbf(f"h{i}", mbit))
        return per

    def _shape_links(self, pairs, mbit):
        self._tc(self._core_cmds(pairs, mbit))

    def _shape_core(self, mbit):
        c = self.cfg
        self._shape_links([(l, s) for l in range(c.leaves) for s in range(c.spines)], mbit)

    def _shape_access(self, mbit):
        self._tc(self._access_cmds(mbit))

    def set_link_rate(self, leaf: int, spine: int, mbit):
        """Shape leaf-spine link (both directions) to mbit; None removes shaping."""
        mbit = _parse_rate(mbit)
        self._check_link(leaf, spine)
        self._shape_links([(leaf, spine)], mbit)
        self._update(lambda st: st["links"][f"{leaf},{spine}"].update(rate=mbit))

    def set_core_rate(self, mbit):
        """Shape every leaf-spine link to mbit (None = unshaped)."""
        mbit = _parse_rate(mbit)
        self._shape_core(mbit)
        self._update(lambda st: [v.update(rate=mbit) for v in st["links"].values()])

    def set_access_rate(self, mbit):
        """Shape every host-leaf link to mbit (None = unshaped)."""
        mbit = _parse_rate(mbit)
        self._shape_access(mbit)
        self._update(lambda st: st.update(access=mbit))

    # ------------------------------------------------------------ faults
    def _check_link(self, leaf, spine):
        if not (0 <= leaf < self.cfg.leaves and 0 <= spine < self.cfg.spines):
            raise NetlabError(f"no link L{leaf}-s{spine}")

    def link_down(self, leaf: int, spine: int, reroute: bool = False):
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
        self._check_link(leaf, spine)
        if self._state()["links"][f"{leaf},{spine}"]["down"]:
            self.link_up(leaf, spine)
        P = self.prefix
        _run(["ip", "-n", f"{P}s{spine}", "link", "set", f"L{leaf}", "down"])
        if reroute:
            _run(["ip", "-n", f"{P}L{leaf}", "link", "set", f"s{spine}", "down"])
        links = self._update(lambda st: (st["links"][f"{leaf},{spine}"].update(
            down="reroute" if reroute else "blackhole"), st["links"])[1])
        if reroute:
            self._sync_routes(links, range(self.cfg.leaves), [])

    def link_up(self, leaf: int, spine: int):
        """Bring the leaf-spine link back and re-add every route the kernel (or
        link_down) removed: pinned tables, ECMP routes, spine routes."""
        self._check_link(leaf, spine)
        P = self.prefix
        _run(["ip", "-n", f"{P}s{spine}", "link", "set", f"L{leaf}", "up"])
        _run(["ip", "-n", f"{P}L{leaf}", "link", "set", f"s{spine}", "up"])
        # forget neighbours that failed to resolve while the link was down (else the
        # first packets wait for the ARP retransmit timer, ~1 s)
        _run(["ip", "-n", f"{P}L{leaf}", "neigh", "flush", "dev", f"s{spine}"], check=False)
        _run(["ip", "-n", f"{P}s{spine}", "neigh", "flush", "dev", f"L{leaf}"], check=False)
        links = self._update(lambda st: (st["links"][f"{leaf},{spine}"].update(down=None),
                                         st["links"])[1])
        self._sync_routes(links, range(self.cfg.leaves), [spine])

    def _sync_routes(self, links, leaves, spines):
        """Make the routes of the given leaves/spines match the link states."""
        c = self.cfg
        jobs = []
        for l in leaves:
            cmds = []
            for j in range(c.hosts):
                lj = self.leaf_of(j)
                if lj == l:
                    continue
                dst = f"10.1.{j}.0/24"
                usable = [s for s in range(c.spines) if links[f"{l},{s}"]["down"] != "reroute"
                          and links[f"{lj},{s}"]["down"] != "reroute"]
                if not usable:
                    cmds.append(f"route del {dst}")
                elif len(usable) == 1:
                    cmds.append(f"route replace {dst} via {link_ips(l, usable[0])[1]} dev s{usable[0]}")
                else:
                    cmds.append(f"route replace {dst} " + " ".join(
                        f"nexthop via {link_ips(l, s)[1]} dev s{s}" for s in usable))
                for s in range(c.spines):
                    if s in usable:
                        cmds.append(f"route replace {dst} via {link_ips(l, s)[1]} dev s{s} "
                                    f"table {TABLE_BASE + s}")
                    else:
                        cmds.append(f"route del {dst} table {TABLE_BASE + s}")
            if cmds:
                jobs.append((["ip", "-force", "-n", f"{self.prefix}L{l}", "-batch", "-"],
                             "\n".join(cmds) + "\n"))
        for s in spines:
            up = [l for l in range(c.leaves) if not links[f"{l},{s}"]["down"]]
            cmds = self._spine_routes(s, up)
            if cmds:
                jobs.append((["ip", "-force", "-n", f"{self.prefix}s{s}", "-batch", "-"],
                             "\n".join(cmds) + "\n"))
        errs = _parallel(jobs, check=False)
        bad = [ln for e in errs for ln in e.split("\n")
               if "RTNETLINK" in ln and "No such process" not in ln]
        if bad:
            raise NetlabError("route sync failed: " + "; ".join(bad))

    def spine_down(self, spine: int, reroute: bool = False):
        """All links of one spine down (see link_down)."""
        for l in range(self.cfg.leaves):
            self.link_down(l, spine, reroute)

    def spine_up(self, spine: int):
        for l in range(self.cfg.leaves):
            self.link_up(l, spine)

    # ------------------------------------------------------------ processes
    def popen(self, node, argv, *, prefork=None, **kw) -> subprocess.Popen:
        """Start argv (list, or str run by sh -c) inside node's namespace.

        node: host index or node name ('h0', 'L1', 's2').  kw go to subprocess.Popen.
        prefork: a scripts/prefork.py Prefork; argv is then [python, SCRIPT or -c, ...]
        and the process is forked from it (torch already imported), not started.
        The process is tracked and killed by down()."""
        if isinstance(argv, str):
            argv = ["sh", "-c", argv]
        env = dict(kw.pop("env", None) or os.environ)
        env.update(NETLAB_PREFIX=self.prefix, NETLAB_NODE=self._node(node))
        if prefork is not None:
            p = prefork.popen(argv[1:], env=env, netns=self.ns(node), **kw)
        else:
            p = subprocess.Popen(["ip", "netns", "exec", self.ns(node), *argv], env=env, **kw)
        self._procs = [q for q in self._procs if q.poll() is None] + [p]
        return p

    def run(self, node, argv, *, check=False, timeout=None, capture_output=True, text=True,
            **kw) -> subprocess.CompletedProcess:
        """Run argv inside node's namespace and wait; returns CompletedProcess
        (output captured as text by default)."""
        if capture_output:
            kw.setdefault("stdout", subprocess.PIPE)
            kw.setdefault("stderr", subprocess.PIPE)
        data = kw.pop("input", None)
        if data is not None:
            kw["stdin"] = subprocess.PIPE
        p = self.popen(node, argv, text=text, **kw)
        try:
            out, err = p.communicate(data, timeout=timeout)
        except BaseException:
            p.kill()
            p.wait()
            raise
        cp = subprocess.CompletedProcess(p.args, p.returncode, out, err)
        if check:
            cp.check_returncode()
        return cp

    def socket(self, node, family=socket.AF_INET, type=socket.SOCK_STREAM, proto=0) -> socket.socket:
        """A socket created inside node's namespace (it stays there for its lifetime)."""
        name = self.ns(node)
        return _in_netns(self._targets([self._node(node)]), lambda _: socket.socket(family, type, proto))[name]

    def reachable(self, src, dst_addr: str, src_addr: str | None = None, timeout: float = 1.0) -> bool:
        """TCP handshake from host src (optionally bound to src_addr) to dst_addr."""
        dst = self.host_of_addr(dst_addr)
        ls = self.socket(dst)
        cs = self.socket(src)
        try:
            ls.bind((dst_addr, 0))
            ls.listen(4)
            if src_addr:
                cs.bind((src_addr, 0))
            cs.settimeout(timeout)
            return cs.connect_ex((dst_addr, ls.getsockname()[1])) == 0
        except OSError:
            return False
        finally:
            cs.close()
            ls.close()

    def _helper(self, *args):
        return [sys.executable, "-s", _SELF, *args]

    def transfer(self, src, dst, *, seconds: float | None = 1.0, nbytes: int | None = None,
                 src_addrs=None, dst_addrs=None, streams: int = 1, mbit: float | None = None,
                 timeout: float | None = None, connect_timeout: float = 3.0) -> TransferResult:
        """TCP transfer host src -> host dst with a small Python sender/receiver.

        One stream per entry of src_addrs/dst_addrs (a single address is reused),
        else `streams` streams between the primary addresses.  Sends for `seconds`
        (or `nbytes` per stream); mbit paces each stream.  Rate measured at the sink
        (first to last byte).  A stream that cannot connect within connect_timeout,
        or a run longer than timeout (default seconds+15), gives ok=False with
        whatever arrived.
        """
        def lst(x):
            return None if x is None else ([x] if isinstance(x, str) else list(x))
        sa, da = lst(src_addrs), lst(dst_addrs)
        n = max(len(sa or []), len(da or [])) or streams
        sa = sa or [self.host_addr(src)]
        da = da or [self.host_addr(dst)]
        sa = sa * n if len(sa) == 1 else sa
        da = da * n if len(da) == 1 else da
        if len(sa) != n or len(da) != n:
            raise NetlabError("src_addrs and dst_addrs lengths differ")
        if timeout is None:
            timeout = (seconds or 0) + 15 + (nbytes or 0) / 1e6
        sink = self.popen(dst, self._helper("_sink", "--expect", str(n), "--timeout", str(timeout)),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
        src_p = None
        try:
            port = int(_read_line(sink.stdout, 10, "sink port").split()[1])
            args = ["_source", "--port", str(port), "--connect-timeout", str(connect_timeout)]
            for a in sa:
                args += ["--bind", a]
            for a in da:
                args += ["--dst", a]
            if nbytes is not None:
                args += ["--bytes", str(nbytes)]
            elif seconds is not None:
                args += ["--seconds", str(seconds)]
            if mbit:
                args += ["--mbit", str(mbit)]
            src_p = self.popen(src, self._helper(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            t_end = time.monotonic() + timeout
            sout, serr = _communicate(src_p, timeout)
            if src_p.returncode != 0:  # e.g. could not connect: do not wait for the sink's timeout
                sink.terminate()
            kout, kerr = _communicate(sink, max(t_end - time.monotonic(), 2))
        finally:
            for p in (src_p, sink):
                if p is not None and p.poll() is None:
                    p.kill()
                    p.wait()
        try:
            res = json.loads(kout.decode().strip().splitlines()[-1])
        except (IndexError, ValueError):
            raise NetlabError(f"sink failed: {kerr.decode().strip()} / source: {serr.decode().strip()}") from None
        sent = []
        try:
            sent = json.loads(sout.decode().strip().splitlines()[-1])["sent"]
        except (IndexError, ValueError, KeyError):
            pass
        st = res["streams"]
        total = sum(x["bytes"] for x in st)
        firsts = [x["first"] for x in st if x["first"] is not None]
        lasts = [x["last"] for x in st if x["last"] is not None]
        dur = (max(lasts) - min(firsts)) if firsts else 0.0
        return TransferResult(total, dur, total * 8 / dur / 1e6 if dur > 0 else 0.0,
                              [x["bytes"] for x in st], sent,
                              src_p.returncode == 0 and res["done"] == n)

    # ------------------------------------------------------------ background
    def background(self, spine: int, mbit: float | None = 100, *, src: int | None = None,
                   dst: int | None = None, proto: str = "tcp", detach: bool = False) -> Background:
        """Start a paced flow src -> dst forced through `spine` (5-tuple policy
        rules at both leaves, works in pinned and ecmp mode).  Default hosts: the
        last host of the first leaf -> the last host of the last leaf (so tests
        between h0 and the first host of another leaf keep their access links).
        mbit=None: unpaced TCP (saturating).  detach: own session, outlives this
        process (stop with stop_background() or down()).  Returns a handle with
        stop(); down() stops every flow."""
        c = self.cfg
        if not 0 <= spine < c.spines:
            raise NetlabError(f"no spine {spine}")
        if proto not in ("tcp", "udp"):
            raise NetlabError("proto must be tcp or udp")
        if proto == "udp" and not mbit:
            raise NetlabError("udp background needs a rate")
        src = self.hosts_of(0)[-1] if src is None else src
        dst = self.hosts_of(c.leaves - 1)[-1] if dst is None else dst
        ls, ld = self.leaf_of(src), self.leaf_of(dst)
        if ls == ld:
            raise NetlabError(f"h{src} and h{dst} share leaf L{ls}: no spine in between")
        sa, da = self.host_addr(src), self.host_addr(dst)
        self._bg_seq += 1
        bid = f"{os.getpid()}-{self._bg_seq}"
        procs = []
        rules = []
        try:
            sink = self.popen(dst, self._helper("_sink", "--proto", proto, "--bind", da),
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0,
                              start_new_session=detach)
            procs.append(sink)
            port = int(_read_line(sink.stdout, 10, "sink port").split()[1])
            t = TABLE_BASE + spine
            rules = [(f"L{ls}", f"from {sa} to {da} ipproto {proto} dport {port} lookup {t} pref {PREF_FLOW}"),
                     (f"L{ld}", f"from {da} to {sa} ipproto {proto} sport {port} lookup {t} pref {PREF_FLOW}")]
            for node, r in rules:
                _run(["ip", "-n", self.ns(node), "rule", "add", *r.split()])
            args = ["_source", "--proto", proto, "--port", str(port), "--bind", sa, "--dst", da,
                    "--connect-timeout", "5"]
            if mbit:
                args += ["--mbit", str(mbit)]
            source = self.popen(src, self._helper(*args), stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, bufsize=0, start_new_session=detach)
            procs.append(source)
            _read_line(source.stdout, 10, "background source connect")
        except BaseException:
            for p in procs:
                p.kill()
                p.wait()
            self._del_rules(rules)
            raise
        self._update(lambda st: st["background"].__setitem__(bid, {
            "spine": spine, "src": src, "dst": dst, "proto": proto, "mbit": mbit, "port": port,
            "pids": [p.pid for p in procs], "rules": rules}))
        bg = Background(self, bid, spine, src, dst, proto, mbit, port, procs, rules)
        self._bgs[bid] = bg
        return bg

    def _del_rules(self, rules):
        for node, r in rules:
            _run(["ip", "-n", self.ns(node), "rule", "del", *r.split()], check=False)

    def _forget_background(self, bid, rules):
        self._bgs.pop(bid, None)
        self._del_rules(rules)
        try:
            self._update(lambda st: st["background"].pop(bid, None))
        except NetlabError:
            pass

    def stop_background(self, bid=None):
        """Stop background flow bid (any process's, from the state file), or all."""
        st = self._state()
        for b, info in list(st["background"].items()):
            if bid not in (None, b):
                continue
            if b in self._bgs:
                self._bgs[b].stop()
                continue
            inodes = set(st["namespaces"].values())
            for pid in info["pids"]:
                try:  # only kill it if it still lives in one of our namespaces
                    if os.stat(f"/proc/{pid}/ns/net").st_ino in inodes:
                        os.kill(pid, signal.SIGTERM)
                except OSError:
                    pass
            self._forget_background(b, [tuple(r) for r in info["rules"]])

    # ------------------------------------------------------------ counters
    def link_bytes(self) -> dict:
        """{(leaf, spine): (bytes leaf->spine, bytes spine->leaf)} read at the spine
        (so only what actually crossed the link, after the leaf's shaper)."""
        st = self._state()
        data = _in_netns(self._targets([f"s{s}" for s in range(self.cfg.spines)], st),
                         lambda name: _read_netdev())
        out = {}
        for s in range(self.cfg.spines):
            devs = data[f"{self.prefix}s{s}"]
            for l in range(self.cfg.leaves):
                rx, tx = devs.get(f"L{l}", (0, 0))
                out[(l, s)] = (rx, tx)
        return out

    def spine_bytes(self) -> list[int]:
        """Bytes forwarded by each spine so far, both directions (sum of tx bytes of
        its leaf-facing devices).  Diff two calls to see which spine a flow took."""
        lb = self.link_bytes()
        return [sum(lb[(l, s)][1] for l in range(self.cfg.leaves)) for s in range(self.cfg.spines)]

    # ------------------------------------------------------------ status
    def status(self) -> str:
        """Human-readable topology, addresses, rates, link states, counters."""
        st = self._state()
        c = self.cfg
        lines = [f"lab {self.prefix}  mode={c.mode}  hosts={c.hosts} leaves={c.leaves} "
                 f"spines={c.spines} aliases={c.aliases} queue={c.queue_ms:g}ms  [{st['status']}]",
                 f"  state {self.state_path}  owner pid {st.get('owner_pid') or '-'}",
                 f"hosts (access links {_fmt_rate(st['access'])} Mbit):"]
        for i in range(c.hosts):
            al = " ".join(f"{a}" + (f"(s{self.alias_spine(k)})" if c.mode == "pinned" else "")
                          for k, a in enumerate(self.aliases(i)))
            lines.append(f"  h{i:<3} ns {self.ns(i):<14} leaf L{self.leaf_of(i)}  addr {host_ip(i)}  "
                         f"gw {gw_ip(i)}  aliases {al or '-'}")
        try:
            lb = self.link_bytes()
        except (NetlabError, OSError):
            lb = {}
        lines.append("leaf-spine links (rate Mbit each direction; bytes up=leaf->spine down=spine->leaf):")
        for l in range(c.leaves):
            for s in range(c.spines):
                info = st["links"].get(f"{l},{s}", {})
                down = info.get("down")
                up_b, dn_b = lb.get((l, s), (0, 0))
                a, b = link_ips(l, s)
                lines.append(f"  L{l}-s{s}  {a:<12} <-> {b:<12} rate {_fmt_rate(info.get('rate')):>6}  "
                             f"{'DOWN(' + down + ')' if down else 'up':<16} up {up_b:>12} down {dn_b:>12}")
        if lb:
            sb = [sum(lb[(l, s)][1] for l in range(c.leaves)) for s in range(c.spines)]
            lines.append("spine bytes: " + "  ".join(f"s{s}={b}" for s, b in enumerate(sb)))
        if st["background"]:
            lines.append("background flows:")
            for b, info in st["background"].items():
                lines.append(f"  {b}: spine s{info['spine']} h{info['src']}->h{info['dst']} "
                             f"{info['proto']} {_fmt_rate(info['mbit'])} Mbit port {info['port']} "
                             f"pids {info['pids']}")
        return "\n".join(lines)

    # ------------------------------------------------------------ teardown
    def down(self):
        """Delete the namespaces this lab created (only those, by recorded inode),
        killing processes inside them first.  Idempotent."""
        main = threading.current_thread() is threading.main_thread()
        blocked = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
        if main:
            old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
        try:
            self._down()
        finally:
            if main:
                signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)

    def _down(self):
        t0 = time.monotonic()
        for bg in list(self._bgs.values()):
            bg.stopped = True
        self._bgs.clear()
        for p in self._procs:
            if p.poll() is None:
                p.terminate()
        if self.prefix is None or not self._owner:
            return  # never reserved (or reservation failed): nothing here is ours
        with _DirLock(self.state_dir):
            st = _load_state(self.state_path)
            if st is not None:
                ours = {}
                for name, ino in st["namespaces"].items():
                    cur = _netns_inode(name)
                    if cur is not None and cur == ino:
                        ours[name] = ino
                _kill_pids_in(set(ours.values()))
                if ours:
                    _run(["ip", "-force", "-batch", "-"], check=False,
                         input="".join(f"netns del {n}\n" for n in ours))
                left = [n for n in ours if _netns_inode(n) == ours[n]]
                if left:
                    st["namespaces"] = {n: ours[n] for n in left}
                    _save_state(self.state_path, st)
                    raise NetlabError(f"could not delete namespaces {left}")
                os.unlink(self.state_path)
        for p in self._procs:
            try:
                p.wait(timeout=1)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            for s in (p.stdout, p.stderr, p.stdin):
                if s:
                    try:
                        s.close()
                    except OSError:
                        pass
        self._procs = []
        self._is_up = False
        atexit.unregister(self._atexit)
        self.down_seconds = time.monotonic() - t0

    def _atexit(self):
        try:
            self.down()
        except Exception as e:  # noqa: BLE001
            print(f"netlab: cleanup of {self.prefix} failed: {e}", file=sys.stderr)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            def handler(signum, frame):
                raise SystemExit(128 + signum)
            self._old_handlers = {sig: signal.signal(sig, handler)
                                  for sig in (signal.SIGTERM, signal.SIGHUP)}
        try:
            self.up()
        except BaseException:
            self._restore_handlers()
            raise
        return self

    def _restore_handlers(self):
        if self._old_handlers:
            for sig, h in self._old_handlers.items():
                signal.signal(sig, h)
            self._old_handlers = None

    def __exit__(self, *exc):
        try:
            self.down()
        finally:
            self._restore_handlers()
        return False

    def __repr__(self):
        c = self.cfg
        return (f"<Lab {self.prefix} {c.mode} h={c.hosts} L={c.leaves} S={c.spines} "
                f"{'up' if self._is_up else 'down'}>")


# -------------------------------------------------------------- module funcs
def list_labs(state_dir=None) -> list[dict]:
    """State of every lab recorded in state_dir."""
    state_dir = state_dir or STATE_DIR
    out = []
    if not os.path.isdir(state_dir):
        return out
    for f in sorted(os.listdir(state_dir)):
        if f.endswith(".json"):
            st = _load_state(os.path.join(state_dir, f))
            if st:
                out.append(st)
    return out


def gc(state_dir=None) -> list[str]:
    """Tear down labs whose owning process has died (CLI 'up' labs have no owner
    and are kept).  Returns the prefixes removed."""
    removed = []
    for st in list_labs(state_dir):
        pid = st.get("owner_pid")
        if pid and not _pid_alive(pid):
            Lab.attach(st["prefix"], state_dir).down()
            removed.append(st["prefix"])
    return removed


# ----------------------------------------------------- traffic helper procs
def _cmd_sink(a):
    """Receiver: prints 'PORT n', counts bytes; TCP: exits after --expect
    connections closed (0 = forever) and prints JSON stats."""
    buf = bytearray(1 << 20)
    if a.proto == "udp":
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.setsockopt(SOL_UDP, UDP_GRO, 1)
        except OSError:
            pass
        s.bind((a.bind, a.port))
        print("PORT", s.getsockname()[1], flush=True)
        while True:
            s.recv_into(buf)

    class _Stop(Exception):
        pass

    def on_term(signum, frame):
        raise _Stop()
    signal.signal(signal.SIGTERM, on_term)  # SIGTERM: report what arrived so far
    streams = []
    try:
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((a.bind, a.port))
        ls.listen(128)
        print("PORT", ls.getsockname()[1], flush=True)
        sel = selectors.DefaultSelector()
        sel.register(ls, selectors.EVENT_READ, None)
        deadline = time.monotonic() + a.timeout if a.timeout else None
        _sink_loop(a, ls, sel, streams, deadline, buf)
    except _Stop:
        pass
    done = sum(1 for st in streams if st.get("closed"))
    try:
        print(json.dumps({"streams": streams, "done": done}), flush=True)
    except BrokenPipeError:
        pass


def _sink_loop(a, ls, sel, streams, deadline, buf):
    done = 0
    while a.expect == 0 or done < a.expect:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            break
        for key, _ in sel.select(left):
            if key.data is None:
                c, peer = ls.accept()
                c.setblocking(False)
                st = {"peer": f"{peer[0]}:{peer[1]}", "bytes": 0, "first": None, "last": None}
                streams.append(st)
                sel.register(c, selectors.EVENT_READ, st)
                continue
            c, st = key.fileobj, key.data
            try:
                n = c.recv_into(buf)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                n = 0
            if n:
                now = time.monotonic()
                if st["first"] is None:
                    st["first"] = now
                st["last"] = now
                st["bytes"] += n
            else:
                sel.unregister(c)
                c.close()
                st["closed"] = True
                done += 1


def _send_loop(s, proto, seconds, nbytes, mbit, out, idx):
    rate = mbit * 1e6 / 8 if mbit else None
    sent = 0
    t0 = time.monotonic()
    deadline = t0 + seconds if seconds else None
    if proto == "udp":
        seg = 1400
        try:
            s.setsockopt(SOL_UDP, UDP_SEGMENT, seg)
            chunk = seg * 40
        except OSError:
            chunk = seg
        buf = memoryview(bytearray(chunk))
    else:
        buf = memoryview(bytearray(65536 if rate else 256 * 1024))
        s.settimeout(0.2)
    try:
        while True:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                break
            if nbytes is not None and sent >= nbytes:
                break
            if rate:
                ahead = sent - (now - t0) * rate
                if ahead > 0:
                    time.sleep(min(ahead / rate, 0.05))
                    continue
            n = len(buf) if nbytes is None else min(len(buf), nbytes - sent)
            try:
                sent += s.send(buf[:n])
            except (socket.timeout, BlockingIOError):
                pass
            except ConnectionRefusedError:  # udp: ICMP port unreachable
                pass
            out[idx] = sent
        if proto == "tcp":
            s.settimeout(10)
            s.shutdown(socket.SHUT_WR)
            while s.recv(65536):
                pass
    except OSError as e:
        print(f"stream {idx}: {e}", file=sys.stderr)
        out[idx] = -1 - sent
    finally:
        s.close()


def _cmd_source(a):
    n = max(len(a.bind or []), len(a.dst))
    binds = (a.bind or [None]) * (n if len(a.bind or []) <= 1 else 1)
    dsts = a.dst * (n if len(a.dst) == 1 else 1)
    socks = []
    for i in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM if a.proto == "tcp" else socket.SOCK_DGRAM)
        if binds[i]:
            s.bind((binds[i], 0))
        s.settimeout(a.connect_timeout)
        try:
            s.connect((dsts[i], a.port))
        except OSError as e:
            print(f"connect {binds[i]} -> {dsts[i]}:{a.port}: {e}", file=sys.stderr)
            sys.exit(2)
        if a.mbit:
            try:
                s.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, int(a.mbit * 1e6 / 8))
            except OSError:
                pass
        socks.append(s)
    print("CONNECTED", flush=True)
    out = [0] * n
    ths = [threading.Thread(target=_send_loop, args=(s, a.proto, a.seconds, a.bytes, a.mbit, out, i),
                            daemon=True) for i, s in enumerate(socks)]

    class _Stop(Exception):
        pass

    def on_term(signum, frame):
        raise _Stop()
    signal.signal(signal.SIGTERM, on_term)  # SIGTERM: report what was sent so far
    stopped = False
    try:
        for t in ths:
            t.start()
        for t in ths:
            t.join()
    except _Stop:
        stopped = True
    try:
        print(json.dumps({"sent": out}), flush=True)
    except BrokenPipeError:
        pass
    sys.exit(0 if not stopped and all(x >= 0 for x in out) else 1)


# ----------------------------------------------------------------------- CLI
def _add_build_args(p):
    p.add_argument("--name", help="lab name -> prefix ml-<name>-")
    p.add_argument("--prefix", help="exact namespace prefix (default: first free ml<N>-)")
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--leaves", type=int, default=2)
    p.add_argument("--spines", type=int, default=4)
    p.add_argument("--aliases", type=int, default=None, help="aliases per host (default: spines)")
    p.add_argument("--core", default="200", help="leaf-spine rate in Mbit, or none")
    p.add_argument("--access", default="1000", help="host-leaf rate in Mbit, or none")
    p.add_argument("--mode", choices=("pinned", "ecmp"), default="pinned")
    p.add_argument("--queue-ms", type=float, default=5.0, help="tbf queue depth in ms at the shaped rate (at least 64 KB)")


def _build_lab(a) -> Lab:
    return Lab(a.name, prefix=a.prefix, hosts=a.hosts, leaves=a.leaves, spines=a.spines,
               aliases=a.aliases, core=_parse_rate(a.core), access=_parse_rate(a.access),
               mode=a.mode, queue_ms=a.queue_ms)


def _attach(a) -> Lab:
    prefix = a.prefix or (f"ml-{a.name}-" if getattr(a, "name", None) else None) \
        or os.environ.get("NETLAB_PREFIX")
    return Lab.attach(prefix)


def _node_arg(s):
    return int(s) if s.isdigit() else s


def _strip_dashes(cmd):
    return cmd[1:] if cmd and cmd[0] == "--" else cmd


def main(argv=None):
    ap = argparse.ArgumentParser(prog="netlab.py", description=__doc__.split("\n")[0],
                                 epilog="examples:" + __doc__.split("E.g.::")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def sp(name, help, lab=True):
        p = sub.add_parser(name, help=help, description=help)
        if lab:
            p.add_argument("--prefix", help="lab prefix (default: $NETLAB_PREFIX or the only lab)")
            p.add_argument("--name", help="lab name (prefix ml-<name>-)")
        return p

    p = sub.add_parser("up", help="build a lab (stays up until 'down')")
    _add_build_args(p)
    p = sp("down", "tear a lab down (only its own namespaces; idempotent)")
    p.add_argument("--all", action="store_true", help="every lab recorded in the state directory")
    sp("status", "topology, addresses, rates, link states, byte counters")
    sp("list", "labs recorded in the state directory", lab=False)
    sp("gc", "tear down labs whose owning process died", lab=False)
    p = sp("exec", "run a command in a node's namespace: exec NODE -- CMD...")
    p.add_argument("node", help="host index or node name (h0, L1, s2)")
    p.add_argument("command", nargs=argparse.REMAINDER)
    p = sub.add_parser("run", help="build a temporary lab, run a command, tear down (also on "
                                   "Ctrl-C/SIGTERM): run [opts] [--node N] -- CMD...")
    _add_build_args(p)
    p.add_argument("--node", help="run CMD inside this node's namespace (default: root "
                                  "namespace, with NETLAB_PREFIX set)")
    p.add_argument("command", nargs=argparse.REMAINDER)
    p = sp("linkdown", "take leaf-spine link L-S down")
    p.add_argument("leaf", type=int)
    p.add_argument("spine", type=int)
    p.add_argument("--reroute", action="store_true",
                   help="withdraw the routes through it at every leaf (traffic moves to other "
                        "spines); default: silent blackhole")
    p = sp("linkup", "bring leaf-spine link L-S up and restore its routes")
    p.add_argument("leaf", type=int)
    p.add_argument("spine", type=int)
    p = sp("linkrate", "shape leaf-spine link L-S to MBIT (or none)")
    p.add_argument("leaf", type=int)
    p.add_argument("spine", type=int)
    p.add_argument("mbit")
    p = sp("core", "shape every leaf-spine link to MBIT (or none)")
    p.add_argument("mbit")
    p = sp("access", "shape every host-leaf link to MBIT (or none)")
    p.add_argument("mbit")
    p = sp("bg", "background flow through one spine")
    p.add_argument("--spine", type=int, required=True)
    p.add_argument("--mbit", default="100", help="rate, or none for unpaced TCP")
    p.add_argument("--src", type=int)
    p.add_argument("--dst", type=int)
    p.add_argument("--proto", choices=("tcp", "udp"), default="tcp")
    p.add_argument("--seconds", type=float, help="stop after this long (default: until Ctrl-C)")
    p.add_argument("--detach", action="store_true", help="leave it running; stop with bgstop or down")
    p = sp("bgstop", "stop detached background flows")
    p.add_argument("id", nargs="?", help="flow id (default: all)")
    sp("counters", "bytes per spine and per leaf-spine link")
    p = sp("measure", "TCP throughput host SRC -> host DST")
    p.add_argument("src", type=int)
    p.add_argument("dst", type=int)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--aliases", help="'all' or comma list of alias indices: one stream per alias "
                                     "(alias k of SRC -> alias k of DST)")
    p.add_argument("--streams", type=int, default=1, help="streams between primary addresses")
    p.add_argument("--mbit", type=float, help="pace each stream")
    p = sub.add_parser("_sink")
    p.add_argument("--bind", default="0.0.0.0")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--proto", default="tcp")
    p.add_argument("--expect", type=int, default=0)
    p.add_argument("--timeout", type=float, default=0)
    p = sub.add_parser("_source")
    p.add_argument("--dst", action="append", required=True)
    p.add_argument("--bind", action="append")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--proto", default="tcp")
    p.add_argument("--seconds", type=float)
    p.add_argument("--bytes", type=int)
    p.add_argument("--mbit", type=float)
    p.add_argument("--connect-timeout", type=float, default=3.0)

    a = ap.parse_args(argv)
    try:
        return _dispatch(a)
    except NetlabError as e:
        print(f"netlab: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _dispatch(a):
    cmd = a.cmd
    if cmd == "_sink":
        return _cmd_sink(a)
    if cmd == "_source":
        return _cmd_source(a)
    if cmd == "up":
        lab = _build_lab(a).up()
        with _DirLock(lab.state_dir):  # CLI labs are not owned by this (exiting) process
            st = lab._state()
            st["owner_pid"] = None
            _save_state(lab.state_path, st)
        atexit.unregister(lab._atexit)
        print(f"lab {lab.prefix} up in {lab.up_seconds:.2f} s  (netlab.py status --prefix {lab.prefix})")
        return 0
    if cmd == "list":
        for st in list_labs():
            c = st["config"]
            own = st.get("owner_pid")
            print(f"{st['prefix']:<16} {st['status']:<9} {c['mode']:<7} h={c['hosts']} L={c['leaves']} "
                  f"S={c['spines']}  owner {own or '-'}{'' if not own or _pid_alive(own) else ' (dead)'}")
        return 0
    if cmd == "gc":
        for p in gc():
            print(f"removed {p}")
        return 0
    if cmd == "run":
        return _cmd_run(a)
    if cmd == "down":
        if a.all:
            for st in list_labs():
                Lab.attach(st["prefix"]).down()
                print(f"lab {st['prefix']} down")
            return 0
        try:
            lab = _attach(a)
        except NetlabError as e:
            if a.prefix or a.name or not list_labs():  # idempotent: nothing recorded, nothing to do
                print(f"netlab: nothing to do ({e})")
                return 0
            raise
        t = time.monotonic()
        lab.down()
        print(f"lab {lab.prefix} down in {time.monotonic() - t:.2f} s")
        return 0
    lab = _attach(a)
    if cmd == "status":
        print(lab.status())
    elif cmd == "exec":
        command = _strip_dashes(a.command)
        if not command:
            raise NetlabError("no command given")
        os.execvp("ip", ["ip", "netns", "exec", lab.ns(_node_arg(a.node)), *command])
    elif cmd == "linkdown":
        lab.link_down(a.leaf, a.spine, a.reroute)
    elif cmd == "linkup":
        lab.link_up(a.leaf, a.spine)
    elif cmd == "linkrate":
        lab.set_link_rate(a.leaf, a.spine, a.mbit)
    elif cmd == "core":
        lab.set_core_rate(a.mbit)
    elif cmd == "access":
        lab.set_access_rate(a.mbit)
    elif cmd == "counters":
        lb = lab.link_bytes()
        for s, b in enumerate(lab.spine_bytes()):
            links = "  ".join(f"L{l}: up {lb[(l, s)][0]} down {lb[(l, s)][1]}" for l in range(lab.cfg.leaves))
            print(f"s{s}: {b:>14}   {links}")
    elif cmd == "bg":
        bg = lab.background(a.spine, _parse_rate(a.mbit), src=a.src, dst=a.dst, proto=a.proto,
                            detach=a.detach)
        print(f"background {bg.id}: spine s{bg.spine} h{bg.src}->h{bg.dst} {bg.proto} "
              f"{_fmt_rate(bg.mbit)} Mbit", flush=True)
        if a.detach:
            return 0
        try:
            with _raise_on_term():
                time.sleep(a.seconds) if a.seconds else signal.pause()
        except KeyboardInterrupt:
            pass
        finally:
            bg.stop()
    elif cmd == "bgstop":
        lab.stop_background(a.id)
    elif cmd == "measure":
        src_addrs = dst_addrs = None
        if a.aliases:
            ks = range(lab.cfg.aliases) if a.aliases == "all" else [int(x) for x in a.aliases.split(",")]
            src_addrs = [alias_ip(a.src, k) for k in ks]
            dst_addrs = [alias_ip(a.dst, k) for k in ks]
        before = lab.spine_bytes()
        r = lab.transfer(a.src, a.dst, seconds=a.seconds, src_addrs=src_addrs, dst_addrs=dst_addrs,
                         streams=a.streams, mbit=a.mbit)
        after = lab.spine_bytes()
        print(r)
        print("spine bytes: " + "  ".join(f"s{s}={y - x}" for s, (x, y) in enumerate(zip(before, after))))
    return 0


class _raise_on_term:
    def __enter__(self):
        def h(signum, frame):
            raise SystemExit(128 + signum)
        self.old = {s: signal.signal(s, h) for s in (signal.SIGTERM, signal.SIGHUP)}

    def __exit__(self, *exc):
        for s, h in self.old.items():
            signal.signal(s, h)


def _cmd_run(a):
    command = _strip_dashes(a.command)
    if not command:
        raise NetlabError("no command given")
    rc = 1
    with _raise_on_term():
        with _build_lab(a) as lab:
            print(f"netlab: lab {lab.prefix} up in {lab.up_seconds:.2f} s", file=sys.stderr, flush=True)
            env = dict(os.environ, NETLAB_PREFIX=lab.prefix, NETLAB_STATE_DIR=lab.state_dir)
            if a.node is not None:
                p = lab.popen(_node_arg(a.node), command, env=env)
            else:
                p = subprocess.Popen(command, env=env)
                lab._procs.append(p)
            try:
                rc = p.wait()
            except BaseException:
                if p.poll() is None:
                    p.terminate()
                    try:
                        p.wait(timeout=2)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()
                raise
    return rc


if __name__ == "__main__":
    sys.exit(main())
