"""maestro_torch: a multi-path collective backend for torch.distributed.

    import torch.distributed as dist
    dist.init_process_group(backend="maestro")   # under torchrun
    dist.all_reduce(t)

Importing this package registers the backend (devices=["cpu", "cuda"]: CUDA
tensors travel through pinned host memory, see MAESTRO_STAGING); the
``torch.distributed.backends`` entry point registers it too, so
``init_process_group("maestro")`` works without the import.

Every knob is a MAESTRO_* environment variable and a field of
:class:`Options` (passed as ``pg_options``); :func:`knobs` lists them.
"""
from __future__ import annotations

import atexit
import re

import torch
import torch.distributed as dist


def _release(version: str) -> str:
    """The release part of a torch version: 2.14.1+cu130 -> 2.14.1, 2.15.0a0+git1234 -> 2.15.0."""
    m = re.match(r"\d+\.\d+\.\d+", version)
    return m.group(0) if m else version


_REBUILD = "rebuild it: pip install --no-build-isolation -e . (scripts/env.sh does this by itself)"
try:
    from . import _C
except ImportError as e:  # typically an undefined torch symbol: built against another torch
    raise ImportError(f"maestro_torch's extension does not load with torch {torch.__version__} ({e}); it is "
                      f"built for one torch release: {_REBUILD}") from e
# The extension is compiled against one torch release's C++ ABI (c10d::Backend,
# Work, the Store): under another torch it may load and then misbehave.
_BUILT_WITH = getattr(_C, "torch_version", "(not recorded: an older build)")
if _BUILT_WITH != _release(torch.__version__):
    raise ImportError(f"maestro_torch's extension was built against torch {_BUILT_WITH}, but this is torch "
                      f"{torch.__version__}: {_REBUILD}")

__all__ = ["Options", "knobs", "path_stats", "describe", "dump", "backend_of", "ProcessGroupMaestro"]
__version__ = "0.1.0"

ProcessGroupMaestro = _C.ProcessGroupMaestro
_KNOBS = {k["name"]: k for k in _C.knobs()}


def knobs() -> list[dict]:
    """Every knob: its Options field name, MAESTRO_* variable, default and doc."""
    return [dict(k) for k in _KNOBS.values()]


def _text(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


class Options:
    """Backend options for ``init_process_group(backend="maestro", pg_options=Options(...))``
    or ``new_group(..., pg_options=...)``. Each field overrides its MAESTRO_*
    environment variable; values are checked when the Options are made.

    Fields: {fields}
    """

    def __init__(self, **fields):
        unknown = sorted(set(fields) - set(_KNOBS))
        if unknown:
            raise TypeError(
                f"unknown maestro option(s) {', '.join(unknown)}; known: {', '.join(_KNOBS)}"
            )
        self._fields = {k: _text(v) for k, v in fields.items() if v is not None}
        _C.resolve_config(self._fields)  # raises ValueError/RuntimeError naming the bad field

    def as_dict(self) -> dict[str, str]:
        return dict(self._fields)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self._fields.items())
        return f"maestro_torch.Options({inner})"


Options.__doc__ = Options.__doc__.format(
    fields="".join(f"\n      {k['name']} ({k['env']}, default {k['default'] or 'unset'}): {k['doc']}" for k in _KNOBS.values())
)


def _create_backend(dist_opts, pg_options):
    if pg_options is None:
        options = {}
    elif isinstance(pg_options, Options):
        options = pg_options.as_dict()
    elif isinstance(pg_options, dict):
        options = Options(**pg_options).as_dict()
    else:
        raise TypeError(f"pg_options for the maestro backend must be maestro_torch.Options, got {type(pg_options).__name__}")
    # The default group's ranks of this group's (empty for the default
    # group): a subgroup sends on the default group's paths.
    return _C.ProcessGroupMaestro(
        dist_opts.store, dist_opts.group_rank, dist_opts.group_size, dist_opts.timeout, options,
        list(dist_opts.global_ranks_in_group),
    )


def _register() -> None:
    """Register the "maestro" backend with torch.distributed (idempotent)."""
    if "MAESTRO" in dist.Backend._plugins:
        return
    # A script (or a framework: Lightning) that ends without
    # destroy_process_group: its groups say goodbye on their paths at the
    # interpreter's exit, so the peers do not log it as a crash. A process
    # killed or ended by os._exit still is one to them.
    atexit.register(_C._abort_all_at_exit)
    dist.Backend.register_backend("maestro", _create_backend, extended_api=True, devices=["cpu", "cuda"])


def backend_of(group=None) -> ProcessGroupMaestro:
    """The maestro backend object of `group` (default: the world group)."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    # The CPU backend, or the CUDA one ("cpu:gloo,cuda:maestro" puts maestro there only).
    found = []
    for device in ("cpu", "cuda"):
        try:
            backend = pg._get_backend(torch.device(device))
        except RuntimeError:  # no backend for that device in this group
            continue
        if isinstance(backend, ProcessGroupMaestro):
            return backend
        found.append(f"{device}: {type(backend).__name__}")
    raise ValueError(f"this process group has no maestro backend ({', '.join(found) or 'none'})")


def path_stats(group=None) -> list[dict]:
    """Per-path counters of this rank: one dict per (peer, path) with bytes and
    chunks each way, errors, resent chunks, state (up/suspect/down), measured
    throughput, chunk completion time and probe RTT. `peer` is the rank in
    `group`, `global_peer` the rank in the world. `nic_counters` holds the
    NIC's congestion and loss counters on verbs (DCQCN's CNP/ECN counters
    where the device has them, retransmissions and sequence errors):
    device-wide values, empty on TCP or where the device exposes none.
    `congestion` is the TCP congestion control the path's connection runs
    (MAESTRO_TCP_CONGESTION, else the kernel's default; "" on verbs), and
    `path_counters` that connection's own counters since it opened: on TCP,
    TCP_INFO's tcp_bytes_sent, tcp_bytes_retrans and tcp_total_retrans
    (segments) -- the loss the kernel recovered from; empty on verbs."""
    stats = backend_of(group).path_stats()
    for s in stats:
        s["global_peer"] = s["peer"] if group is None else dist.get_global_rank(group, s["peer"])
    return stats


def describe(group=None) -> str:
    """The group's transport, vNICs, knob values and path table (what
    MAESTRO_DEBUG=INFO prints at start-up)."""
    return backend_of(group).describe()


def dump(group=None, file=None) -> dict:
    """The group's flight record: its last 64 operations (sequence number,
    op, input bytes, state queued/running/completed/failed, unix times queued,
    started and ended, error) and every path's counters (the fields of
    :func:`path_stats`, as MAESTRO_METRICS writes them). With `file`, also
    written there as JSON. MAESTRO_DUMP writes the same by itself when an
    operation fails or times out. Torch's own recorder
    (``torch._C._distributed_c10d.FlightRecorderHook.attach(group)``) records
    the calls on a maestro group too; this record adds maestro's side."""
    import json

    text = backend_of(group).dump_json()
    if file is not None:
        with open(file, "w") as f:
            f.write(text)
    return json.loads(text)


if dist.is_available():
    _register()
