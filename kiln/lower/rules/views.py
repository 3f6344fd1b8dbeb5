"""views: view ops → index maps (`ViewValue`), plus cat and constant padding.

A view never copies: it maps the consumer's index to its input's index (`reindex`), and the
index algebra (`index.py`) simplifies the composition. A reshape goes through the flat
row-major position: `base[d] = (flat // stride_d) % size_d`, which simplification turns back into
plain variables whenever dims line up. `as_strided` indexes the base buffer's storage directly.
The `*_copy` variants (what `functionalize(remove="mutations_and_views")` emits) are the same
index maps wrapped in a lazy copy, since their results do not alias.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from kiln.lower.index import Expr, as_expr, as_size, size_hint
from kiln.lower.ir import compute_dtype, contiguous_strides
from kiln.lower.rule_table import Call, LoweringError, register
from kiln.lower.ops import ops
from kiln.lower.rules.helpers import (expand_to, has_elements, index_value, loader_as, norm_dim,
                                      pointwise)
from kiln.lower.values import BufferValue, PointwiseValue, TensorValue, ViewValue, base_of

aten = torch.ops.aten

__all__ = ["permute_view", "reshape_view", "select_view", "slice_view"]


def _view(call: Call, x: TensorValue, size: Sequence[int], reindex: Any) -> TensorValue:
    return ViewValue(x, size, reindex, call.origin.op, (call.origin,))


def reshape_view(x: TensorValue, size: Sequence[int]) -> tuple[tuple[int, ...], Any]:
    size = tuple(as_size(s) for s in size)
    if -1 in size:
        known = math.prod(s for s in size if s != -1)
        size = tuple(x.numel // known if s == -1 else s for s in size)
    old = x.size
    if size == old:
        return size, lambda index: list(index)
    if any(isinstance(s, int) and s == 0 for s in old):  # no element: nothing is ever read
        return size, lambda index: [as_expr(0)] * len(old)
    new_strides = contiguous_strides(size)
    old_strides = contiguous_strides(old)

    def reindex(index: Sequence[Expr]) -> list[Expr]:
        flat = as_expr(0)
        for i, st in zip(index, new_strides):
            flat = flat + as_expr(i) * st
        return [(flat // st) % s for st, s in zip(old_strides, old)]

    return size, reindex


def permute_view(x: TensorValue, dims: Sequence[int]) -> tuple[tuple[int, ...], Any]:
    ndim = len(x.size)
    dims = [norm_dim(d, ndim) for d in dims]
    size = tuple(x.size[d] for d in dims)

    def reindex(index: Sequence[Expr]) -> list[Expr]:
        out: list[Any] = [None] * ndim
        for k, d in enumerate(dims):
            out[d] = index[k]
        return out

    return size, reindex


def slice_view(x: TensorValue, dim: int, start: Any, end: Any, step: int,
               length: Any = None) -> tuple[tuple[int, ...], Any]:
    """`x[..., start:end:step, ...]` along `dim`. With symbolic bounds or a symbolic extent,
    `length` (the fake output's size along `dim`, which torch's meta function clamped) gives
    the size, and only the start is worked out here."""
    dim = norm_dim(dim, len(x.size))
    n = x.size[dim]
    if all(_constant(v) for v in (n, start, end)):
        start, end, _ = slice(_int_or_none(start), _int_or_none(end), 1).indices(int(n))
        length = max(0, -(-(end - start) // step))
    elif length is None:
        raise TypeError("a slice with symbolic bounds needs the size of its result")
    else:
        start = _slice_start(start, n, end, step, length)
    size = x.size[:dim] + (as_size(length),) + x.size[dim + 1:]

    def reindex(index: Sequence[Expr]) -> list[Expr]:
        out = list(index)
        out[dim] = as_expr(index[dim]) * step + start
        return out

    return size, reindex


def _constant(value: Any) -> bool:
    return not isinstance(value, Expr) or value.is_constant


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _slice_start(start: Any, n: Any, end: Any = None, step: int = 1,
                 length: Any = None) -> Expr:
    """The first element of a slice of an extent-`n` dim with symbolic bounds, as an index.
    A negative start counts from the end (torch clamps it at 0: only a start known to stay in
    the dim for every size is taken). A slice that runs to the end of the dim with step 1
    (`x[:, -4096:]`, a sliding window) starts `length` before the end whatever the clamp did,
    `length` being torch's own size of the result. Else TypeError, and the graph compiles per
    size. A start past the end needs no clamp: the slice is then empty and reads nothing."""
    start = as_expr(0 if start is None else start)
    if start >= 0:  # raises when the sign depends on the sizes
        return start
    from_end = as_expr(n) + start
    try:
        if from_end >= 0:
            return from_end
    except TypeError:
        pass
    if step == 1 and length is not None and _reaches_end(end, n):
        return as_expr(n) - as_expr(length)
    raise TypeError(f"slice start {start} of a dim of {n} may fall before its first element")


def _reaches_end(end: Any, n: Any) -> bool:
    """Whether a slice's `end` is at or past the dim's extent `n` for every size."""
    if end is None:
        return True
    try:
        return bool(as_expr(end) >= as_expr(n))
    except TypeError:  # the order depends on the sizes
        return False


def select_view(x: TensorValue, dim: int, i: int) -> tuple[tuple[int, ...], Any]:
    dim = norm_dim(dim, len(x.size))
    i = i + x.size[dim] if i < 0 else i
    size = x.size[:dim] + x.size[dim + 1:]

    def reindex(index: Sequence[Expr]) -> list[Expr]:
        return [*index[:dim], as_expr(i), *index[dim:]]

    return size, reindex


@register(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def lower_view(call: Call, x: TensorValue, size: Sequence[int]) -> TensorValue:
    return _view(call, x, *reshape_view(x, call.out.shape))


@register(aten.permute.default)
def lower_permute(call: Call, x: TensorValue, dims: Sequence[int]) -> TensorValue:
    return _view(call, x, *permute_view(x, dims))


@register(aten.transpose.int)
def lower_transpose(call: Call, x: TensorValue, d0: int, d1: int) -> TensorValue:
    dims = list(range(len(x.size)))
    if dims:
        d0, d1 = norm_dim(d0, len(dims)), norm_dim(d1, len(dims))
        dims[d0], dims[d1] = dims[d1], dims[d0]
    return _view(call, x, *permute_view(x, dims))


@register(aten.t.default)
def lower_t(call: Call, x: TensorValue) -> TensorValue:
    return _view(call, x, *permute_view(x, list(range(len(x.size)))[::-1]))


@register(aten.expand.default)
def lower_expand(call: Call, x: TensorValue, size: Sequence[int], *, implicit: bool = False) -> TensorValue:
    view = expand_to(x, call.out.shape)
    return view if view is x else _view(call, x, view.size, view.reindex)


@register(aten.unsqueeze.default)
def lower_unsqueeze(call: Call, x: TensorValue, dim: int) -> TensorValue:
    dim = norm_dim(dim, len(x.size) + 1)

    def reindex(index: Sequence[Expr]) -> list[Expr]:
        return [*index[:dim], *index[dim + 1:]]

    return _view(call, x, call.out.shape, reindex)


@register(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def lower_squeeze(call: Call, x: TensorValue, dims: Any = None) -> TensorValue:
    ndim = len(x.size)
    if dims is None:
        dims = list(range(ndim))
    elif isinstance(dims, int):
        dims = [dims]
    gone = {norm_dim(d, ndim) for d in dims if ndim} if ndim else set()
    # a symbolic size that was 1 when traced is squeezed under the ShapeEnv's guard that it is 1
    gone = {d for d in gone if size_hint(x.size[d]) == 1}
    if ndim - len(gone) != len(call.out.shape):
        raise LoweringError(f"squeeze of {x.size} to {tuple(call.out.shape)}: the dims to drop "
                            "are not known")

    def reindex(index: Sequence[Expr]) -> list[Expr]:
        it = iter(index)
        return [as_expr(0) if d in gone else next(it) for d in range(ndim)]

    return _view(call, x, call.out.shape, reindex)


@register(aten.slice.Tensor)
def lower_slice(call: Call, x: TensorValue, dim: int = 0, start: int | None = None,
                end: int | None = None, step: int = 1) -> TensorValue:
    length = call.out.shape[norm_dim(dim, len(x.size))]
    return _view(call, x, *slice_view(x, dim, start, end, step, length))


@register(aten.select.int)
def lower_select(call: Call, x: TensorValue, dim: int, index: int) -> TensorValue:
    return _view(call, x, *select_view(x, dim, index))


@register(aten.split.Tensor, aten.split_with_sizes.default)
def lower_split(call: Call, x: TensorValue, sizes: Any, dim: int = 0) -> tuple:
    dim = norm_dim(dim, len(x.size))
    outs, start = [], 0
    for meta in call.out:
        n = meta.shape[dim]
        outs.append(_view(call, x, *slice_view(x, dim, start, start + n, 1, n)))
        start += n
    return tuple(outs)


@register(aten.unbind.int)
def lower_unbind(call: Call, x: TensorValue, dim: int = 0) -> tuple:
    return tuple(_view(call, x, *select_view(x, dim, i))
                 for i in range(x.size[norm_dim(dim, len(x.size))]))


@register(aten.as_strided.default)
def lower_as_strided(call: Call, x: TensorValue, size: Sequence[int], stride: Sequence[int],
                     storage_offset: int | None = None) -> TensorValue:
    base, _ = base_of(x)
    if isinstance(base, PointwiseValue) or not isinstance(base, BufferValue):
        base = call.builder.realize(base)
    offset = call.meta_args[0].storage_offset() if storage_offset is None else storage_offset
    # positions in the input's storage, whose layout counts from the input's first element
    offset = offset - call.builder.graph.input_offsets.get(base.buffer.name, 0)
    storage = BufferValue(base.buffer, storage=True)
    stride = tuple(stride)

    def reindex(index: Sequence[Expr]) -> list[Expr]:
        flat = as_expr(offset)
        for i, st in zip(index, stride):
            flat = flat + as_expr(i) * st
        return [flat]

    return _view(call, storage, tuple(size), reindex)


def _copy_of(view_lowering: Any) -> Any:
    def lower(call: Call, x: TensorValue, *args: Any, **kwargs: Any) -> Any:
        result = view_lowering(call, x, *args, **kwargs)
        if isinstance(result, tuple):
            return tuple(pointwise(call, v.size, v.loader(), v.dtype, [v], stride=None)
                         for v in result)
        return pointwise(call, result.size, result.loader(), result.dtype, [result])

    return lower


for _name, _fn in [("view_copy", lower_view), ("permute_copy", lower_permute),
                   ("transpose_copy", lower_transpose), ("t_copy", lower_t),
                   ("expand_copy", lower_expand), ("unsqueeze_copy", lower_unsqueeze),
                   ("squeeze_copy", lower_squeeze), ("slice_copy", lower_slice),
                   ("select_copy", lower_select), ("split_copy", lower_split),
                   ("split_with_sizes_copy", lower_split), ("unbind_copy", lower_unbind),
                   ("as_strided_copy", lower_as_strided), ("alias_copy", None)]:
    packet = getattr(aten, _name, None)
    if packet is None or _fn is None:
        continue
    for _overload in packet.overloads():
        _op = getattr(packet, _overload)
        if not _overload.startswith("out") and not _op._schema.is_mutable:
            register(_op)(_copy_of(_fn))


@register(aten.flip.default)
def lower_flip(call: Call, x: TensorValue, dims: Sequence[int]) -> TensorValue:
    flipped = {norm_dim(d, len(x.size)) for d in dims}
    size = x.size

    def reindex(index: Sequence[Expr]) -> list[Expr]:
        return [size[d] - 1 - as_expr(i) if d in flipped else i for d, i in enumerate(index)]

    view = _view(call, x, size, reindex)  # not a view in eager: a lazy copy through the map
    return pointwise(call, size, view.loader(), x.dtype, [view])


# -- cat and padding -------------------------------------------------------------------------------

def _index_lt(i: Expr, bound: Any) -> Any:
    return ops.lt(ops.index_expr(i, torch.int64), index_value(bound))


def _index_ge(i: Expr, bound: Any) -> Any:
    return ops.ge(ops.index_expr(i, torch.int64), index_value(bound))


@register(aten.cat.default)
def lower_cat(call: Call, tensors: Sequence[TensorValue], dim: int = 0) -> TensorValue:
    """Each output element reads one piece, under a mask that is exactly that piece's range
    along `dim` (a wider mask read before the piece's storage: a null pointer for an empty
    piece). Pieces with nothing along `dim` (and legacy 1-D empties) take no part; the pieces
    are converted to the promoted dtype, as eager's cat does."""
    out = call.out
    dim = norm_dim(dim, out.dim())
    parts = [t for t in tensors if has_elements(t.size)]
    comp = compute_dtype(out.dtype)
    if not parts:  # the result has no elements
        return pointwise(call, out.shape, lambda index: ops.constant(0, comp), out.dtype, [])
    bounds, acc = [], 0
    for t in parts:
        bounds.append((acc, acc + t.size[dim]))
        acc += t.size[dim]
    loaders = [loader_as(t, comp, into=out.dtype) for t in parts]

    def piece(k: int, index: Sequence[Expr]) -> Any:
        shifted = list(index)
        shifted[dim] = as_expr(index[dim]) - bounds[k][0]
        return loaders[k](shifted)

    def inner(index: Sequence[Expr]) -> Any:
        value = None
        for k in reversed(range(len(parts))):
            lo, hi = bounds[k]
            inside = [_index_ge(index[dim], lo)] if lo > 0 else []
            inside += [_index_lt(index[dim], hi)] if hi < acc else []
            if not inside:  # the only piece
                return piece(k, index)
            mask = inside[0] if len(inside) == 1 else ops.logical_and(*inside)
            masked = ops.masked(mask, lambda k=k: piece(k, index), 0)
            value = masked if value is None else ops.where(mask, masked, value)
        return value

    return pointwise(call, out.shape, inner, out.dtype, parts)


@register(aten.constant_pad_nd.default)
def lower_constant_pad_nd(call: Call, x: TensorValue, pad: Sequence[int],
                          value: float = 0) -> TensorValue:
    out = call.out
    ndim = len(x.size)
    lows = [0] * ndim
    for k in range(len(pad) // 2):
        lows[ndim - 1 - k] = pad[2 * k]
    load = x.loader()
    fill = value

    def inner(index: Sequence[Expr]) -> Any:
        src = [as_expr(i) - lo for i, lo in zip(index, lows)]
        mask = None
        for d, (s, lo) in enumerate(zip(src, lows)):
            hi_pad = out.shape[d] - lo - x.size[d]
            if lo <= 0 and hi_pad <= 0:
                continue
            m = ops.logical_and(_index_ge(index[d], lo), _index_lt(index[d], lo + x.size[d]))
            mask = m if mask is None else ops.logical_and(mask, m)
        if mask is None:
            return load(src)
        return ops.masked(mask, lambda: load(src), fill)

    return pointwise(call, out.shape, inner, out.dtype, [x])
