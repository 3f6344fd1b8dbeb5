"""deps: the dependency-collecting ops handler.

Running a loop body under `DepsCollector` records every `load`/`store` as a `MemoryDep`
(buffer name, flat index expression, loop variables) and counts the other ops. The schedule stage
uses `read_writes(node)` for fusion legality (a consumer's read index equal to the producer's
write index) and the lower stage uses `count_ops` for its inlining heuristic.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Sequence

import torch

from kiln.lower.index import Expr, sym
from kiln.lower.ir import ComputedBuffer, loop_vars
from kiln.lower.ops import OpsHandler, use_handler

__all__ = ["DepsCollector", "MemoryDep", "ReadWrites", "count_ops", "innermost", "read_writes",
           "reduction_axis_class", "step_along"]


@dataclasses.dataclass(frozen=True)
class MemoryDep:
    """A read or write of buffer `name` at flat storage offset `index` (an `Expr` over the
    node's loop variables `x*`, `r*` and indirect symbols `i*`)."""

    name: str
    index: Expr


@dataclasses.dataclass(frozen=True)
class ReadWrites:
    """What a node's body touches: `reads`, `writes` (deduplicated, in first-seen order), the
    number of non-memory `ops`, and whether any index is indirect (data-dependent)."""

    reads: tuple[MemoryDep, ...]
    writes: tuple[MemoryDep, ...]
    ops: int
    indirect: bool

    @property
    def read_names(self) -> list[str]:
        return list(dict.fromkeys(d.name for d in self.reads))


class _Token:
    __slots__ = ()


_TOKEN = _Token()


class DepsCollector(OpsHandler):
    def __init__(self) -> None:
        self.reads: list[MemoryDep] = []
        self.writes: list[MemoryDep] = []
        self.ops = 0
        self.indirect = 0

    def load(self, name: str, index: Expr) -> _Token:
        self.reads.append(MemoryDep(name, index))
        return _TOKEN

    def store(self, name: str, index: Expr, value: Any) -> None:
        self.writes.append(MemoryDep(name, index))

    store_reduction = store

    def reduction(self, dtype: torch.dtype, src_dtype: torch.dtype, reduction_type: str,
                  value: Any) -> _Token:
        self.ops += 1
        return _TOKEN

    def constant(self, value: Any, dtype: torch.dtype) -> _Token:
        return _TOKEN

    def index_expr(self, expr: Expr, dtype: torch.dtype) -> _Token:
        self.ops += 1
        return _TOKEN

    def indirect_indexing(self, value: Any, size: int, check: bool = True,
                          wrap: bool = True) -> Expr:
        name = f"i{self.indirect}"
        self.indirect += 1
        return sym(name, size)

    def to_dtype(self, x: Any, dtype: torch.dtype) -> _Token:
        self.ops += 1
        return _TOKEN

    def where(self, cond: Any, a: Any, b: Any) -> _Token:
        self.ops += 1
        return _TOKEN

    def masked(self, mask: Any, body: Callable[[], Any], other: Any) -> _Token:
        body()
        self.ops += 1
        return _TOKEN

    def math(self, name: str, *args: Any) -> _Token:
        self.ops += 1
        return _TOKEN


def count_ops(inner_fn: Callable[[Sequence[Expr]], Any], ranges: Sequence[int]) -> tuple[int, int]:
    """(loads, ops) of one evaluation of a pointwise inner function."""
    collector = DepsCollector()
    with use_handler(collector):
        inner_fn(loop_vars(ranges))
    return len(collector.reads), collector.ops


def read_writes(node: ComputedBuffer) -> ReadWrites:
    """The memory dependencies of a computed buffer's body."""
    collector = DepsCollector()
    index, rindex = node.loop_vars()
    with use_handler(collector):
        node.body(index, rindex)
    return ReadWrites(tuple(dict.fromkeys(collector.reads)), tuple(dict.fromkeys(collector.writes)),
                      collector.ops, collector.indirect > 0)


def step_along(index: Expr, name: str) -> int | None:
    """How far `index` moves when loop variable `name` goes from 0 to 1 with every other
    symbol at 0: the memory stride of that axis at the origin, also for div/mod (reshaped)
    indices whose linear coefficients do not exist. 0 when the index does not use `name`;
    None for data-dependent (indirect) indices. Tells coalesced axes apart (schedule's split
    heuristic, codegen's reduction tiling)."""
    names = {s.name for s in index.free_symbols()}
    if any(not (n.startswith("x") or n.startswith("r") or n.startswith("y")) for n in names):
        return None
    if name not in names:
        return 0
    env = dict.fromkeys(names, 0)
    base = index.evaluate(env)
    env[name] = 1
    return int(index.evaluate(env)) - int(base)


def innermost(vars_: Sequence[Expr]) -> str | None:
    """Name of the fastest-varying loop variable of size > 1 (None when all have size 1, whose
    symbols simplify away)."""
    for v in reversed(vars_):
        atom = v.atom()
        if atom is not None:
            return atom.name
    return None


def reduction_axis_class(reads: Iterable[Expr], x_name: str | None, r_name: str | None) -> str:
    """"outer" when the reads that walk both the output and the reduction axis are contiguous
    along the output (a column reduction such as a bias gradient), else "inner". A read along
    one axis only (a per-row statistic, a per-column weight) does not decide it; memory steps
    along the innermost variables also see through reshaped (div/mod) indices. Shared by the
    schedule's split heuristic and codegen's tiling, which must agree."""
    if x_name is None or r_name is None:
        return "inner"
    inner = outer = 0
    for index in reads:
        dx, dr = step_along(index, x_name), step_along(index, r_name)
        if not dx or not dr:
            continue
        if abs(dr) == 1:
            inner += 1
        elif abs(dx) == 1:
            outer += 1
    return "outer" if outer > inner else "inner"
