"""vit: a ViT-style image classifier (conv patch embedding, cls token, learned position
embedding, pre-LN encoder blocks with fused-qkv SDPA attention and erf-GELU MLP, final LayerNorm,
linear head on the cls token), written the way timm's VisionTransformer is.

Full: vit_base_patch16_224 (d 768, 12 blocks, 12 heads, MLP 3072, 1000 classes), images
[64, 3, 224, 224]. `forward(images)` returns logits [B, classes].
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn
import torch.nn.functional as F

from kiln.tools.suite.batch import Batch, classification_loss, image_batch

__all__ = ["NAME", "ViTConfig", "VisionTransformer", "make_model", "make_batch", "loss"]

NAME = "vit"


@dataclasses.dataclass(frozen=True)
class ViTConfig:
    image: int = 224
    patch: int = 16
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: int = 4
    num_classes: int = 1000
    batch: int = 64


SIZES = {"full": ViTConfig(),
         "small": ViTConfig(image=32, patch=8, embed_dim=64, depth=2, num_heads=4,
                            num_classes=10, batch=2)}


class Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        x = F.scaled_dot_product_attention(q, k, v)
        return self.proj(x.transpose(1, 2).reshape(B, N, C))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim: int, num_heads: int, mlp_ratio: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, dim * mlp_ratio)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class PatchEmbed(nn.Module):
    def __init__(self, patch: int, dim: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, dim, kernel_size=patch, stride=patch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)  # [B, C, H, W] -> [B, H*W, C]


class VisionTransformer(nn.Module):
    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        dim, num_patches = config.embed_dim, (config.image // config.patch) ** 2
        self.patch_embed = PatchEmbed(config.patch, dim)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 1e-6)
        self.pos_embed = nn.Parameter(torch.randn(1, num_patches + 1, dim) * 0.02)
        self.blocks = nn.Sequential(*(Block(dim, config.num_heads, config.mlp_ratio)
                                      for _ in range(config.depth)))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, config.num_classes)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.normal_(module.bias, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        x = self.norm(self.blocks(x + self.pos_embed))
        return self.head(x[:, 0])


def make_model(size: str) -> nn.Module:
    return VisionTransformer(SIZES[size])


def make_batch(size: str) -> Batch:
    c = SIZES[size]
    return image_batch(c.batch, c.image, c.num_classes)


loss = classification_loss
