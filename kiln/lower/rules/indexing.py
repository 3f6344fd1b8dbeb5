"""indexing: gathers through data-dependent indices (`ops.indirect_indexing`).

`embedding`, `gather`, `index_select`, `index.Tensor` (integer index tensors) become pointwise
values whose loads use an indirect index symbol. `scatter` whose index has size 1 along `dim`
(what cross-entropy's backward emits) is a pointwise `where(position == index, value, self)`;
other scatters and `index_put` stay fallbacks (they need atomics or a sort).
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from kiln.lower.index import Expr, as_expr
from kiln.lower.rule_table import Call, register
from kiln.lower.ops import ops
from kiln.lower.rules.helpers import expand_to, loader_as, norm_dim, pointwise, scalar_loader
from kiln.lower.values import TensorValue

aten = torch.ops.aten


def _indirect(index_value: TensorValue, size: int, wrap: bool = True) -> Any:
    """Loads of `index_value` as an index symbol over `[0, size)`. `wrap`: negative indices
    count from the end (`x[idx]`); embedding, gather and index_select raise on them in eager,
    so they pass `wrap=False` and a negative index fails the bounds check."""
    load = index_value.loader()
    return lambda idx: ops.indirect_indexing(load(idx), size, wrap=wrap)


@register(aten.embedding.default)
def lower_embedding(call: Call, weight: TensorValue, indices: TensorValue, padding_idx: int = -1,
                    scale_grad_by_freq: bool = False, sparse: bool = False) -> TensorValue:
    row = _indirect(indices, weight.size[0], wrap=False)
    load = weight.loader()
    k = len(indices.size)

    def inner(index: Sequence[Expr]) -> Any:
        return load([row(index[:k]), *index[k:]])

    return pointwise(call, call.out.shape, inner, weight.dtype, [weight, indices])


def _source_has_dims(call: Call, x: Any, *args: Any, **kwargs: Any) -> bool:
    """A 0-dim source has no dim to index: the op stays a library call (rare)."""
    return len(call.meta_args[0].shape) > 0


@register(aten.gather.default, checker=_source_has_dims)
def lower_gather(call: Call, x: TensorValue, dim: int, index: TensorValue, *,
                 sparse_grad: bool = False) -> TensorValue:
    dim = norm_dim(dim, len(x.size))
    pos = _indirect(index, x.size[dim], wrap=False)
    load = x.loader()

    def inner(idx: Sequence[Expr]) -> Any:
        src = list(idx)
        src[dim] = pos(idx)
        return load(src)

    return pointwise(call, call.out.shape, inner, x.dtype, [x, index])


@register(aten.index_select.default, checker=_source_has_dims)
def lower_index_select(call: Call, x: TensorValue, dim: int, index: TensorValue) -> TensorValue:
    dim = norm_dim(dim, len(x.size))
    pos = _indirect(index, x.size[dim], wrap=False)
    load = x.loader()

    def inner(idx: Sequence[Expr]) -> Any:
        src = list(idx)
        src[dim] = pos([idx[dim]]) if index.size else pos([])
        return load(src)

    return pointwise(call, call.out.shape, inner, x.dtype, [x, index])


def _integer_indices(call: Call, x: Any, indices: Sequence[Any]) -> bool:
    metas = call.meta_args[1]
    return all(m is None or not (m.dtype == torch.bool or m.dtype == torch.uint8) for m in metas)


@register(aten.index.Tensor, checker=_integer_indices)
def lower_index(call: Call, x: TensorValue, indices: Sequence[TensorValue | None]) -> TensorValue:
    out = call.out
    ndim = len(x.size)
    indexed = [d for d, t in enumerate(indices) if t is not None]
    adjacent = indexed == list(range(indexed[0], indexed[-1] + 1))
    first = indexed[0] if adjacent else 0
    nb = max(len(indices[d].size) for d in indexed)
    # the indices' broadcast shape, as the fake output has it (sizes may be symbolic)
    bshape = tuple(out.shape[first:first + nb])
    loads = {d: _indirect(expand_to(indices[d], bshape), x.size[d]) for d in indexed}
    load = x.loader()
    rest = [d for d in range(ndim) if d not in indexed]

    def inner(idx: Sequence[Expr]) -> Any:
        bidx = list(idx[first:first + nb])
        others = list(idx[:first]) + list(idx[first + nb:])
        src: list[Any] = [None] * ndim
        for d in indexed:
            src[d] = loads[d](bidx)
        for d, i in zip(rest, others):
            src[d] = i
        return load(src)

    return pointwise(call, out.shape, inner, x.dtype, [x, *[t for t in indices if t is not None]])


def _scatter_one(call: Call, x: Any, dim: int, index: Any, *rest: Any, **kw: Any) -> bool:
    meta_x, meta_i = call.meta_args[0], call.meta_args[2]
    if meta_x.dim() == 0:
        return False  # a 0-dim scatter stays a library call
    d = norm_dim(dim, meta_x.dim())
    return (meta_i.dim() == meta_x.dim() and meta_i.shape[d] == 1
            and all(meta_i.shape[k] == meta_x.shape[k] for k in range(meta_x.dim()) if k != d)
            and kw.get("reduce") is None)


@register(aten.scatter.value, aten.scatter.src, checker=_scatter_one)
def lower_scatter_one(call: Call, x: TensorValue, dim: int, index: TensorValue,
                      src: Any) -> TensorValue:
    dim = norm_dim(dim, len(x.size))
    comp = x.compute_dtype
    lx = x.loader()
    li = index.loader()
    lsrc = loader_as(src, comp, into=x.dtype) if isinstance(src, TensorValue) else scalar_loader(src, comp)

    def inner(idx: Sequence[Expr]) -> Any:
        at = list(idx)
        at[dim] = as_expr(0)
        # the index as an indirect index: bounds-checked like gather's (eager raises on one out
        # of [0, size), negative included), where a compare alone would drop the write
        pos = ops.indirect_indexing(li(at), x.size[dim], wrap=False)
        hit = ops.eq(ops.index_expr(idx[dim], torch.int64), ops.index_expr(pos, torch.int64))
        return ops.where(hit, lsrc(at), lx(idx))

    return pointwise(call, x.size, inner, x.dtype, [x, index, src])
