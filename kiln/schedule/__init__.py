"""schedule: loop IR (`IRGraph`) → an ordered list of kernels to launch (`Schedule`).

Input: an `IRGraph` from `kiln.lower`. Output: a `Schedule`: `steps` in execution order, each a
`FusedGroup` (one generated kernel computing several `ComputedBuffer`s over one iteration
space) or an `ExternKernel` (library call / fallback), plus the fusion decisions (fused or not,
with a reason for every pair of neighbours), buffer lifetimes and storage reuse for the wrapper.

The contract with codegen (`kiln.codegen.emit_group`) and the wrapper (`kiln.runtime`):

- A `FusedGroup` iterates `x_ranges` (output loop, `numel = prod(x_ranges)`) and `r_ranges`
  (reduction loop, `rnumel = prod(r_ranges)`, `()` for a pointwise group); both are at least 1,
  and a reduction group's `r_ranges` is never `()` (the lower stage allocates a buffer with no
  elements with an `empty` extern and gives every reduction a non-empty r loop). Every member's own
  loop variables are expressions of the group's variables: `group_index(member, xvars, rvars)`
  gives the `(index, rindex)` to call `member.body(index, rindex)` with. A pointwise member of a
  reduction group spans x and r (a LayerNorm's normalize step over [rows, cols]: x = rows,
  r = cols); a reduction member's x must cover the group's x and its r the group's r.
- Members run in order; a load of a member buffer by a later member reads the value computed in
  registers (no memory round trip); `stores` are the member buffers that must still be written
  to memory (read by a later step, a graph output, or a mutation).
- Buffers in `Schedule.elided` are never computed: every reader reads the `TensorArg` view of
  another buffer instead (a copy that an extern could read as a strided view).

Steps of `schedule(graph)`, in order (each a small module):
1. `attention_layout.py` + `elide.py`: extern layout planning — attention operands regrouped
   to `[B, H, L, D]` where that helps, pure copies read only by library calls replaced by
   strided views, attention outputs in the layout the op returns (repeated while it helps);
2. `split.py`: long reductions with few outputs split into a partial and a final reduction;
3. `fusion.py`: greedy, score-ordered fusion with legality checks and a reason for every
   not-fused neighbour pair;
4. `memory.py`: last uses and storage reuse;
`render.py` prints the result (`KILN_LOGS=fusion`, `schedule.txt`) and builds `fusion.json`.

Graph rewrites (1, 2) stay in IR form on a copy of the graph (the caller's is never changed),
so `kiln.lower.evaluate.run_ir(schedule.graph, inputs)` still equals eager. Never: emits code,
picks kernel configurations, or reorders work across a dependency.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from kiln.lower.index import Expr, as_expr
from kiln.lower.ir import (
    ComputedBuffer,
    ExternKernel,
    IRGraph,
    Origin,
    Reduction,
    TensorArg,
)

__all__ = [
    "FusedGroup",
    "FusionDecision",
    "Schedule",
    "fusion_json",
    "group_index",
    "reduction_passes",
    "render_schedule",
    "schedule",
    "trivial_schedule",
]


@dataclasses.dataclass(eq=False)
class FusedGroup:
    """One generated kernel: `nodes` (in order) over the iteration space `x_ranges` × `r_ranges`.

    name: a stable kernel-group name ("group3"). stores: names of member buffers that must be
    written to memory. reason: why these nodes were grouped (for the fusion log)."""

    name: str
    nodes: list[ComputedBuffer]
    x_ranges: tuple[int, ...]
    r_ranges: tuple[int, ...] = ()
    stores: tuple[str, ...] = ()

    @property
    def numel(self) -> int:
        return math.prod(self.x_ranges)

    @property
    def rnumel(self) -> int:
        return math.prod(self.r_ranges)

    @property
    def is_reduction(self) -> bool:
        return any(n.is_reduction for n in self.nodes)

    @property
    def origins(self) -> tuple[Origin, ...]:
        return tuple(dict.fromkeys(o for n in self.nodes for o in n.origins))

    def __repr__(self) -> str:
        names = ", ".join(n.name for n in self.nodes)
        return f"<FusedGroup {self.name} [{names}] x={list(self.x_ranges)} r={list(self.r_ranges)}>"


@dataclasses.dataclass(frozen=True)
class FusionDecision:
    """Whether two neighbouring nodes (`a` before `b`, buffer names) share a kernel, and why."""

    a: str
    b: str
    fused: bool
    reason: str


@dataclasses.dataclass(eq=False)
class Schedule:
    """The schedule stage's output.

    graph: the (possibly rewritten) `IRGraph`. steps: `FusedGroup`s and `ExternKernel`s in
    execution order. decisions: one `FusionDecision` per considered pair. last_use: buffer name →
    index of the last step that reads it (graph outputs and inputs are never freed). reuse:
    buffer name → name of an earlier, dead buffer whose storage it takes (same byte size or
    smaller, same device). elided: buffer name → the view its readers read instead. split:
    buffer name → number of chunks its reduction was split into (the partial reduction is the
    buffer `<name>_partial`)."""

    graph: IRGraph
    steps: list[FusedGroup | ExternKernel]
    decisions: list[FusionDecision] = dataclasses.field(default_factory=list)
    last_use: dict[str, int] = dataclasses.field(default_factory=dict)
    reuse: dict[str, str] = dataclasses.field(default_factory=dict)
    elided: dict[str, TensorArg] = dataclasses.field(default_factory=dict)
    split: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def groups(self) -> list[FusedGroup]:
        return [s for s in self.steps if isinstance(s, FusedGroup)]

    def __repr__(self) -> str:
        return (f"<Schedule {len(self.groups)} kernels, "
                f"{len(self.steps) - len(self.groups)} extern calls>")


def _flat(vars_: Sequence[Expr], ranges: Sequence[int]) -> Expr:
    total = as_expr(0)
    for v, size in zip(vars_, ranges):
        total = total * size + v
    return total


def _unflat(flat: Expr, ranges: Sequence[int]) -> list[Expr]:
    out: list[Expr] = []
    inner = math.prod(ranges)
    for size in ranges:
        inner //= max(size, 1)
        out.append((flat // inner) % size if size != 1 else as_expr(0))
    return out


def group_index(member: ComputedBuffer, xvars: Sequence[Expr], rvars: Sequence[Expr],
                x_ranges: Sequence[int], r_ranges: Sequence[int]) -> tuple[list[Expr], list[Expr]]:
    """The member's `(index, rindex)` as expressions of the group's loop variables.

    A reduction member: its x loop flattens onto the group's x, its r loop onto the group's r.
    A pointwise member: its loop flattens onto (group x, group r) in row-major order, so a
    pointwise step over [rows, cols] in a row-reduction group reads x = row, r = col. Exact
    `Expr` simplification turns the div/mod of matching splits back into plain variables."""
    data = member.data
    gx = _flat(xvars, x_ranges)
    if isinstance(data, Reduction):
        gr = _flat(rvars, r_ranges)
        return _unflat(gx, data.ranges), _unflat(gr, data.reduction_ranges)
    flat = gx * math.prod(r_ranges) + _flat(rvars, r_ranges) if r_ranges else gx
    return _unflat(flat, data.ranges), []


def trivial_schedule(graph: IRGraph) -> Schedule:
    """One kernel per computed buffer, every buffer stored: the unfused baseline (and the
    fallback when fusion is disabled)."""
    steps: list[FusedGroup | ExternKernel] = []
    for i, node in enumerate(graph.nodes):
        if isinstance(node, ComputedBuffer):
            rr = node.data.reduction_ranges if node.is_reduction else ()
            steps.append(FusedGroup(f"group{i}", [node], tuple(node.data.ranges), tuple(rr),
                                    (node.name,)))
        else:
            steps.append(node)
    return Schedule(graph, steps)


def schedule(graph: IRGraph, *, fuse: bool = True, elide: bool = True,
             split: bool = True) -> Schedule:
    """Plan `graph`: elide copies into extern views, split long reductions, fuse, and plan
    memory. `fuse=False` keeps one kernel per computed buffer (the rewrites still apply)."""
    from kiln.logs import artifact_enabled, artifact_logger
    from kiln.schedule.attention_layout import refresh_attention_layouts, regroup_attention
    from kiln.schedule.elide import elide_copies
    from kiln.schedule.fusion import fuse_nodes
    from kiln.schedule.gemm_merge import merge_gemms
    from kiln.schedule.graph_edit import copy_graph
    from kiln.schedule.memory import plan_memory
    from kiln.schedule.render import render_schedule
    from kiln.schedule.split import split_reductions

    work = copy_graph(graph)
    merge_gemms(work)
    elided: dict[str, TensorArg] = {}
    if elide:
        regroup_attention(work)
        for _ in range(3):  # an output in its op's own layout may let a later copy go too
            elide_copies(work, elided)
            if not refresh_attention_layouts(work):
                break
    chunks = split_reductions(work) if split else {}
    steps, decisions = fuse_nodes(work, fuse)
    last_use, reuse = plan_memory(steps, work)
    result = Schedule(work, steps, decisions, last_use, reuse, elided, chunks)
    if artifact_enabled("fusion"):
        artifact_logger("fusion").info("%s", render_schedule(result))
    return result


def __getattr__(name: str):
    if name in ("render_schedule", "fusion_json"):
        from kiln.schedule import render

        return getattr(render, name)
    if name == "reduction_passes":
        from kiln.schedule.fusion import reduction_passes

        return reduction_passes
    raise AttributeError(f"module 'kiln.schedule' has no attribute {name!r}")
