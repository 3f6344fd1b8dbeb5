"""reduction: reductions → realized `Reduction` buffers.

A reduction always realizes (its result is a buffer); the reduced input stays inlined into its
`inner_fn`, so `sum(x * y)` reads x and y directly. Accumulation is in the compute dtype
(float32 for bf16, int64 for integer sums). `mean` is a sum buffer plus a lazy division, and
`var_mean`/`var` are two passes (mean, then the sum of squared deviations), each its own buffer.
A reduction's r loop is never empty: a 0-dim input reduces over `(1,)`, and a zero-size reduced
dim reduces the op's identity once (`sum` of nothing is 0), so every reduction is a kernel.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from kiln.lower.index import Expr
from kiln.lower.ir import Reduction, compute_dtype
from kiln.lower.rule_table import Call, LoweringError, register
from kiln.lower.ops import ops
from kiln.lower.rules.helpers import (has_elements, inlined_origins, loader_as, norm_dims, pointwise,
                                    scalar_loader)
from kiln.lower.values import BufferValue, TensorValue, ViewValue

aten = torch.ops.aten


def reduce(call: Call, x: TensorValue, dims: Sequence[int] | int | None, keepdim: bool,
           reduction_type: str, out_dtype: torch.dtype, src_dtype: torch.dtype | None = None,
           stride: Sequence[int] | None = None) -> BufferValue:
    """Reduce `x` over `dims` into a new buffer of `out_dtype` (kept dims as size 1 when
    `keepdim`). The accumulator is `compute_dtype(out_dtype)` (int64 for arg-reductions)."""
    ndim = len(x.size)
    rdims = norm_dims(dims, ndim)
    kept = [d for d in range(ndim) if d not in rdims]
    ranges = tuple(1 if d in rdims else x.size[d] for d in range(ndim)) if keepdim else \
        tuple(x.size[d] for d in kept)
    rranges = tuple(x.size[d] for d in rdims)
    if reduction_type in ("argmax", "argmin"):
        acc = torch.int64
        src = src_dtype or x.compute_dtype
    elif reduction_type == "any":
        acc = src = torch.bool
    else:
        acc = compute_dtype(out_dtype)
        src = src_dtype or acc
    load = loader_as(x, src, into=out_dtype)

    def inner(index: Sequence[Expr], rindex: Sequence[Expr]) -> Any:
        full: list[Expr] = []
        out_pos = 0
        for d in range(ndim):
            if d in rdims:
                full.append(rindex[rdims.index(d)])
                out_pos += keepdim
            else:
                full.append(index[d if keepdim else out_pos])
                out_pos += not keepdim
        return load(full)

    body = inner
    if math.prod(rranges) == 0:
        body, rranges = _identity(reduction_type, src), (1,)
    data = Reduction(ranges, rranges or (1,), reduction_type, body, acc, src)
    if stride is None and isinstance(call.out, torch.Tensor) and tuple(call.out.shape) == ranges:
        stride = tuple(call.out.stride())
    origins = [*inlined_origins([x]), call.origin]
    return call.builder.reduction(data, out_dtype, call.device, origins, stride)


_IDENTITY = {"sum": 0, "prod": 1, "any": False}


def _identity(reduction_type: str, src: torch.dtype) -> Any:
    """The inner function of a reduction over no elements: its identity, reduced once (a
    kernel needs a non-empty r loop). max/min/arg* of nothing raise in eager before this."""
    if reduction_type not in _IDENTITY:
        raise LoweringError(f"{reduction_type} over a zero-size dimension has no identity")
    value = _IDENTITY[reduction_type]
    return lambda index, rindex: ops.constant(value, src)


def _out(call: Call, i: int | None = None) -> torch.Tensor:
    return call.out if i is None else call.out[i]


@register(aten.sum.dim_IntList, aten.sum.default)
def lower_sum(call: Call, x: TensorValue, dim: Any = None, keepdim: bool = False, *,
              dtype: torch.dtype | None = None) -> BufferValue:
    return reduce(call, x, dim, keepdim, "sum", _out(call).dtype)


@register(aten.prod.dim_int, aten.prod.default)
def lower_prod(call: Call, x: TensorValue, dim: Any = None, keepdim: bool = False, *,
               dtype: torch.dtype | None = None) -> BufferValue:
    return reduce(call, x, dim, keepdim, "prod", _out(call).dtype)


@register(aten.amax.default)
def lower_amax(call: Call, x: TensorValue, dim: Any = (), keepdim: bool = False) -> BufferValue:
    return reduce(call, x, dim, keepdim, "max", x.dtype)


@register(aten.amin.default)
def lower_amin(call: Call, x: TensorValue, dim: Any = (), keepdim: bool = False) -> BufferValue:
    return reduce(call, x, dim, keepdim, "min", x.dtype)


def _not_bool(call: Call, x: Any, *args: Any, **kwargs: Any) -> bool:
    """argmax / argmin of a bool tensor raise in eager ("does not support bool input"): refused,
    so the ATen op runs and raises."""
    return call.meta_args[0].dtype != torch.bool


@register(aten.argmax.default, aten.argmin.default, checker=_not_bool)
def lower_argmax(call: Call, x: TensorValue, dim: int | None = None,
                 keepdim: bool = False) -> BufferValue:
    rtype = "argmax" if call.op._schema.name == "aten::argmax" else "argmin"
    return reduce(call, x, dim, keepdim, rtype, torch.int64)


@register(aten.max.dim, aten.min.dim)
def lower_max_dim(call: Call, x: TensorValue, dim: int, keepdim: bool = False) -> tuple:
    is_max = call.op._schema.name == "aten::max"
    values = reduce(call, x, [dim], keepdim, "max" if is_max else "min", x.dtype,
                    stride=tuple(_out(call, 0).stride()))
    indices = reduce(call, x, [dim], keepdim, "argmax" if is_max else "argmin", torch.int64,
                     stride=tuple(_out(call, 1).stride()))
    return values, indices


@register(*[getattr(aten.any, o) for o in ("dim", "dims", "default") if hasattr(aten.any, o)])
def lower_any(call: Call, x: TensorValue, dim: Any = None, keepdim: bool = False) -> BufferValue:
    return reduce(call, x, dim, keepdim, "any", torch.bool)


def _count(x: TensorValue, dims: Any) -> int:
    return math.prod(x.size[d] for d in norm_dims(dims, len(x.size)))


def _divide(call: Call, total: TensorValue, n: float, dtype: torch.dtype, size: Sequence[int],
            inputs: Sequence[Any]) -> TensorValue:
    comp = compute_dtype(dtype)
    load = loader_as(total, comp)
    k = _count_loader(n, comp)
    return pointwise(call, size, lambda i: ops.truediv(load(i), k(i)), dtype, inputs)


def _count_loader(n: Any, dtype: torch.dtype) -> Any:
    """The element count a mean divides by: a constant, or a symbolic size read in the kernel."""
    if isinstance(n, Expr):
        return lambda index: ops.index_expr(n, dtype)
    return scalar_loader(n, dtype)


def _as_count(n: Any) -> Any:
    return n if isinstance(n, Expr) else float(n)


@register(aten.mean.dim, aten.mean.default)
def lower_mean(call: Call, x: TensorValue, dim: Any = None, keepdim: bool = False, *,
               dtype: torch.dtype | None = None) -> TensorValue:
    out = _out(call)
    comp = compute_dtype(out.dtype)
    total = reduce(call, x, dim, keepdim, "sum", comp, stride=tuple(out.stride()))
    return _divide(call, total, _as_count(_count(x, dim)), out.dtype, out.shape, [total])


def _denominator(n: Any, correction: float) -> Any:
    """max(n - correction, 0): a symbolic count only with an integral correction below 2
    (n >= 2 for every size), else the symbolic path refuses."""
    if isinstance(n, Expr):
        if correction != int(correction) or correction > n.bounds()[0]:
            raise TypeError(f"variance of {n} elements with correction {correction}")
        return n - int(correction)
    return max(n - correction, 0.0)


def _squeeze_view(value: TensorValue, rdims: Sequence[int]) -> TensorValue:
    size = [s for d, s in enumerate(value.size) if d not in rdims]

    def reindex(index: Sequence[Expr]) -> list[Expr]:
        it = iter(index)
        return [Expr((), 0) if d in rdims else next(it) for d in range(len(value.size))]

    return ViewValue(value, size, reindex, "squeeze")


def _shifted_mean(call: Call, x: TensorValue, rdims: Sequence[int], n: Any,
                  kept_size: Sequence[Any], dtype: torch.dtype) -> TensorValue:
    """The mean over `rdims` as `p + sum(x - p) / n`, p each row's first element: a row of
    equal values gives exactly that value, as eager's Welford mean does (`sum / n` need not:
    3 * c can round, and var(x) of a constant row then came out above 0, fuzz seed 120422).
    Elsewhere as accurate as `sum / n` or better (the sum adds smaller terms)."""
    comp = compute_dtype(dtype)
    lx = loader_as(x, comp)

    def first_of_row(index: Sequence[Expr]) -> list[Expr]:
        return [Expr((), 0) if d in rdims else i for d, i in enumerate(index)]

    shifted = pointwise(call, x.size, lambda i: ops.sub(lx(i), lx(first_of_row(i))), comp,
                        [x], stride=None)
    total = reduce(call, shifted, rdims, True, "sum", comp)
    lt, k = loader_as(total, comp), _count_loader(_as_count(n), comp)
    return pointwise(call, kept_size,
                     lambda i: ops.add(lx(first_of_row(i)), ops.truediv(lt(i), k(i))),
                     dtype, [x, total], stride=None)


def _var_mean(call: Call, x: TensorValue, dim: Any, correction: float | None,
              keepdim: bool, out_dtype: torch.dtype) -> tuple[TensorValue, TensorValue]:
    comp = compute_dtype(out_dtype)
    rdims = norm_dims(dim, len(x.size))
    n = _count(x, dim)
    kept_size = [1 if d in rdims else s for d, s in enumerate(x.size)]
    if has_elements([x.size[d] for d in rdims]):
        mean = _shifted_mean(call, x, rdims, n, kept_size, comp)
    else:  # no first element to shift by: sum / n (0 / 0, NaN, as eager)
        total = reduce(call, x, rdims, True, "sum", comp)
        mean = _divide(call, total, _as_count(n), comp, kept_size, [total])
    mean_b = loader_as(mean, comp, x.size)
    lx = loader_as(x, comp, into=out_dtype)

    def deviation(index: Sequence[Expr]) -> Any:
        d = ops.sub(lx(index), mean_b(index))
        return ops.mul(d, d)

    sq = pointwise(call, x.size, deviation, comp, [x, mean], stride=None)
    squares = reduce(call, sq, rdims, True, "sum", comp)
    denom = _denominator(n, 1.0 if correction is None else correction)
    var = _divide(call, squares, denom, out_dtype, kept_size, [squares])
    if out_dtype != comp:
        lm = loader_as(mean, comp)
        mean = pointwise(call, kept_size, lm, out_dtype, [mean], stride=None)
    if not keepdim:
        var, mean = _squeeze_view(var, rdims), _squeeze_view(mean, rdims)
    return var, mean


@register(aten.var_mean.correction)
def lower_var_mean(call: Call, x: TensorValue, dim: Any = None, *, correction: Any = None,
                   keepdim: bool = False) -> tuple:
    return _var_mean(call, x, dim, correction, keepdim, _out(call, 0).dtype)


@register(aten.var.correction)
def lower_var(call: Call, x: TensorValue, dim: Any = None, *, correction: Any = None,
              keepdim: bool = False) -> TensorValue:
    return _var_mean(call, x, dim, correction, keepdim, _out(call).dtype)[0]
