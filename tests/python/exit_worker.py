"""A rank process that ends as a script does, for the clean-exit tests:
    python exit_worker.py RANK WORLD PORT HOW
HOW: "exit" (returns from the script without destroy_process_group),
"destroy" (destroy_process_group first), "crash" (os._exit: no goodbye).
The store is the test's (on PORT). Every rank allreduces once; then the last rank ends
as HOW says while the others wait for it to be gone, then end normally."""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

import maestro_torch  # noqa: F401

rank, world, port, how = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
store = dist.TCPStore("127.0.0.1", port, world, False, timeout=datetime.timedelta(seconds=60))
dist.init_process_group("maestro", store=store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
t = torch.ones(1000)
dist.all_reduce(t)
assert bool(torch.all(t == world))
dist.barrier()
if rank == world - 1:
    store.set("leaving", "1")
    if how == "crash":
        os._exit(0)
    if how == "destroy":
        dist.destroy_process_group()
    sys.exit(0)  # "exit" and "destroy": the interpreter ends as usual
store.wait(["leaving"])
time.sleep(3)  # the peer's exit (and its goodbye or its closed sockets) reaches this rank
print("DONE", flush=True)
