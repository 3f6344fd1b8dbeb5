"""Python numbers that stay symbolic: graph nodes instead of guarded constants.

Two kinds. An int or float read from a source whose value already changed once between calls
(automatic dynamic, as TorchDynamo does) becomes a graph input, so new values reuse the graph:
it stays symbolic only through arithmetic with tensors and other numbers; anything that needs the
value itself (a branch, a shape, a Python call) specializes it: the sources it came from get
their equality guards back and the value is used as a constant.

A size of a tensor with symbolic dims (`x.shape[0]`, `x.numel()`, arithmetic on them) is a
`sym_size` node whose example is a torch SymInt: it may decide shapes (`x.view(b, -1)`), and a
branch on it (`if x.shape[0] > 4:`) asks the ShapeEnv, which records the answer as a guard.
"""
from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

import torch
import torch.fx

from kiln.capture import _compat
from kiln.capture.sources import Source
from kiln.capture.variables.base import VT, ConstantVT

if TYPE_CHECKING:
    from kiln.capture.translator import Translator

__all__ = ["SymScalarVT", "VALUE_ONLY_TARGETS", "specialize_all", "scalar_op",
           "tensor_of_numbers"]

# Graph targets whose scalar arguments only feed values, never shapes: symbolic numbers may
# flow into these. Any other use specializes.
VALUE_ONLY_TARGETS = frozenset({
    operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv, operator.mod,
    operator.pow, operator.neg, operator.lt, operator.le, operator.gt, operator.ge, operator.eq,
    operator.ne, operator.iadd, operator.isub, operator.imul, operator.itruediv,
    torch.add, torch.sub, torch.mul, torch.div, torch.pow, torch.clamp, torch.maximum,
    torch.minimum, "add", "sub", "mul", "div", "pow", "clamp", "add_", "sub_", "mul_", "div_",
    "masked_fill", "masked_fill_", "fill_", "clamp_", torch.scalar_tensor,
})


_PYTHON_TYPES = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}


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
        return _PYTHON_TYPES.get(type(self.value), type(self.value))

    def as_constant(self) -> Any:
        for root in self.roots:
            self.output.guards.equals(root, self.output.scalar_examples[root])
        return _compat.concrete(self.value)  # a symbolic size: the ShapeEnv records the guard

    def is_size(self) -> bool:
        """Derived from symbolic sizes only: may flow into any op, shapes included."""
        return not self.roots and _compat.is_symbolic(self.value)

    def truth(self, tx: Translator) -> bool:
        return bool(self.as_constant())

    def getattr(self, tx: Translator, name: str) -> VT:
        return ConstantVT(self.as_constant()).getattr(tx, name)

    def describe(self) -> str:
        return f"symbolic {self.python_type().__name__} ({self.value!r} while tracing)"


def specialize_all(value: Any, sizes: bool = False) -> Any:
    """`value` (a tracker, or a list/tuple/dict of them) with every symbolic number made a
    guarded constant, but symbolic sizes: for tensor ops whose scalar arguments may decide
    shapes (the fake computation asks the ShapeEnv about a size, which records a guard).
    `sizes`: symbolic sizes too (for a kernel that takes only concrete ones)."""
    from kiln.capture.variables.containers import ListVT, SliceVT, TupleVT
    if isinstance(value, SymScalarVT) and (sizes or not value.is_size()):
        return ConstantVT(value.as_constant())
    if isinstance(value, list):
        return [specialize_all(v, sizes) for v in value]
    if isinstance(value, dict):
        return {k: specialize_all(v, sizes) for k, v in value.items()}
    if isinstance(value, TupleVT):
        return TupleVT([specialize_all(i, sizes) for i in value.items], value.cls)
    if isinstance(value, ListVT):
        return ListVT([specialize_all(i, sizes) for i in value.items])
    if isinstance(value, SliceVT) and sizes:
        return SliceVT(*(specialize_all(p, sizes) for p in (value.start, value.stop, value.step)))
    return value


def scalar_op(tx: Translator, op: Any, args: list[VT]) -> VT:
    """`op(*args)` on numbers where at least one is symbolic: a node returning a number (a 0-dim
    tensor where one is a value-only number: `number_tensors`)."""
    from kiln.capture.variables.number_tensors import TensorNumberVT, number_arithmetic
    from kiln.capture.variables.tensor import to_graph_args
    if any(isinstance(a, TensorNumberVT) for a in args):
        return number_arithmetic(tx, op, args)
    pairs = [to_graph_args(a) for a in args]
    node, value = tx.output.create_node("call_function", op, tuple(p[0] for p in pairs), {},
                                        lambda: op(*(p[1] for p in pairs)))
    roots = tuple(dict.fromkeys(r for a in args if isinstance(a, SymScalarVT) for r in a.roots))
    return SymScalarVT(node, value, roots, tx.output)


def tensor_of_numbers(tx: Translator, fn: Any, args: list[VT], kwargs: dict[str, VT]) -> VT | None:
    """`torch.tensor(n)` / `torch.tensor([n, 2.0])` (or `as_tensor`) holding symbolic numbers: one
    `scalar_tensor` per number, stacked, so the numbers stay symbolic (the fake `torch.tensor`
    would read each one's value, a guard per size). None where this does not apply."""
    from kiln.capture.variables.containers import ListVT, TupleVT
    from kiln.capture.variables.number_tensors import TensorNumberVT, number_as_tensor
    from kiln.capture.variables.tensor import graph_call
    if fn not in (torch.tensor, torch.as_tensor) or len(args) != 1 or set(kwargs) - {"dtype",
                                                                                    "device"}:
        return None
    data = args[0]
    listed = isinstance(data, (ListVT, TupleVT))
    items = data.items if listed else [data]
    if not any(isinstance(i, SymScalarVT) for i in items) or not all(
            isinstance(i, SymScalarVT) or (isinstance(i, ConstantVT) and type(i.value) in
                                           (int, float, bool)) for i in items):
        return None
    kinds = {i.python_type() for i in items}
    dtype = kwargs["dtype"].as_constant() if "dtype" in kwargs else (
        torch.get_default_dtype() if float in kinds else torch.bool if kinds == {bool}
        else torch.int64)
    options = {"dtype": ConstantVT(dtype), **({"device": kwargs["device"]} if "device" in kwargs
                                             else {})}
    scalars = [number_as_tensor(tx, i, dtype, kwargs.get("device"))
               if isinstance(i, TensorNumberVT) else
               graph_call(tx, "call_function", torch.scalar_tensor, [i], options) for i in items]
    if not listed:
        return scalars[0]
    return graph_call(tx, "call_function", torch.stack, [ListVT(scalars)], {})
