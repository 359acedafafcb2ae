"""The lab's state file: ``/run/maestro-netlab/<prefix>.json`` (or
$NETLAB_STATE_DIR) records the namespaces a lab created with their nsfs
inode numbers, its link states and rates, its background flows and the pid
of the process that owns it (none for a lab made by ``netlab.py up``). Every
update holds an exclusive flock on the directory.
"""
from __future__ import annotations

import fcntl
import json
import os
import threading

STATE_DIR = os.environ.get("NETLAB_STATE_DIR", "/run/maestro-netlab")


class DirLock:
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


def load_state(path):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def save_state(path, st):
    tmp = f"{path}.tmp{os.getpid()}.{threading.get_ident()}"
    with open(tmp, "w") as f:
        json.dump(st, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def create_state(path, st):
    """Write a new state file; False if one exists already."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        json.dump(st, f)
    return True


def free_prefix(state_dir, existing_netns: set) -> str:
    """The first ``ml<N>-`` with neither a state file nor a namespace."""
    n = 0
    while True:
        p = f"ml{n}-"
        if (not os.path.exists(os.path.join(state_dir, f"{p}.json"))
                and not any(e.startswith(p) for e in existing_netns)):
            return p
        n += 1


def pid_alive(pid):
    if not pid:
        return False
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def list_labs(state_dir=None) -> list[dict]:
    """State of every lab recorded in state_dir."""
    state_dir = state_dir or STATE_DIR
    out = []
    if not os.path.isdir(state_dir):
        return out
    for f in sorted(os.listdir(state_dir)):
        if f.endswith(".json"):
            st = load_state(os.path.join(state_dir, f))
            if st:
                out.append(st)
    return out
