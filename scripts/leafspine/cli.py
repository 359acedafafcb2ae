"""netlab -- a leaf-spine data-center network built from Linux network namespaces.

The command line of scripts/netlab.py: ``netlab.py up|down|status|list|gc|exec|
run|linkdown|linkup|linkrate|core|access|bg|bgstop|counters|measure``
(``netlab.py CMD -h``).  E.g.::

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
import os
import signal
import subprocess
import sys
import time

from .lab import Lab, gc
from .state import DirLock, list_labs, pid_alive, save_state
from .topology import NetlabError, alias_ip, fmt_rate, parse_rate


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
               aliases=a.aliases, core=parse_rate(a.core), access=parse_rate(a.access),
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
    if cmd == "up":
        lab = _build_lab(a).up()
        with DirLock(lab.state_dir):  # CLI labs are not owned by this (exiting) process
            st = lab._state()
            st["owner_pid"] = None
            save_state(lab.state_path, st)
        atexit.unregister(lab._atexit)
        print(f"lab {lab.prefix} up in {lab.up_seconds:.2f} s  (netlab.py status --prefix {lab.prefix})")
        return 0
    if cmd == "list":
        for st in list_labs():
            c = st["config"]
            own = st.get("owner_pid")
            print(f"{st['prefix']:<16} {st['status']:<9} {c['mode']:<7} h={c['hosts']} L={c['leaves']} "
                  f"S={c['spines']}  owner {own or '-'}{'' if not own or pid_alive(own) else ' (dead)'}")
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
        bg = lab.background(a.spine, parse_rate(a.mbit), src=a.src, dst=a.dst, proto=a.proto,
                            detach=a.detach)
        print(f"background {bg.id}: spine s{bg.spine} h{bg.src}->h{bg.dst} {bg.proto} "
              f"{fmt_rate(bg.mbit)} Mbit", flush=True)
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
