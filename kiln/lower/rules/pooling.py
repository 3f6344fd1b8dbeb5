"""pooling: max-pool backward as a pointwise gather (the forward decomposes).

`max_pool2d_with_indices_backward` is a scatter-add in eager; here each input element gathers
instead: it sums `grad_out` over the ≤ ceil(k/s)² output windows that can contain it, where the
saved argmax index points at it, visiting them in eager's accumulation order. Dilation must be 1 (other cases decompose to `scatter_add`, a
fallback).
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from kiln.lower.index import Expr, as_expr
from kiln.lower.rule_table import Call, register
from kiln.lower.ops import ops
from kiln.lower.rules.helpers import index_value, loader_as, pointwise
from kiln.lower.values import TensorValue

aten = torch.ops.aten


def _pair(v: Sequence[int] | int) -> tuple[int, int]:
    v = [v] if isinstance(v, int) else list(v)
    return (v[0], v[0]) if len(v) == 1 else (v[0], v[1])


def _window_max(x: TensorValue, index: Sequence[Expr], kernel: tuple[int, int],
                stride: tuple[int, int], padding: tuple[int, int],
                dilation: tuple[int, int]) -> tuple[Any, Any]:
    """(max value, flat h*W+w index of the first maximum) of the window of output `index`."""
    comp = x.compute_dtype
    load = loader_as(x, comp)  # ties as eager sees them: half values rounded
    height, width = x.size[-2:]
    lead, oh, ow = list(index[:-2]), index[-2], index[-1]
    h0 = as_expr(oh) * stride[0] - padding[0]
    w0 = as_expr(ow) * stride[1] - padding[1]
    zero = ops.constant(0, torch.int64)
    first = ops.add(ops.mul(ops.maximum(ops.index_expr(h0, torch.int64), zero),
                            index_value(width)),
                    ops.maximum(ops.index_expr(w0, torch.int64), zero))
    best, argmax = ops.constant(float("-inf"), comp), first
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            h, w = h0 + i * dilation[0], w0 + j * dilation[1]
            valid = ops.logical_and(_in_range(h, height), _in_range(w, width))
            value = ops.masked(valid, lambda h=h, w=w: load([*lead, h, w]), float("-inf"))
            take = ops.logical_and(valid, ops.logical_or(ops.gt(value, best), ops.isnan(value)))
            best = ops.where(take, value, best)
            argmax = ops.where(take, ops.index_expr(h * width + w, torch.int64), argmax)
    return best, argmax


def _in_range(i: Expr, size: int) -> Any:
    value = ops.index_expr(i, torch.int64)
    return ops.logical_and(ops.ge(value, ops.constant(0, torch.int64)),
                           ops.lt(value, index_value(size)))


def _float_input(call: Call, x: Any, *args: Any, **kwargs: Any) -> bool:
    return call.meta_args[0].dtype.is_floating_point


@register(aten.max_pool2d_with_indices.default, checker=_float_input)
def lower_max_pool2d(call: Call, x: TensorValue, kernel_size: Any, stride: Any = (),
                     padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False) -> tuple:
    kernel = _pair(kernel_size)
    args = (kernel, _pair(stride) if stride else kernel, _pair(padding), _pair(dilation))
    values, indices = call.out
    # call.out is the pair, so the values' layout is passed on: a channels-last input pools
    # into a channels-last output as in eager (contiguous would feed the next convolution NCHW)
    out_v = pointwise(call, values.shape, lambda i: _window_max(x, i, *args)[0], x.dtype, [x],
                      stride=tuple(values.stride()))
    call_i = Call(call.builder, call.node, call.op, call.meta_args, call.meta_kwargs, indices,
                  call.origin)
    out_i = pointwise(call_i, indices.shape, lambda i: _window_max(x, i, *args)[1],
                      torch.int64, [x])
    return out_v, out_i


def _no_dilation(call: Call, grad: Any, x: Any, kernel_size: Any, stride: Any, padding: Any,
                 dilation: Any, *rest: Any) -> bool:
    return _pair(dilation) == (1, 1)


def _candidates(pos: Expr, pad: int, k: int, s: int, n_out: int) -> list[tuple[Expr, Any]]:
    """(output position, validity) for each output window along one dim that may hold `pos`."""
    first = (as_expr(pos) + pad - k) // s + 1
    last = (as_expr(pos) + pad) // s
    out = []
    for j in range(-(-k // s)):
        p = first + j
        valid = ops.logical_and(
            ops.logical_and(ops.ge(ops.index_expr(p, torch.int64), ops.constant(0, torch.int64)),
                            ops.lt(ops.index_expr(p, torch.int64), index_value(n_out))),
            ops.le(ops.index_expr(p, torch.int64), ops.index_expr(last, torch.int64)))
        out.append((p, valid))
    return out


@register(aten.max_pool2d_with_indices_backward.default, checker=_no_dilation)
def lower_max_pool2d_backward(call: Call, grad: TensorValue, x: TensorValue, kernel_size: Any,
                              stride: Any, padding: Any, dilation: Any, ceil_mode: bool,
                              indices: TensorValue) -> TensorValue:
    kh, kw = _pair(kernel_size)
    sh, sw = _pair(stride) if stride else (kh, kw)
    ph, pw = _pair(padding)
    oh, ow = grad.size[-2:]
    width = x.size[-1]
    load_g, load_i = grad.loader(), indices.loader()
    comp = grad.compute_dtype

    def inner(index: Sequence[Expr]) -> Any:
        lead, h, w = list(index[:-2]), index[-2], index[-1]
        target = ops.index_expr(as_expr(h) * width + w, torch.int64)
        total = ops.constant(0.0, comp)
        for r, valid_r in _candidates(h, ph, kh, sh, oh):
            for c, valid_c in _candidates(w, pw, kw, sw, ow):
                at = [*lead, r, c]

                def contribution(at: list = at) -> Any:
                    hit = ops.eq(load_i(at), target)
                    return ops.where(hit, load_g(at), ops.constant(0.0, comp))

                total = ops.add(total, ops.masked(ops.logical_and(valid_r, valid_c),
                                                  contribution, 0.0))
        return total

    return pointwise(call, x.size, inner, call.out.dtype, [grad, indices])
