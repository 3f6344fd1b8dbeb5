"""gpt2: a GPT-2-style decoder (token + position embeddings, pre-LN blocks, causal SDPA, tanh-GELU
MLP, final LayerNorm, lm_head tied to the token embedding), written the way HF GPT-2 is.

Full: GPT2Config's defaults (vocab 50257, 1024 positions, d 768, 12 layers, 12 heads), ids
[16, 512]. `forward(input_ids)` returns logits [B, T, vocab].
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from kiln.tools.suite.batch import Batch, next_token_loss, token_batch

__all__ = ["NAME", "GPT2Config", "GPT2", "make_model", "make_batch", "loss"]

NAME = "gpt2"


@dataclasses.dataclass(frozen=True)
class GPT2Config:
    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    layer_norm_epsilon: float = 1e-5
    batch: int = 16
    seq: int = 512


SIZES = {"full": GPT2Config(),
         "small": GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                             batch=2, seq=32)}


class GPT2Attention(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.head_dim = config.n_embd // config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        bsz, seq, embd = hidden_states.shape
        q, k, v = self.c_attn(hidden_states).split(embd, dim=2)
        shape = (bsz, seq, self.n_head, self.head_dim)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out = out.transpose(1, 2).reshape(bsz, seq, embd)
        return self.c_proj(out)


class GPT2MLP(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(hidden_states), approximate="tanh"))


class GPT2Block(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = GPT2Attention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = GPT2MLP(config)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = hidden_states + self.attn(self.ln_1(hidden_states))
        return hidden_states + self.mlp(self.ln_2(hidden_states))


class GPT2(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.h = nn.ModuleList(GPT2Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # GPT-2's scaled residual-projection init
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * config.n_layer))
        self.lm_head.weight = self.wte.weight  # tied, as GPT2LMHeadModel does

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.normal_(module.bias, std=0.02)  # random, so bias gradients are exercised

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        hidden_states = self.wte(input_ids) + self.wpe(positions)[None]
        for block in self.h:
            hidden_states = block(hidden_states)
        return self.lm_head(self.ln_f(hidden_states))


def make_model(size: str) -> nn.Module:
    return GPT2(SIZES[size])


def make_batch(size: str) -> Batch:
    c = SIZES[size]
    return token_batch(c.vocab_size, c.batch, c.seq)


loss = next_token_loss
