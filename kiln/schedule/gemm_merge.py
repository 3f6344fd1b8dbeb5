"""gemm_merge: matmuls that share their input and read neighbouring slices of one weight become
one matmul (a horizontal GEMM fusion).

`nn.MultiheadAttention` projects q, k and v with three `addmm`s of the same input against the
three row blocks of `in_proj_weight` (and of `in_proj_bias`). One `addmm` against the whole
weight computes the same numbers in one library call (one launch instead of three, and a wider
GEMM that cuBLAS tiles at least as well); each old output becomes a column slice of the merged
output, which is a strided view, so readers follow through index maps (computed buffers) or
re-expressed views (extern arguments, graph outputs) and nothing is copied.

Merged when: the same op (`mm` or `addmm`), equal input `TensorArg`s, the weights (and biases)
are views of one buffer with equal sizes and strides whose offsets step by exactly one block,
and every reader of the outputs can be rewritten (else the group is left alone).
"""
from __future__ import annotations

import logging
from typing import Any

import torch

from kiln.lower.index import Expr
from kiln.lower.ir import ComputedBuffer, ExternKernel, ExternOutput, IRGraph, Layout, TensorArg
from kiln.schedule.elide import ACCEPTS, _elidable_positions
from kiln.schedule.graph_edit import (
    arg_offset,
    compose_view,
    map_args,
    readers,
    remap_loads,
    replace_node,
)

__all__ = ["merge_gemms"]

log = logging.getLogger("kiln.schedule")
aten = torch.ops.aten
MERGEABLE = {"mm": 1, "addmm": 2}  # kind -> position of the weight argument


def merge_gemms(graph: IRGraph) -> list[str]:
    """Merge every mergeable group in place (the caller owns `graph`); returns the merged
    buffers' names."""
    merged: list[str] = []
    for group in _candidate_groups(graph):
        name = _merge(graph, group)
        if name is not None:
            merged.append(name)
    return merged


def _key(node: ExternKernel) -> tuple | None:
    if node.kind not in MERGEABLE or node.kwargs or len(node.output_buffers()) != 1:
        return None
    w = node.args[MERGEABLE[node.kind]]
    x = node.args[MERGEABLE[node.kind] - 1]
    if not (isinstance(w, TensorArg) and isinstance(x, TensorArg)) or len(w.size) != 2:
        return None
    bias = node.args[0] if node.kind == "addmm" else None
    if bias is not None and (not isinstance(bias, TensorArg) or len(bias.size) != 1):
        return None
    bias_key = None if bias is None else (bias.name, bias.size, bias.stride)
    return node.kind, node.op, x, w.name, w.size, w.stride, bias_key


def _candidate_groups(graph: IRGraph) -> list[list[ExternKernel]]:
    groups: dict[tuple, list[ExternKernel]] = {}
    for node in graph.nodes:
        if isinstance(node, ExternKernel) and (key := _key(node)) is not None:
            groups.setdefault(key, []).append(node)
    out = []
    for nodes in groups.values():
        run = _consecutive_blocks(nodes)
        if len(run) > 1:
            out.append(run)
    return out


def _consecutive_blocks(nodes: list[ExternKernel]) -> list[ExternKernel]:
    """The nodes ordered by weight offset when their weights (and biases) tile one block after
    another along the output dimension; [] otherwise."""
    pos = MERGEABLE[nodes[0].kind]
    ordered = sorted(nodes, key=lambda n: n.args[pos].offset)
    w0 = ordered[0].args[pos]
    n_out = w0.size[1]
    for i, node in enumerate(ordered):
        if node.args[pos].offset != w0.offset + i * n_out * w0.stride[1]:
            return []
        if node.kind == "addmm":
            b0 = ordered[0].args[0]
            if node.args[0].offset != b0.offset + i * n_out * b0.stride[0]:
                return []
    return ordered


def _merge(graph: IRGraph, group: list[ExternKernel]) -> str | None:
    first = group[0]
    pos = MERGEABLE[first.kind]
    w0 = first.args[pos]
    n_out, parts = w0.size[1], len(group)
    outs = [node.output_buffers()[0] for node in group]
    lay0 = outs[0].layout
    if any(o.layout.size != lay0.size or o.layout.stride != (n_out, 1) or o.layout.offset
           for o in outs):
        return None
    name = f"{outs[0].name}_merged"
    width = n_out * parts
    layout = Layout(lay0.dtype, lay0.device, (lay0.size[0], width), (width, 1), 0)
    maps = {o.name: _slice_map(i, n_out, width) for i, o in enumerate(outs)}
    rewritten = _rewrite_readers(graph, maps, name, lay0.dtype, set(group))
    if rewritten is None:
        return None
    args = list(first.args)
    args[pos] = TensorArg(w0.name, w0.dtype, (w0.size[0], width), w0.stride, w0.offset)
    if first.kind == "addmm":
        b0 = first.args[0]
        args[0] = TensorArg(b0.name, b0.dtype, (width,), b0.stride, b0.offset)
    out = ExternOutput(name, layout, tuple(o for n in group for o in n.origins))
    merged = type(first)(first.kind, first.op, tuple(args), {}, [out], out.origins)
    at = graph.nodes.index(first)
    graph.nodes = [n for n in graph.nodes if n not in group]
    graph.nodes.insert(at, merged)
    for o in outs:
        del graph.buffers[o.name]
    graph.buffers[name] = out
    rewritten()
    log.debug("merged %d %s calls into %s", parts, first.kind, name)
    return name


def _slice_map(i: int, n_out: int, width: int):
    """Storage offset in part i (contiguous [rows, n_out]) -> offset in the merged output."""
    def remap(off: Expr) -> Expr:
        return (off // n_out) * width + off % n_out + i * n_out
    return remap


def _rewrite_readers(graph: IRGraph, maps: dict, name: str, dtype: Any,
                     group: set) -> Any:
    """A closure applying every reader rewrite, or None when some reader cannot follow."""
    found = readers(graph)

    def view(arg: TensorArg) -> TensorArg | None:
        if arg.name not in maps:
            return arg
        remap = maps[arg.name]
        return compose_view(name, dtype, arg.size, lambda v: remap(arg_offset(arg, v)))

    externs: dict[int, ExternKernel] = {}
    computed: dict[int, ComputedBuffer] = {}
    for buf in maps:
        who = found.get(buf)
        if who is None:
            continue
        for node in who.computed:
            computed[id(node)] = node
        for node in who.externs:
            if node not in group:
                externs[id(node)] = node
    new_externs = {}
    for key, node in externs.items():
        args = _mapped(node.args, view)
        kwargs = _mapped(node.kwargs, view)
        if args is None or kwargs is None or not _library_accepts(node, args, name):
            return None
        new_externs[key] = (node, args, kwargs)
    outputs = _mapped(list(graph.outputs), view)
    mutations = _mapped([arg for _, arg in graph.mutations], view)
    if outputs is None or mutations is None:
        return None

    rename = dict.fromkeys(maps, name)

    def apply() -> None:
        for node in computed.values():
            replace_node(graph, node, remap_loads(node, maps, rename))
        for node, args, kwargs in new_externs.values():
            new = type(node)(node.kind, node.op, args, kwargs, node.outputs, node.origins)
            replace_node(graph, node, new)
        graph.outputs = outputs
        graph.mutations = [(n, arg) for (n, _), arg in zip(graph.mutations, mutations)]
    return apply


def _library_accepts(node: ExternKernel, args: tuple, name: str) -> bool:
    """The library kernel still accepts its arguments that became slices of the merged output
    (BLAS needs a unit stride and a long enough leading dimension, SDPA 16-byte alignment)."""
    accepts = ACCEPTS.get(node.kind)
    if accepts is None:
        return True  # ATen fallbacks and convolutions take any strides
    checked = _elidable_positions(node)
    return all(accepts(arg) for pos, arg in enumerate(args)
               if isinstance(arg, TensorArg) and arg.name == name and checked(pos, arg))


def _mapped(value: Any, view) -> Any:
    failed = []

    def fn(arg: TensorArg) -> TensorArg:
        new = view(arg)
        if new is None:
            failed.append(arg)
            return arg
        return new
    out = map_args(value, fn)
    return None if failed else out
