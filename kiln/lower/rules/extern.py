"""extern: library kernels the backend calls on purpose.

Matmuls (`mm`, `bmm`, `addmm` — the bias rides in the library call's epilogue), convolution
(forward and backward) and scaled-dot-product attention (forward and backward, every fused
variant torch has) become `Extern` nodes. Their tensor arguments are strided views of buffers
whenever the lazy value is one (a transposed weight is a view, not a copy); anything else is
realized first.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from kiln.lower import _compat
from kiln.lower.ir import Extern, Fallback
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


@register(aten.as_strided_scatter.default)
def lower_as_strided_scatter(call: Call, x: Any, *args: Any, **kwargs: Any) -> Any:
    """The library call, laid out as ATen lays it out: `x` cloned with its whole storage, its
    strides and its storage offset, then the scatter. FakeTensor's rule (torch 2.11-2.13) can
    say offset 0 when `x` does not start its storage (and its dispatch cache can hand that to
    the first scatter too): the copy made to that layout dropped the storage before `x`, and
    the view read next at x's offset fell outside it (fuzz seed 708022). The layout comes from
    the lowered `x` instead, a buffer at its real offset.

    The op's storage offset counts from the start of x's storage. For `x` of a graph input
    (whose layout counts from the input's first element) that is the example's storage offset
    plus x's: the wrapper hands the library `x` at that offset (a copy when the input arrives
    elsewhere in its storage, `wrapper._write_extern`), so the positions the graph names hold."""
    arg = call.builder.tensor_arg(x)
    offset = arg.offset + call.builder.graph.input_offsets.get(arg.name, 0)
    if not all(isinstance(v, int) for v in (*arg.size, *arg.stride, offset)):
        return call.builder.call_kernel(Fallback, "fallback", call, (x, *args), kwargs)
    like_x = _compat.fake_tensor_like(_compat.fake_mode_of([call.out]), arg.size, arg.stride,
                                      arg.dtype, call.out.device, offset)
    as_eager = dataclasses.replace(call, out=like_x)
    return call.builder.call_kernel(Fallback, "fallback", as_eager, (x, *args), kwargs)
