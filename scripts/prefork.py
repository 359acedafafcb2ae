"""Rank processes forked from one that has already imported torch.

A rank process spends about 2.5 s of CPU importing torch before it does
anything; the tests and the benchmark suite start hundreds of them, four at a
time on a 2-core host, so much of their wall time went there. `Prefork`
starts one server process that imports torch and torch.distributed once, then
forks a child for every `popen`. The child enters the network namespace it is
given (setns, as `ip netns exec` does), takes the caller's environment,
working directory and pipes, and runs the script as `python SCRIPT ARGS...`
(or `python -c CODE ARGS...`) would, ending through the interpreter's normal
exit (atexit handlers, destructors) as a started process does. What it does
not get: a mount namespace with the namespace's own /sys (ranks find their
addresses through the kernel's interfaces, not /sys/class/net), and a fresh
interpreter: what torch reads once at import (OpenMP's thread count) is set
again from the caller's environment.

    pf = Prefork()                 # one per run; close() or the `with` ends it
    p = pf.popen(["bench.py", "--size", "1M"], env=env, cwd=ROOT, netns="lab-h0")
    p.stdout, p.stderr, p.pid, p.poll(), p.wait(timeout), p.kill(), p.returncode

`ForkedProcess` answers as much of subprocess.Popen as the runners use
(scripts/labrun.py, tests/python/launcher.py).
"""
from __future__ import annotations

import io
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time

# Not maestro_torch (cheap to import): a rank must be able to find it through
# torch's backend entry point without importing it.
PRELOAD = ("torch", "torch.distributed")
CLONE_NEWNET = 0x40000000


def runs(argv: list[str]) -> bool:
    """Whether argv (what follows `python`) is what a Prefork child can run:
    a Python script or -c CODE."""
    return argv[:1] == ["-c"] or (bool(argv) and argv[0].endswith(".py"))


_shared = None


def shared() -> "Prefork":
    """This process's server, started on first use and closed at exit (the
    one the runners share)."""
    global _shared
    if _shared is None:
        import atexit

        _shared = Prefork()
        atexit.register(_shared.close)
    return _shared


class ForkedProcess:
    """A child of the prefork server, as the caller sees it: pipes it owns,
    and the exit status the server reports on the request's connection."""

    def __init__(self, conn: socket.socket, stdout, stderr):
        self._conn = conn
        self._buf = b""
        self.stdin, self.stdout, self.stderr = None, stdout, stderr
        self.returncode: int | None = None
        self.pid = int(self._line(timeout=60).split()[1])

    def _line(self, timeout: float | None) -> str:
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self._conn], [], [], left)[0]:
                raise subprocess.TimeoutExpired("prefork child", timeout)
            data = self._conn.recv(4096)
            if not data:
                raise RuntimeError("the prefork server went away before it reported on its child")
            self._buf += data
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode()

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            status = self._line(timeout)  # "exit STATUS" (os.waitstatus_to_exitcode)
            self.returncode = int(status.split()[1])
            self._conn.close()
        return self.returncode

    def poll(self) -> int | None:
        try:
            return self.wait(timeout=0)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass


class Prefork:
    """The server: started at construction, ended by close()."""

    def __init__(self, preload=PRELOAD, python: str | None = None):
        self._dir = tempfile.mkdtemp(prefix="prefork-")
        self._path = os.path.join(self._dir, "sock")
        # -c, not this file as the script: the child's script replaces
        # __main__, which must not be this module. sys.path[0] (the child's
        # script directory) is this directory in the server, not the cwd.
        boot = (f"import sys; sys.path[0] = {os.path.dirname(os.path.abspath(__file__))!r}; "
                f"import prefork; prefork.serve({self._path!r}, {list(preload)!r})")
        self._server = subprocess.Popen([python or sys.executable, "-c", boot], stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE)
        line = self._server.stdout.readline()
        if line.strip() != b"ready":
            self._server.wait()
            raise RuntimeError(f"the prefork server failed to start (exit {self._server.returncode})")

    def popen(self, argv: list[str], *, env: dict | None = None, cwd: str | None = None,
              netns: str | None = None, stdout=None, stderr=None, text: bool = False) -> ForkedProcess:
        """Run `python argv...` in a child forked from the server. stdout and
        stderr: subprocess.PIPE for pipes read through p.stdout / p.stderr,
        None to share the caller's."""
        if not runs(argv):
            raise ValueError(f"prefork runs a Python script or -c CODE, not {argv[:1]}")
        pipes, theirs = [], []
        for want, default in ((stdout, 1), (stderr, 2)):
            if want == subprocess.PIPE:
                r, w = os.pipe()
                pipes.append(open(r, "r", encoding="utf-8", errors="replace") if text else open(r, "rb"))
                theirs.append(w)
            else:
                pipes.append(None)
                theirs.append(os.dup(default if want is None else want.fileno()))
        request = json.dumps({"argv": argv, "env": dict(os.environ if env is None else env),
                              "cwd": cwd or os.getcwd(), "netns": netns}).encode()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self._path)
            socket.send_fds(conn, [len(request).to_bytes(8, "little") + request], theirs)
        finally:
            for fd in theirs:
                os.close(fd)
        return ForkedProcess(conn, *pipes)

    def close(self) -> None:
        if self._server.poll() is None:
            self._server.terminate()
            self._server.wait()
        try:
            os.unlink(self._path)
        except FileNotFoundError:
            pass
        os.rmdir(self._dir)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ------------------------------------------------------------------ the server

def _receive(conn: socket.socket):
    msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 2)
    size = int.from_bytes(msg[:8], "little")
    while len(msg) < 8 + size:
        more = conn.recv(8 + size - len(msg))
        if not more:
            raise EOFError("request cut short")
        msg += more
    return json.loads(msg[8:8 + size]), fds


def _child(request: dict, fds: list[int]) -> None:
    """In the forked child: become the rank, run it, raise SystemExit."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if request["netns"]:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        ns = os.open(f"/run/netns/{request['netns']}", os.O_RDONLY)
        if libc.setns(ns, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {request['netns']}")
        os.close(ns)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in (devnull, *fds):
        os.close(fd)
    env = request["env"]
    os.environ.clear()
    os.environ.update(env)
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", line_buffering=True,
                                  write_through=unbuffered)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
                                  line_buffering=True, write_through=True)
    sys.stdin = open(0, closefd=False)
    os.chdir(request["cwd"])
    import torch
    if env.get("OMP_NUM_THREADS", "").isdigit():
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()  # a fresh process's numpy state, not the server's
    argv = request["argv"]
    if argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        sys.path[0] = ""
        code, name = argv[1], "<string>"
    else:
        script = os.path.abspath(argv[0])
        sys.argv = [script, *argv[1:]]
        sys.path[0] = os.path.dirname(script)
        with open(script) as f:
            code, name = f.read(), script
    main = sys.modules["__main__"]
    main.__dict__.clear()
    main.__dict__.update({"__name__": "__main__", "__file__": name, "__builtins__": __builtins__})
    exec(compile(code, name, "exec"), main.__dict__)
    raise SystemExit(0)


def serve(path: str, preload: list[str]) -> None:
    import importlib
    for name in preload:
        importlib.import_module(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    children: dict[int, socket.socket] = {}
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print("ready", flush=True)
    while True:
        ready = select.select([listener, wake_r], [], [], 1.0)[0]
        if wake_r in ready:
            os.read(wake_r, 4096)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if conn is not None:
                try:
                    conn.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
                except OSError:
                    pass
                conn.close()
        if listener in ready:
            conn, _ = listener.accept()
            request, fds = _receive(conn)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                listener.close()
                conn.close()
                for fd in (wake_r, wake_w):
                    os.close(fd)
                signal.set_wakeup_fd(-1)
                for other in children.values():
                    other.close()
                _child(request, fds)
            for fd in fds:
                os.close(fd)
            children[pid] = conn
            conn.sendall(f"pid {pid}\n".encode())
