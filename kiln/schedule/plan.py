"""plan: the schedule stage's output types, below every step that builds or reads them.

`FusedGroup` (one generated kernel), `FusionDecision` (fused or not, and why), `Schedule` (the
stage's output) and `group_index` (a member's loop variables as expressions of its group's).
`kiln.schedule` re-exports them; the step modules (`fusion`, `memory`, `split`, `render`) import
them from here, so the package entry can import the steps without a cycle.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from kiln.lower.index import Expr, as_expr
from kiln.lower.ir import ComputedBuffer, ExternKernel, IRGraph, Origin, Reduction, TensorArg

__all__ = ["FusedGroup", "FusionDecision", "Schedule", "group_index", "row_start", "spans_x_only"]


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
    for k, size in enumerate(ranges):
        # the product of the inner extents, not a running quotient: with symbolic sizes,
        # `s0*(s0 - 1) // s0` is no plain size expression
        inner = math.prod(max(r, 1) if isinstance(r, int) else r for r in ranges[k + 1:])
        out.append((flat // inner) % size if size != 1 else as_expr(0))
    return out


def spans_x_only(member: ComputedBuffer, x_ranges: Sequence[int],
                 r_ranges: Sequence[int]) -> bool:
    """Whether `member` is a pointwise step of a reduction group with one value per reduced row
    (a LayerNorm's mean or rstd output, the shifted mean a variance reads, a cast of the reduced
    value) rather than one per (row, r) element."""
    if member.is_reduction or not r_ranges:
        return False
    rnumel = math.prod(r_ranges)
    if isinstance(rnumel, int) and rnumel <= 1:
        return False   # x × r is x itself: the ordinary pointwise mapping
    return math.prod(member.data.ranges) == math.prod(x_ranges)


def row_start(index: Expr) -> Expr:
    """`index` (a member's write index in its group's loop variables) at r = 0: where a
    variance's shifted mean reads its pivot, the first element of the row."""
    return index.subs({s: 0 for s in index.free_symbols() if s.name.startswith("r")})


def group_index(member: ComputedBuffer, xvars: Sequence[Expr], rvars: Sequence[Expr],
                x_ranges: Sequence[int], r_ranges: Sequence[int]) -> tuple[list[Expr], list[Expr]]:
    """The member's `(index, rindex)` as expressions of the group's loop variables.

    A reduction member: its x loop flattens onto the group's x, its r loop onto the group's r.
    A pointwise member: its loop flattens onto (group x, group r) in row-major order, so a
    pointwise step over [rows, cols] in a row-reduction group reads x = row, r = col; one that
    spans only x (`spans_x_only`) flattens onto x. Exact `Expr` simplification turns the
    div/mod of matching splits back into plain variables."""
    data = member.data
    gx = _flat(xvars, x_ranges)
    if isinstance(data, Reduction):
        gr = _flat(rvars, r_ranges)
        return _unflat(gx, data.ranges), _unflat(gr, data.reduction_ranges)
    if spans_x_only(member, x_ranges, r_ranges):
        return _unflat(gx, data.ranges), []
    flat = gx * math.prod(r_ranges) + _flat(rvars, r_ranges) if r_ranges else gx
    return _unflat(flat, data.ranges), []
