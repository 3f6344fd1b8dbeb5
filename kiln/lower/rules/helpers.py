"""helpers: the small vocabulary rule modules build lowerings from.

- `pointwise(call, size, inner_fn, dtype, inputs)`: a new lazy `PointwiseValue` for the call;
- `loader_as(value, dtype, size, into=)`: a loader broadcasting `value` to `size`, converted to
  `dtype` (a fused half-precision value rounded first when it flows into another dtype);
- `scalar_loader(x, dtype)`: a loader of a Python number;
- `expand_to(value, size)`: the broadcast view;
- `norm_dim(d, ndim)`, `norm_dims(dims, ndim)`: negative/None dims made explicit.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from kiln.config import config
from kiln.lower.index import Expr, as_size, size_hint
from kiln.lower.ir import Pointwise, compute_dtype
from kiln.lower.rule_table import Call
from kiln.lower.ops import ops
from kiln.lower.size_scalars import SizeScalar, is_size_number
from kiln.lower.values import (BufferValue, PointwiseValue, TensorValue, ViewValue, base_of,
                               inlined_origins)

__all__ = [
    "expand_to",
    "index_value",
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
    data = Pointwise(tuple(as_size(s) for s in size), inner_fn, compute_dtype(dtype))
    return PointwiseValue(data, dtype, call.device, origins, stride)


def has_elements(size: Sequence[Any]) -> bool:
    """Whether a tensor of `size` has elements, dim by dim (the bounds of a product of
    symbolic sizes are too loose to order `s0*s0 - s0` against 0); TypeError when a symbolic
    extent may be 0 for some sizes and not for others."""
    return all(d > 0 for d in size)


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
        return [Expr((), 0) if broadcasts(own[d], size[lead + d]) else index[lead + d]
                for d in range(len(own))]

    return ViewValue(value, size, reindex, "expand")


def broadcasts(own: Any, size: Any) -> bool:
    """Whether a dim of size `own` is broadcast to `size`: where they differ and `own` is 1, a
    constant or a symbolic size that was 1 at the example's sizes. A graph traced with
    symbolic sizes broadcast that dim under the ShapeEnv's guard that it is 1 (torch's
    broadcasting asks `size == 1`), so it is 1 for every call reaching the graph: `x + x[1::3]`
    of an (s0, s1) input broadcasts the slice's `(s0 + 1)//3` rows, and indexing them as
    (s0, s1) read past the input (fuzz seed 3203575 with --grow)."""
    return own != size and size_hint(own) == 1


_HALF = (torch.float16, torch.bfloat16)


def loader_as(value: TensorValue, dtype: torch.dtype, size: Sequence[int] | None = None, *,
              into: torch.dtype | None = None) -> Loader:
    """A loader of `value` (broadcast to `size` when given) returning `dtype` values, for an op
    whose result has dtype `into`.

    A float16/bfloat16 value computes in float32 while it is fused; eager rounds it at every
    op. With `config.emulate_precision_casts` (the default) every fused op rounds its operands
    to their half-precision dtype as eager stores them, so `(acc16 * 3).long()` sees eager's
    `acc16` (fuzz seed 92238: off by one otherwise). Without it (Inductor's default), the value
    is still rounded where it flows into a result of another dtype (`t16 - x32`,
    `(b16 * 3).long()`, `t16 > 0`): it leaves its half-precision world, and eager's value there
    is the rounded one (fuzz seeds 23534, 23979). A value read from a buffer is already rounded
    and is not rounded again. The other way, an operand of another dtype entering a
    half-precision result is rounded to that dtype, as eager's TensorIterator casts operands to
    the common dtype."""
    if size is not None:
        value = expand_to(value, size)
    inner = value.loader()
    src = value.compute_dtype
    leaves = into is not None and into != value.dtype
    emulated = config.emulate_precision_casts and value.dtype in _HALF
    if (leaves or emulated) and src != value.dtype \
            and not isinstance(base_of(value)[0], BufferValue):
        half = value.dtype
        return lambda index: ops.to_dtype(ops.to_dtype(inner(index), half), dtype)
    if into in _HALF and into != value.dtype and into != dtype:
        # Entering a half-precision result: eager casts every operand to the result dtype
        # first (`t16.add_(x32[1])` adds x32[1] rounded to float16), then computes in float32.
        return lambda index: ops.to_dtype(ops.to_dtype(inner(index), into), dtype)
    if src == dtype:
        return inner
    return lambda index: ops.to_dtype(inner(index), dtype)


def index_value(value: Any) -> Any:
    """An int64 ops value of an index bound: a constant, or an expression of the sizes (a
    symbolic extent, a piece's edge), which the kernel computes from its size arguments."""
    if isinstance(value, Expr) and not value.is_constant:
        return ops.index_expr(value, torch.int64)
    return ops.constant(int(value), torch.int64)


def scalar_loader(x: bool | int | float, dtype: torch.dtype) -> Loader:
    if is_size_number(x):  # a symbolic size, or a float computed from sizes (SizeScalar)
        return _size_number_loader(x, dtype)
    if dtype.is_floating_point:
        x = float(x)
    elif dtype == torch.bool:
        x = bool(x)
    else:
        x = int(x)
    return lambda index: ops.constant(x, dtype)


def _size_number_loader(x: Any, dtype: torch.dtype) -> Loader:
    if isinstance(x, SizeScalar):
        if not dtype.is_floating_point:  # eager would truncate a float operand: not here
            raise TypeError(f"a float computed from sizes ({x}) as a {dtype} operand")
        return lambda index: x.load(dtype)
    return lambda index: ops.index_expr(x, dtype)
