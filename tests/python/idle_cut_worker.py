"""A rank of the lab's idle-cut test (test_lab.py): the group carries one
allreduce over every path, then sits idle while the test cuts a spine link.
It reports when its paths through that spine are seen down -- only probes
cross an idle path, so nothing else can tell -- waits for the link to come
back and for those paths to be up again, and checks an allreduce exactly.

argv: <directory the test signals in> <spine> <seconds to wait per phase>"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import maestro_torch  # noqa: F401  (registers the backend)


def wait_file(path: str, timeout: float) -> None:
    until = time.time() + timeout
    while not os.path.exists(path):
        if time.time() > until:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.05)


def states() -> dict:
    return {(s["peer"], s["path"]): s["state"] for s in maestro_torch.path_stats()}


def wait_states(want, timeout: float) -> float:
    """Seconds until every (peer, path) in `want` has its state; raise with the table otherwise."""
    t0 = time.time()
    while True:
        now = states()
        if all(now[k] == v for k, v in want.items()):
            return time.time() - t0
        if time.time() - t0 > timeout:
            raise TimeoutError(f"after {timeout} s, wanted {want}, path states {now}")
        time.sleep(0.05)


def allreduce_exact(n: int, rank: int, world: int) -> bool:
    t = torch.arange(n, dtype=torch.float32) % 977 + rank
    dist.all_reduce(t)
    return torch.equal(t, (torch.arange(n, dtype=torch.float32) % 977) * world + world * (world - 1) // 2)


def main() -> None:
    signals, spine, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    dist.init_process_group("maestro")
    rank, world = dist.get_rank(), dist.get_world_size()
    ok = [allreduce_exact(1 << 22, rank, world)]
    print("READY", flush=True)
    # Hosts 0 and 1 hang off leaf 0, 2 and 3 off leaf 1; path i is pinned to
    # spine i, so a leaf's link to the spine cuts path `spine` to the ranks
    # on the other leaf, and nothing else.
    far = [p for p in range(world) if (p < 2) != (rank < 2)]
    cut = {(p, spine): "down" for p in far}
    others = {k: "up" for k in states() if k not in cut}
    wait_file(os.path.join(signals, "cut"), timeout)
    detected = wait_states(cut, timeout)
    still_up = states()
    print("DETECTED", flush=True)
    wait_file(os.path.join(signals, "restored"), timeout)
    back = wait_states({k: "up" for k in cut}, timeout)
    ok.append(allreduce_exact(1 << 22, rank, world))
    result = {"detected_s": detected, "back_s": back, "ok": ok,
              "others_stayed_up": all(still_up[k] == "up" for k in others),
              "states_when_detected": {f"{p}/{i}": s for (p, i), s in still_up.items()}}
    print("RESULT " + json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
