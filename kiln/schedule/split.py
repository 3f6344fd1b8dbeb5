"""split: long reductions with few outputs become a partial and a final reduction.

A bias gradient (1024 columns summed over 16384 rows) or a full sum gives the GPU a handful of
programs each walking a long row. Splitting the reduction axis into chunks computes
`partial[x, c] = reduce(rows of chunk c)` with `numel × chunks` programs, then
`out[x] = reduce(partial[x, :])`. Both are ordinary `Reduction` `ComputedBuffer`s, so the
rewritten graph still runs under `run_ir` and fuses like any other.

Heuristic (`plan_split`): only sum/prod/max/min/any (argmax needs the index carried along);
a reduction whose reads walk the reduction axis with a non-unit stride is an "outer" one, and
codegen tiles `OUTER_TILE` columns per program, so it counts as `numel / OUTER_TILE` programs.
Split when that is under `TARGET_PROGRAMS` and the axis holds at least two chunks of
`MIN_CHUNK` rows; chunk counts divide `rnumel` exactly (no masked tail). A row ("inner")
reduction of at most `INNER_WHOLE_RNUMEL` elements is never split: one program walks such a row
in a few microseconds, while a split adds a launch and a round trip through memory per
reduction (a LayerNorm at batch 1 became five kernels instead of one; Inductor keeps rows up to
8192 whole on this GPU class too).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from kiln.lower.deps import innermost, reduction_axis_class
from kiln.lower.index import Expr
from kiln.lower.ir import ComputedBuffer, IRGraph, Layout, Reduction
from kiln.lower.ops import ops
from kiln.schedule.plan import _unflat
from kiln.schedule.graph_edit import node_deps

__all__ = ["INNER_WHOLE_RNUMEL", "MIN_CHUNK", "TARGET_PROGRAMS", "plan_split",
           "split_reductions"]

SPLITTABLE = ("sum", "prod", "max", "min", "any")
TARGET_PROGRAMS = 1024
MIN_CHUNK = 256
OUTER_TILE = 32
INNER_WHOLE_RNUMEL = 8192


def _is_outer(node: ComputedBuffer) -> bool:
    """A column reduction (`deps.reduction_axis_class`), which codegen tiles along x."""
    index, rindex = node.loop_vars()
    reads = [dep.index for dep in node_deps(node).reads]
    return reduction_axis_class(reads, innermost(index), innermost(rindex)) == "outer"


def plan_split(node: ComputedBuffer, target: int = TARGET_PROGRAMS,
               min_chunk: int = MIN_CHUNK) -> int:
    """Number of chunks to split `node`'s reduction into (1: leave it)."""
    data = node.data
    if not isinstance(data, Reduction) or data.reduction_type not in SPLITTABLE:
        return 1
    numel, rnumel = math.prod(data.ranges), math.prod(data.reduction_ranges)
    outer = _is_outer(node)
    programs = -(-numel // OUTER_TILE) if outer else numel
    if programs >= target or rnumel < 2 * min_chunk:
        return 1
    if not outer and rnumel <= INNER_WHOLE_RNUMEL:
        return 1
    want = min(-(-target // programs), rnumel // min_chunk)
    for chunks in range(want, 1, -1):
        if rnumel % chunks == 0 and rnumel // chunks >= min_chunk:
            return chunks
    return 1


def split_node(node: ComputedBuffer, chunks: int, name: str) -> tuple[ComputedBuffer,
                                                                      ComputedBuffer]:
    """(partial, final): `partial` reduces each chunk into `[chunks, *ranges]` (chunks
    outermost, so neighbouring partial outputs are neighbouring columns and a column
    reduction's partial kernel stays coalesced); `final` (same name and layout as `node`)
    reduces the partials."""
    data = node.data
    rnumel = math.prod(data.reduction_ranges)
    chunk = rnumel // chunks
    rranges = tuple(data.reduction_ranges)

    def partial_fn(index: Sequence[Expr], rindex: Sequence[Expr]) -> Any:
        flat = index[0] * chunk + rindex[0]
        return data.inner_fn(list(index[1:]), _unflat(flat, rranges))

    layout = Layout.contiguous(data.dtype, node.layout.device, (chunks, *data.ranges))
    partial = ComputedBuffer(name, layout, Reduction(
        (chunks, *data.ranges), (chunk,), data.reduction_type, partial_fn, data.dtype,
        data.src_dtype), node.origins)

    def final_fn(index: Sequence[Expr], rindex: Sequence[Expr]) -> Any:
        return ops.load(name, layout.index([rindex[0], *index]))

    final = ComputedBuffer(node.name, node.layout, Reduction(
        tuple(data.ranges), (chunks,), data.reduction_type, final_fn, data.dtype, data.dtype),
        node.origins)
    return partial, final


def split_reductions(graph: IRGraph, target: int = TARGET_PROGRAMS,
                     min_chunk: int = MIN_CHUNK) -> dict[str, int]:
    """Split every reduction `plan_split` picks (in place on `graph`, which the caller owns);
    returns {buffer name: chunks}."""
    done: dict[str, int] = {}
    for node in list(graph.nodes):
        if not isinstance(node, ComputedBuffer):
            continue
        chunks = plan_split(node, target, min_chunk)
        if chunks == 1:
            continue
        name = f"{node.name}_partial"
        partial, final = split_node(node, chunks, name)
        at = graph.nodes.index(node)
        graph.nodes[at:at + 1] = [partial, final]
        graph.buffers[name] = partial
        graph.buffers[node.name] = final
        done[node.name] = chunks
    return done
