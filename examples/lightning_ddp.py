"""PyTorch Lightning on maestro: a small MLP trained with Lightning's DDP
strategy on 2 CPU processes, the process group on maestro (or gloo).

    python examples/lightning_ddp.py --backend maestro --out /tmp/lightning_maestro.pt
    python examples/lightning_ddp.py --backend gloo --out /tmp/lightning_gloo.pt

No torchrun: Lightning starts the second rank itself (it runs this script
again with its rank in the environment), initialises the process group with
Trainer(strategy=DDPStrategy(process_group_backend=...)) -- "maestro" is found
through maestro_torch's entry point -- and wraps the model in
DistributedDataParallel: gradients are all-reduced over maestro's paths.
Lightning never calls destroy_process_group; maestro's groups say goodbye at
the interpreter's exit, so neither rank logs the other's end as a crash.

A fixed synthetic regression set, fixed seeds and one thread per rank: the
same run on any backend. Rank 0 prints the loss of every step (the mean over
the ranks, summed in rank order), a summary, and with --out saves the final
weights (torch.save of the state_dict).
"""
import time

import lightning as L
import torch
import torch.distributed as dist
import torch.nn.functional as F
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader

from common import maestro_traffic, parser, regression_dataset, regression_mlp

class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = regression_mlp()
        self.losses = []

    def training_step(self, batch, step):
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        every = [torch.zeros(()) for _ in range(self.trainer.world_size)]
        dist.all_gather(every, loss.detach())
        self.losses.append(sum(l.item() for l in every) / len(every))  # summed in rank order
        if self.global_rank == 0:
            print(f"step {self.global_step} loss {self.losses[-1]:.8f}", flush=True)
        return loss

    def on_train_start(self):
        self.start = time.perf_counter()  # fit itself starts rank 1 first

    def on_train_end(self):
        self.elapsed = time.perf_counter() - self.start

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


def main():
    ap = parser(__doc__, steps=24)
    ap.add_argument("--batch", type=int, default=32, help="samples per rank and step")
    ap.add_argument("--out", help="save the final weights here (rank 0)")
    args = ap.parse_args()

    torch.set_num_threads(1)  # the same kernels on every run: deterministic losses
    L.seed_everything(args.seed, verbose=False)  # the same initial weights on every rank
    model = Regressor()
    trainer = L.Trainer(strategy=DDPStrategy(process_group_backend=args.backend), accelerator="cpu", devices=2,
                        max_steps=args.steps, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    # shuffle=True: Lightning gives each rank a DistributedSampler (seed 0, set_epoch per epoch).
    data = DataLoader(regression_dataset(args.seed), batch_size=args.batch, shuffle=True)
    trainer.fit(model, data)

    traffic = maestro_traffic()  # the group outlives fit: Lightning does not destroy it
    if trainer.global_rank == 0:
        if args.out:
            torch.save(model.state_dict(), args.out)
        print(f"lightning on {dist.get_backend()}: {trainer.world_size} ranks, {trainer.global_step} steps, "
              f"{sum(p.numel() for p in model.parameters())} parameters, {model.elapsed:.2f} s{traffic}", flush=True)


if __name__ == "__main__":
    main()
