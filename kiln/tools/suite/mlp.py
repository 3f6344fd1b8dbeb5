"""mlp: a feed-forward classifier (Linear -> LayerNorm -> GELU per hidden layer, linear head).

Full: 1024 features, 4 hidden layers of 4096, 1000 classes, batch 8192 (not in the zoo; sized to
be GEMM-bound on the GPU like the transformer MLPs). `forward(x)` returns logits [B, classes].
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn

from kiln.tools.suite.batch import Batch, classification_loss

__all__ = ["NAME", "MLPConfig", "MLP", "make_model", "make_batch", "loss"]

NAME = "mlp"


@dataclasses.dataclass(frozen=True)
class MLPConfig:
    in_features: int = 1024
    hidden: int = 4096
    depth: int = 4
    num_classes: int = 1000
    batch: int = 8192


SIZES = {"full": MLPConfig(),
         "small": MLPConfig(in_features=32, hidden=128, depth=3, num_classes=10, batch=16)}


class MLP(nn.Module):
    def __init__(self, config: MLPConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = config.in_features
        for _ in range(config.depth):
            layers += [nn.Linear(width, config.hidden), nn.LayerNorm(config.hidden), nn.GELU()]
            width = config.hidden
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, config.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def make_model(size: str) -> nn.Module:
    return MLP(SIZES[size])


def make_batch(size: str) -> Batch:
    c = SIZES[size]
    return Batch((torch.randn(c.batch, c.in_features),),
                 torch.randint(0, c.num_classes, (c.batch,)))


loss = classification_loss
