"""helpers: the small vocabulary rule modules build lowerings from.

- `pointwise(call, size, inner_fn, dtype, inputs)`: a new lazy `PointwiseValue` for the call;
- `loader_as(value, dtype, size)`: a loader broadcasting `value` to `size`, converted to `dtype`;
- `scalar_loader(x, dtype)`: a loader of a Python number;
- `expand_to(value, size)`: the broadcast view;
- `norm_dim(d, ndim)`, `norm_dims(dims, ndim)`: negative/None dims made explicit.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from kiln.lower.index import Expr
from kiln.lower.ir import Pointwise, compute_dtype
from kiln.lower.lowering import Call
from kiln.lower.ops import ops
from kiln.lower.values import PointwiseValue, TensorValue, ViewValue, inlined_origins

__all__ = [
    "expand_to",
    "inlined_origins",
    "loader_as",
    "norm_dim",
    "norm_dims",
    "pointwise",
    "scalar_loader",
]

Loader = Callable[[Sequence[Expr]], Any]


def norm_dim(dim: int, ndim: int) -> int:
    ndim = max(ndim, 1)
    if not -ndim <= dim < ndim:
        raise IndexError(f"dim {dim} out of range for {ndim} dims")
    return dim % ndim


def norm_dims(dims: Sequence[int] | int | None, ndim: int) -> list[int]:
    """Sorted, non-negative dims; None or [] means every dim (torch's reduction convention)."""
    if dims is None:
        return list(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    if len(dims) == 0:
        return list(range(ndim))
    return sorted({norm_dim(d, ndim) for d in dims} if ndim else set())


def pointwise(call: Call, size: Sequence[int], inner_fn: Loader, dtype: torch.dtype,
              inputs: Sequence[Any] = (), stride: Sequence[int] | None = None) -> PointwiseValue:
    """A lazy pointwise value of `dtype` over `size`; `inner_fn` returns `compute_dtype(dtype)`."""
    meta = call.out if isinstance(call.out, torch.Tensor) else None
    if stride is None and meta is not None and tuple(meta.shape) == tuple(size):
        stride = tuple(meta.stride())
    origins = [*inlined_origins(inputs), call.origin]
    data = Pointwise(tuple(int(s) for s in size), inner_fn, compute_dtype(dtype))
    return PointwiseValue(data, dtype, call.device, origins, stride)


def expand_to(value: TensorValue, size: Sequence[int]) -> TensorValue:
    """`value` broadcast to `size` (right-aligned, as torch broadcasting)."""
    size = tuple(size)
    if value.size == size:
        return value
    lead = len(size) - len(value.size)
    if lead < 0:
        raise ValueError(f"cannot broadcast {value.size} to {size}")
    own = value.size

    def reindex(index: Sequence[Expr]) -> list[Expr]:
        return [Expr((), 0) if own[d] == 1 and size[lead + d] != 1 else index[lead + d]
                for d in range(len(own))]

    return ViewValue(value, size, reindex, "expand")


def loader_as(value: TensorValue, dtype: torch.dtype, size: Sequence[int] | None = None) -> Loader:
    """A loader of `value` (broadcast to `size` when given) returning `dtype` values."""
    if size is not None:
        value = expand_to(value, size)
    inner = value.loader()
    src = value.compute_dtype
    if src == dtype:
        return inner
    return lambda index: ops.to_dtype(inner(index), dtype)


def scalar_loader(x: bool | int | float, dtype: torch.dtype) -> Loader:
    if dtype.is_floating_point:
        x = float(x)
    elif dtype == torch.bool:
        x = bool(x)
    else:
        x = int(x)
    return lambda index: ops.constant(x, dtype)
