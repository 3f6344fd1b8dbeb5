"""attention_layout: attention calls' operand grouping and output layouts.

The attention rewrite passes `[1, B·H, L, D]` operands; B·H merged into one dim is rarely a
strided view of a `[B, L, H·D]` projection, so `regroup_attention` tries every split
`B'·H' = B·H` (SDPA treats both batch dims alike) and keeps the one that lets the most q/k/v
copies become views. `refresh_attention_layouts` gives the outputs the layout the op's meta
kernel returns for the (rewritten) arguments — flash, efficient and the CPU flash kernel lay the
output out like q, so once q is a view of the projection the output is `[B, L, H, D]`-major and
the copy into `[B, L, H·D]` before `out_proj` can become a view too. When an output's storage
arrangement changes, every computed reader follows through `remap_loads` (an old-offset →
new-offset index map); an output that a graph output or another library call reads keeps its
layout (their views would change strides), and the call is left alone.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from kiln.lower.index import Expr
from kiln.lower.ir import ComputedBuffer, Extern, ExternKernel, ExternOutput, IRGraph, Layout, \
    TensorArg
from kiln.schedule.elide import _attention_ok, _through_copies
from kiln.schedule.graph_edit import arg_offset, compose_view, invert_layout, map_args, \
    node_deps, readers, remap_loads, replace_node

__all__ = ["refresh_attention_layouts", "regroup_attention"]


# -- regrouping attention's batch dims ------------------------------------------------------------

def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _regroup_offset(arg: TensorArg, groups: tuple[int, int]) -> Callable[[list[Expr]], Expr]:
    """Element `[b, h, ...]` of the regrouped view → storage offset in `arg`'s storage."""
    n1 = arg.size[1]

    def offset_of(v: list[Expr]) -> Expr:
        merged = v[0] * groups[1] + v[1]
        old = [merged // n1, merged % n1, *v[2:]]
        return arg_offset(arg, old)

    return offset_of


def _regroup_arg(arg: TensorArg, batch: int, groups: tuple[int, int]) -> TensorArg | None:
    if len(arg.size) < 3 or arg.size[0] * arg.size[1] != batch:
        return arg
    size = (*groups, *arg.size[2:])
    return compose_view(arg.name, arg.dtype, size, _regroup_offset(arg, groups))


def _elidable_depth(graph: IRGraph, arg: TensorArg) -> int:
    """How many pure copies a chain of elisions would read past under `arg`."""
    return len(_through_copies(graph, arg, _attention_ok)[1])


def _meta_outputs(ext: ExternKernel, args: tuple, kwargs: dict) -> list[Any] | None:
    def meta(arg: TensorArg) -> torch.Tensor:
        extent = arg.offset + sum((s - 1) * st for s, st in zip(arg.size, arg.stride)) + 1
        base = torch.empty(extent, dtype=arg.dtype, device="meta")
        return torch.as_strided(base, arg.size, arg.stride, arg.offset)

    try:
        result = ext.op(*map_args(args, meta), **map_args(kwargs, meta))
    except Exception:  # noqa: BLE001 - no meta kernel: keep the call as it is
        return None
    return list(result) if isinstance(result, (tuple, list)) else [result]


def regroup_attention(graph: IRGraph) -> int:
    """Regroup `[1, B·H, ...]` attention operands to `[B, H, ...]` where that lets more
    q/k/v copies become views (in place on `graph`); returns how many calls changed."""
    changed = 0
    for ext in [n for n in graph.nodes if isinstance(n, Extern) and n.kind == "attention"]:
        changed += _regroup_one(graph, ext)
    return changed


def _regroup_one(graph: IRGraph, ext: ExternKernel) -> bool:
    fours = [a for a in ext.tensor_args() if len(a.size) == 4]
    if not fours or any(a.size[:2] != fours[0].size[:2] for a in fours):
        return False
    batch = fours[0].size[0] * fours[0].size[1]
    best = (sum(_elidable_depth(graph, a) for a in fours), None)
    for b in _divisors(batch):
        groups = (b, batch // b)
        if groups == tuple(fours[0].size[:2]):
            continue
        new = [_regroup_arg(a, batch, groups) for a in fours]
        if any(a is None for a in new):
            continue
        score = sum(_elidable_depth(graph, a) for a in new)
        if score > best[0]:
            best = (score, groups)
    return best[1] is not None and _apply_regroup(graph, ext, batch, best[1])


def _apply_regroup(graph: IRGraph, ext: ExternKernel, batch: int,
                   groups: tuple[int, int]) -> bool:
    ok = [True]

    def regroup(arg: TensorArg) -> TensorArg:
        new = _regroup_arg(arg, batch, groups)
        if new is None:
            ok[0] = False
            return arg
        return new

    args, kwargs = map_args(ext.args, regroup), map_args(ext.kwargs, regroup)
    if not ok[0]:
        return False
    return _relayout(graph, ext, args, kwargs, batch, groups)


def _relayout(graph: IRGraph, ext: ExternKernel, args: tuple, kwargs: dict, batch: int,
              groups: tuple[int, int] | None) -> bool:
    """Replace `ext` by a call with `args`, its outputs in the layouts the op returns for them
    (from its meta kernel), every reader following; False (graph untouched) if that fails."""
    metas = _meta_outputs(ext, args, kwargs)
    if metas is None or len(metas) != len(ext.outputs):
        return False
    outputs, moved = [], {}
    for out, meta in zip(ext.outputs, metas):
        if isinstance(out, ExternOutput) and isinstance(meta, torch.Tensor):
            lay = Layout(out.layout.dtype, out.layout.device, tuple(meta.shape),
                         tuple(meta.stride()), meta.storage_offset())
            if lay == out.layout:
                outputs.append(out)
                continue
            moved[out.name] = (out.layout, lay)
            outputs.append(ExternOutput(out.name, lay, out.origins))
        else:
            outputs.append(out)
    new_ext = type(ext)(ext.kind, ext.op, args, kwargs, outputs, ext.origins)
    return _follow_moved_outputs(graph, ext, new_ext, moved, batch, groups)


def refresh_attention_layouts(graph: IRGraph) -> int:
    """Give attention outputs the layouts the op returns for the (rewritten) arguments —
    CUDA's flash and efficient kernels lay the output out like q, `[B, L, H, D]`-major once q
    is a view of the projection — so that a later copy into `[B, L, H·D]` can become a view;
    returns how many calls changed."""
    changed = 0
    for ext in [n for n in graph.nodes if isinstance(n, Extern) and n.kind == "attention"]:
        metas = _meta_outputs(ext, ext.args, ext.kwargs)
        if metas is None:
            continue
        same = all(not isinstance(o, ExternOutput) or not isinstance(m, torch.Tensor) or
                   (tuple(m.shape), tuple(m.stride())) == (o.layout.size, o.layout.stride)
                   for o, m in zip(ext.outputs, metas))
        if not same and _relayout(graph, ext, ext.args, ext.kwargs, 0, None):
            changed += 1
    return changed


def _offset_map(old: Layout, new: Layout, batch: int,
                groups: tuple[int, int] | None) -> Callable[[Expr], Expr | None]:
    """Old storage offset → new storage offset of the same element (batch dims regrouped)."""
    def remap(offset: Expr) -> Expr | None:
        logical = invert_layout(old, offset)
        if logical is None:
            return None
        if groups is not None and len(old.size) >= 2 and \
                old.size[0] * old.size[1] == batch and tuple(new.size[:2]) == groups:
            merged = logical[0] * old.size[1] + logical[1]
            logical = [merged // groups[1], merged % groups[1], *logical[2:]]
        return new.index(logical)

    return remap


def _follow_moved_outputs(graph: IRGraph, old_ext: ExternKernel, new_ext: ExternKernel,
                          moved: dict, batch: int, groups: tuple[int, int] | None) -> bool:
    """Point every reader of a moved output at its new storage; False (graph untouched) when
    some reader cannot follow (a graph output or a library call reading it: their views
    would change strides)."""
    users = readers(graph)
    maps = {name: _offset_map(old, new, batch, groups) for name, (old, new) in moved.items()}
    replaced: list[tuple[ComputedBuffer, ComputedBuffer]] = []
    for name in moved:
        if name in users and (users[name].output or users[name].externs):
            return False
    for node in graph.nodes:
        if not isinstance(node, ComputedBuffer):
            continue
        touched = {n: maps[n] for n in moved if n in users and node in users[n].computed}
        if touched:
            new_node = remap_loads(node, _checked(touched))
            try:
                node_deps(new_node)
            except ValueError:
                return False
            replaced.append((node, new_node))
    replace_node(graph, old_ext, new_ext)
    for out in new_ext.output_buffers():
        graph.buffers[out.name] = out
    for old, new in replaced:
        replace_node(graph, old, new)
    return True


def _checked(maps: dict) -> dict:
    def wrap(fn: Callable[[Expr], Expr | None]) -> Callable[[Expr], Expr]:
        def remap(offset: Expr) -> Expr:
            new = fn(offset)
            if new is None:
                raise ValueError(f"layout remap failed for offset {offset}")
            return new
        return remap

    return {name: wrap(fn) for name, fn in maps.items()}
