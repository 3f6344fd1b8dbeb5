"""padding: matmuls whose rows are not 16-byte aligned computed on zero-padded operands.

cuBLAS's fast Hopper GEMMs need every leading dimension 16-byte aligned. A GPT-2 language-model
head — hidden [M, 768] @ tied embedding ᵀ [768, 50257] in bf16 — writes rows of 50257 × 2 bytes,
so cuBLAS falls back to an sm75-era kernel: 6.7 ms of a 10 ms forward on the H200
(benchmarks/RESULTS.md), where torch.compile pads (its `pad_mm`). This pass rewrites, on CUDA
graphs before lowering,

    mm(a [M, K], b [K, N])          → mm(pad(a) [M, Kp], pad(b) [Kp, Np])[:, :N]
    addmm(c, a, b)                  → addmm(pad(c), pad(a), pad(b))[:, :N]

padding N and K up to a multiple of 16 bytes with zeros (the padded K terms add 0; the padded N
columns are sliced away). The pads are copy kernels (for the LM head, 77 MB of weight per call,
~40 µs); a graph output that is such a slice is copied into eager's strides by the lower stage.
Only large products are padded (`MIN_FLOPS`): for small ones the copies cost more than cuBLAS's
slower kernel.
"""
from __future__ import annotations

import logging
from typing import Any

import torch
import torch.fx

from kiln.lower.graph_emit import NodeEmitter

__all__ = ["MIN_FLOPS", "pad_matmuls"]

log = logging.getLogger("kiln.lower")
aten = torch.ops.aten

MIN_FLOPS = 2 ** 30  # 2·M·N·K below this: not worth two extra copies
DEVICES = ("cuda",)  # CPU BLAS has no alignment cliff (tests set ("cpu",))


def _aligned(n: int, dtype: torch.dtype) -> int:
    per = max(1, 16 // dtype.itemsize)
    return -(-n // per) * per


def _plan(node: torch.fx.Node, devices: tuple[str, ...]) -> tuple[int, int, int, int] | None:
    """(K, Kp, N, Np) for an mm / addmm worth padding, else None."""
    if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default):
        return None
    a, b = node.args[-2:]
    va, vb = (x.meta.get("val") if isinstance(x, torch.fx.Node) else None for x in (a, b))
    if not (isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor)):
        return None
    if va.device.type not in devices or va.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return None
    (m, k), n = va.shape, vb.shape[1]
    if not all(isinstance(d, int) for d in (m, k, n)):
        # a symbolic size: deciding "aligned?" or "large?" would record a fact about it (a
        # `s0 % 4 == 0` guard), and a later size on the other side compiles another variant
        return None
    kp, np_ = _aligned(k, va.dtype), _aligned(n, va.dtype)
    if (kp, np_) == (k, n) or 2 * m * n * k < MIN_FLOPS:
        return None
    return k, kp, n, np_


def _pad(e: NodeEmitter, x: Any, last: int, second_last: int = 0) -> Any:
    if not (last or second_last):
        return x
    pad = [0, last, 0, second_last] if second_last else [0, last]
    return e.call(aten.constant_pad_nd.default, x, pad, 0.0)


def _rewrite(graph: torch.fx.Graph, node: torch.fx.Node, plan: tuple[int, int, int, int]) -> None:
    k, kp, n, np_ = plan
    e = NodeEmitter(graph, node.meta.get("user_location"))
    with graph.inserting_before(node):
        a, b = node.args[-2:]
        args = [_pad(e, a, kp - k), _pad(e, b, np_ - n, kp - k)]
        if node.target is aten.addmm.default:
            bias = node.args[0]
            if isinstance(bias, torch.fx.Node) and bias.meta["val"].shape[-1] == n:
                bias = _pad(e, bias, np_ - n)
            args.insert(0, bias)
        padded = e.call(node.target, *args, **node.kwargs)
        out = e.call(aten.slice.Tensor, padded, 1, 0, n) if np_ != n else padded
    node.replace_all_uses_with(out)
    graph.erase_node(node)


def pad_matmuls(gm: torch.fx.GraphModule) -> int:
    """Pad every large misaligned mm / addmm on `DEVICES` in `gm` (in place); returns how
    many."""
    count = 0
    for node in list(gm.graph.nodes):
        plan = _plan(node, DEVICES)
        if plan is not None:
            _rewrite(gm.graph, node, plan)
            count += 1
    if count:
        gm.recompile()
        log.debug("padding: %d misaligned matmul(s) padded to 16-byte rows", count)
    return count
