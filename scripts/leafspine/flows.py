"""The lab's traffic programs, run inside a host's namespace by traffic.py:
a sink that counts what arrives and a source that sends, paced or not, over
one or more streams. Standalone (the standard library only), started as
``python -s flows.py sink|source ...``:

    sink    prints 'PORT n', counts bytes; TCP: exits after --expect
            connections closed (0 = forever, or --timeout) and prints
            {"streams": [...], "done": n}; UDP: counts until killed
    source  connects every stream, prints CONNECTED, sends for --seconds or
            --bytes per stream (--mbit paces each) and prints {"sent": [...]}

Both report what they have so far on SIGTERM.
"""
from __future__ import annotations

import argparse
import json
import selectors
import signal
import socket
import sys
import threading
import time

SO_MAX_PACING_RATE = 47
SOL_UDP = 17
UDP_SEGMENT = 103
UDP_GRO = 104


def sink(a):
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


def source(a):
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


def main(argv=None):
    ap = argparse.ArgumentParser(prog="flows.py", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("sink")
    p.add_argument("--bind", default="0.0.0.0")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--proto", default="tcp")
    p.add_argument("--expect", type=int, default=0)
    p.add_argument("--timeout", type=float, default=0)
    p = sub.add_parser("source")
    p.add_argument("--dst", action="append", required=True)
    p.add_argument("--bind", action="append")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--proto", default="tcp")
    p.add_argument("--seconds", type=float)
    p.add_argument("--bytes", type=int)
    p.add_argument("--mbit", type=float)
    p.add_argument("--connect-timeout", type=float, default=3.0)
    a = ap.parse_args(argv)
    return sink(a) if a.cmd == "sink" else source(a)


if __name__ == "__main__":
    sys.exit(main())
