"""nodes: the loop IR's nodes and buffers (`ir.py` puts them together into an `IRGraph`).

- `ComputedBuffer`: a buffer computed by a generated loop nest, whose `data` is either a
  `Pointwise` (one element per point of `ranges`) or a `Reduction` (one element per point of
  `ranges`, reducing over `reduction_ranges`). Its computation is a Python closure (`inner_fn`)
  that emits ops on the current ops handler (`kiln.lower.ops`): evaluating, printing and
  dependency collection are all "run the closure under another handler".
- `Extern`: a call to a library kernel the backend chooses on purpose (matmul, attention,
  convolution), reading strided views of buffers (`TensorArg`) and writing output buffers.
- `Fallback`: any other ATen op, run as an opaque call (the census in tests pins which occur).

Buffers (`InputBuffer`, `ConstantBuffer`, `ComputedBuffer`, `ExternOutput`) each have a `Layout`
(dtype, device, size, stride, storage offset); `ops.load(name, index)` reads the buffer's storage
at a flat offset, so a view is never a node: it is an index map folded into the reader's index.
Every node and buffer records its provenance as `Origin`s (FX node name, ATen op, user line).

Below the graph and its printer (`printer.py` type-checks these classes; `IRGraph.__str__` calls
the printer), so neither imports the other's file back.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import torch

from kiln.lower.index import Expr, as_expr, sym
from kiln.lower.ops import ops

__all__ = [
    "Buffer",
    "ComputedBuffer",
    "ConstantBuffer",
    "Extern",
    "ExternKernel",
    "ExternOutput",
    "Fallback",
    "InputBuffer",
    "Layout",
    "Node",
    "Origin",
    "Pointwise",
    "Reduction",
    "TensorArg",
    "compute_dtype",
    "contiguous_strides",
    "loop_vars",
    "map_nested",
]

LOW_PRECISION = (torch.bfloat16, torch.float16)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype loop bodies compute in for values stored as `dtype` (fp32 for bf16/fp16)."""
    return torch.float32 if dtype in LOW_PRECISION else dtype


@dataclasses.dataclass(frozen=True)
class Origin:
    """Where an IR node came from: the FX `node` name, its `op` (e.g. "aten.add.Tensor"; for
    ops produced by a decomposition, "aten.native_layer_norm.default/aten.var_mean.correction"),
    and the `user_location` ("file.py:12") from `node.meta["user_location"]`, when known."""

    node: str
    op: str
    user_location: str | None = None

    def render(self) -> str:
        return f"{self.node} ({self.user_location})" if self.user_location else self.node


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a buffer's elements sit in its storage.

    dtype, device: of the elements. size: logical shape. stride: elements between neighbours
    along each dim (0 for a broadcast dim). offset: storage offset of element (0, ..., 0).
    `index(idx)` is the flat storage offset of the element at loop index `idx`.
    """

    dtype: torch.dtype
    device: torch.device
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int = 0

    @staticmethod
    def contiguous(dtype: torch.dtype, device: torch.device, size: Sequence[int]) -> Layout:
        return Layout(dtype, device, tuple(size), contiguous_strides(size), 0)

    def index(self, idx: Sequence[Expr | int]) -> Expr:
        total = as_expr(self.offset)
        for i, st in zip(idx, self.stride):
            total = total + as_expr(i) * st
        return total

    def storage_size(self) -> int:
        if any(s == 0 for s in self.size):
            return 0
        return self.offset + sum((s - 1) * st for s, st in zip(self.size, self.stride)) + 1

    @property
    def numel(self) -> int:
        return math.prod(self.size)

    def is_dense(self) -> bool:
        """Non-overlapping and gap-free (some permutation of contiguous)."""
        if self.is_contiguous():
            return True  # decided without ordering strides, which symbolic sizes may not allow
        dims = sorted((st, s) for s, st in zip(self.size, self.stride) if s != 1)
        expected = 1
        for st, s in dims:
            if st != expected:
                return False
            expected *= s
        return True

    def is_contiguous(self) -> bool:
        """Row-major for its size (strides of size-1 dims do not matter)."""
        expected: Any = 1
        for s, st in reversed(tuple(zip(self.size, self.stride))):
            if s != 1 and st != expected:
                return False
            expected = s * expected
        return True

    def render(self) -> str:
        dtype = str(self.dtype).replace("torch.", "")
        off = f" +{self.offset}" if self.offset else ""
        return f"{dtype}{list(self.size)} stride={self.stride}{off}"


def contiguous_strides(size: Sequence[int]) -> tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(size):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def loop_vars(ranges: Sequence[int], prefix: str = "x") -> list[Expr]:
    """The index symbols of a loop nest: `x0, x1, ...` (or `r0, ...`) with their ranges."""
    return [sym(f"{prefix}{i}", s) for i, s in enumerate(ranges)]


# -- computations ----------------------------------------------------------------------------------

@dataclasses.dataclass(eq=False)
class Pointwise:
    """One value per point of a loop nest.

    ranges: loop sizes, outermost first (the loop variables are `x0, x1, ...`).
    inner_fn: `inner_fn(index: list[Expr]) -> value`; emits ops on the current handler and
        returns the element at `index`.
    dtype: dtype of the value `inner_fn` returns (the compute dtype: float32 for a bf16 buffer,
        whose store body rounds once).
    store_fn: optional `store_fn(index) -> value` already in the stored dtype, for a body whose
        last op is a rounding cast (so the store does not round a rounded value again); the
        default store is `to_dtype(inner_fn(index), buffer dtype)`.
    """

    ranges: tuple[int, ...]
    inner_fn: Callable[[Sequence[Expr]], Any]
    dtype: torch.dtype
    store_fn: Callable[[Sequence[Expr]], Any] | None = None


@dataclasses.dataclass(eq=False)
class Reduction:
    """One value per point of `ranges`, reducing `inner_fn` over `reduction_ranges`.

    ranges: output loop sizes (`x0, ...`); reduction_ranges: reduced loop sizes (`r0, ...`),
        never empty and never with a zero (the lower stage reduces a 0-dim input over `(1,)`
        and an empty dim's identity once; a buffer with no elements is an `Extern` "empty").
    reduction_type: one of `ops.REDUCTION_TYPES` ("sum", "max", "argmax", ...); argmax/argmin
        give the row-major flat position within the reduction ranges.
    inner_fn: `inner_fn(index, rindex) -> value` of dtype `src_dtype`.
    dtype: accumulator and result dtype (int64 for argmax/argmin).
    """

    ranges: tuple[int, ...]
    reduction_ranges: tuple[int, ...]
    reduction_type: str
    inner_fn: Callable[[Sequence[Expr], Sequence[Expr]], Any]
    dtype: torch.dtype
    src_dtype: torch.dtype


# -- buffers ---------------------------------------------------------------------------------------

class Buffer:
    """A named storage. name: unique in the graph (placeholder names for inputs, "bufN" for
    computed ones); layout: its `Layout`; origins: the FX nodes whose values it holds."""

    kind = "buffer"

    def __init__(self, name: str, layout: Layout, origins: Sequence[Origin] = ()) -> None:
        self.name = name
        self.layout = layout
        self.origins = tuple(origins)

    @property
    def dtype(self) -> torch.dtype:
        return self.layout.dtype

    @property
    def user_location(self) -> str | None:
        for origin in reversed(self.origins):
            if origin.user_location:
                return origin.user_location
        return None

    def as_arg(self) -> TensorArg:
        lay = self.layout
        return TensorArg(self.name, lay.dtype, lay.size, lay.stride, lay.offset)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}: {self.layout.render()}>"


class InputBuffer(Buffer):
    """A graph input (FX placeholder `name`), with the example input's sizes and strides. Its
    layout's offset counts from the input tensor's first element (its `data_ptr()`), not from
    the start of its storage: kernels address inputs from the pointer they are handed, so a
    graph compiled for `xs[0]` runs `xs[5]` unchanged (the example's storage offset is in
    `IRGraph.input_offsets`)."""

    kind = "input"


class ConstantBuffer(Buffer):
    """A tensor constant of the FX graph (`get_attr`); `value` is the real tensor."""

    kind = "constant"

    def __init__(self, name: str, layout: Layout, value: torch.Tensor,
                 origins: Sequence[Origin] = ()) -> None:
        super().__init__(name, layout, origins)
        self.value = value


class ComputedBuffer(Buffer):
    """A buffer written by a generated loop nest; `data` is its `Pointwise` or `Reduction`.

    `body(index, rindex)` is the whole computation including the store; run it under an ops
    handler (with `loop_vars(...)`) to evaluate, print or collect dependencies."""

    kind = "computed"

    def __init__(self, name: str, layout: Layout, data: Pointwise | Reduction,
                 origins: Sequence[Origin] = ()) -> None:
        super().__init__(name, layout, origins)
        self.data = data

    @property
    def is_reduction(self) -> bool:
        return isinstance(self.data, Reduction)

    def loop_vars(self) -> tuple[list[Expr], list[Expr]]:
        rranges = self.data.reduction_ranges if self.is_reduction else ()
        return loop_vars(self.data.ranges, "x"), loop_vars(rranges, "r")

    def body(self, index: Sequence[Expr], rindex: Sequence[Expr] = ()) -> None:
        data = self.data
        if isinstance(data, Pointwise):
            if data.store_fn is not None:
                value = data.store_fn(index)
            else:
                value = data.inner_fn(index)
                if data.dtype != self.dtype:
                    value = ops.to_dtype(value, self.dtype)
            ops.store(self.name, self.layout.index(index), value)
            return
        value = data.inner_fn(index, rindex)
        acc = ops.reduction(data.dtype, data.src_dtype, data.reduction_type, value)
        if data.dtype != self.dtype:
            acc = ops.to_dtype(acc, self.dtype)
        ops.store_reduction(self.name, self.layout.index(index), acc)


class ExternOutput(Buffer):
    """A buffer written by an `Extern` or `Fallback` node (`producer`)."""

    kind = "extern"

    def __init__(self, name: str, layout: Layout, origins: Sequence[Origin] = ()) -> None:
        super().__init__(name, layout, origins)
        self.producer: ExternKernel | None = None


@dataclasses.dataclass(frozen=True)
class TensorArg:
    """A strided view of buffer `name` handed to a kernel call (no copy): the tensor is
    `torch.as_strided(storage(name), size, stride, offset)`."""

    name: str
    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int = 0

    def render(self) -> str:
        return f"tensor({self.name!r}, {self.size}, {self.stride}, {self.offset})"


class ExternKernel:
    """A kernel call node.

    kind: "mm", "bmm", "addmm", "attention", "attention_backward", "convolution",
        "convolution_backward" for an `Extern`; "fallback" for a `Fallback`.
    op: the ATen OpOverload called.
    args, kwargs: the call's arguments with every tensor replaced by a `TensorArg`.
    outputs: one entry per returned value (flattened): an `ExternOutput`, None, or a Python
        constant (static shape outputs such as flash attention's max_q).
    origins: FX nodes it came from.
    """

    def __init__(self, kind: str, op: Any, args: tuple, kwargs: dict,
                 outputs: Sequence[ExternOutput | None | Any], origins: Sequence[Origin]) -> None:
        self.kind = kind
        self.op = op
        self.args = args
        self.kwargs = kwargs
        self.outputs = tuple(outputs)
        self.origins = tuple(origins)
        for out in self.outputs:
            if isinstance(out, ExternOutput):
                out.producer = self

    @property
    def name(self) -> str:
        names = [o.name for o in self.outputs if isinstance(o, ExternOutput)]
        return names[0] if names else f"extern_{id(self):x}"

    def output_buffers(self) -> list[ExternOutput]:
        return [o for o in self.outputs if isinstance(o, ExternOutput)]

    def tensor_args(self) -> list[TensorArg]:
        found: list[TensorArg] = []
        _collect_args((self.args, self.kwargs), found)
        return found

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.kind} {self.op}>"


class Extern(ExternKernel):
    """A library kernel chosen on purpose (matmul/attention/convolution)."""


class Fallback(ExternKernel):
    """An ATen op the lower stage has no lowering for, run as an opaque call."""


def map_nested(value: Any, leaf: type | tuple[type, ...], fn: Callable[[Any], Any]) -> Any:
    """`value` with every `leaf` instance inside nested lists, tuples and dicts replaced by
    `fn(instance)`; anything else is kept (an op's args, a graph's outputs)."""
    if isinstance(value, leaf):
        return fn(value)
    if isinstance(value, list):
        return [map_nested(v, leaf, fn) for v in value]
    if isinstance(value, tuple):
        return tuple(map_nested(v, leaf, fn) for v in value)
    if isinstance(value, dict):
        return {k: map_nested(v, leaf, fn) for k, v in value.items()}
    return value


def _collect_args(value: Any, found: list[TensorArg]) -> None:
    if isinstance(value, TensorArg):
        found.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _collect_args(v, found)
    elif isinstance(value, dict):
        for v in value.values():
            _collect_args(v, found)


# What `IRGraph.nodes` holds, in execution order.
Node = ComputedBuffer | ExternKernel
