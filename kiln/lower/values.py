"""values: what an FX node lowers to while the graph is being built.

A `TensorValue` is a lazy tensor: a size, a dtype and a *loader* — `loader(index) -> value`, a
function that emits ops reading the element at `index` (always in the compute dtype: float32 for
bf16/fp16, so an inlined chain rounds once, at its store). Three kinds:

- `BufferValue`: a realized `Buffer`; loads `ops.load(name, layout.index(index))`.
- `PointwiseValue`: an unrealized `Pointwise`; its loader *is* its `inner_fn`, so consumers
  inline it (fusion by inlining, Inductor's idea). `realize` turns it into a `ComputedBuffer`.
- `ViewValue`: an index map over another value (`reindex(index) -> base index`): permute,
  expand, slice, select, reshape, ... never copy anything.

`strided_view(value)` answers "is this value a strided view of a buffer?" by composing the index
maps into the buffer's layout and checking the result is affine in the loop variables: that is
how externs read views instead of copies.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch

from kiln.lower.index import Expr, affine_form, as_size, sym
from kiln.lower.ir import Buffer, Layout, Origin, Pointwise, TensorArg, compute_dtype
from kiln.lower.ops import ops

__all__ = [
    "BufferValue",
    "PointwiseValue",
    "TensorValue",
    "ViewValue",
    "base_of",
    "inlined_origins",
    "strided_view",
]

Loader = Callable[[Sequence[Expr]], Any]
Reindex = Callable[[Sequence[Expr]], list[Expr]]


class TensorValue:
    """A lazy tensor: `size`, `dtype`, `device`, `origins`; `loader()` reads elements."""

    def __init__(self, size: Sequence[int], dtype: torch.dtype, device: torch.device,
                 origins: Sequence[Origin] = ()) -> None:
        self.size = tuple(as_size(s) for s in size)
        self.dtype = dtype
        self.device = device
        self.origins = tuple(origins)

    @property
    def compute_dtype(self) -> torch.dtype:
        return compute_dtype(self.dtype)

    @property
    def numel(self) -> int:
        return math.prod(self.size)

    def loader(self) -> Loader:
        raise NotImplementedError

    def load(self, index: Sequence[Expr]) -> Any:
        return self.loader()(index)


class BufferValue(TensorValue):
    """A realized buffer, read through its (current) layout; `storage=True` reads the whole
    storage as a flat 1-D tensor instead (what `as_strided` views)."""

    def __init__(self, buffer: Buffer, storage: bool = False) -> None:
        lay = buffer.layout
        size = (lay.storage_size(),) if storage else lay.size
        super().__init__(size, lay.dtype, lay.device, buffer.origins)
        self.buffer = buffer
        self.storage = storage

    @property
    def layout(self) -> Layout:
        lay = self.buffer.layout
        if self.storage:
            return Layout(lay.dtype, lay.device, (lay.storage_size(),), (1,), 0)
        return lay

    def loader(self) -> Loader:
        buf = self.buffer

        def load(index: Sequence[Expr]) -> Any:
            value = ops.load(buf.name, affine_form(self.layout.index(index)))
            if compute_dtype(buf.dtype) != buf.dtype:
                value = ops.to_dtype(value, compute_dtype(buf.dtype))
            return value

        return load

    def __repr__(self) -> str:
        return f"BufferValue({self.buffer.name})"


class PointwiseValue(TensorValue):
    """An unrealized pointwise computation. `stride_hint` is eager's stride for this value (from
    the FX node's fake tensor), used as its layout when it is realized."""

    def __init__(self, data: Pointwise, dtype: torch.dtype, device: torch.device,
                 origins: Sequence[Origin] = (), stride_hint: Sequence[int] | None = None) -> None:
        super().__init__(data.ranges, dtype, device, origins)
        if data.dtype != compute_dtype(dtype):
            raise TypeError(f"pointwise of {dtype} must compute in {compute_dtype(dtype)}, "
                            f"not {data.dtype}")
        self.data = data
        self.stride_hint = None if stride_hint is None else tuple(stride_hint)
        self.realized: Any = None  # the BufferValue once realized
        self._stats: tuple[int, int] | None = None

    def loader(self) -> Loader:
        if self.realized is not None:
            return self.realized.loader()
        return self.data.inner_fn

    def stats(self) -> tuple[int, int]:
        """(loads, ops) of one evaluation of the inner function (inlined producers included)."""
        if self._stats is None:
            from kiln.lower.deps import count_ops

            self._stats = count_ops(self.data.inner_fn, self.size)
        return self._stats

    def __repr__(self) -> str:
        return f"PointwiseValue({list(self.size)}, {self.dtype})"


class ViewValue(TensorValue):
    """`base` read through `reindex`: element `index` of the view is element `reindex(index)` of
    `base`. `op` names the view op (for messages)."""

    def __init__(self, base: TensorValue, size: Sequence[int], reindex: Reindex,
                 op: str = "view", origins: Sequence[Origin] = ()) -> None:
        super().__init__(size, base.dtype, base.device, origins or base.origins)
        self.base = base
        self.reindex = reindex
        self.op = op

    def loader(self) -> Loader:
        inner = self.base.loader()
        reindex = self.reindex
        return lambda index: inner(reindex(index))

    def __repr__(self) -> str:
        return f"ViewValue({self.op}, {list(self.size)}, of {self.base!r})"


def inlined_origins(values: Sequence[Any]) -> list[Origin]:
    """Origins of the lazy work that reading `values` inlines (views and unrealized pointwise)."""
    found: list[Origin] = []
    for value in values:
        while isinstance(value, ViewValue):
            found += value.origins
            value = value.base
        if isinstance(value, PointwiseValue) and value.realized is None:
            found += value.origins
    return found


def base_of(value: TensorValue) -> tuple[TensorValue, Reindex]:
    """The non-view value under a chain of views, and the composed index map into it."""
    maps: list[Reindex] = []
    while isinstance(value, ViewValue):
        maps.append(value.reindex)
        value = value.base
    if isinstance(value, PointwiseValue) and value.realized is not None:
        value = value.realized

    def reindex(index: Sequence[Expr]) -> list[Expr]:
        out = list(index)
        for m in maps:
            out = m(out)
        return out

    return value, reindex


def strided_view(value: TensorValue) -> TensorArg | None:
    """The value as `as_strided(buffer, size, stride, offset)` when it is a view of a realized
    buffer expressible that way (affine in every loop variable), else None."""
    base, reindex = base_of(value)
    if not isinstance(base, BufferValue):
        return None
    buf = base.buffer
    if value.numel == 0:
        return None
    index = [sym(f"v{d}", s) for d, s in enumerate(value.size)]
    flat = affine_form(base.layout.index(reindex(index)))
    affine = flat.size_coefficients()
    if affine is None:
        return None
    coefs, offset = affine
    by_name = {s.name: c for s, c in coefs.items()}
    if len(by_name) != len(coefs):
        return None
    stride = [by_name.pop(f"v{d}", 0 if s != 1 else None) for d, s in enumerate(value.size)]
    if by_name:  # a symbol that is not a loop variable (indirect)
        return None
    return TensorArg(buf.name, buf.dtype, value.size, _unit_dim_strides(stride, value.size,
                                                                       base.layout), offset)


def _unit_dim_strides(stride: list, size: tuple, layout: Any) -> tuple:
    """`stride` with the dims of size 1 (None: the index never steps them) filled in. Their
    stride is never used to address memory, but library calls read it: a convolution picks
    channels-last when its weight looks channels-last, and a (C, 1, k, k) depthwise weight
    given stride 1 along its size-1 dim does (cuDNN then converts the NCHW input and the
    output is copied back). A view with the buffer's own sizes keeps the buffer's strides;
    otherwise a size-1 dim gets the stride contiguous order would give it."""
    known = [s for s in stride if s is not None]
    if tuple(size) == tuple(layout.size) and known == [
            s for s, n in zip(layout.stride, layout.size) if n != 1]:
        return tuple(layout.stride)
    filled: list = list(stride)
    step = 1
    for d in reversed(range(len(size))):
        if filled[d] is None:
            filled[d] = step
        if filled[d] != 0:  # a broadcast dim says nothing about the order
            step = filled[d] * size[d] if isinstance(size[d], int) else filled[d]
    return tuple(filled)

