"""rule_table: the lowering rule table and the vocabulary a rule is written in.

`lowerings[op]` is a list of `(checker, lowering)` pairs filled by `register` (the rule modules in
`kiln/lower/rules/`); a lowering receives a `Call` and raises `LoweringError` when it cannot lower
a graph. The interpreter (`lowering.py`) reads the table; both it and the rules import from here,
so neither imports the other to share these names. `kiln.lower.lowering` re-exports them.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
import torch.fx

from kiln.errors import KilnError
from kiln.lower.ir import Origin

__all__ = ["Call", "LoweringError", "lowerings", "register"]

Checker = Callable[..., bool]
LoweringFn = Callable[..., Any]

lowerings: dict[Any, list[tuple[Checker, LoweringFn]]] = {}


class LoweringError(KilnError):
    """The lower stage cannot lower a graph (never raised for a merely unknown op: that falls
    back)."""

    stage = "lower"


def _always(call: Call, *args: Any, **kwargs: Any) -> bool:
    return True


def register(*ops: Any, checker: Checker | None = None) -> Callable[[LoweringFn], LoweringFn]:
    """Add `(checker, fn)` to `lowerings[op]` for each op (checker defaults to always)."""

    def deco(fn: LoweringFn) -> LoweringFn:
        for op in ops:
            lowerings.setdefault(op, []).append((checker or _always, fn))
        return fn

    return deco


@dataclasses.dataclass
class Call:
    """One node being lowered. `meta_args`/`meta_kwargs` are the node's arguments with FX
    nodes replaced by their `meta["val"]` (fake tensors); `out` is the node's own
    `meta["val"]`; `origin` its provenance."""

    builder: Any  # the interpreter's `lowering.GraphBuilder`
    node: torch.fx.Node
    op: Any
    meta_args: tuple
    meta_kwargs: dict
    out: Any
    origin: Origin

    @property
    def origins(self) -> tuple[Origin, ...]:
        return (self.origin,)

    @property
    def device(self) -> torch.device:
        out = self.out[0] if isinstance(self.out, (tuple, list)) else self.out
        return out.device if isinstance(out, torch.Tensor) else torch.device("cpu")
