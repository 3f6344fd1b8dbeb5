"""bert: a BERT-style encoder (word + position + token-type embeddings, post-LN layers with a
padding mask turned into an additive float mask, erf-GELU, tanh pooler), written the way HF
BertModel's eager attention is.

Full: BertConfig's defaults (vocab 30522, d 768, 12 layers, 12 heads, intermediate 3072), ids
[16, 512]. `forward(input_ids, attention_mask, token_type_ids)` returns (last hidden, pooled).
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from kiln.tools.suite.batch import Batch

__all__ = ["NAME", "BertConfig", "Bert", "make_model", "make_batch", "loss"]

NAME = "bert"


@dataclasses.dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    batch: int = 16
    seq: int = 512


SIZES = {"full": BertConfig(),
         "small": BertConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2,
                             num_attention_heads=4, intermediate_size=256,
                             max_position_embeddings=64, batch=2, seq=32)}


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings,
                                                config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
        embeddings = (self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
                      + self.position_embeddings(positions))
        return self.LayerNorm(embeddings)


class BertSelfAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_size = config.hidden_size // config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(*x.shape[:-1], self.num_heads, self.head_size).permute(0, 2, 1, 3)

    def forward(self, hidden_states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q = self.split_heads(self.query(hidden_states))
        k = self.split_heads(self.key(hidden_states))
        v = self.split_heads(self.value(hidden_states))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_size)
        probs = F.softmax(scores + mask, dim=-1)
        context = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        return context.view(*context.shape[:-2], -1)


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.layer_norm_eps
        self.attention = BertSelfAttention(config)
        self.attention_output = nn.Linear(hidden, hidden)
        self.attention_norm = nn.LayerNorm(hidden, eps=eps)
        self.intermediate = nn.Linear(hidden, config.intermediate_size)
        self.output = nn.Linear(config.intermediate_size, hidden)
        self.output_norm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, hidden_states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        attn = self.attention_output(self.attention(hidden_states, mask))
        hidden_states = self.attention_norm(attn + hidden_states)
        mlp = self.output(F.gelu(self.intermediate(hidden_states)))
        return self.output_norm(mlp + hidden_states)


class Bert(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.embeddings = BertEmbeddings(config)
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.bias, std=0.02)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden_states = self.embeddings(input_ids, token_type_ids)
        dtype = hidden_states.dtype
        # [B, T] of 1 (keep) / 0 (pad) -> [B, 1, 1, T] of 0 / most negative, added to scores
        mask = (1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min
        for layer in self.layer:
            hidden_states = layer(hidden_states, mask)
        pooled = torch.tanh(self.pooler(hidden_states[:, 0]))
        return hidden_states, pooled


def make_model(size: str) -> nn.Module:
    return Bert(SIZES[size])


def make_batch(size: str) -> Batch:
    """Random ids and segments; each row keeps a random prefix of 1..seq tokens (rest padding)."""
    c = SIZES[size]
    ids = torch.randint(0, c.vocab_size, (c.batch, c.seq))
    lengths = torch.randint(1, c.seq + 1, (c.batch, 1))
    attention_mask = (torch.arange(c.seq)[None] < lengths).long()
    token_type_ids = torch.randint(0, c.type_vocab_size, (c.batch, c.seq))
    target = torch.randn(c.batch, c.hidden_size)
    return Batch((ids, attention_mask, token_type_ids), target)


def loss(output: tuple[torch.Tensor, torch.Tensor], target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(output[1].float(), target.float())
