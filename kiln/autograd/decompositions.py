"""decompositions: kiln's one decomposition policy: which ATen ops each stage decomposes, and why.

Two stages decompose, both starting from torch's Core ATen decomposition table:

- autograd (`decomposition_table()`, applied by the tracer as stage 2 records): the core table
  plus `AUTOGRAD_EXTRAS` (fused ops torch has no decomposition for), minus what autograd keeps.
  Random ops are kept too when eager RNG is on (`rng.eager_rng`), so they draw from torch's
  generator exactly as eager does. An op autograd keeps is never expanded by the tracer, not even
  a CompositeImplicitAutograd one.
- lower (`kiln.lower.decomposition_tables`, for an op no lowering rule takes): the core table
  minus what lower keeps (`trace_table()`, also what tests and tools trace ATen graphs with), plus
  `LOWER_EXTRAS` from torch's full table (`lowering_table()`): composite ops that are only
  pointwise ops and reductions to the lower stage.

What each stage keeps whole (`keeps(op, stage)`, every overload of a packet):

- both: `LIBRARY_KERNELS` and `LIBRARY_KERNEL_PREFIXES`, the matmuls, convolution and fused
  attention kernels the backend calls as library kernels (externs): a library kernel beats
  their decomposition.
- autograd only, `KEEP_AT_AUTOGRAD_ONLY`: `native_layer_norm`, which the lower stage lowers itself
  (a rule, else its `LOWER_EXTRAS` decomposition), and `var_mean` / `clone`, whose core
  decompositions leave ATen for `prims` (the lower stage lowers both, and refuses any
  decomposition that traces to prims).
- lower only, `KEEP_AT_LOWER_ONLY`: the composite `scaled_dot_product_attention`, an attention op
  and so the lower stage's own. Autograd leaves it in its table: stage 1 has already expanded
  this CompositeImplicit op into the fused kernel ATen picks, which both stages keep.

`tests/autograd/test_census.py` pins the op set the autograd policy produces for the seed block
and the nanoGPT model, so a torch upgrade that changes it is noticed.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from kiln.autograd import _compat
from kiln.autograd.rng import eager_rng, is_random

__all__ = ["AUTOGRAD_EXTRAS", "FUNCTION_FIXES", "KEEP", "KEEP_AT_AUTOGRAD_ONLY",
           "KEEP_AT_LOWER_ONLY", "LIBRARY_KERNELS", "LIBRARY_KERNEL_PREFIXES", "LOWER_EXTRAS",
           "decomposition_table", "keeps"]

aten = torch.ops.aten

# -- what each stage keeps whole (overload packets: every overload) --------------------------------
LIBRARY_KERNELS: frozenset[str] = frozenset({
    "aten::addmm", "aten::mm", "aten::bmm", "aten::convolution", "aten::convolution_backward",
})
LIBRARY_KERNEL_PREFIXES: tuple[str, ...] = ("aten::_scaled_dot_product",)  # forward and backward
KEEP_AT_AUTOGRAD_ONLY: frozenset[str] = frozenset({
    "aten::native_layer_norm",
    "aten::var_mean",  # its decomposition goes through prims.var / prims.broadcast_in_dim
    "aten::clone",     # decomposes to prims.clone
})
KEEP_AT_LOWER_ONLY: frozenset[str] = frozenset({"aten::scaled_dot_product_attention"})
KEEP: dict[str, frozenset[str]] = {
    "autograd": LIBRARY_KERNELS | KEEP_AT_AUTOGRAD_ONLY,
    "lower": LIBRARY_KERNELS | KEEP_AT_LOWER_ONLY,
}


def keeps(op: _compat.OpOverload, stage: str) -> bool:
    """True when `stage` ("autograd" or "lower") leaves `op` as it is."""
    name = _packet_name(op)
    return name in KEEP[stage] or name.startswith(LIBRARY_KERNEL_PREFIXES)


def _packet_name(op: _compat.OpOverload) -> str:
    """"aten::mm" for every overload of aten.mm; "" for a table key that is not an overload."""
    if not isinstance(op, _compat.OpOverload):
        return ""
    return f"{op.namespace}::{op.overloadpacket.__name__}"


# -- what each stage adds to the core table ---------------------------------------------------------
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


AUTOGRAD_EXTRAS: dict[_compat.OpOverload, Callable] = {
    aten._native_multi_head_attention.default: _native_multi_head_attention,
}


# Composite ops the lower stage decomposes (torch has decompositions, not in its core table).
LOWER_EXTRAS: tuple[_compat.OpOverload, ...] = (
    aten._softmax.default,
    aten._log_softmax.default,
    aten.native_layer_norm.default,
    aten.native_batch_norm.default,
    aten._native_batch_norm_legit_functional.default,
    aten._native_batch_norm_legit_no_training.default,
    aten._native_batch_norm_legit.default,
    aten._native_batch_norm_legit.no_stats,
    aten.max_pool2d_with_indices.default,
    aten._adaptive_avg_pool2d.default,
    aten.hardtanh.default,
    aten.leaky_relu.default,
    aten.elu.default,
    aten.native_group_norm.default,
    aten.native_dropout.default,
    aten.addmv.default,
    aten.repeat.default,
    aten.diagonal.default,
)


# -- autograd: fixes around torch calls, and the tracer's table ----------------------------------

def _lstm_states_like_hx(func: Callable, args: tuple, kwargs: dict) -> object:
    """torch.lstm with the final states in the shapes of the initial ones. torch's Python
    kernel for aten.lstm (run under tracing, before any dispatch mode or table sees the op) ends
    a layer with `hx.squeeze(1)` in some releases (2.11 among them) where the state is
    [1, batch, hidden]: a no-op for batch > 1, so h_n / c_n came out [layers, 1, batch, hidden].
    CPU eager uses mkldnn and CUDA eager cuDNN, so only the traced graph was wrong (issue 11)."""
    out, h_n, c_n = func(*args, **kwargs)
    hx = args[1] if isinstance(args[1], (list, tuple)) else args[2]  # (input, hx, ...) or packed
    return out, h_n.reshape(hx[0].shape), c_n.reshape(hx[1].shape)


_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}  # at::Reduction, as torch._C._nn takes it


def _multilabel_margin_loss(func: Callable, args: tuple, kwargs: dict) -> object:
    """F.multilabel_margin_loss as composite ops, right where a target row ends early.

    torch's decomposition of `aten.multilabel_margin_loss_forward` (2.13; registered as the op's
    Autograd kernel under the Python dispatcher, so a trace takes it before any table is asked)
    gathers position 0 in place of every target after a row's first -1 and still adds those
    positions' hinge terms: any target with a -1 gave a larger loss than eager's (torch.compile
    shares the bug). Here the terms of positions after the end are masked out. Gradients are
    those of these ops, which are eager's (`multilabel_margin_loss_backward`).
    """
    if func is torch._C._nn.multilabel_margin_loss:
        names = ("input", "target", "reduction")
        bound = {**dict(zip(names, args)), **kwargs}
        reduction = _REDUCTIONS[bound.get("reduction", 1)]
    else:
        names = ("input", "target", "size_average", "reduce", "reduction")
        bound = {**dict(zip(names, args)), **kwargs}
        reduction = bound.get("reduction", "mean")
        if bound.get("size_average") is not None or bound.get("reduce") is not None:
            reduction = torch.nn._reduction.legacy_get_string(bound.get("size_average"),
                                                               bound.get("reduce"))
    x, target = bound["input"], bound["target"]
    if x.dim() not in (1, 2) or target.shape != x.shape or x.shape[-1] == 0:
        return func(*args, **kwargs)  # eager's error messages
    x2, t2 = torch.atleast_2d(x), torch.atleast_2d(target)
    dim = x2.shape[-1]
    idx = torch.arange(dim, device=x.device)
    end = torch.amin(torch.where(t2 == -1, idx, dim), dim=-1, keepdim=True)
    valid = idx < end  # [batch, j]: target positions before the row's first -1
    u = torch.gather(x2, -1, torch.where(valid, t2, 0))
    is_target = torch.any(idx == torch.where(valid, t2, -1).unsqueeze(-1), dim=1)  # [batch, k]
    z = (1.0 - u.unsqueeze(-1) + x2.unsqueeze(1)).clamp_min(0) / dim  # [batch, j, k]
    z = torch.where(valid.unsqueeze(-1) & ~is_target.unsqueeze(1), z, 0)
    per_row = z.sum(dim=(1, 2))
    if reduction == "none":
        return per_row.reshape(x.shape[:-1])
    if reduction == "sum":
        return per_row.sum()
    return per_row.sum() / max(per_row.shape[0], 1)  # eager: 0 for an empty batch, not nan


def _one_hot(func: Callable, args: tuple, kwargs: dict) -> object:
    """F.one_hot with eager's class range checks where torch's trace drops them (torch 2.11
    checks real tensors only: a class out of range became an all-zero row instead of eager's
    RuntimeError). The checks are the `_assert_async.msg` ops torch 2.13 records itself."""
    bound = {**dict(zip(("input", "num_classes"), args)), **kwargs}
    labels, num_classes = bound["input"], bound.get("num_classes", -1)
    if num_classes == -1 or labels.numel() == 0 or _compat.one_hot_traces_range_checks():
        return func(*args, **kwargs)  # -1: eager reads the classes' max itself
    torch._assert_async(torch.all(labels >= 0), "one_hot: Class values must be non-negative.")
    torch._assert_async(torch.all(labels < num_classes),
                        "one_hot: Class values must be smaller than num_classes.")
    return func(*args, **kwargs)


# torch functions whose traced form needs a fix, applied around the call while replaying the
# captured graph (`trace._FunctionFixes`); keyed by the function object.
FUNCTION_FIXES: dict[Callable, Callable] = {
    torch.lstm: _lstm_states_like_hx,
    torch._C._VariableFunctions.lstm: _lstm_states_like_hx,
    torch.nn.functional.multilabel_margin_loss: _multilabel_margin_loss,
    torch._C._nn.multilabel_margin_loss: _multilabel_margin_loss,
    torch.nn.functional.one_hot: _one_hot,
    torch._C._nn.one_hot: _one_hot,
}


_tables: dict[bool, dict] = {}


def decomposition_table(*, eager_random: bool | None = None) -> dict:
    """op overload -> decomposition, for the autograd tracer. Built once per RNG policy."""
    eager_random = eager_rng() if eager_random is None else eager_random
    table = _tables.get(eager_random)
    if table is None:
        merged = {**_compat.core_aten_decompositions(), **AUTOGRAD_EXTRAS}
        table = {op: fn for op, fn in merged.items()
                 if not keeps(op, "autograd") and not (eager_random and is_random(op))}
        _tables[eager_random] = table
    return table
