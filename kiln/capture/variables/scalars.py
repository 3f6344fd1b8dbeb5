"""Python numbers that stay symbolic: graph inputs instead of guarded constants.

An int or float read from a source whose value already changed once between calls (automatic
dynamic, as TorchDynamo does) becomes a graph input, so new values reuse the graph. It stays
symbolic only through arithmetic with tensors and other numbers; anything that needs the value
itself (a branch, a shape, a Python call) specializes it: the sources it came from get their
equality guards back and the value is used as a constant.
"""
from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

import torch
import torch.fx

from kiln.capture.sources import Source
from kiln.capture.variables.base import VT, ConstantVT

if TYPE_CHECKING:
    from kiln.capture.translator import Translator

__all__ = ["SymScalarVT", "VALUE_ONLY_TARGETS", "specialize_all", "scalar_op"]

# Graph targets whose scalar arguments only feed values, never shapes: symbolic numbers may
# flow into these. Any other use specializes.
VALUE_ONLY_TARGETS = frozenset({
    operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv, operator.mod,
    operator.pow, operator.neg, operator.lt, operator.le, operator.gt, operator.ge, operator.eq,
    operator.ne, operator.iadd, operator.isub, operator.imul, operator.itruediv,
    torch.add, torch.sub, torch.mul, torch.div, torch.pow, torch.clamp, torch.maximum,
    torch.minimum, "add", "sub", "mul", "div", "pow", "clamp", "add_", "sub_", "mul_", "div_",
    "masked_fill", "masked_fill_", "fill_", "clamp_",
})


class SymScalarVT(VT):
    """A Python number known only at run time: an FX node (a placeholder or arithmetic on one)
    plus the example value seen while tracing, and the sources it derives from. Asking for its
    value (`as_constant`) specializes it: the root sources get equality guards back."""

    def __init__(self, node: torch.fx.Node, value: Any, roots: tuple[Source, ...],
                 output: Any) -> None:
        self.node = node
        self.value = value
        self.roots = roots
        self.output = output

    def python_type(self) -> type:
        return type(self.value)

    def as_constant(self) -> Any:
        for root in self.roots:
            self.output.guards.equals(root, self.output.scalar_examples[root])
        return self.value

    def truth(self, tx: Translator) -> bool:
        return bool(self.as_constant())

    def getattr(self, tx: Translator, name: str) -> VT:
        return ConstantVT(self.as_constant()).getattr(tx, name)

    def describe(self) -> str:
        return f"symbolic {type(self.value).__name__} ({self.value!r} while tracing)"


def specialize_all(value: Any) -> Any:
    """`value` (a tracker, or a list/tuple/dict of them) with every symbolic number made a
    guarded constant: for tensor ops whose scalar arguments may decide shapes."""
    from kiln.capture.variables.containers import ListVT, TupleVT
    if isinstance(value, SymScalarVT):
        return ConstantVT(value.as_constant())
    if isinstance(value, list):
        return [specialize_all(v) for v in value]
    if isinstance(value, dict):
        return {k: specialize_all(v) for k, v in value.items()}
    if isinstance(value, TupleVT):
        return TupleVT([specialize_all(i) for i in value.items], value.cls)
    if isinstance(value, ListVT):
        return ListVT([specialize_all(i) for i in value.items])
    return value


def scalar_op(tx: Translator, op: Any, args: list[VT]) -> SymScalarVT:
    """`op(*args)` on numbers where at least one is symbolic: a node returning a number."""
    from kiln.capture.variables.tensor import to_graph_args
    pairs = [to_graph_args(a) for a in args]
    node, value = tx.output.create_node("call_function", op, tuple(p[0] for p in pairs), {},
                                        lambda: op(*(p[1] for p in pairs)))
    roots = tuple(dict.fromkeys(r for a in args if isinstance(a, SymScalarVT) for r in a.roots))
    return SymScalarVT(node, value, roots, tx.output)
