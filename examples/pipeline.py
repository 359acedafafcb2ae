"""Pipeline parallelism on maestro: a residual MLP cut into one stage per
rank (torch.distributed.pipelining's PipelineStage), trained with the 1F1B
schedule (or GPipe) on CPU.

    torchrun --nproc_per_node 2 examples/pipeline.py --backend maestro
    torchrun --nproc_per_node 4 examples/pipeline.py --backend maestro --schedule gpipe
    torchrun --nproc_per_node 2 examples/pipeline.py --backend gloo

Every rank builds the same model from the same seed and keeps its own slice of
it. Each step splits the batch into microbatches; activations go forward and
their gradients backward between neighbouring stages as point-to-point
messages (isend / irecv; batch_isend_irecv where 1F1B sends and receives at
once). The last stage computes the loss; rank 0 prints
it (the mean over the microbatches, broadcast from the last stage) and a
summary. The same model is cut differently for 2 or 4 stages, so any number of
stages trains the same way.
"""
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from common import join_group, maestro_traffic, parser

IN, DIM, CLASSES, BLOCKS = 32, 128, 10, 4


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))

    def forward(self, x):
        return x + self.mlp(self.ln(x))


def build_model() -> list[nn.Module]:
    """The whole model as a list of layers: input projection, blocks, head."""
    return [nn.Linear(IN, DIM)] + [Block() for _ in range(BLOCKS)] + [nn.Sequential(nn.LayerNorm(DIM),
                                                                                    nn.Linear(DIM, CLASSES))]


def stage_layers(layers: list[nn.Module], stage: int, stages: int) -> nn.Sequential:
    """Stage `stage`'s slice: the blocks split evenly, the input projection on
    the first stage, the head on the last."""
    blocks = layers[1:-1]
    per = len(blocks) // stages
    mine = blocks[stage * per:(stage + 1) * per]
    return nn.Sequential(*([layers[0]] if stage == 0 else []), *mine, *([layers[-1]] if stage == stages - 1 else []))


def batch(seed, step, size, teacher):
    """Inputs and the labels a fixed random teacher network gives them: the
    same on every rank and backend."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(size, IN, generator=g)
    with torch.no_grad():
        y = teacher(x).argmax(dim=1)
    return x, y


def main():
    ap = parser(__doc__, steps=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--schedule", choices=["1f1b", "gpipe"], default="1f1b")
    args = ap.parse_args()

    rank, world = join_group(args.backend)
    if BLOCKS % world:
        raise SystemExit(f"{BLOCKS} blocks do not split into {world} stages: use 1, 2 or 4 ranks")

    torch.manual_seed(args.seed)
    layers = build_model()
    teacher = nn.Sequential(nn.Linear(IN, 64), nn.Tanh(), nn.Linear(64, CLASSES))
    module = stage_layers(layers, rank, world)
    stage = PipelineStage(module, rank, world, torch.device("cpu"))
    schedule_cls = Schedule1F1B if args.schedule == "1f1b" else ScheduleGPipe
    schedule = schedule_cls(stage, n_microbatches=args.microbatches, loss_fn=F.cross_entropy)
    opt = torch.optim.AdamW(module.parameters(), lr=1e-3)
    first, last = rank == 0, rank == world - 1

    start = time.perf_counter()
    for step in range(args.steps):
        x, y = batch(args.seed, step, args.batch, teacher)
        opt.zero_grad()
        losses = []
        if first and last:
            schedule.step(x, target=y, losses=losses)
        elif first:
            schedule.step(x)
        elif last:
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()
        opt.step()
        loss = torch.stack(losses).mean().reshape(1) if last else torch.zeros(1)
        dist.broadcast(loss, src=world - 1)
        if first:
            print(f"step {step} loss {loss.item():.8f}", flush=True)
    elapsed = time.perf_counter() - start

    traffic = maestro_traffic()
    if first:
        print(f"pipeline ({args.schedule}) on {dist.get_backend()}: {world} stages, {args.microbatches} "
              f"microbatches, {args.steps} steps, {elapsed:.2f} s{traffic}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
