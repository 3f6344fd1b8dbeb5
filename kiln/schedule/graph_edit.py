"""graph_edit: the small toolkit the schedule's graph rewrites (elision, split) share.

- `copy_graph`: a new `IRGraph` sharing node objects; rewrites replace nodes, never mutate them,
  so the caller's graph stays valid.
- `readers`: who reads each buffer (computed buffers, extern calls, graph outputs, mutations).
- `invert_layout`: a layout's flat storage offset back to its logical index (exact `Expr`s).
- `compose_view`: a `TensorArg`-shaped read of some storage map, re-expressed as a strided view
  (the affine check every elision and regroup rests on).
- `remap_loads`: wrap a computed buffer so its loads of some buffers go through an index map
  (how readers follow a buffer whose storage arrangement changed).
"""
from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kiln.lower.deps import read_writes
from kiln.lower.index import Expr, affine_form, as_expr, sym
from kiln.lower.ir import (
    ComputedBuffer,
    ExternKernel,
    IRGraph,
    Layout,
    Pointwise,
    Reduction,
    TensorArg,
    map_nested,
)
from kiln.lower.ops import OpsHandler, current_handler, use_handler

__all__ = [
    "Readers",
    "compose_view",
    "copy_graph",
    "invert_layout",
    "map_args",
    "node_deps",
    "readers",
    "remap_loads",
]

OffsetMap = Callable[[Expr], "Expr | None"]


_deps: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def node_deps(node: ComputedBuffer) -> Any:
    """`read_writes(node)`, cached per node object (rewrites make new nodes, never mutate)."""
    found = _deps.get(node)
    if found is None:
        found = _deps[node] = read_writes(node)
    return found


def copy_graph(graph: IRGraph) -> IRGraph:
    """A shallow copy: new containers, shared nodes and buffers."""
    new = IRGraph()
    new.inputs = list(graph.inputs)
    new.constants = dict(graph.constants)
    new.nodes = list(graph.nodes)
    new.outputs = list(graph.outputs)
    new.mutations = list(graph.mutations)
    new.buffers = dict(graph.buffers)
    new.moved_inputs = list(graph.moved_inputs)
    new.input_offsets = dict(graph.input_offsets)
    new.size_inputs = dict(graph.size_inputs)
    new.symbolic = graph.symbolic
    return new


@dataclasses.dataclass
class Readers:
    """Everything that reads one buffer."""

    computed: list[ComputedBuffer] = dataclasses.field(default_factory=list)
    externs: list[ExternKernel] = dataclasses.field(default_factory=list)
    output: bool = False   # a graph output or a mutation source: its storage is observable

    @property
    def only_externs(self) -> bool:
        return not self.computed and not self.output and bool(self.externs)


def readers(graph: IRGraph) -> dict[str, Readers]:
    found: dict[str, Readers] = {}
    for node in graph.nodes:
        if isinstance(node, ComputedBuffer):
            for name in node_deps(node).read_names:
                found.setdefault(name, Readers()).computed.append(node)
        else:
            for name in dict.fromkeys(a.name for a in node.tensor_args()):
                found.setdefault(name, Readers()).externs.append(node)
    observed = [o for o in graph.outputs if isinstance(o, TensorArg)]
    observed += [arg for _, arg in graph.mutations]
    for arg in observed:
        found.setdefault(arg.name, Readers()).output = True
    return found


def map_args(value: Any, fn: Callable[[TensorArg], TensorArg]) -> Any:
    """`value` (an extern's args/kwargs) with every `TensorArg` replaced by `fn(arg)`."""
    return map_nested(value, TensorArg, fn)


def invert_layout(layout: Layout, offset: Expr) -> list[Expr] | None:
    """The logical index whose storage offset is `offset`, or None when the layout is not
    invertible by div/mod (overlapping or oddly interleaved strides)."""
    dims = [d for d, s in enumerate(layout.size) if s != 1]
    if any(layout.stride[d] <= 0 for d in dims):
        return None

    def inverse(off: Expr) -> list[Expr]:
        rel = off - layout.offset
        return [((rel // layout.stride[d]) % layout.size[d]) if layout.size[d] != 1
                else as_expr(0) for d in range(len(layout.size))]

    probe = [sym(f"_inv{d}", s) for d, s in enumerate(layout.size)]
    back = inverse(layout.index(probe))
    if any(back[d] != probe[d] for d in dims):
        return None
    return inverse(offset)


def arg_symbols(size: Sequence[int]) -> list[Expr]:
    return [sym(f"v{d}", s) for d, s in enumerate(size)]


def arg_offset(arg: TensorArg, index: Sequence[Expr]) -> Expr:
    total = as_expr(arg.offset)
    for i, st in zip(index, arg.stride):
        total = total + i * st
    return total


def compose_view(name: str, dtype: Any, size: Sequence[int],
                 offset_of: Callable[[list[Expr]], Expr | None]) -> TensorArg | None:
    """The strided view of buffer `name` whose element `v` sits at storage offset
    `offset_of(v)`, when that offset is affine in `v`; else None. Size-1 dims get the view's
    extent as stride (any value is valid; a large aligned one satisfies every library check)."""
    index = arg_symbols(size)
    flat = offset_of(index)
    if flat is None:
        return None
    flat = affine_form(flat)
    coefs = flat.linear_coefficients()
    if coefs is None:
        return None
    by_name = {s.name: c for s, c in coefs.items()}
    if len(by_name) != len(coefs) or any(c < 0 for c in by_name.values()):
        return None
    stride = [by_name.pop(f"v{d}", 0) for d in range(len(size))]
    if by_name:
        return None
    extent = max([st * s for st, s in zip(stride, size) if s != 1] + [1])
    stride = [extent if s == 1 else st for st, s in zip(stride, size)]
    return TensorArg(name, dtype, tuple(size), tuple(stride), flat.const)


class _RemapHandler(OpsHandler):
    """Forwards every op to `outer`, rewriting the index of loads of remapped buffers."""

    def __init__(self, outer: OpsHandler, maps: Mapping[str, OffsetMap],
                 rename: Mapping[str, str]) -> None:
        self.outer = outer
        self.maps = maps
        self.rename = rename

    def load(self, name: str, index: Expr) -> Any:
        if name in self.maps:
            index = self.maps[name](index)
        return self.outer.load(self.rename.get(name, name), index)

    def __getattribute__(self, name: str) -> Any:
        if name in ("load", "outer", "maps", "rename"):
            return object.__getattribute__(self, name)
        return getattr(object.__getattribute__(self, "outer"), name)


def _remapped(fn: Callable[..., Any], maps: Mapping[str, OffsetMap],
              rename: Mapping[str, str]) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        with use_handler(_RemapHandler(current_handler(), maps, rename)):
            return fn(*args)

    return run


def remap_loads(node: ComputedBuffer, maps: Mapping[str, OffsetMap],
                rename: Mapping[str, str] | None = None) -> ComputedBuffer:
    """A copy of `node` whose loads of `maps`' buffers read `maps[name](offset)` instead (of
    buffer `rename[name]` when given: a buffer that became part of another)."""
    data = node.data
    rename = rename or {}
    if isinstance(data, Pointwise):
        store_fn = None if data.store_fn is None else _remapped(data.store_fn, maps, rename)
        new_data: Pointwise | Reduction = Pointwise(
            data.ranges, _remapped(data.inner_fn, maps, rename), data.dtype, store_fn)
    else:
        new_data = Reduction(data.ranges, data.reduction_ranges, data.reduction_type,
                             _remapped(data.inner_fn, maps, rename), data.dtype, data.src_dtype)
    return ComputedBuffer(node.name, node.layout, new_data, node.origins)


def replace_node(graph: IRGraph, old: Any, new: Any) -> None:
    graph.nodes[graph.nodes.index(old)] = new
    if isinstance(new, ComputedBuffer):
        graph.buffers[new.name] = new
