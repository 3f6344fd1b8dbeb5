"""decompositions: the one decomposition policy of the autograd stage.

The table the tracer applies is torch's Core ATen decomposition table, plus `EXTRAS` (ops torch
has no decomposition for that kiln wants to see as simpler ops), minus `KEEP` (ops the backend
lowers itself: matmuls, attention, convolution, layer norm; and two ops whose decompositions leave
the ATen vocabulary for `prims`). Random ops are kept too when eager RNG is on (`rng.eager_rng`),
so they draw from torch's generator exactly as eager does.

`tests/autograd/test_census.py` pins the op set this policy produces for the seed block and the
nanoGPT model, so a torch upgrade that changes it is noticed.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from kiln.autograd import _compat
from kiln.autograd.rng import eager_rng, is_random

__all__ = ["EXTRAS", "FUNCTION_FIXES", "KEEP", "KEEP_PREFIXES", "decomposition_table", "keeps"]

aten = torch.ops.aten

# Overload packets (all overloads) the backend wants as they are.
KEEP: frozenset[str] = frozenset({
    "aten::addmm", "aten::mm", "aten::bmm",
    "aten::convolution", "aten::convolution_backward",
    "aten::native_layer_norm",
    "aten::var_mean",  # its decomposition goes through prims.var / prims.broadcast_in_dim
    "aten::clone",     # decomposes to prims.clone
})
KEEP_PREFIXES: tuple[str, ...] = ("aten::_scaled_dot_product",)


def _native_multi_head_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 embed_dim: int, num_head: int, qkv_weight: torch.Tensor,
                                 qkv_bias: torch.Tensor, proj_weight: torch.Tensor,
                                 proj_bias: torch.Tensor, mask: torch.Tensor | None = None,
                                 need_weights: bool = True, average_attn_weights: bool = True,
                                 mask_type: int | None = None) -> object:
    """nn.MultiheadAttention's inference fast path (batch-first, no mask) as matmul + softmax.
    torch has no decomposition for this fused op; masks keep the op as it is."""
    if mask is not None:
        return NotImplemented
    batch, q_len, _ = query.shape
    head_dim = embed_dim // num_head
    w_q, w_k, w_v = qkv_weight.chunk(3)
    b_q, b_k, b_v = qkv_bias.chunk(3)

    def heads(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        projected = torch.nn.functional.linear(x, w, b)
        return projected.view(batch, -1, num_head, head_dim).transpose(1, 2)

    q, k, v = heads(query, w_q, b_q), heads(key, w_k, b_k), heads(value, w_v, b_v)
    scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(head_dim))
    probs = torch.softmax(scores, dim=-1)
    attn = torch.matmul(probs, v).transpose(1, 2).reshape(batch, q_len, embed_dim)
    out = torch.nn.functional.linear(attn, proj_weight, proj_bias)
    if not need_weights:
        return out, None
    return out, (probs.mean(dim=1) if average_attn_weights else probs)


EXTRAS: dict[_compat.OpOverload, Callable] = {
    aten._native_multi_head_attention.default: _native_multi_head_attention,
}


def _lstm_states_like_hx(func: Callable, args: tuple, kwargs: dict) -> object:
    """torch.lstm with the final states in the shapes of the initial ones. torch's Python
    kernel for aten.lstm (run under tracing, before any dispatch mode or table sees the op) ends
    a layer with `hx.squeeze(1)` in some releases (2.11 among them) where the state is
    [1, batch, hidden]: a no-op for batch > 1, so h_n / c_n came out [layers, 1, batch, hidden].
    CPU eager uses mkldnn and CUDA eager cuDNN, so only the traced graph was wrong (issue 11)."""
    out, h_n, c_n = func(*args, **kwargs)
    hx = args[1] if isinstance(args[1], (list, tuple)) else args[2]  # (input, hx, ...) or packed
    return out, h_n.reshape(hx[0].shape), c_n.reshape(hx[1].shape)


# torch functions whose traced form needs a fix, applied around the call while replaying the
# captured graph (`trace._FunctionFixes`); keyed by the function object.
FUNCTION_FIXES: dict[Callable, Callable] = {
    torch.lstm: _lstm_states_like_hx,
    torch._C._VariableFunctions.lstm: _lstm_states_like_hx,
}


def keeps(op: _compat.OpOverload) -> bool:
    """True when the policy leaves `op` as it is."""
    name = f"{op.namespace}::{op.overloadpacket.__name__}"
    return name in KEEP or name.startswith(KEEP_PREFIXES)


_tables: dict[bool, dict] = {}


def decomposition_table(*, eager_random: bool | None = None) -> dict:
    """op overload -> decomposition, for the tracer. Built once per RNG policy."""
    eager_random = eager_rng() if eager_random is None else eager_random
    table = _tables.get(eager_random)
    if table is None:
        merged = {**_compat.core_aten_decompositions(), **EXTRAS}
        table = {op: fn for op, fn in merged.items()
                 if not keeps(op) and not (eager_random and is_random(op))}
        _tables[eager_random] = table
    return table
