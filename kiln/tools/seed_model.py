"""The seed document's TransformerBlock (`shared/seed/`, section 3), unchanged, and its sizes."""
from __future__ import annotations

import torch.nn as nn

__all__ = ["TransformerBlock", "seed_sizes"]


class TransformerBlock(nn.Module):
    def __init__(self, d_model=1024, nhead=16):
        super().__init__()
        self.attn = nn.MultiheadAttention(d_model, nhead, batch_first=True)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, d_model * 4),
            nn.GELU(),
            nn.Linear(d_model * 4, d_model),
        )

    def forward(self, x):
        attn_out, _ = self.attn(x, x, x)
        x = self.norm1(x + attn_out)
        mlp_out = self.mlp(x)
        x = self.norm2(x + mlp_out)
        return x


def seed_sizes(device: str) -> tuple[int, int, tuple[int, int, int]]:
    """(d_model, nhead, input shape): the seed's on a GPU, a small one on the CPU."""
    if device == "cuda":
        return 1024, 16, (32, 512, 1024)
    return 256, 8, (4, 128, 256)
