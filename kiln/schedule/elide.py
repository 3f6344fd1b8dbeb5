"""elide: extern layout planning — pure copies read only by library calls become strided views.

A `ComputedBuffer` that only copies another buffer (one load, at most lossless dtype round
trips, no math) and whose every reader is an extern `TensorArg` costs a kernel and a round trip
through memory. When the extern's argument, composed through the copy's index map, is affine in
the argument's dims, it is a `(size, stride, offset)` view of the copy's source: if the library
accepts those strides (`ACCEPTS`), the extern reads the view and the copy is dropped. Chains
(a copy of a copy, a permuted view of a copy) compose, one copy per step, until nothing changes.

Attention's batch-dim regrouping and output layouts live in `attention_layout.py`.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kiln.lower.index import Expr
from kiln.lower.ir import (
    ComputedBuffer,
    ExternKernel,
    IRGraph,
    Pointwise,
    TensorArg,
)
from kiln.lower.ops import OpsHandler, use_handler
from kiln.schedule.graph_edit import (
    arg_offset,
    compose_view,
    invert_layout,
    map_args,
    readers,
    replace_node,
)

__all__ = ["ACCEPTS", "copy_source", "elide_copies", "view_through_copy"]

_LOSSLESS_UP = {
    torch.bfloat16: (torch.float32, torch.float64),
    torch.float16: (torch.float32, torch.float64),
    torch.float32: (torch.float64,),
}


# -- which strides a library call accepts ---------------------------------------------------------

def _matrix_ok(arg: TensorArg) -> bool:
    """BLAS reads a matrix whose rows or columns are contiguous (stride 1) with the other stride
    at least the row (column) length; a batch dim may have any stride."""
    if len(arg.size) < 2:
        return False
    (rows, cols), (s_row, s_col) = arg.size[-2:], arg.stride[-2:]
    row_major = (s_col == 1 or cols == 1) and (s_row >= cols or rows == 1)
    col_major = (s_row == 1 or rows == 1) and (s_col >= rows or cols == 1)
    return row_major or col_major


def _attention_ok(arg: TensorArg) -> bool:
    """SDPA kernels read the head dim contiguously and need 16-byte aligned rows and base:
    the other strides and the storage offset multiples of 8 elements."""
    if len(arg.size) != 4 or (arg.stride[-1] != 1 and arg.size[-1] != 1):
        return False
    others = [st for st, s in zip(arg.stride[:-1], arg.size[:-1]) if s != 1]
    return all(st % 8 == 0 for st in others) and arg.offset % 8 == 0


def _elidable_positions(node: ExternKernel) -> Callable[[int, TensorArg], bool]:
    if node.kind in ("mm", "bmm"):
        return lambda pos, arg: pos in (0, 1)
    if node.kind == "addmm":
        return lambda pos, arg: pos in (1, 2)
    if node.kind in ("attention", "attention_backward"):
        return lambda pos, arg: len(arg.size) == 4
    return lambda pos, arg: False


ACCEPTS: dict[str, Callable[[TensorArg], bool]] = {
    "mm": _matrix_ok, "bmm": _matrix_ok, "addmm": _matrix_ok,
    "attention": _attention_ok, "attention_backward": _attention_ok,
}


# -- recognizing a pure copy ----------------------------------------------------------------------

class _Loaded:
    __slots__ = ("dtype", "index", "name", "source_dtype")

    def __init__(self, name: str, index: Expr, source_dtype: torch.dtype,
                 dtype: torch.dtype) -> None:
        self.name, self.index = name, index
        self.source_dtype, self.dtype = source_dtype, dtype


class _NotACopy(Exception):
    pass


class _CopyProbe(OpsHandler):
    """Runs a body; anything but one load, lossless casts and the store raises `_NotACopy`."""

    def __init__(self, graph: IRGraph) -> None:
        self.graph = graph
        self.stored: tuple[_Loaded, str] | None = None

    def load(self, name: str, index: Expr) -> _Loaded:
        dtype = self.graph.buffers[name].dtype
        return _Loaded(name, index, dtype, dtype)

    def to_dtype(self, x: Any, dtype: torch.dtype) -> _Loaded:
        if not isinstance(x, _Loaded):
            raise _NotACopy
        if dtype != x.source_dtype and dtype not in _LOSSLESS_UP.get(x.source_dtype, ()):
            raise _NotACopy
        return _Loaded(x.name, x.index, x.source_dtype, dtype)

    def store(self, name: str, index: Expr, value: Any) -> None:
        if not isinstance(value, _Loaded) or self.stored is not None:
            raise _NotACopy
        self.stored = (value, name)

    def __getattribute__(self, name: str) -> Any:
        if name in ("load", "to_dtype", "store", "graph", "stored"):
            return object.__getattribute__(self, name)

        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise _NotACopy

        return refuse


def copy_source(graph: IRGraph, node: ComputedBuffer,
                index: list[Expr]) -> tuple[str, Expr] | None:
    """`(source buffer, source offset)` read by the pure copy `node` at loop index `index`, or
    None when `node` is not a pure copy."""
    if not isinstance(node.data, Pointwise):
        return None
    probe = _CopyProbe(graph)
    try:
        with use_handler(probe):
            node.body(index)
    except _NotACopy:
        return None
    if probe.stored is None:
        return None
    value, _ = probe.stored
    if value.source_dtype != node.dtype or value.name not in graph.buffers:
        return None
    return value.name, value.index


def view_through_copy(graph: IRGraph, copy: ComputedBuffer, arg: TensorArg) -> TensorArg | None:
    """`arg` (a view of `copy`) as a strided view of the copy's source, if affine."""
    found: list[str] = []

    def offset_of(v: list[Expr]) -> Expr | None:
        logical = invert_layout(copy.layout, arg_offset(arg, v))
        if logical is None:
            return None
        source = copy_source(graph, copy, logical)
        if source is None:
            return None
        found.append(source[0])
        return source[1]

    view = compose_view("?", arg.dtype, arg.size, offset_of)
    if view is None or not found:
        return None
    return TensorArg(found[0], view.dtype, view.size, view.stride, view.offset)


# -- the elision pass -----------------------------------------------------------------------------

def _through_copies(graph: IRGraph, arg: TensorArg,
                    accepts: Callable[[TensorArg], bool]) -> tuple[TensorArg, list[str]]:
    """The deepest view under `arg` through a chain of pure copies that the library accepts,
    and the copies it reads past (`arg` itself and [] when there is none)."""
    best, best_chain = arg, []
    chain: list[str] = []
    current = arg
    while len(chain) < 32:
        node = graph.buffers.get(current.name)
        if not isinstance(node, ComputedBuffer) or node not in graph.nodes:
            break
        view = view_through_copy(graph, node, current)
        if view is None:
            break
        chain.append(node.name)
        current = view
        if accepts(current):
            best, best_chain = current, list(chain)
    return best, best_chain


def _rewrite_extern(graph: IRGraph, ext: ExternKernel) -> tuple[ExternKernel, list[str]]:
    allowed, accepts = _elidable_positions(ext), ACCEPTS.get(ext.kind)
    passed: list[str] = []
    if accepts is None:
        return ext, passed

    def rewrite(arg: TensorArg, pos: int) -> TensorArg:
        if not allowed(pos, arg):
            return arg
        view, chain = _through_copies(graph, arg, accepts)
        passed.extend(chain)
        return view

    args = tuple(map_args(a, lambda t, p=p: rewrite(t, p)) for p, a in enumerate(ext.args))
    if not passed:
        return ext, passed
    return type(ext)(ext.kind, ext.op, args, ext.kwargs, ext.outputs, ext.origins), passed


def _drop_dead_copies(graph: IRGraph, candidates: set[str],
                      elided: dict[str, TensorArg]) -> None:
    """Remove the copies nothing reads any more (last first: a dead copy may be a copy's only
    reader), recording each as a view of its source where that is affine."""
    changed = True
    while changed:
        changed = False
        users = readers(graph)
        for node in reversed(list(graph.nodes)):
            if isinstance(node, ComputedBuffer) and node.name in candidates and \
                    node.name not in users:
                view = view_through_copy(graph, node, node.as_arg())
                for name, recorded in list(elided.items()):
                    if recorded.name == node.name:
                        elided[name] = view_through_copy(graph, node, recorded) or recorded
                graph.nodes.remove(node)
                del graph.buffers[node.name]
                if view is not None:
                    elided[node.name] = view
                changed = True


def elide_copies(graph: IRGraph,
                 elided: dict[str, TensorArg] | None = None) -> dict[str, TensorArg]:
    """Point extern arguments past chains of pure copies where the library accepts the view,
    then drop the copies left unread (in place on `graph`, which the caller owns); returns
    {copy name: the view of its source}."""
    passed: set[str] = set()
    for node in list(graph.nodes):
        if isinstance(node, ExternKernel):
            new, chain = _rewrite_extern(graph, node)
            if chain:
                replace_node(graph, node, new)
                passed |= set(chain)
    elided = {} if elided is None else elided
    _drop_dead_copies(graph, passed, elided)
    return elided
