"""Train a model data-parallel on maestro (or gloo, to compare) with synthetic
data, and see what maestro does for the training: samples/s, iteration time,
the communication time exposed to the step, and the bytes each of maestro's
paths carried.

    torchrun --nproc_per_node=2 benchmarks/train.py --model vgg19 --backend maestro --steps 20 --batch 8
    torchrun --nproc_per_node=2 benchmarks/train.py --model bert-large --backend gloo --steps 5 --seq-len 32
    # gloo with one device per local address (each node its own aliases, or "vnics" = MAESTRO_VNICS)
    torchrun ... benchmarks/train.py --model vgg19 --backend gloo --gloo-devices 10.0.0.10,10.0.0.11,10.0.0.12,10.0.0.13

Models: vgg19 and resnet50 from torchvision.models (weights=None: built, not
downloaded), bert-large as transformers' BertForSequenceClassification built
from a BertConfig (nothing downloaded either). Data: torchvision's FakeData
(random images) or random token ids, every sample seeded by its index and
spread over the ranks by a DistributedSampler, so a run is reproducible and
maestro's losses can be compared with gloo's step by step. Rank 0 shows a
progress bar (tqdm) and prints one line at the end; --json writes the same
figures (and per-step losses) to a file.

--gloo-devices gives gloo one device per address (benchmarks/gloo_devices.py):
gloo then hands whole collectives to its devices in turn, so DDP's gradient
buckets in flight at once can take several paths, while each collective
still takes one. It is the fair comparison for maestro on a host with vNICs.

The evaluation suite's models experiment (benchmarks/suite.py) runs this
script on the lab through scripts/labrun.py for its DDP figures, so the
recorded figures and what a user runs are one code path.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import hashlib
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

MODELS = ("vgg19", "resnet50", "bert-large")
IMAGE_CLASSES = 1000  # the ImageNet classifiers torchvision defines
BERT_LABELS = 2
BERT_VOCAB = 30522


# ---------------------------------------------------------------- models

def bert_large_config():
    """BERT-large (24 layers, hidden 1024, 16 heads, FFN 4096, vocab 30522, 512
    positions: ~335 M parameters) with a 2-label classification head.

    Why transformers and not a torch.nn encoder of the same shape: for maestro
    the two are nearly equivalent (same parameter bytes, similar gradient
    buckets), but the people maestro is for train BERT-class models as
    transformers' BertForSequenceClassification, and this builds exactly that
    from its config (no download). What it costs on top of the pinned torch
    pair (measured for transformers 5.23 on Python 3.11): about 200 MB
    installed (torch and torchvision take 5.6 GB), 24 more packages
    (huggingface_hub, tokenizers, safetensors, pydantic, ...), and 1.3 s of
    import per rank, paid only for --model bert-large (the import is lazy)."""
    from transformers import BertConfig

    return BertConfig(vocab_size=BERT_VOCAB, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                      intermediate_size=4096, max_position_embeddings=512, type_vocab_size=2,
                      num_labels=BERT_LABELS)


def build_model(name: str) -> nn.Module:
    """The model, freshly initialised from torch's global RNG (seed it first)."""
    if name == "vgg19":
        import torchvision

        return torchvision.models.vgg19(weights=None, num_classes=IMAGE_CLASSES)
    if name == "resnet50":
        import torchvision

        return torchvision.models.resnet50(weights=None, num_classes=IMAGE_CLASSES)
    if name == "bert-large":
        try:
            from transformers import BertForSequenceClassification
        except ImportError as e:
            raise SystemExit(f"--model bert-large needs transformers ({e}): pip install -r requirements/train.txt") from e
        return BertForSequenceClassification(bert_large_config())
    raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")


def parameter_shapes(name: str) -> list[tuple]:
    """Parameter shapes in registration order, from the model built on the
    meta device (nothing allocated, nothing initialised)."""
    with torch.device("meta"):
        return [tuple(p.shape) for p in build_model(name).parameters()]


def is_image_model(name: str) -> bool:
    return name in ("vgg19", "resnet50")


class RandomTokens(torch.utils.data.Dataset):
    """FakeData's counterpart for BERT: sample i is `seq_len` token ids uniform
    over BERT's vocabulary and a 2-way label, drawn from a generator seeded
    with i + random_offset (the same sample in every run)."""

    def __init__(self, size: int, seq_len: int, random_offset: int = 0):
        self.size, self.seq_len, self.random_offset = size, seq_len, random_offset

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int):
        if not 0 <= i < self.size:
            raise IndexError(i)
        g = torch.Generator().manual_seed(i + self.random_offset)
        return torch.randint(0, BERT_VOCAB, (self.seq_len,), generator=g), int(torch.randint(0, BERT_LABELS, (1,),
                                                                                             generator=g))


class SyntheticData:
    """Synthetic batches as a user's input pipeline makes them: torchvision's
    FakeData (random images, labels in [0, 1000), converted with ToTensor) or
    RandomTokens, split between the ranks by a DistributedSampler (each rank
    its own samples: data parallelism) and batched by a DataLoader. Every
    sample is seeded by its index (and --seed), so a run is reproducible and
    two runs on different backends see the same data. `samples` per rank; the
    loader starts over (next epoch) when they run out."""

    def __init__(self, model: str, batch: int, *, rank: int, world: int, samples: int, seed: int = 0,
                 image_size: int = 224, seq_len: int = 128, device="cpu"):
        size = world * max(samples, batch)
        offset = seed * 10_000_019  # distinct seeds: far more samples than any run draws
        if is_image_model(model):
            from torchvision import datasets, transforms

            ds = datasets.FakeData(size=size, image_size=(3, image_size, image_size), num_classes=IMAGE_CLASSES,
                                   transform=transforms.ToTensor(), random_offset=offset)
        else:
            ds = RandomTokens(size, seq_len, random_offset=offset)
        self.sampler = torch.utils.data.DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=False)
        self.loader = torch.utils.data.DataLoader(ds, batch_size=batch, sampler=self.sampler, drop_last=True)
        self.device, self.epoch, self.it = device, 0, iter(self.loader)

    def next(self):
        try:
            x, y = next(self.it)
        except StopIteration:
            self.epoch += 1
            self.sampler.set_epoch(self.epoch)
            self.it = iter(self.loader)
            x, y = next(self.it)
        return x.to(self.device), y.to(self.device)


def loss_of(name: str, model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    logits = model(x) if is_image_model(name) else model(input_ids=x).logits
    return F.cross_entropy(logits, y)


# ---------------------------------------------------------------- training

@dataclasses.dataclass
class Config:
    model: str = "vgg19"
    mode: str = "ddp"            # ddp | fsdp
    batch: int = 8               # per rank
    image_size: int = 224
    seq_len: int = 128
    seed: int = 0
    steps: int = 20              # batches the data is sized for (more: the next epoch)
    lr: float = 0.001
    device: str = "cpu"


@dataclasses.dataclass
class Step:
    loss: float
    iteration_s: float           # zero_grad + forward + backward (with the gradient sync) + optimizer step
    exposed_comm_s: float | None  # DDP: backward's wait for the gradient sync after the last gradient was computed


class Trainer:
    """One data-parallel training run on `group` (default: the world group):
    the model wrapped in DDP (or FSDP2's fully_shard), plain SGD, synthetic
    data. step() runs and times one training step.

    Exposed communication (DDP): a hook on every parameter notes when its
    gradient has been accumulated; when the last one has, backward's compute
    is over, and what backward() still takes after that is DDP waiting for
    the gradient allreduces that did not finish under the compute (the part
    not overlapped with backward). It is measured inside the very steps
    that train, so it cannot come out negative as a difference of two
    medians (steps with the sync minus steps without it) can on a busy
    machine. It does not count compute slowed down by communication running
    beside it (on a CPU the two share cores): compute_step() (--compute-steps)
    gives the compute-only baseline for that difference."""

    def __init__(self, cfg: Config, group=None):
        self.cfg, self.group = cfg, group
        self.rank = dist.get_rank(group)
        torch.manual_seed(cfg.seed)  # the same initial model on every rank and in every run
        model = build_model(cfg.model).to(cfg.device)
        self.parameters = sum(p.numel() for p in model.parameters())
        torch.manual_seed(cfg.seed + 1 + self.rank)  # dropout: per rank, reproducible
        self._last_grad = None
        if cfg.mode == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP

            # gradient_as_bucket_view: gradients live in DDP's buckets instead
            # of beside them (BERT-large: 1.3 GB less per rank); same numbers.
            self.model = DDP(model, process_group=group, gradient_as_bucket_view=True,
                             device_ids=[torch.device(cfg.device).index] if cfg.device.startswith("cuda") else None)
            for p in model.parameters():
                if p.requires_grad:
                    p.register_post_accumulate_grad_hook(self._grad_ready)
        elif cfg.mode == "fsdp":
            self.model = fsdp_wrap(cfg.model, model, group)
        else:
            raise ValueError(f"mode {cfg.mode!r}: ddp or fsdp")
        self.opt = torch.optim.SGD(self.model.parameters(), lr=cfg.lr)
        self.data = SyntheticData(cfg.model, cfg.batch, rank=self.rank, world=dist.get_world_size(group),
                                  samples=cfg.batch * cfg.steps, seed=cfg.seed, image_size=cfg.image_size,
                                  seq_len=cfg.seq_len, device=cfg.device)

    def _grad_ready(self, _param) -> None:
        self._last_grad = time.perf_counter()

    def _sync_device(self) -> None:
        if self.cfg.device.startswith("cuda"):
            torch.cuda.synchronize()

    def step(self) -> Step:
        batch = self.data.next()
        self._sync_device()
        t0 = time.perf_counter()
        self.opt.zero_grad()
        loss = loss_of(self.cfg.model, self.model, batch)
        self._last_grad = None
        loss.backward()
        t_backward = time.perf_counter()
        self.opt.step()
        self._sync_device()
        t1 = time.perf_counter()
        exposed = None
        # On a GPU the host returns before the kernels finish: the hooks'
        # host times say nothing about the sync there.
        if self.cfg.mode == "ddp" and self._last_grad is not None and not self.cfg.device.startswith("cuda"):
            exposed = max(0.0, t_backward - self._last_grad)
        return Step(loss=loss.item(), iteration_s=t1 - t0, exposed_comm_s=exposed)

    def compute_step(self) -> float:
        """Forward and backward without the gradient sync (DDP's no_sync), no
        optimizer step (the replicas stay equal): the compute-only time of
        the part of a step that step()'s iteration_s minus its optimizer step
        times, for `iteration - compute` comparisons."""
        if self.cfg.mode != "ddp":
            raise ValueError("compute-only steps need DDP's no_sync (not available under --fsdp)")
        batch = self.data.next()
        self._sync_device()
        t0 = time.perf_counter()
        self.opt.zero_grad()
        with self.model.no_sync():
            loss_of(self.cfg.model, self.model, batch).backward()
        self._sync_device()
        t = time.perf_counter() - t0
        self.opt.zero_grad()
        return t

    def params_sha256(self) -> str:
        """A digest of this rank's parameter bytes (under FSDP: of its shards):
        with DDP equal on every rank, and equal across backends whenever
        their reductions are exact."""
        h = hashlib.sha256()
        for p in self.model.parameters():
            t = p.detach()
            if hasattr(t, "to_local"):  # FSDP2: a DTensor, this rank's shard
                t = t.to_local()
            h.update(t.cpu().contiguous().view(torch.uint8).numpy().tobytes())
        return h.hexdigest()


def fsdp_wrap(name: str, model: nn.Module, group) -> nn.Module:
    """FSDP2 (fully_shard): each block its own unit, then the root. Runs on
    maestro's CPU backend: it needs all_gather_into_tensor and
    reduce_scatter_tensor, which maestro implements."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(group or dist.group.WORLD, device_type=torch.device(next(model.parameters()).device).type)
    if name == "vgg19":
        blocks = [model.features, model.classifier]
    elif name == "resnet50":
        blocks = [model.layer1, model.layer2, model.layer3, model.layer4]
    else:
        blocks = list(model.bert.encoder.layer)
    for b in blocks:
        fully_shard(b, mesh=mesh)
    return fully_shard(model, mesh=mesh)


# ---------------------------------------------------------------- reporting

def path_bytes(group=None) -> dict | None:
    """{(peer, path): bytes sent} on this rank's maestro group, None for another backend."""
    try:
        import maestro_torch

        return {(s["peer"], s["path"]): s["bytes_sent"] for s in maestro_torch.path_stats(group)}
    except (ImportError, ValueError, RuntimeError):
        return None


def summarize(steps: list[list[Step]], warmup: int) -> dict:
    """Every rank's steps -> per-step figures of the slowest rank, medians over
    the timed steps (after the warm-up)."""
    n = len(steps[0])
    per_step = []
    for i in range(n):
        its = [r[i].iteration_s for r in steps]
        exp = [r[i].exposed_comm_s for r in steps if r[i].exposed_comm_s is not None]
        per_step.append({"iteration_s": max(its), "exposed_comm_s": max(exp) if exp else None})
    timed = per_step[warmup:]
    out = {"iteration_s": statistics.median(s["iteration_s"] for s in timed), "exposed_comm_s": None}
    if all(s["exposed_comm_s"] is not None for s in timed):
        out["exposed_comm_s"] = statistics.median(s["exposed_comm_s"] for s in timed)
    out["per_step"] = per_step
    return out


def fmt_bytes(n: float) -> str:
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n:.0f} B"


def run(args, group=None) -> dict:
    """Train args.steps steps on `group`; every rank returns the same result
    dict (rank 0 prints it)."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    cfg = Config(model=args.model, mode="fsdp" if args.fsdp else "ddp", batch=args.batch, image_size=args.image_size,
                 seq_len=args.seq_len, seed=args.seed, steps=args.steps + args.compute_steps, lr=args.lr, device=args.device)
    trainer = Trainer(cfg, group)
    steps: list[Step] = []
    before = None
    bar = None
    if rank == 0 and not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(total=args.steps, desc=f"{args.model} on {args.backend}", unit="step", file=sys.stderr,
                   dynamic_ncols=True)
    for i in range(args.steps):
        if i == args.warmup:
            before = path_bytes(group)  # per-path bytes of the timed steps only
        s = trainer.step()
        steps.append(s)
        if bar:
            bar.set_postfix(loss=f"{s.loss:.4f}", it=f"{s.iteration_s:.2f}s")
            bar.update(1)
    after = path_bytes(group)
    compute = [trainer.compute_step() for _ in range(args.compute_steps)]
    if bar:
        bar.close()

    everyone = [None] * world
    mine = {"steps": steps, "compute": compute, "before": before, "after": after,
            "sha256": trainer.params_sha256() if args.checksum else None}
    dist.all_gather_object(everyone, mine, group=group)
    result = {"model": args.model, "parameters": trainer.parameters, "mode": cfg.mode, "backend": args.backend,
              "world": world, "batch": args.batch, "steps": args.steps, "warmup": args.warmup, "seed": args.seed,
              "deterministic": args.deterministic,
              "torch": torch.__version__}
    result["input"] = f"{args.image_size}x{args.image_size}" if is_image_model(args.model) else f"seq {args.seq_len}"
    if args.backend == "maestro":
        result["maestro_options"] = maestro_options(args).as_dict()
    if args.gloo_devices:
        result["gloo_devices"] = args.gloo_devices
    result.update(summarize([e["steps"] for e in everyone], args.warmup))
    result["samples_per_s"] = world * args.batch / result["iteration_s"]
    result["losses"] = [[s.loss for s in e["steps"]] for e in everyone]
    result["device"] = args.device
    if compute:
        result["compute_s"] = statistics.median(max(e["compute"][i] for e in everyone) for i in range(len(compute)))
        if result["exposed_comm_s"] is None and cfg.mode == "ddp":
            # On a GPU the hooks' host times say nothing (see Trainer.step):
            # what the sync adds is the step minus the same step without it.
            result["exposed_comm_s"] = max(0.0, result["iteration_s"] - result["compute_s"])
            result["exposed_comm_from"] = "iteration - compute alone"
    if args.checksum:
        result["params_sha256"] = [e["sha256"] for e in everyone]
    if everyone[0]["after"] is not None:
        paths = 1 + max(p for e in everyone for _, p in e["after"])
        sent = [0] * paths
        for e in everyone:
            for (peer, p), b in e["after"].items():
                sent[p] += b - (e["before"] or {}).get((peer, p), 0)
        result["path_bytes_sent"] = sent  # over every rank and peer, timed steps
    return result


def summary_line(r: dict) -> str:
    devices = f" ({len(r['gloo_devices'])} devices)" if r.get("gloo_devices") else ""
    where = f"{r['model']} {r['mode']} on {r['backend']}{devices}, {r['world']} ranks x batch {r['batch']} ({r['input']})"
    line = f"{where}: {r['samples_per_s']:.2f} samples/s, iteration {r['iteration_s']:.3f} s"
    if r.get("exposed_comm_s") is not None:
        line += f", exposed comm {r['exposed_comm_s']:.3f} s ({r['exposed_comm_s'] / r['iteration_s']:.0%})"
    else:
        line += ", exposed comm n/a" + (" (FSDP)" if r["mode"] == "fsdp" else "")
    if "compute_s" in r:
        line += f", compute alone {r['compute_s']:.3f} s"
    if "path_bytes_sent" in r:
        total = sum(r["path_bytes_sent"]) or 1
        line += "; bytes sent per path: " + "  ".join(
            f"{i}: {fmt_bytes(b)} ({b / total:.0%})" for i, b in enumerate(r["path_bytes_sent"]))
    return line


# ---------------------------------------------------------------- command line

def maestro_options(args):
    import maestro_torch

    return maestro_torch.Options(policy=args.policy, paths=args.paths, chunk_size=args.chunk_size)


def check_backend(args, ap) -> None:
    """Set args.device from --backend; refuse what this machine cannot run."""
    gpu = torch.cuda.is_available()
    if args.device is None:
        args.device = "cuda" if args.backend == "nccl" else "cpu"
    if args.backend == "nccl" and args.device != "cuda":
        ap.error("--backend nccl: trains on a GPU (--device cuda)")
    if args.device == "cuda" and not gpu:
        ap.error(f"--device cuda ({'--backend nccl' if args.backend == 'nccl' else 'a GPU'}): torch sees no GPU here "
                 "(torch.cuda.is_available() is False); use --device cpu with --backend maestro or gloo")
    maestro_knobs = [f for f, v in (("--policy", args.policy), ("--paths", args.paths),
                                    ("--chunk-size", args.chunk_size)) if v is not None]
    if maestro_knobs and args.backend != "maestro":
        ap.error(f"{', '.join(maestro_knobs)}: maestro's options, not {args.backend}'s")
    if args.gloo_devices is not None:
        if args.backend != "gloo":
            ap.error(f"--gloo-devices: gloo's option, not {args.backend}'s")
        import gloo_devices

        try:
            args.gloo_devices = gloo_devices.parse(args.gloo_devices)
        except ValueError as e:
            ap.error(f"--gloo-devices: {e}")
    if args.steps <= args.warmup:
        ap.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup}): warm-up steps are not timed")
    if args.fsdp and args.compute_steps:
        ap.error("--compute-steps needs DDP's no_sync (not available under --fsdp)")
    if args.device == "cuda":
        # Ranks share the GPUs there are (several ranks on one GPU work too).
        args.device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0')) % torch.cuda.device_count()}"
        torch.cuda.set_device(torch.device(args.device))


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=MODELS, default="vgg19")
    ap.add_argument("--backend", default="maestro", choices=["maestro", "gloo", "nccl"])
    ap.add_argument("--device", choices=["cpu", "cuda"],
                    help="where the model trains: cpu (the default for maestro and gloo) or cuda (nccl's; maestro "
                         "stages CUDA tensors through pinned host memory, gloo copies them too)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--ddp", action="store_true", help="DistributedDataParallel (the default)")
    mode.add_argument("--fsdp", action="store_true", help="FSDP2 (torch.distributed.fsdp.fully_shard)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=1, help="first steps left out of the timing (default 1)")
    ap.add_argument("--batch", type=int, default=8, help="samples per rank and step")
    ap.add_argument("--image-size", type=int, default=224, help="vgg19/resnet50: input images are S x S (min 32)")
    ap.add_argument("--seq-len", type=int, default=128, help="bert-large: tokens per sample (max 512)")
    ap.add_argument("--lr", type=float, default=0.001, help="SGD learning rate")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policy", help="maestro: load balancer (MAESTRO_POLICY), e.g. adaptive, round_robin")
    ap.add_argument("--paths", type=int, help="maestro: paths per peer (MAESTRO_PATHS)")
    ap.add_argument("--chunk-size", help="maestro: bytes per chunk (MAESTRO_CHUNK_SIZE), e.g. 50K")
    ap.add_argument("--gloo-devices", metavar="ADDRS",
                    help="gloo: one device per local address, comma-separated (the same count and order on "
                         "every node), or 'vnics' for this host's MAESTRO_VNICS; gloo gives whole collectives to "
                         "the devices in turn (default: one device, gloo's own choice)")
    ap.add_argument("--compute-steps", type=int, default=0,
                    help="after training, time this many forward+backward passes without the gradient sync")
    ap.add_argument("--checksum", action="store_true", help="also report a SHA-256 of each rank's final parameters")
    ap.add_argument("--deterministic", action="store_true",
                    help="deterministic kernels (torch.use_deterministic_algorithms, cuDNN's deterministic "
                         "convolutions): on a GPU, cuDNN's default backward may sum in any order, so two runs "
                         "differ in the last bits whatever the backend")
    ap.add_argument("--threads", type=int, help="torch.set_num_threads (torchrun's default: OMP_NUM_THREADS=1)")
    ap.add_argument("--timeout", type=float, default=600, help="process group timeout, seconds")
    ap.add_argument("--json", metavar="FILE", help="rank 0 writes the result (and per-step losses) here")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    return ap


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    check_backend(args, ap)
    if args.image_size < 32 and is_image_model(args.model):
        ap.error("--image-size: at least 32 (the models downsample 32x)")
    if not 1 <= args.seq_len <= 512:
        ap.error("--seq-len: 1 to 512 (BERT's position embeddings)")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    timeout = datetime.timedelta(seconds=args.timeout)
    if args.backend == "maestro":
        dist.init_process_group("maestro", pg_options=maestro_options(args), timeout=timeout)
    elif args.gloo_devices:
        import gloo_devices

        gloo_devices.register()
        dist.init_process_group(gloo_devices.BACKEND, pg_options=gloo_devices.options(args.gloo_devices),
                                timeout=timeout)
    else:
        dist.init_process_group(args.backend, timeout=timeout)
    try:
        result = run(args)
        if dist.get_rank() == 0:
            print(summary_line(result), flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(result, f, indent=1)
    finally:
        # DDP's reducer holds the process group; if the model sits in a
        # reference cycle, only the interpreter's finalisation would free it,
        # and a gloo group torn down then can abort the process (SIGABRT,
        # "terminate called without an active exception") after a run that
        # succeeded. Free it now, while the interpreter is whole.
        gc.collect()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # Everything is reported and every group destroyed: leave without the
    # interpreter's finalisation, where gloo's worker threads may still
    # destroy tensors and abort the process (seen under load).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
