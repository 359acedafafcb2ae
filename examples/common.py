"""What the example workloads (fsdp2.py, pipeline.py, moe.py, and the
framework examples lightning_ddp.py and accelerate_ddp.py) share: their
command line, the start of a deterministic run, the framework examples'
regression task, and the line saying how much went over maestro's paths."""
import argparse

import torch
import torch.distributed as dist


def parser(doc: str, steps: int) -> argparse.ArgumentParser:
    """--backend, --steps and --seed; an example adds its own options."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--backend", default="maestro", help="maestro or gloo (CPU)")
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--seed", type=int, default=0)
    return ap


def join_group(backend: str) -> tuple[int, int]:
    """The process group on `backend` (under torchrun); returns (rank, world)."""
    torch.set_num_threads(1)  # the same kernels on every run: deterministic losses
    dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size()


def maestro_traffic(group=None) -> str:
    """How much this rank sent over maestro's paths ("" on another backend)."""
    if dist.get_backend(group) != "maestro":
        return ""
    import maestro_torch

    sent = [s["bytes_sent"] for s in maestro_torch.path_stats(group)]
    return f", rank 0 sent {sum(sent) / 1e6:.2f} MB over {sum(1 for b in sent if b)} maestro paths"


# The framework examples' task: a small MLP on a fixed synthetic regression set.
REGRESSION_IN, REGRESSION_HIDDEN, REGRESSION_OUT, REGRESSION_SAMPLES = 32, 64, 4, 512


def regression_dataset(seed: int):
    """y = tanh(x A) + noise: learnable, and the same tensors on every rank and run."""
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(REGRESSION_SAMPLES, REGRESSION_IN, generator=g)
    y = torch.tanh(x @ torch.randn(REGRESSION_IN, REGRESSION_OUT, generator=g)) + \
        0.05 * torch.randn(REGRESSION_SAMPLES, REGRESSION_OUT, generator=g)
    return TensorDataset(x, y)


def regression_mlp() -> torch.nn.Module:
    n = torch.nn
    return n.Sequential(n.Linear(REGRESSION_IN, REGRESSION_HIDDEN), n.ReLU(),
                        n.Linear(REGRESSION_HIDDEN, REGRESSION_HIDDEN), n.ReLU(),
                        n.Linear(REGRESSION_HIDDEN, REGRESSION_OUT))
