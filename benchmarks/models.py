"""The paper's models (Fig. 11), built with torch.nn only (no torchvision or
transformers download): VGG19 as torchvision defines it (143.7 M parameters,
ImageNet classifier; fed 32x32 images so that compute stays small on a CPU)
and a BERT-large encoder (24 layers, hidden 1024, 16 heads, FFN 4096, vocab
30522: ~335 M parameters) with a 2-way classification head."""
from __future__ import annotations

import torch
import torch.nn as nn

VGG19_CFG = [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M"]


class VGG19(nn.Module):
    def __init__(self, classes: int = 1000):
        super().__init__()
        layers, c = [], 3
        for v in VGG19_CFG:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(c, v, 3, padding=1), nn.ReLU(inplace=True)]
                c = v
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(nn.Linear(512 * 7 * 7, 4096), nn.ReLU(True), nn.Dropout(),
                                        nn.Linear(4096, 4096), nn.ReLU(True), nn.Dropout(), nn.Linear(4096, classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


class BertLarge(nn.Module):
    def __init__(self, vocab=30522, hidden=1024, layers=24, heads=16, ffn=4096, positions=512):
        super().__init__()
        self.tokens = nn.Embedding(vocab, hidden)
        self.positions = nn.Embedding(positions, hidden)
        self.segments = nn.Embedding(2, hidden)
        self.norm = nn.LayerNorm(hidden)
        layer = nn.TransformerEncoderLayer(hidden, heads, ffn, activation="gelu", batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.pooler = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, 2)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1]).unsqueeze(0)
        x = self.norm(self.tokens(ids) + self.positions(pos) + self.segments(torch.zeros_like(ids)))
        return self.head(torch.tanh(self.pooler(self.encoder(x)[:, 0])))


def build(name: str, device="cpu") -> nn.Module:
    with torch.device(device):
        return VGG19() if name == "vgg19" else BertLarge()


def parameter_shapes(name: str) -> list[tuple]:
    """Parameter shapes, from a model on the meta device (nothing allocated)."""
    return [tuple(p.shape) for p in build(name, "meta").parameters()]


def ddp_buckets(numels: list[int], cap_bytes: int = 25 << 20, first_cap_bytes: int = 1 << 20,
                elem: int = 4) -> list[int]:
    """Element counts of DDP's gradient buckets: parameters in reverse order
    (gradients become ready back to front), the first bucket capped at 1 MiB,
    the others at `cap_bytes`; a larger parameter is a bucket of its own."""
    buckets, cur, cap = [], 0, first_cap_bytes
    for n in reversed(numels):
        if cur and (cur + n) * elem > cap:
            buckets.append(cur)
            cur, cap = 0, cap_bytes
        cur += n
    if cur:
        buckets.append(cur)
    return buckets


def batch(name: str, size: int):
    g = torch.Generator().manual_seed(0)
    if name == "vgg19":
        return torch.randn(size, 3, 32, 32, generator=g), torch.randint(0, 1000, (size,), generator=g)
    return torch.randint(0, 30522, (size, 32), generator=g), torch.randint(0, 2, (size,), generator=g)


def loss(name: str, model: nn.Module, data) -> torch.Tensor:
    x, y = data
    return nn.functional.cross_entropy(model(x), y)
