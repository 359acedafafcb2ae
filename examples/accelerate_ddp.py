"""Hugging Face Accelerate on maestro: a small MLP trained by an
Accelerator(cpu=True) loop on 2 CPU processes, the process group on maestro
(or gloo).

    torchrun --nproc_per_node 2 examples/accelerate_ddp.py --backend maestro --out /tmp/accelerate_maestro.pt
    torchrun --nproc_per_node 2 examples/accelerate_ddp.py --backend gloo --out /tmp/accelerate_gloo.pt

accelerator.prepare wraps the model in DistributedDataParallel (gradients
all-reduced over maestro's paths) and shards the data loader over the ranks;
accelerator.gather collects the losses.

Accelerate (1.15) does not take maestro from
InitProcessGroupKwargs(backend="maestro") with cpu=True: on CPU it accepts
only "gloo" or "mpi" and raises "Your assigned backend maestro is not
available, please use gloo" (PartialState._prepare_backend in
accelerate/state.py) before any process group exists. It does adopt a
default process group that is already initialised, so the group is made
first, on any backend, and then the Accelerator (which then reports
"Backend: gloo" in its state, a label only: the collectives run on the
group made here).

A fixed synthetic regression set, fixed seeds and one thread per rank: the
same run on any backend. Rank 0 prints the loss of every step (the mean over
the ranks, summed in rank order), a summary, and with --out saves the final
weights (torch.save of the state_dict).
"""
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader

from common import join_group, maestro_traffic, parser, regression_dataset, regression_mlp

def main():
    ap = parser(__doc__, steps=24)
    ap.add_argument("--batch", type=int, default=32, help="samples per rank and step")
    ap.add_argument("--out", help="save the final weights here (rank 0)")
    args = ap.parse_args()

    join_group(args.backend)  # see above: Accelerate adopts this group
    accelerator = Accelerator(cpu=True)
    torch.set_num_threads(1)  # Accelerate sets its own count where OMP_NUM_THREADS is unset
    set_seed(args.seed)  # the same initial weights on every rank, the same shuffles
    model = regression_mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = DataLoader(regression_dataset(args.seed), batch_size=args.batch, shuffle=True)
    model, opt, data = accelerator.prepare(model, opt, data)

    step, start = 0, time.perf_counter()
    while step < args.steps:
        for x, y in data:
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            accelerator.backward(loss)
            opt.step()
            every = accelerator.gather(loss.detach())  # (world,) in rank order
            if accelerator.is_main_process:
                print(f"step {step} loss {sum(l.item() for l in every) / len(every):.8f}", flush=True)
            step += 1
            if step == args.steps:
                break
    elapsed = time.perf_counter() - start

    weights = accelerator.unwrap_model(model).state_dict()
    traffic = maestro_traffic()
    if accelerator.is_main_process:
        if args.out:
            torch.save(weights, args.out)
        print(f"accelerate on {dist.get_backend()}: {accelerator.num_processes} ranks, {step} steps, "
              f"{sum(p.numel() for p in model.parameters())} parameters, {elapsed:.2f} s{traffic}", flush=True)
    accelerator.end_training()  # destroys the process group


if __name__ == "__main__":
    main()
