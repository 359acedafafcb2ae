"""Namespace and link plumbing: running ip/tc (one command, or batches in
parallel), entering a network namespace from a thread, creating the lab's
namespaces, sysctls and veth pairs, reading device counters, and killing
and reaping what runs inside.

Every namespace is named ``<prefix><node>`` (node = h<i>, L<l>, s<s>) and
recorded with its nsfs inode number (state.py); whatever acts on a namespace
checks that inode first, so nothing here touches a namespace the lab did not
create.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import threading
import time

from .topology import NetlabError

NETNS_DIR = "/run/netns"
CLONE_NEWNET = 0x40000000


# ------------------------------------------------------------ commands
def run_cmd(argv, input=None, check=True):
    p = subprocess.run(argv, input=input, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise NetlabError(f"{' '.join(argv)} failed (rc {p.returncode}): {p.stderr.strip() or p.stdout.strip()}")
    return p


def run_parallel(jobs, check=True):
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


def batch_job(tool, ns, cmds, force=False):
    """A run_parallel job: `tool` (ip or tc) -batch inside namespace ns."""
    return ([tool, *(["-force"] if force else []), "-n", ns, "-batch", "-"], "\n".join(cmds) + "\n")


# ------------------------------------------------------------ namespaces
_libc = None


def _setns(fd: int):
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def in_netns(targets, fn):
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


def netns_inode(name):
    try:
        return os.stat(os.path.join(NETNS_DIR, name)).st_ino
    except FileNotFoundError:
        return None


def existing_netns() -> set:
    return set(os.listdir(NETNS_DIR)) if os.path.isdir(NETNS_DIR) else set()


def add_netns(name):
    """Create namespace name; returns its inode."""
    run_cmd(["ip", "netns", "add", name])
    return netns_inode(name)


def delete_netns(recorded: dict) -> dict:
    """Delete the namespaces of {name: inode} that are still those inodes,
    killing the processes inside first; returns those left undeleted."""
    ours = {}
    for name, ino in recorded.items():
        cur = netns_inode(name)
        if cur is not None and cur == ino:
            ours[name] = ino
    kill_pids_in(set(ours.values()))
    if ours:
        run_cmd(["ip", "-force", "-batch", "-"], check=False,
                input="".join(f"netns del {n}\n" for n in ours))
    return {n: ours[n] for n in ours if netns_inode(n) == ours[n]}


def write_sysctls(values: dict):
    for key, val in values.items():
        with open("/proc/sys/" + key.replace(".", "/"), "w") as f:
            f.write(str(val))


def add_veths(cfg, prefix):
    """The veth pairs, created directly inside the lab namespaces: host i's
    eth0 <-> its leaf's h<i>, and leaf l's s<s> <-> spine s's L<l>."""
    P = prefix
    veth = [f"link add eth0 netns {P}h{i} type veth peer name h{i} netns {P}L{cfg.leaf_of(i)}"
            for i in range(cfg.hosts)]
    veth += [f"link add s{s} netns {P}L{l} type veth peer name L{l} netns {P}s{s}" for l, s in cfg.links()]
    run_cmd(["ip", "-batch", "-"], input="\n".join(veth) + "\n")


def read_netdev():
    """{dev: (rx_bytes, tx_bytes)} of the calling thread's network namespace."""
    out = {}
    with open("/proc/thread-self/net/dev") as f:
        for line in f.readlines()[2:]:
            name, _, rest = line.partition(":")
            v = rest.split()
            out[name.strip()] = (int(v[0]), int(v[8]))
    return out


# ------------------------------------------------------------ processes
def pids_in_netns(inodes: set) -> list[int]:
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


def kill_pids_in(inodes: set, grace=0.5):
    pids = pids_in_netns(inodes)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in pids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 2.0)
        while pids and time.monotonic() < deadline:
            time.sleep(0.01)
            pids = [p for p in pids_in_netns(inodes) if p in pids]
        if not pids:
            return


def reap(p: subprocess.Popen, timeout: float):
    """Wait for p (already told to end) up to timeout, then SIGKILL it; close
    its pipes."""
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    for s in (p.stdout, p.stderr, p.stdin):
        if s:
            try:
                s.close()
            except OSError:
                pass
