"""Mixture of experts on maestro: one expert per rank, top-1 gating, tokens
sent to their expert and back with all_to_all_single, trained on CPU.

    torchrun --nproc_per_node 2 examples/moe.py --backend maestro
    torchrun --nproc_per_node 4 examples/moe.py --backend maestro
    torchrun --nproc_per_node 2 examples/moe.py --backend gloo

Expert parallelism as in Switch Transformer: every rank holds the shared
layers (input projection, router, head; their gradients averaged over the
ranks with all_reduce) and one expert (its own parameters, which see the
tokens of every rank). Each step every rank routes its own tokens: the router
picks one expert per token, the tokens are grouped by expert, the ranks first
exchange how many tokens each will send to each (all_to_all_single of the
counts), then the tokens themselves (all_to_all_single with those uneven split
sizes). Each expert runs on what it received and the results go back the same
way, reversed; backward moves the gradients along the same routes. Rank 0
prints the mean loss over the ranks per step and a summary with the tokens
each expert got in the last step.
"""
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from common import join_group, maestro_traffic, parser

IN, DIM, HIDDEN, CLASSES = 16, 32, 128, 8
AUX_WEIGHT = 0.01  # Switch Transformer's load-balancing loss


class AllToAll(torch.autograd.Function):
    """all_to_all_single with autograd: rows of `x` go out in runs of
    `send` rows per rank and come in as runs of `recv` rows per rank; the
    gradient goes back the other way."""

    @staticmethod
    def forward(ctx, x, send, recv):
        ctx.send, ctx.recv = send, recv
        out = x.new_empty((sum(recv), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send)
        return out

    @staticmethod
    def backward(ctx, grad):
        out = grad.new_empty((sum(ctx.send), *grad.shape[1:]))
        dist.all_to_all_single(out, grad.contiguous(), output_split_sizes=ctx.send, input_split_sizes=ctx.recv)
        return out, None, None


class MoELayer(nn.Module):
    """Top-1 routed feed-forward layer whose expert `rank` lives on this rank."""

    def __init__(self, world):
        super().__init__()
        self.world = world
        self.router = nn.Linear(DIM, world)
        self.expert = nn.Sequential(nn.Linear(DIM, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, DIM))
        self.last_counts = None

    def forward(self, h):
        probs = self.router(h).softmax(dim=-1)
        weight, choice = probs.max(dim=-1)
        order = torch.argsort(choice, stable=True)  # tokens grouped by expert (= rank)
        send_counts = torch.bincount(choice, minlength=self.world)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts)  # the split sizes first
        send, recv = send_counts.tolist(), recv_counts.tolist()
        self.last_counts = send_counts

        arrived = AllToAll.apply(h[order], send, recv)     # to the experts
        done = AllToAll.apply(self.expert(arrived), recv, send)  # and back
        out = torch.empty_like(done).index_copy(0, order, done)  # original token order
        # Load-balancing loss: fraction of tokens per expert times its mean probability.
        aux = self.world * (send_counts.to(probs.dtype) / len(h) * probs.mean(dim=0)).sum()
        return h + weight.unsqueeze(-1) * out, aux


class Model(nn.Module):
    def __init__(self, world):
        super().__init__()
        self.inp = nn.Linear(IN, DIM)
        self.moe = MoELayer(world)
        self.head = nn.Sequential(nn.LayerNorm(DIM), nn.Linear(DIM, CLASSES))

    def forward(self, x):
        h, aux = self.moe(F.gelu(self.inp(x)))
        return self.head(h), aux


def batch(seed, rank, step, size, teacher):
    """This rank's tokens for this step, labelled by a fixed random teacher
    network: each (rank, step) its own, the same on any backend."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + rank * 1009 + step)
    x = torch.randn(size, IN, generator=g)
    with torch.no_grad():
        y = teacher(x).argmax(dim=1)
    return x, y


def main():
    ap = parser(__doc__, steps=6)
    ap.add_argument("--tokens", type=int, default=64, help="tokens per rank and step")
    args = ap.parse_args()

    rank, world = join_group(args.backend)

    torch.manual_seed(args.seed)  # shared layers and the teacher: the same on every rank
    model = Model(world)
    teacher = nn.Sequential(nn.Linear(IN, 64), nn.Tanh(), nn.Linear(64, CLASSES))
    torch.manual_seed(args.seed + 1 + rank)  # each rank's expert its own
    for layer in model.moe.expert:
        if isinstance(layer, nn.Linear):
            layer.reset_parameters()
    shared = [p for n, p in model.named_parameters() if not n.startswith("moe.expert.")]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

    start = time.perf_counter()
    for step in range(args.steps):
        x, y = batch(args.seed, rank, step, args.tokens, teacher)
        logits, aux = model(x)
        task = F.cross_entropy(logits, y)
        opt.zero_grad()
        (task + AUX_WEIGHT * aux).backward()
        # Data parallel for the shared layers: average their gradients. The
        # expert's gradient already holds every rank's tokens.
        flat = torch.cat([p.grad.reshape(-1) for p in shared])
        dist.all_reduce(flat)
        flat /= world
        offset = 0
        for p in shared:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        opt.step()
        # The mean over ranks, summed in rank order on rank 0: the printed value
        # does not depend on how a backend orders an allreduce.
        losses = [torch.zeros(1) for _ in range(world)]
        dist.all_gather(losses, task.detach().reshape(1))
        if rank == 0:
            print(f"step {step} loss {sum(l.item() for l in losses) / world:.8f}", flush=True)
    elapsed = time.perf_counter() - start

    counts = model.moe.last_counts.clone()
    dist.all_reduce(counts)
    traffic = maestro_traffic()
    if rank == 0:
        print(f"moe on {dist.get_backend()}: {world} experts (one per rank), {args.tokens} tokens per rank, "
              f"{args.steps} steps, tokens per expert at the last step {counts.tolist()}, {elapsed:.2f} s{traffic}",
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
