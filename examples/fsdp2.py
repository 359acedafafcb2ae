"""FSDP2 on maestro: a small transformer trained with fully sharded data
parallelism (torch.distributed.fsdp.fully_shard) on CPU.

    torchrun --nproc_per_node 2 examples/fsdp2.py --backend maestro
    torchrun --nproc_per_node 2 examples/fsdp2.py --backend gloo

Every block and then the whole model is one FSDP unit: parameters live as
shards (DTensors on a 1-D "cpu" DeviceMesh), each forward and backward
all-gathers a unit's parameters (all_gather_into_tensor) and backward
reduce-scatters its gradients (reduce_scatter_tensor). Each rank trains on its
own batch of a synthetic next-token task, the same one on every backend (fixed
seeds), so maestro and gloo print the same losses. Rank 0 prints one line per
step (the mean loss over the ranks) and a summary.
"""
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from common import join_group, maestro_traffic, parser

VOCAB, DIM, HEADS, LAYERS, SEQ = 64, 64, 4, 2, 16


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, DIM))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.randn(SEQ, DIM) * 0.02)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x).flatten(0, 1))  # logits (batch * seq, vocab)


def batch(seed, rank, step, size):
    """A learnable sequence task: token t+1 = (3 * token t + 1) mod VOCAB, from
    a random start; each (rank, step) its own samples, the same on any backend."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + rank * 1009 + step)
    start = torch.randint(0, VOCAB, (size, 1), generator=g)
    seq = [start]
    for _ in range(SEQ):
        seq.append((3 * seq[-1] + 1) % VOCAB)
    seq = torch.cat(seq, dim=1)
    return seq[:, :-1], seq[:, 1:]


def main():
    ap = parser(__doc__, steps=5)
    ap.add_argument("--batch", type=int, default=8, help="samples per rank and step")
    args = ap.parse_args()

    rank, world = join_group(args.backend)
    mesh = init_device_mesh("cpu", (world,))

    torch.manual_seed(args.seed)  # the same full model on every rank before sharding
    model = TinyLM()
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

    start = time.perf_counter()
    for step in range(args.steps):
        x, y = batch(args.seed, rank, step, args.batch)
        loss = F.cross_entropy(model(x), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        # The mean over ranks, summed in rank order on rank 0: the printed value
        # does not depend on how a backend orders an allreduce.
        losses = [torch.zeros(1) for _ in range(world)]
        dist.all_gather(losses, loss.detach().reshape(1))
        if rank == 0:
            print(f"step {step} loss {sum(l.item() for l in losses) / world:.8f}", flush=True)
    elapsed = time.perf_counter() - start

    shards = sum(p.to_local().numel() for p in model.parameters())
    full = sum(p.numel() for p in model.parameters())
    traffic = maestro_traffic(mesh.get_group())
    if rank == 0:
        print(f"fsdp2 on {dist.get_backend()}: {world} ranks, {args.steps} steps, {full} parameters "
              f"({shards} on rank 0), {elapsed:.2f} s{traffic}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
