"""group: the body of one fused kernel — a `FusedGroup`'s members printed in order.

Every member's body runs under one `TritonPrinter` with its loop variables expressed in the
group's (`member_indices`). A load of a member buffer reads the value in registers (by buffer
name and index: a reduction result is `[XBLOCK, 1]` and broadcasts along r when an epilogue
reads it at an x-only index); only `group.stores` are written to memory. A member read at an
index other than the one it was computed at cannot be served from registers: CodegenError.

Member shapes in a reduction group: a reduction member spans x (it reduces the group's r); a
pointwise member spans x × r (the normalize step of a LayerNorm) or x only (a cast of the
reduced value, an rstd output).

Kernel bodies:

- pointwise and persistent reductions: one straight-line scope, members in order.
- looped reductions: one or more r loops ("passes"). A reduction's result exists only after its
  loop, so each member is placed in the first pass where everything it reads is available
  (`plan_passes`): LayerNorm is mean (pass 0), variance (pass 1), normalize + store (pass 2).
  Accumulators are initialised before their loop, reduced after it; x-only members sit between
  loops. A pointwise member needed in a later loop is recomputed there from its inputs
  (memory written by this kernel is never read back); earlier passes load with
  `evict_last` so the last pass finds its data in L2.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from kiln.codegen.triton_printer import TV, CodegenError, TritonPrinter
from kiln.lower.deps import DepsCollector, read_writes
from kiln.lower.index import Expr, affine_form, as_expr
from kiln.lower.ir import ComputedBuffer, loop_vars
from kiln.lower.ops import use_handler
from kiln.schedule import group_index
from kiln.schedule.plan import row_start, spans_x_only

__all__ = ["GroupBody", "group_accesses", "member_indices", "plan_passes", "print_group"]


def is_x_only(node: ComputedBuffer, group) -> bool:
    """A pointwise member of a reduction group that spans only the group's x (one value per
    reduced row), as opposed to x × r."""
    return spans_x_only(node, group.x_ranges, group.r_ranges)


def member_indices(node: ComputedBuffer, group, xvars: Sequence[Expr],
                   rvars: Sequence[Expr]) -> tuple[list[Expr], list[Expr]]:
    """The member's `(index, rindex)` in the group's loop variables."""
    data = node.data
    size = math.prod(data.ranges)
    if node.is_reduction:
        if size != group.numel or math.prod(data.reduction_ranges) != group.rnumel:
            raise CodegenError(f"{node.name}: reduction over {list(data.ranges)} x "
                               f"{list(data.reduction_ranges)} does not match its group's "
                               f"x={list(group.x_ranges)} r={list(group.r_ranges)}")
        return group_index(node, xvars, rvars, group.x_ranges, group.r_ranges)
    if is_x_only(node, group):
        return group_index(node, xvars, rvars, group.x_ranges, group.r_ranges)
    if size != group.numel * group.rnumel:
        raise CodegenError(f"{node.name}: pointwise over {list(data.ranges)} does not match its "
                           f"group's x={list(group.x_ranges)} r={list(group.r_ranges)}; "
                           "hint: the scheduler must only fuse members of one iteration space")
    return group_index(node, xvars, rvars, group.x_ranges, group.r_ranges)


def group_accesses(group, reductions_only: bool = False) -> tuple[list, list, list, list]:
    """(reads of buffers outside the group, writes, x vars, r vars) of the group's members, as
    `MemoryDep`s (name, index in the group's loop variables; a buffer several members read
    appears once per member)."""
    members = {n.name for n in group.nodes}
    xvars = loop_vars(group.x_ranges, "x")
    rvars = loop_vars(group.r_ranges, "r")
    reads, writes = [], []
    for node in group.nodes:
        if reductions_only and not node.is_reduction:
            continue
        collector = DepsCollector()
        index, rindex = member_indices(node, group, xvars, rvars)
        with use_handler(collector):
            node.body(index, rindex)
        reads += [dep for dep in collector.reads if dep.name not in members]
        writes += [dep for dep in collector.writes if dep.name in group.stores]
    return reads, writes, xvars, rvars


def member_reads(group) -> dict[str, list[str]]:
    """For each member: the member buffers (computed earlier in the group) it reads."""
    names = {n.name for n in group.nodes}
    return {n.name: [r for r in read_writes(n).read_names if r in names and r != n.name]
            for n in group.nodes}


def plan_passes(group) -> tuple[dict[str, int], int]:
    """(pass of each member, number of r loops) for a looped reduction.

    A reduction's result is available from the pass after its own; a pointwise x × r member
    can run in any pass from the one its inputs are available in; an x-only member runs
    between loops (its "pass" p means: before loop p). Loops: enough for every reduction and
    every stored x × r member."""
    reads = member_reads(group)
    avail: dict[str, int] = {}
    where: dict[str, int] = {}
    loops = 0
    for node in group.nodes:
        need = max((avail[d] for d in reads[node.name]), default=0)
        where[node.name] = need
        if node.is_reduction:
            avail[node.name] = need + 1
            loops = max(loops, need + 1)
        else:
            avail[node.name] = need
            if not is_x_only(node, group) and node.name in group.stores:
                loops = max(loops, need + 1)
    return where, max(loops, 1)


@dataclasses.dataclass
class _Scope:
    """Straight-line code at one nesting level: its lines, CSE table and member values."""

    lines: list[str]
    cse: dict
    values: dict[str, tuple[Expr, TV]]
    parent: _Scope | None = None

    def lookup(self, name: str) -> tuple[Expr, TV] | None:
        scope: _Scope | None = self
        while scope is not None:
            if name in scope.values:
                return scope.values[name]
            scope = scope.parent
        return None


def _same_index(a: Expr, b: Expr) -> bool:
    return a == b or affine_form(a) == affine_form(b)


@dataclasses.dataclass
class GroupBody:
    """The printed kernel body: `lines` (after the x prologue), the printer (its loads/stores
    name the pointer arguments) and the number of r loops (0 when not looped)."""

    lines: list[str]
    printer: TritonPrinter
    loops: int


class _Emitter:
    def __init__(self, group, printer: TritonPrinter, xvars, rvars, r_prologue) -> None:
        self.group = group
        self.printer = printer
        self.xvars, self.rvars = xvars, rvars
        self.r_prologue = r_prologue  # lines defining rindex/rmask/r vars inside a loop
        self.members = {n.name: n for n in group.nodes}
        self.stores = set(group.stores)
        self.capturing = 0
        self.aliases: dict[str, str] = {}  # member -> the name its value is kept under now
        self.outer = _Scope([], {}, {})
        self.scope = self.outer
        printer.resolve_load = self.resolve_load
        printer.on_store = self.on_store

    def enter(self, scope: _Scope) -> None:
        self.scope = scope
        self.printer.lines = scope.lines
        self.printer._cse = scope.cse

    def run_member(self, node: ComputedBuffer) -> None:
        index, rindex = member_indices(node, self.group, self.xvars, self.rvars)
        saved = self.printer.x_only
        self.printer.x_only = is_x_only(node, self.group)
        try:
            node.body(index, rindex)
        finally:
            self.printer.x_only = saved

    # -- printer hooks -------------------------------------------------------------------------

    def resolve_load(self, name: str, index: Expr) -> TV | None:
        if name not in self.members:
            return None
        found = self.scope.lookup(name)
        if found is None:
            found = self._recompute(self.members[name])
        stored_at, value = found
        if not _same_index(stored_at, index):
            node = self.members[name]
            if not node.is_reduction and not is_x_only(node, self.group) and \
                    _same_index(row_start(stored_at), index):
                return self._at_row_start(node)
            raise CodegenError(
                f"{self.group.name}: {name} is computed at index {stored_at} but read at "
                f"{index}; registers cannot serve that read. hint: the scheduler must not fuse "
                f"a consumer that reads its producer at another index")
        return value

    def _recompute(self, node: ComputedBuffer) -> tuple[Expr, TV]:
        if node.is_reduction:
            raise CodegenError(f"{self.group.name}: {node.name} is read before its reduction "
                               "finished (members out of order?)")
        return self._captured(node.name, lambda: self.run_member(node))

    def _captured(self, key: str, run) -> tuple[Expr, TV]:
        """Run a member's body for its value only (no store to memory) and return what it left
        under `key`; values computed under a mask are not valid outside it, so they are
        forgotten afterwards."""
        saved = dict(self.scope.values) if self.printer.masks else None
        self.capturing += 1
        try:
            run()
        finally:
            self.capturing -= 1
        found = self.scope.lookup(key)
        if saved is not None:
            self.scope.values.clear()
            self.scope.values.update(saved)
        assert found is not None
        return found

    def _at_row_start(self, node: ComputedBuffer) -> TV:
        """A pointwise x × r member's value at its row's first element (r = 0), recomputed from
        its inputs as an x-only value: the pivot of a shifted mean (fusion's
        `_reads_row_start`). Kept under its own name so the member's value at (x, r) stays."""
        key = f"{node.name}@row_start"
        found = self.scope.lookup(key)
        if found is not None:
            return found[1]
        zeros = [as_expr(0)] * len(self.rvars)
        index, rindex = member_indices(node, self.group, self.xvars, zeros)

        def run() -> None:
            x_only, self.printer.x_only = self.printer.x_only, True
            self.aliases[node.name] = key
            try:
                node.body(index, rindex)
            finally:
                del self.aliases[node.name]
                self.printer.x_only = x_only

        return self._captured(key, run)[1]

    def on_store(self, name: str, index: Expr, value: TV) -> bool:
        self.scope.values[self.aliases.get(name, name)] = (index, value)
        return name in self.stores and not self.capturing

    # -- bodies --------------------------------------------------------------------------------

    def straight(self) -> list[str]:
        self.enter(self.outer)
        for node in self.group.nodes:
            self.run_member(node)
        return self.outer.lines

    def looped(self) -> tuple[list[str], int]:
        where, loops = plan_passes(self.group)
        main: list[str] = []
        nodes = self.group.nodes
        for p in range(loops + 1):
            self.outer.lines = main
            self.enter(self.outer)
            for node in nodes:
                if is_x_only(node, self.group) and min(where[node.name], loops) == p:
                    self.run_member(node)
            if p == loops:
                break
            in_loop = [n for n in nodes if where[n.name] == p and (
                n.is_reduction or (not is_x_only(n, self.group) and n.name in self.stores))]
            main.extend(self._loop(in_loop, p, loops))
        return main, loops

    def _loop(self, nodes: list[ComputedBuffer], p: int, loops: int) -> list[str]:
        printer = self.printer
        pre: list[str] = []
        body: list[str] = []
        post: list[str] = []
        self.outer.lines = post
        inner = _Scope(body, dict(self.outer.cse), {}, parent=self.outer)
        printer.eviction = None if loops == 1 else (
            "evict_last" if p < loops - 1 else "evict_first")

        def leave() -> None:
            printer.loop_pre = None
            self.enter(self.outer)

        printer.exit_loop = leave
        for node in nodes:
            self.enter(inner)
            printer.loop_pre = pre
            self.run_member(node)
        printer.loop_pre = None
        printer.exit_loop = None
        printer.eviction = None
        head = ["for roffset in range(0, rnumel, RBLOCK):"]
        return pre + head + ["    " + line for line in self.r_prologue + body] + post


def print_group(group, printer: TritonPrinter, xvars, rvars, looped: bool,
                r_prologue: Sequence[str] = ()) -> GroupBody:
    """Run the group's members under `printer` and return the kernel body."""
    members = [n.name for n in group.nodes]
    missing = [s for s in group.stores if s not in members]
    if missing:
        raise CodegenError(f"{group.name}: stores {missing} are not members of the group")
    _register_pointers(group, printer)
    emitter = _Emitter(group, printer, xvars, rvars, list(r_prologue))
    with use_handler(printer):
        if looped:
            lines, loops = emitter.looped()
        else:
            lines, loops = emitter.straight(), 0
    return GroupBody(lines, printer, loops)


def _register_pointers(group, printer: TritonPrinter) -> None:
    """Fix the pointer arguments up front, in member order (reads, then stored members), so
    every config of a group takes the same arguments whatever order its passes print in."""
    members = {n.name for n in group.nodes}
    for node in group.nodes:
        for name in read_writes(node).read_names:
            if name not in members:
                printer.loads.setdefault(name, f"in_ptr{len(printer.loads)}")
    for node in group.nodes:
        if node.name in group.stores:
            printer.stores.setdefault(node.name, f"out_ptr{len(printer.stores)}")
