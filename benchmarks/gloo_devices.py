"""gloo with one device per local address: the best a user can get from gloo
on a host with several IP aliases (vNICs), to compare maestro with.

ProcessGroupGloo takes a list of devices in its Options and gives each
collective to the next device in turn (round robin over whole collectives,
never one collective split over devices), so several collectives in flight
at once, as DDP's gradient buckets are, can use several paths; a single
collective uses one. GLOO_SOCKET_IFNAME=eth0,eth1 does the same with one
device per interface, but aliases of one interface need one device per
address, and torch's gloo backend drops pg_options. So this registers a
backend, "gloo_devices", that builds a ProcessGroupGloo from those Options:

    import gloo_devices
    g = gloo_devices.new_group(["10.1.0.10", "10.1.0.11"])   # every rank its own addresses
    dist.init_process_group(gloo_devices.BACKEND, pg_options=gloo_devices.options(addrs))

Device i of every rank listens on its address i and connects to the peers'
address i (gloo binds the listening socket, not the connecting one: the
source address is the one the route to the peer picks), so every rank must
pass as many addresses, in the order of its aliases; a network that pins
aliases to spines by destination (the lab's pinned mode) or hashes 5-tuples
(ECMP) then sees one flow per device and pair. Like torch's
GLOO_SOCKET_IFNAME path, the group gets 2 worker threads per device
(collectives in flight at once).
"""
from __future__ import annotations

import datetime
import os

import torch.distributed as dist
from torch.distributed import ProcessGroupGloo

BACKEND = "gloo_devices"
THREADS_PER_DEVICE = 2


def parse(addresses: str | list[str]) -> list[str]:
    """A comma-separated list (or a list) of addresses; "vnics" means this
    host's vNIC addresses as maestro takes them (MAESTRO_VNICS)."""
    if isinstance(addresses, str):
        if addresses == "vnics":
            addresses = os.environ.get("MAESTRO_VNICS", "")
            if not addresses:
                raise ValueError("gloo devices 'vnics': MAESTRO_VNICS is not set (comma-separated local addresses)")
        addresses = [a.strip() for a in addresses.split(",") if a.strip()]
    if not addresses:
        raise ValueError("gloo devices: no address given")
    return list(addresses)


def options(addresses: str | list[str], timeout: datetime.timedelta | None = None) -> ProcessGroupGloo._Options:
    """ProcessGroupGloo Options with one TCP device bound to each address."""
    opts = ProcessGroupGloo._Options()
    opts._devices = [ProcessGroupGloo.create_device(hostname=a) for a in parse(addresses)]
    opts._threads = THREADS_PER_DEVICE * len(opts._devices)
    if timeout is not None:
        opts._timeout = timeout
    return opts


def _create(dist_opts, pg_options) -> ProcessGroupGloo:
    if not isinstance(pg_options, ProcessGroupGloo._Options) or not pg_options._devices:
        raise ValueError(f"backend {BACKEND!r} needs pg_options=gloo_devices.options([addresses])")
    pg_options._timeout = dist_opts.timeout
    pg_options.global_ranks_in_group = dist_opts.global_ranks_in_group
    pg_options.group_name = dist_opts.group_id
    return ProcessGroupGloo(dist_opts.store, dist_opts.group_rank, dist_opts.group_size, pg_options)


def register() -> None:
    """Make BACKEND known to torch.distributed (idempotent)."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])


def new_group(addresses: str | list[str], **kw):
    """dist.new_group over every rank (or kw's ranks) on gloo with one device
    per address."""
    register()
    return dist.new_group(backend=BACKEND, pg_options=options(addresses), **kw)


def device_count(group) -> int:
    """The devices of a group's gloo backend (what the Options carried)."""
    import torch

    return len(group._get_backend(torch.device("cpu")).options._devices)
