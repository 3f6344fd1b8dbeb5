"""evaluate: the reference evaluator — runs the loop IR with torch ops on the CPU.

`Evaluator` is an ops handler whose values are torch tensors. A `ComputedBuffer` is evaluated
once over its whole index grid, vectorized: loop variable `x{d}` is bound to
`arange(size_d)` shaped to broadcast along dim d, every index expression evaluates to an int64
index tensor, `ops.load` gathers from the buffer's flat storage and `ops.store` scatters into it.
Math ops call their row's torch reference (`op_table.MATH_OPS`). Reductions reduce the trailing
reduction dims of the grid. No Python loop runs per element.

`run_ir(graph, inputs)` runs a whole `IRGraph` (externs and fallbacks call the ATen op on
strided views) and returns the flat outputs; `PrintedRun` is the same machine driven by the
printed form of a graph (`str(graph)`), which is how printed IR runs.

It is a test oracle, not a fast path: it never fuses, caches or parallelizes.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import torch

from kiln._util import memory_from
from kiln.lower.index import Expr, Sym
from kiln.lower.ir import (ComputedBuffer, ConstantBuffer, ExternKernel, IRGraph, Reduction,
                           TensorArg, map_nested)
from kiln.lower.op_table import MATH_OPS
from kiln.lower.ops import OpsHandler, use_handler

__all__ = ["Evaluator", "PrintedRun", "run_ir", "run_printed"]


class Evaluator(OpsHandler):
    """Evaluates loop bodies over full index grids; `storages` maps buffer names to flat
    (1-D) storage tensors."""

    def __init__(self, storages: dict[str, torch.Tensor]) -> None:
        self.storages = storages
        self.env: dict[str, Any] = {}
        self.grid: tuple[int, ...] = ()
        self.n_reduction = 0
        self.masks: list[torch.Tensor] = []
        self.indirect = 0

    def run(self, body: Callable[..., None], ranges: Sequence[int],
            reduction_ranges: Sequence[int] = ()) -> None:
        """Run `body(x0, ..., r0, ...)` over the grid `ranges + reduction_ranges`."""
        from kiln.lower.ir import loop_vars

        self.grid = tuple(ranges) + tuple(reduction_ranges)
        self.n_reduction = len(reduction_ranges)
        names = [f"x{i}" for i in range(len(ranges))] + \
                [f"r{i}" for i in range(len(reduction_ranges))]
        self.env = {}
        for d, (name, size) in enumerate(zip(names, self.grid)):
            shape = [1] * len(self.grid)
            shape[d] = size
            self.env[name] = torch.arange(size).view(shape)
        args = loop_vars(ranges, "x") + loop_vars(reduction_ranges, "r")
        with use_handler(self):
            body(*args)

    # -- index evaluation --------------------------------------------------------------------

    def _expr(self, expr: Expr | int) -> torch.Tensor:
        value = expr.evaluate(self.env) if isinstance(expr, Expr) else expr
        if not isinstance(value, torch.Tensor):
            value = torch.tensor(value, dtype=torch.int64)
        return value

    def _index(self, expr: Expr) -> torch.Tensor:
        value = self._expr(expr)
        if self.masks:
            value = torch.where(self._mask(), value, 0)
        return value

    def _mask(self) -> torch.Tensor:
        mask = self.masks[0]
        for m in self.masks[1:]:
            mask = mask & m
        return mask

    # -- memory ------------------------------------------------------------------------------

    def load(self, name: str, index: Expr) -> torch.Tensor:
        return self.storages[name][self._index(index)]

    def _scatter(self, name: str, index: Expr, value: torch.Tensor, shape: tuple) -> None:
        storage = self.storages[name]
        if value.dtype != storage.dtype:
            raise TypeError(f"store of {value.dtype} into {name} ({storage.dtype}): the IR "
                            f"must convert with ops.to_dtype first")
        idx = torch.broadcast_to(self._expr(index), shape).reshape(-1)
        storage[idx] = torch.broadcast_to(value, shape).reshape(-1)

    def store(self, name: str, index: Expr, value: torch.Tensor) -> None:
        self._scatter(name, index, value, self.grid)

    def store_reduction(self, name: str, index: Expr, value: torch.Tensor) -> None:
        shape = self.grid[:len(self.grid) - self.n_reduction] + (1,) * self.n_reduction
        self._scatter(name, index, value, shape)

    def reduction(self, dtype: torch.dtype, src_dtype: torch.dtype, reduction_type: str,
                  value: torch.Tensor) -> torch.Tensor:
        keep = len(self.grid) - self.n_reduction
        full = torch.broadcast_to(value, self.grid).reshape(*self.grid[:keep], -1)
        if reduction_type == "sum":
            out = full.to(dtype).sum(-1)
        elif reduction_type == "prod":
            out = full.to(dtype).prod(-1)
        elif reduction_type == "max":
            out = full.amax(-1)
        elif reduction_type == "min":
            out = full.amin(-1)
        elif reduction_type == "argmax":
            out = full.argmax(-1)
        elif reduction_type == "argmin":
            out = full.argmin(-1)
        elif reduction_type == "any":
            out = full.bool().any(-1)
        else:
            raise ValueError(f"unknown reduction type {reduction_type!r}")
        return out.to(dtype).reshape(*self.grid[:keep], *(1,) * self.n_reduction)

    # -- leaves and control ------------------------------------------------------------------

    def constant(self, value: Any, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(value, dtype=dtype)

    def index_expr(self, expr: Expr, dtype: torch.dtype) -> torch.Tensor:
        return self._expr(expr).to(dtype)

    def indirect_indexing(self, value: torch.Tensor, size: int, check: bool = True,
                          wrap: bool = True) -> Expr:
        value = value.long()
        if wrap:
            value = torch.where(value < 0, value + size, value)
        if check:
            bad = (value < 0) | (value >= size)
            if self.masks:
                bad = bad & self._mask()
            if bool(bad.any()):
                raise IndexError(f"indirect index out of range [0, {size})")
        name = f"_ind{self.indirect}"
        self.indirect += 1
        self.env[name] = value
        return Expr.make([(Sym(name, size), 1)])

    def to_dtype(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return x.to(dtype)

    def where(self, cond: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.where(cond, a, b)

    def masked(self, mask: torch.Tensor, body: Callable[[], Any], other: Any) -> torch.Tensor:
        self.masks.append(mask)
        try:
            value = body()
        finally:
            self.masks.pop()
        return torch.where(mask, value, torch.tensor(other, dtype=value.dtype))

    def math(self, name: str, *args: Any) -> torch.Tensor:
        return MATH_OPS[name].reference(*args)


# -- running graphs --------------------------------------------------------------------------------

def flat_storage(t: torch.Tensor) -> torch.Tensor:
    """The whole storage of `t` as a 1-D tensor of its dtype (shares memory)."""
    n = t.untyped_storage().nbytes() // t.element_size()
    return torch.as_strided(t, (n,), (1,), 0)


def _new_storage(dtype: torch.dtype, size: Sequence[int], stride: Sequence[int],
                 offset: int) -> torch.Tensor:
    n = 0 if any(s == 0 for s in size) else \
        offset + sum((s - 1) * st for s, st in zip(size, stride)) + 1
    if dtype.is_floating_point:
        return torch.full((n,), math.nan, dtype=dtype)  # unwritten elements show up as NaN
    return torch.zeros((n,), dtype=dtype)


class PrintedRun:
    """The machine a graph runs on: named flat storages plus the evaluator. Its methods are
    what printed IR calls (`rt.bind`, `rt.pointwise`, ...); `run_ir` drives it directly."""

    def __init__(self, constants: Mapping[str, Any] | None = None) -> None:
        self.constants = dict(constants or {})
        self.storages: dict[str, torch.Tensor] = {}
        self.evaluator = Evaluator(self.storages)

    def bind(self, name: str, tensor: torch.Tensor, dtype: torch.dtype, size: Sequence[int],
             stride: Sequence[int], offset: int) -> None:
        """An input: its layout's offset counts from the tensor's first element (any storage
        offset of the tensor itself is fine, as for compiled kernels)."""
        got = (tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()))
        want = (dtype, tuple(size), tuple(stride))
        if got != want:
            raise ValueError(f"input {name}: the graph was lowered for (dtype, size, stride) "
                             f"{want}, got {got}")
        self.storages[name] = memory_from(tensor)  # `offset` is 0: lowered input layouts

    def constant(self, name: str) -> None:
        value = self.constants[name]
        self.storages[name] = flat_storage(value.value if isinstance(value, ConstantBuffer)
                                           else value)

    def tensor(self, name: str, size: Sequence[int], stride: Sequence[int],
               offset: int = 0) -> torch.Tensor:
        return torch.as_strided(self.storages[name], tuple(size), tuple(stride), offset)

    def pointwise(self, name: str, body: Callable[..., None], ranges: Sequence[int],
                  dtype: torch.dtype, size: Sequence[int], stride: Sequence[int],
                  offset: int) -> None:
        self.storages[name] = _new_storage(dtype, size, stride, offset)
        self.evaluator.run(body, ranges)

    def reduction(self, name: str, body: Callable[..., None], ranges: Sequence[int],
                  reduction_ranges: Sequence[int], dtype: torch.dtype, size: Sequence[int],
                  stride: Sequence[int], offset: int) -> None:
        self.storages[name] = _new_storage(dtype, size, stride, offset)
        self.evaluator.run(body, ranges, reduction_ranges)

    def _call(self, op: Any, args: Any, kwargs: dict, outputs: Sequence[Any]) -> None:
        result = op(*args, **kwargs)
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        for out, value in zip(outputs, results):
            if isinstance(out, tuple):
                name, dtype, size, stride, offset = out
                self.storages[name] = _new_storage(dtype, size, stride, offset)
                self.tensor(name, size, stride, offset).copy_(value)

    def extern(self, kind: str, op: Any, args: Any, kwargs: dict, outputs: Sequence[Any]) -> None:
        self._call(op, args, kwargs, outputs)

    def fallback(self, op: Any, args: Any, kwargs: dict, outputs: Sequence[Any]) -> None:
        self._call(op, args, kwargs, outputs)

    def mutate(self, name: str, target: torch.Tensor, value: torch.Tensor) -> None:
        target.copy_(value)


def _materialize(value: Any, rt: PrintedRun) -> Any:
    return map_nested(value, TensorArg,
                      lambda a: rt.tensor(a.name, a.size, a.stride, a.offset))


def _run_node(rt: PrintedRun, node: ComputedBuffer | ExternKernel) -> None:
    if isinstance(node, ComputedBuffer):
        lay = node.layout
        n = len(node.data.ranges)
        body = lambda *v: node.body(v[:n], v[n:])  # noqa: E731
        if isinstance(node.data, Reduction):
            rt.reduction(node.name, body, node.data.ranges, node.data.reduction_ranges,
                         lay.dtype, lay.size, lay.stride, lay.offset)
        else:
            rt.pointwise(node.name, body, node.data.ranges, lay.dtype, lay.size, lay.stride,
                         lay.offset)
        return
    outputs = [(o.name, o.layout.dtype, o.layout.size, o.layout.stride, o.layout.offset)
               if hasattr(o, "layout") else o for o in node.outputs]
    rt._call(node.op, _materialize(node.args, rt), _materialize(node.kwargs, rt), outputs)


def run_ir(graph: IRGraph, inputs: Sequence[Any], run_node: Any = None) -> list[Any]:
    """Run `graph` on `inputs` (one per placeholder, with the layouts it was lowered for) and
    return the flat outputs; in-place updates of inputs (`graph.mutations`) are applied.
    `run_node(rt, node)` replaces how each node runs (codegen launches kernels instead)."""
    run_node = run_node or _run_node
    rt = PrintedRun(graph.constants)
    for buf, value in zip(graph.inputs, inputs):
        if buf is not None:
            lay = buf.layout
            rt.bind(buf.name, value, lay.dtype, lay.size, lay.stride, lay.offset)
    for name in graph.constants:
        rt.constant(name)
    for node in graph.nodes:
        run_node(rt, node)
    by_name = {buf.name: value for buf, value in zip(graph.inputs, inputs) if buf is not None}
    for name, arg in graph.mutations:
        rt.mutate(name, by_name[name], _materialize(arg, rt))
    return [_materialize(out, rt) for out in graph.outputs]


def run_printed(source: str, graph: IRGraph, inputs: Sequence[Any]) -> list[Any]:
    """exec the printed form of `graph` and run its `call` on `inputs`."""
    namespace: dict[str, Any] = {}
    exec(compile(source, "<kiln.lower IR>", "exec"), namespace)
    return namespace["call"](*inputs, constants=graph.constants)
