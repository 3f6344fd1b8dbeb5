"""seed_block: the seed document's TransformerBlock (nn.MultiheadAttention, post-LN, erf-GELU MLP).

The block itself lives in `kiln.tools.seed_model`; this file only gives it suite sizes, inputs
and a loss. Full: d_model 1024, 16 heads, input [32, 512, 1024] (ANCHORS.md).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from kiln.tools.seed_model import TransformerBlock
from kiln.tools.suite.batch import Batch

__all__ = ["NAME", "make_model", "make_batch", "loss"]

NAME = "seed_block"
SIZES = {"full": (1024, 16, (32, 512, 1024)), "small": (64, 4, (2, 16, 64))}


def make_model(size: str) -> nn.Module:
    d_model, nhead, _ = SIZES[size]
    return TransformerBlock(d_model, nhead)


def make_batch(size: str) -> Batch:
    shape = SIZES[size][2]
    return Batch((torch.randn(shape),), torch.randn(shape))


def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(output, target)
