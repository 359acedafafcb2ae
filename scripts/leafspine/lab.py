"""The Lab facade: one object per lab, building it (namespaces, veths,
routes, shaping) and tearing it down, running processes inside its nodes,
and handing faults, traffic and counters to their modules.

A lab's state file (state.py) records the namespaces it created together
with their nsfs inode numbers, and ``down`` deletes only those (after
checking the inode), so it never touches anything else.  Processes still
running inside the lab's namespaces are killed by ``down``.  A ``with
Lab(...)`` block also cleans up on exceptions, Ctrl-C, SIGTERM and SIGHUP; a
lab whose owning process was SIGKILLed is removed by ``gc``.
"""
from __future__ import annotations

import atexit
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict

from . import faults, plumbing, routing, shaping, state, status, traffic
from .state import DirLock, load_state, save_state
from .topology import Config, NetlabError, alias_ip, host_ip, parse_rate
from .traffic import Background, TransferResult

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$")


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
        self.state_dir = state_dir or state.STATE_DIR
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
        return self.cfg.leaf_of(host)

    def hosts_of(self, leaf: int) -> list[int]:
        return self.cfg.hosts_of(leaf)

    def nodes(self) -> list[str]:
        return self.cfg.nodes()

    def ns(self, node) -> str:
        """Namespace name of a node (int = host index, or 'h0', 'L1', 's2')."""
        return self.prefix + self.cfg.node(node)

    def host_addr(self, i: int) -> str:
        self.cfg.node(i)
        return host_ip(i)

    def aliases(self, i: int) -> list[str]:
        self.cfg.node(i)
        return [alias_ip(i, k) for k in range(self.cfg.aliases)]

    def alias_addr(self, i: int, k: int) -> str:
        """Alias k of host i."""
        self.cfg.node(i)
        if not 0 <= k < self.cfg.aliases:
            raise NetlabError(f"no alias {k} (aliases per host: {self.cfg.aliases})")
        return alias_ip(i, k)

    def alias_spine(self, k: int) -> int:
        """Spine that alias k is pinned to (pinned mode)."""
        return self.cfg.alias_spine(k)

    def spine_of_hop(self, addr: str) -> int:
        """The spine a route probe's answer came from: the spine side of a
        leaf-spine link (see link_ips)."""
        return self.cfg.spine_of_hop(addr)

    def host_of_addr(self, addr: str) -> int:
        return self.cfg.host_of_addr(addr)

    # ------------------------------------------------------------ state
    def _state(self):
        st = load_state(self.state_path)
        if st is None:
            raise NetlabError(f"lab {self.prefix} is not up (no {self.state_path})")
        return st

    def _update(self, fn):
        with DirLock(self.state_dir):
            st = self._state()
            r = fn(st)
            save_state(self.state_path, st)
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
        state_dir = state_dir or state.STATE_DIR
        if prefix is None:
            labs = state.list_labs(state_dir)
            if len(labs) != 1:
                raise NetlabError(f"{len(labs)} labs exist ({' '.join(x['prefix'] for x in labs) or '-'}); "
                                  "say which (--prefix / NETLAB_PREFIX)")
            prefix = labs[0]["prefix"]
        st = load_state(os.path.join(state_dir, f"{prefix}.json"))
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
        with DirLock(self.state_dir):
            existing = plumbing.existing_netns()
            if self.prefix is None:
                self.prefix = state.free_prefix(self.state_dir, existing)
            clash = [self.prefix + n for n in self.nodes() if self.prefix + n in existing]
            if clash:
                raise NetlabError(f"namespaces already exist (not created by this lab, left alone): "
                                  f"{' '.join(clash)}")
            st = {"version": 1, "prefix": self.prefix, "status": "building",
                  "owner_pid": os.getpid(), "created": time.time(), "config": asdict(self.cfg),
                  "namespaces": {}, "links": {}, "access": self.cfg.access, "background": {}}
            if not state.create_state(self.state_path, st):
                raise NetlabError(f"lab {self.prefix} already exists ({self.state_path})")

    def _build(self):
        c = self.cfg
        # 1. namespaces, one by one, each recorded (with its inode) as soon as it exists
        for n in self.nodes():
            name = self.prefix + n
            ino = plumbing.add_netns(name)
            self._update(lambda st: st["namespaces"].__setitem__(name, ino))
        # 2. sysctls (before any veth exists, so "default" applies to every device)
        plumbing.in_netns(self._targets(self.nodes()),
                          lambda name: plumbing.write_sysctls(routing.SYSCTLS[name[len(self.prefix)]]))
        # 3. veth pairs, 4. addresses, routes, rules (one ip batch per namespace, in parallel)
        plumbing.add_veths(c, self.prefix)
        plumbing.run_parallel(routing.build_jobs(c, self.prefix))
        # 5. shaping
        links = {f"{l},{s}": {"rate": c.core, "down": None} for l, s in c.links()}
        self._update(lambda st: st.update(links=links, access=c.access))
        shaping.apply(self.prefix, shaping.initial_cmds(c))
        self._update(lambda st: st.update(status="up"))

    # ------------------------------------------------------------ shaping
    def set_link_rate(self, leaf: int, spine: int, mbit):
        """Shape leaf-spine link (both directions) to mbit; None removes shaping."""
        mbit = parse_rate(mbit)
        self.cfg.check_link(leaf, spine)
        shaping.apply(self.prefix, shaping.core_cmds(self.cfg, [(leaf, spine)], mbit))
        self._update(lambda st: st["links"][f"{leaf},{spine}"].update(rate=mbit))

    def set_core_rate(self, mbit):
        """Shape every leaf-spine link to mbit (None = unshaped)."""
        mbit = parse_rate(mbit)
        shaping.apply(self.prefix, shaping.core_cmds(self.cfg, self.cfg.links(), mbit))
        self._update(lambda st: [v.update(rate=mbit) for v in st["links"].values()])

    def set_access_rate(self, mbit):
        """Shape every host-leaf link to mbit (None = unshaped)."""
        mbit = parse_rate(mbit)
        shaping.apply(self.prefix, shaping.access_cmds(self.cfg, mbit))
        self._update(lambda st: st.update(access=mbit))

    # ------------------------------------------------------------ faults (faults.py)
    def link_down(self, leaf: int, spine: int, reroute: bool = False):
        """Take the leaf-spine link down: by default the spine end only, a
        silent blackhole both ways; reroute=True also withdraws its routes at
        every leaf. See faults.link_down."""
        faults.link_down(self, leaf, spine, reroute)

    def link_up(self, leaf: int, spine: int):
        """Bring the leaf-spine link back with every route through it."""
        faults.link_up(self, leaf, spine)

    def spine_down(self, spine: int, reroute: bool = False):
        """All links of one spine down (see link_down)."""
        faults.spine_down(self, spine, reroute)

    def spine_up(self, spine: int):
        faults.spine_up(self, spine)

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
        env.update(NETLAB_PREFIX=self.prefix, NETLAB_NODE=self.cfg.node(node))
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
        return plumbing.in_netns(self._targets([self.cfg.node(node)]),
                                 lambda _: socket.socket(family, type, proto))[name]

    # ------------------------------------------------------------ traffic (traffic.py)
    def reachable(self, src, dst_addr: str, src_addr: str | None = None, timeout: float = 1.0) -> bool:
        """TCP handshake from host src (optionally bound to src_addr) to dst_addr."""
        return traffic.reachable(self, src, dst_addr, src_addr, timeout)

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
        return traffic.transfer(self, src, dst, seconds=seconds, nbytes=nbytes, src_addrs=src_addrs,
                                dst_addrs=dst_addrs, streams=streams, mbit=mbit, timeout=timeout,
                                connect_timeout=connect_timeout)

    def background(self, spine: int, mbit: float | None = 100, *, src: int | None = None,
                   dst: int | None = None, proto: str = "tcp", detach: bool = False) -> Background:
        """Start a paced flow src -> dst forced through `spine` (5-tuple policy
        rules at both leaves, works in pinned and ecmp mode).  Default hosts: the
        last host of the first leaf -> the last host of the last leaf (so tests
        between h0 and the first host of another leaf keep their access links).
        mbit=None: unpaced TCP (saturating).  detach: own session, outlives this
        process (stop with stop_background() or down()).  Returns a handle with
        stop(); down() stops every flow."""
        return traffic.background(self, spine, mbit, src=src, dst=dst, proto=proto, detach=detach)

    def stop_background(self, bid=None):
        """Stop background flow bid (any process's, from the state file), or all."""
        traffic.stop_background(self, bid)

    # ------------------------------------------------------------ counters (status.py)
    def link_bytes(self) -> dict:
        """{(leaf, spine): (bytes leaf->spine, bytes spine->leaf)} read at the spine
        (so only what actually crossed the link, after the leaf's shaper)."""
        return status.link_bytes(self)

    def spine_bytes(self) -> list[int]:
        """Bytes forwarded by each spine so far, both directions (sum of tx bytes of
        its leaf-facing devices).  Diff two calls to see which spine a flow took."""
        return status.spine_bytes(self.cfg, self.link_bytes())

    def status(self) -> str:
        """Human-readable topology, addresses, rates, link states, counters."""
        return status.status(self)

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
        with DirLock(self.state_dir):
            st = load_state(self.state_path)
            if st is not None:
                left = plumbing.delete_netns(st["namespaces"])
                if left:
                    st["namespaces"] = left
                    save_state(self.state_path, st)
                    raise NetlabError(f"could not delete namespaces {list(left)}")
                os.unlink(self.state_path)
        for p in self._procs:
            plumbing.reap(p, 1)
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


def gc(state_dir=None) -> list[str]:
    """Tear down labs whose owning process has died (CLI 'up' labs have no owner
    and are kept).  Returns the prefixes removed."""
    removed = []
    for st in state.list_labs(state_dir):
        pid = st.get("owner_pid")
        if pid and not state.pid_alive(pid):
            Lab.attach(st["prefix"], state_dir).down()
            removed.append(st["prefix"])
    return removed
