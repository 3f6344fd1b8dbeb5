"""extern: library kernels the backend calls on purpose.

Matmuls (`mm`, `bmm`, `addmm` — the bias rides in the library call's epilogue), convolution
(forward and backward) and scaled-dot-product attention (forward and backward, every fused
variant torch has) become `Extern` nodes. Their tensor arguments are strided views of buffers
whenever the lazy value is one (a transposed weight is a view, not a copy); anything else is
realized first.
"""
from __future__ import annotations

from typing import Any

import torch

from kiln.lower.ir import Extern
from kiln.lower.rule_table import Call, register

aten = torch.ops.aten

ATTENTION_FORWARD = (
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_fused_attention_overrideable",
)


def _extern(kind: str) -> Any:
    def lower(call: Call, *args: Any, **kwargs: Any) -> Any:
        return call.builder.call_kernel(Extern, kind, call, args, kwargs)

    lower.__name__ = f"lower_{kind}"
    return lower


register(aten.mm.default)(_extern("mm"))
register(aten.bmm.default)(_extern("bmm"))
register(aten.addmm.default)(_extern("addmm"))
register(aten.convolution.default)(_extern("convolution"))
register(aten.convolution_backward.default)(_extern("convolution_backward"))

for _name in ATTENTION_FORWARD:
    for _suffix, _kind in (("", "attention"), ("_backward", "attention_backward")):
        _packet = getattr(aten, _name + _suffix, None)
        if _packet is not None:
            register(_packet.default)(_extern(_kind))
