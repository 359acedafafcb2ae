"""Runs INSIDE the Soft-RoCE VM (scripts/softroce/run.sh): two rank processes
use init_process_group("maestro") with MAESTRO_TRANSPORT=verbs over the VM's
four aliases; a small allreduce and allgather are verified, and every path's
queue pair must carry the RoCEv2 GID index of its own alias (the transport
reads it back with ibv_query_qp), and path_stats() must report the NIC's
counters. Tensors stay tiny: torch runs ~1000x
slower under emulation. Exit code 0 = everything checked."""
import multiprocessing as mp
import os
import re
import socket
import sys
import time
import traceback


def roce_gid_index(ip: str) -> int:
    """The RoCEv2 GID index of `ip` on any RDMA device, from sysfs."""
    a, b, c, d = (int(x) for x in ip.split("."))
    want = f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"
    root = "/sys/class/infiniband"
    for dev in os.listdir(root):
        port = f"{root}/{dev}/ports/1"
        for idx in os.listdir(f"{port}/gids"):
            try:
                gid = open(f"{port}/gids/{idx}").read().strip()
                kind = open(f"{port}/gid_attrs/types/{idx}").read().strip()
            except OSError:
                continue
            if gid == want and kind == "RoCE v2":
                return int(idx)
    raise LookupError(f"no RoCEv2 GID for {ip}")


def rank_main(rank, world, port, out):
    try:
        os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                           "WORLD_SIZE": str(world), "MAESTRO_TRANSPORT": "verbs"})
        t0 = time.time()
        import torch  # imported already, before the fork (main)
        import torch.distributed as dist
        import maestro_torch

        dist.init_process_group("maestro")
        t = torch.full((1000,), float(rank + 1))
        dist.all_reduce(t)
        assert torch.equal(t, torch.full((1000,), float(sum(range(1, world + 1))))), "allreduce result"
        outs = [torch.empty(100, dtype=torch.int32) for _ in range(world)]
        dist.all_gather(outs, torch.arange(100, dtype=torch.int32) + rank * 1000)
        for r in range(world):
            assert torch.equal(outs[r], torch.arange(100, dtype=torch.int32) + r * 1000), f"allgather block {r}"
        # Beyond the ring collectives, over verbs too: point to point (many
        # chunks), all_to_all_single with uneven splits, reduce, gather and
        # PREMUL_SUM.
        right, left = (rank + 1) % world, (rank - 1) % world
        big = torch.arange(300000, dtype=torch.float32) + rank
        got = torch.empty_like(big)
        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, big, right), dist.P2POp(dist.irecv, got, left)]):
            w.wait()
        assert torch.equal(got, torch.arange(300000, dtype=torch.float32) + left), "send/recv"
        sends = [(rank + 1) * (j + 1) * 1000 for j in range(world)]
        receives = [(j + 1) * (rank + 1) * 1000 for j in range(world)]
        x = torch.cat([torch.full((n,), float(rank * 10 + j)) for j, n in enumerate(sends)])
        y = torch.empty(sum(receives))
        dist.all_to_all_single(y, x, receives, sends)
        assert torch.equal(y, torch.cat([torch.full((n,), float(j * 10 + rank)) for j, n in enumerate(receives)])), \
            "all_to_all_single"
        r = torch.full((100000,), float(rank + 1))
        dist.reduce(r, dst=world - 1)
        want = float(sum(range(1, world + 1))) if rank == world - 1 else float(rank + 1)
        assert torch.equal(r, torch.full((100000,), want)), "reduce"
        blocks = [torch.empty(50, dtype=torch.int64) for _ in range(world)] if rank == 0 else None
        dist.gather(torch.full((50,), rank, dtype=torch.int64), blocks, dst=0)
        assert rank != 0 or all(torch.equal(b, torch.full((50,), i, dtype=torch.int64)) for i, b in enumerate(blocks)), \
            "gather"
        p = torch.full((1000,), float(rank + 1))
        dist.all_reduce(p, op=dist._make_nccl_premul_sum(0.5))
        assert torch.equal(p, torch.full((1000,), sum(range(1, world + 1)) * 0.5)), "PREMUL_SUM"
        backend = maestro_torch.backend_of()
        assert backend.transport == "verbs", backend.transport
        vnics = os.environ["MAESTRO_VNICS"].split(",")
        checked = []
        for s in maestro_torch.path_stats():
            m = re.match(r"(\S+) -> \S+ gid_idx (\d+)", s["addresses"])
            assert m, f"no gid in {s['addresses']!r}"
            local, gid = m.group(1), int(m.group(2))
            assert local == vnics[s["path"] % len(vnics)], f"path {s['path']} starts at {local}"
            assert gid == roce_gid_index(local), f"path {s['path']}: QP uses GID {gid}, alias {local} has {roce_gid_index(local)}"
            assert s["bytes_sent"] + s["bytes_received"] > 0 or s["path"] >= 0
            # Soft-RoCE's retransmission / sequence-error counters (it has no CNP ones).
            assert "rcvd_seq_err" in s["nic_counters"], f"path {s['path']}: nic_counters {s['nic_counters']}"
            checked.append((s["path"], local, gid))
        if rank == 0:
            # maestro-vnic shows every alias with the GID index its QP uses.
            from maestro_torch import vnic

            listing = vnic.describe(os.environ["MAESTRO_SOFTROCE_NIC"])
            for ip in vnics:
                line = next((l for l in listing.splitlines() if f" {ip}/" in l), "")
                assert f"RoCEv2 GID index {roce_gid_index(ip)}" in line, f"maestro-vnic list: {line!r}\n{listing}"
        dist.barrier()
        dist.destroy_process_group()
        out.put((rank, "ok", f"{time.time() - t0:.0f} s, paths {sorted(checked)}"))
    except BaseException as e:  # noqa: BLE001
        out.put((rank, "error", f"{e}\n{traceback.format_exc()}"))


def main():
    world = 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # torch is imported once, here, and the ranks are forked from this
    # process: under emulation an import of torch takes minutes of CPU, and
    # spawned ranks would each import it again.
    t0 = time.time()
    import torch  # noqa: F401
    import maestro_torch  # noqa: F401

    print(f"torch and maestro_torch imported in {time.time() - t0:.0f} s", flush=True)
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, world, port, out)) for r in range(world)]
    for p in procs:
        p.start()
    results = {}
    deadline = time.time() + float(os.environ.get("TORCH_VM_TIMEOUT", "480"))
    while len(results) < world and time.time() < deadline:
        try:
            rank, status, text = out.get(timeout=5)
            results[rank] = (status, text)
            print(f"rank {rank}: {status}: {text}", flush=True)
        except Exception:  # noqa: BLE001 - queue.Empty
            if not any(p.is_alive() for p in procs) and out.empty():
                break
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
    ok = len(results) == world and all(s == "ok" for s, _ in results.values())
    print("torch over verbs:", "PASS" if ok else "FAIL", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
