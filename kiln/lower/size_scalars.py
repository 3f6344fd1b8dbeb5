"""size_scalars: Python numbers a symbolic graph computes from its sizes (issue 15, stage C).

Batch norm in training keeps an unbiased running variance, `var * n / (n - 1)` with
`n = N*H*W`, and torch's decomposition computes that factor in Python from `sym_numel`: a graph
traced with a symbolic batch holds `truediv(sym_numel(x), C)`, `sub(..., 1.0)` and
`truediv(n, n - 1)` nodes whose values are SymFloats. While lowering, such a value is a
`SizeScalar`: the arithmetic kept as a small tree over size expressions, which the kernel
evaluates from its size arguments, in float64 as Python does, then rounded once to the op's
computation dtype as eager rounds a Python scalar operand. Its value is the same for every
element; the kernel recomputes it (a few flops) rather than the wrapper passing it in.
"""
from __future__ import annotations

import operator
from typing import Any

import torch

from kiln.lower.index import Expr
from kiln.lower.ops import ops

__all__ = ["SizeScalar", "is_size_number", "size_arithmetic"]

# Python arithmetic on sizes whose result may be a float, and the ops handler op for each
_OPS = {operator.add: "add", operator.sub: "sub", operator.mul: "mul",
        operator.truediv: "truediv", operator.neg: "neg", operator.pow: "pow"}
# functions of one size whose result is a float: `float(n)` (a size read as a float), and
# `math.sqrt(n)` (`torch._sym_sqrt`, capture's symbolic math.sqrt): in float64, as Python
_FLOAT_FNS = {torch.sym_float: "float", torch._sym_sqrt: "sqrt"}


class SizeScalar:
    """A float computed at run time from symbolic sizes: `op(*args)` over ints, floats,
    size expressions and other `SizeScalar`s."""

    __slots__ = ("op", "args")

    def __init__(self, op: Any, args: tuple) -> None:
        self.op = op
        self.args = args

    def load(self, dtype: torch.dtype) -> Any:
        """The value as an ops value of `dtype` (computed in float64, rounded once)."""
        value = self._value()
        return value if dtype == torch.float64 else ops.to_dtype(value, dtype)

    def _value(self) -> Any:
        if self.op in _FLOAT_FNS:
            value = _load64(self.args[0])
            return value if self.op is torch.sym_float else ops.sqrt(value)
        return getattr(ops, _OPS[self.op])(*(_load64(a) for a in self.args))

    def __str__(self) -> str:
        if self.op in _FLOAT_FNS:
            return f"{_FLOAT_FNS[self.op]}({self.args[0]})"
        if self.op is operator.neg:
            return f"-({self.args[0]})"
        sign = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "pow": "**"}[_OPS[self.op]]
        return f"({self.args[0]} {sign} {self.args[1]})"

    __repr__ = __str__

    # arithmetic between a SizeScalar and anything else stays a SizeScalar
    def __add__(self, other: Any) -> SizeScalar:
        return SizeScalar(operator.add, (self, other))

    def __radd__(self, other: Any) -> SizeScalar:
        return SizeScalar(operator.add, (other, self))

    def __sub__(self, other: Any) -> SizeScalar:
        return SizeScalar(operator.sub, (self, other))

    def __rsub__(self, other: Any) -> SizeScalar:
        return SizeScalar(operator.sub, (other, self))

    def __mul__(self, other: Any) -> SizeScalar:
        return SizeScalar(operator.mul, (self, other))

    def __rmul__(self, other: Any) -> SizeScalar:
        return SizeScalar(operator.mul, (other, self))

    def __truediv__(self, other: Any) -> SizeScalar:
        return SizeScalar(operator.truediv, (self, other))

    def __rtruediv__(self, other: Any) -> SizeScalar:
        return SizeScalar(operator.truediv, (other, self))

    def __neg__(self) -> SizeScalar:
        return SizeScalar(operator.neg, (self,))


def _load64(value: Any) -> Any:
    if isinstance(value, SizeScalar):
        return value._value()
    if isinstance(value, Expr) and not value.is_constant:
        return ops.index_expr(value, torch.float64)
    return ops.constant(float(value), torch.float64)


def is_size_number(value: Any) -> bool:
    """Whether a scalar operand is known only at run time (a size or a `SizeScalar`)."""
    return isinstance(value, SizeScalar) or (isinstance(value, Expr) and not value.is_constant)


def size_arithmetic(target: Any, args: tuple) -> Any:
    """`target(*args)` of a graph's Python arithmetic when the result is a float that depends
    on the sizes (a `SizeScalar`); None when it is integer arithmetic on sizes (an `Expr`,
    computed by the index algebra) or plain numbers."""
    if target in _FLOAT_FNS and len(args) == 1 and is_size_number(args[0]):
        return SizeScalar(target, tuple(args))
    if target not in _OPS or not any(is_size_number(a) for a in args):
        return None
    floats = target is operator.truediv or any(
        isinstance(a, (float, SizeScalar)) for a in args)
    if not floats:
        return None
    return SizeScalar(target, tuple(args))
