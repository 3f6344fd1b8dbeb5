"""Small conv-net and transformer models for peak-memory tests (torchvision and timm are not
importable here): a ResNet-50-style bottleneck net (conv/BN/ReLU, residuals, max pool, strided
1x1 downsample, shortcut added last as timm does), one bottleneck stage without the stem (so
the peak falls between blocks), a ConvNeXt-style net (depthwise 7x7 conv, LayerNorm over
channels between permutes, MLP, layer scale), a ViT block (fused qkv, SDPA) and the seed
transformer block. `CASES[name]() -> (model, make_input, loss)`; inputs are fresh random
tensors on each call; `loss(output)` is what a training step reduces."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from kiln.tools.seed_model import TransformerBlock

__all__ = ["CASES"]


class Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int = 1) -> None:
        super().__init__()
        cout = width * 4
        self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out += x if self.down is None else self.down(x)
        return self.relu(out)


class BottleneckNet(nn.Module):
    def __init__(self, stem: int = 8, widths: tuple[int, ...] = (4, 8), classes: int = 10,
                 with_stem: bool = True, first_stride: int = 1) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, stem, 7, 2, 3, bias=False), nn.BatchNorm2d(stem),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)) \
            if with_stem else nn.Identity()
        blocks, cin = [], stem
        for i, width in enumerate(widths):
            blocks += [Bottleneck(cin, width, first_stride if i == 0 else 2),
                       Bottleneck(width * 4, width)]
            cin = width * 4
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pw1, self.pw2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(0.1 * torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.pw2(F.gelu(self.pw1(self.norm(y))))
        return x + (self.gamma * y).permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    def __init__(self, dim: int = 16, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, dim, 4, 4)
        self.blocks = nn.Sequential(ConvNeXtBlock(dim), ConvNeXtBlock(dim))
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


class ViTBlock(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, c // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        attn = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, c)
        x = x + self.proj(attn)
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


def _classify(logits: torch.Tensor) -> torch.Tensor:
    labels = torch.randint(0, logits.shape[-1], logits.shape[:1], device=logits.device)
    return F.cross_entropy(logits, labels)


def _regress(out: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out, torch.randn_like(out))


CASES = {
    "bottleneck_net": lambda: (BottleneckNet(), lambda: torch.randn(2, 3, 32, 32), _classify),
    "bottleneck_stage": lambda: (BottleneckNet(16, (8, 8), with_stem=False, first_stride=2),
                                 lambda: torch.randn(2, 16, 16, 16), _classify),
    "convnext": lambda: (ConvNeXt(), lambda: torch.randn(2, 3, 32, 32), _classify),
    "vit_block": lambda: (ViTBlock(32, 4), lambda: torch.randn(2, 16, 32), _regress),
    "seed_block": lambda: (TransformerBlock(32, 2), lambda: torch.randn(2, 8, 32), _regress),
}
