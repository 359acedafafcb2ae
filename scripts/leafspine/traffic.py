"""Traffic between the lab's hosts: a measured transfer (TransferResult),
background flows pinned to one spine (Background), and a TCP handshake
probe. The programs that send and receive are flows.py, started inside the
hosts' namespaces through Lab.popen; each function here acts on a Lab."""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from .plumbing import reap, run_cmd
from .routing import PREF_FLOW, TABLE_BASE
from .topology import NetlabError, fmt_rate

FLOWS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flows.py")


def flows(*args) -> list[str]:
    """The command line of a flows.py program."""
    return [sys.executable, "-s", FLOWS, *args]


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
            reap(p, 2)
        forget_background(self.lab, self.id, self._rules)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def __repr__(self):
        return (f"<Background {self.id} spine {self.spine} h{self.src}->h{self.dst} {self.proto} "
                f"{fmt_rate(self.mbit)} Mbit {'stopped' if self.stopped else 'running'}>")


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


def reachable(lab, src, dst_addr: str, src_addr: str | None = None, timeout: float = 1.0) -> bool:
    """TCP handshake from host src (optionally bound to src_addr) to dst_addr."""
    dst = lab.cfg.host_of_addr(dst_addr)
    ls = lab.socket(dst)
    cs = lab.socket(src)
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


def _stream_addrs(lab, src, dst, src_addrs, dst_addrs, streams):
    """(source addresses, sink addresses), one of each per stream."""
    def lst(x):
        return None if x is None else ([x] if isinstance(x, str) else list(x))
    sa, da = lst(src_addrs), lst(dst_addrs)
    n = max(len(sa or []), len(da or [])) or streams
    sa = sa or [lab.host_addr(src)]
    da = da or [lab.host_addr(dst)]
    sa = sa * n if len(sa) == 1 else sa
    da = da * n if len(da) == 1 else da
    if len(sa) != n or len(da) != n:
        raise NetlabError("src_addrs and dst_addrs lengths differ")
    return sa, da


def transfer(lab, src, dst, *, seconds=1.0, nbytes=None, src_addrs=None, dst_addrs=None, streams=1,
             mbit=None, timeout=None, connect_timeout=3.0) -> TransferResult:
    """See Lab.transfer."""
    sa, da = _stream_addrs(lab, src, dst, src_addrs, dst_addrs, streams)
    n = len(sa)
    if timeout is None:
        timeout = (seconds or 0) + 15 + (nbytes or 0) / 1e6
    sink = lab.popen(dst, flows("sink", "--expect", str(n), "--timeout", str(timeout)),
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
    src_p = None
    try:
        port = int(_read_line(sink.stdout, 10, "sink port").split()[1])
        args = ["source", "--port", str(port), "--connect-timeout", str(connect_timeout)]
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
        src_p = lab.popen(src, flows(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
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


def background(lab, spine, mbit=100, *, src=None, dst=None, proto="tcp", detach=False) -> Background:
    """See Lab.background."""
    c = lab.cfg
    if not 0 <= spine < c.spines:
        raise NetlabError(f"no spine {spine}")
    if proto not in ("tcp", "udp"):
        raise NetlabError("proto must be tcp or udp")
    if proto == "udp" and not mbit:
        raise NetlabError("udp background needs a rate")
    src = c.hosts_of(0)[-1] if src is None else src
    dst = c.hosts_of(c.leaves - 1)[-1] if dst is None else dst
    ls, ld = c.leaf_of(src), c.leaf_of(dst)
    if ls == ld:
        raise NetlabError(f"h{src} and h{dst} share leaf L{ls}: no spine in between")
    sa, da = lab.host_addr(src), lab.host_addr(dst)
    lab._bg_seq += 1
    bid = f"{os.getpid()}-{lab._bg_seq}"
    procs = []
    rules = []
    try:
        sink = lab.popen(dst, flows("sink", "--proto", proto, "--bind", da),
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0,
                         start_new_session=detach)
        procs.append(sink)
        port = int(_read_line(sink.stdout, 10, "sink port").split()[1])
        t = TABLE_BASE + spine
        rules = [(f"L{ls}", f"from {sa} to {da} ipproto {proto} dport {port} lookup {t} pref {PREF_FLOW}"),
                 (f"L{ld}", f"from {da} to {sa} ipproto {proto} sport {port} lookup {t} pref {PREF_FLOW}")]
        for node, r in rules:
            run_cmd(["ip", "-n", lab.ns(node), "rule", "add", *r.split()])
        args = ["source", "--proto", proto, "--port", str(port), "--bind", sa, "--dst", da,
                "--connect-timeout", "5"]
        if mbit:
            args += ["--mbit", str(mbit)]
        source = lab.popen(src, flows(*args), stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, bufsize=0, start_new_session=detach)
        procs.append(source)
        _read_line(source.stdout, 10, "background source connect")
    except BaseException:
        for p in procs:
            p.kill()
            p.wait()
        _del_rules(lab, rules)
        raise
    lab._update(lambda st: st["background"].__setitem__(bid, {
        "spine": spine, "src": src, "dst": dst, "proto": proto, "mbit": mbit, "port": port,
        "pids": [p.pid for p in procs], "rules": rules}))
    bg = Background(lab, bid, spine, src, dst, proto, mbit, port, procs, rules)
    lab._bgs[bid] = bg
    return bg


def _del_rules(lab, rules):
    for node, r in rules:
        run_cmd(["ip", "-n", lab.ns(node), "rule", "del", *r.split()], check=False)


def forget_background(lab, bid, rules):
    lab._bgs.pop(bid, None)
    _del_rules(lab, rules)
    try:
        lab._update(lambda st: st["background"].pop(bid, None))
    except NetlabError:
        pass


def stop_background(lab, bid=None):
    """Stop background flow bid (any process's, from the state file), or all."""
    st = lab._state()
    for b, info in list(st["background"].items()):
        if bid not in (None, b):
            continue
        if b in lab._bgs:
            lab._bgs[b].stop()
            continue
        inodes = set(st["namespaces"].values())
        for pid in info["pids"]:
            try:  # only kill it if it still lives in one of our namespaces
                if os.stat(f"/proc/{pid}/ns/net").st_ino in inodes:
                    os.kill(pid, signal.SIGTERM)
            except OSError:
                pass
        forget_background(lab, b, [tuple(r) for r in info["rules"]])
