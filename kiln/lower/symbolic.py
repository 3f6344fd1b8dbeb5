"""symbolic: lowering a graph whose sizes are symbolic (issue 15, stage C).

A graph traced with torch's ShapeEnv carries `SymInt` sizes in its fake tensors (`s0`). While
`symbolic_lowering(gm)` is active, the interpreter sees those sizes as index expressions over
`Size` atoms (`index.size_expr`): every fake tensor with a symbolic size is wrapped in a
`SymMeta` (shape, strides and numel as `Expr`s, everything else delegated), every `SymInt`
argument becomes an `Expr`, and layouts, loop ranges and strides are built from them by the
rules as they are.

Soundness: a rule that needs a concrete size either fails (an `Expr` refuses `int()`,
`range()` and ordering) or asks the SymInt directly, which makes the ShapeEnv record a guard.
Any guard recorded during lowering means some decision held only for the example's sizes:
`symbolic_lowering` then raises `SymbolicShapeError`, and the backend compiles per size
(`kiln/backends/per_size.py`). Never a kernel that is right for one size only.
"""
from __future__ import annotations

import contextlib
import math
import operator
from typing import Any, Iterator

import torch

from kiln.lower import _compat
from kiln.lower.index import Expr, as_expr, derived_size, size_expr
from kiln.lower.rule_table import LoweringError
from kiln.lower.size_scalars import size_arithmetic

__all__ = ["SymMeta", "SymbolicShapeError", "active", "is_symbolic_graph", "lower_metas",
           "python_op", "symbolic_lowering", "to_size"]


class SymbolicShapeError(LoweringError):
    """The graph has symbolic sizes and some part of it cannot be lowered for every size."""


_state: dict[str, Any] = {"active": False, "shape_envs": []}


def active() -> bool:
    return _state["active"]


def is_symbolic_graph(gm: torch.fx.GraphModule) -> bool:
    """Whether a placeholder's example has a symbolic size or is a symbolic int."""
    for node in gm.graph.nodes:
        if node.op == "placeholder" and _has_symbols(node.meta.get("val")):
            return True
    return False


def _has_symbols(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return any(_compat.symint_parts(v) is not None
                   for v in (*value.shape, *value.stride(), value.storage_offset()))
    return _compat.symint_parts(value) is not None


@contextlib.contextmanager
def symbolic_lowering(gm: torch.fx.GraphModule) -> Iterator[None]:
    """Lower `gm` with symbolic sizes (see the module docstring)."""
    envs = _shape_envs(gm)
    before = [_compat.guard_count(env) for env in envs]
    saved = dict(_state)
    _state.update(active=True, shape_envs=envs)
    try:
        yield
    finally:
        _state.clear()
        _state.update(saved)
    after = [_compat.guard_count(env) for env in envs]
    if after != before:
        raise SymbolicShapeError("lowering specialized a symbolic size (the ShapeEnv recorded "
                                 f"{sum(after) - sum(before)} new guard(s))")


def _shape_envs(gm: torch.fx.GraphModule) -> list:
    envs: list = []
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        sizes = (*val.shape, *val.stride()) if isinstance(val, torch.Tensor) else (val,)
        for v in sizes:
            parts = _compat.symint_parts(v)
            if parts is not None and all(e is not parts[1] for e in envs):
                envs.append(parts[1])
    return envs


# -- SymInt -> Expr ----------------------------------------------------------------------------

def to_size(value: Any) -> Any:
    """An int stays; a symbolic SymInt becomes an `Expr` over `Size` atoms; else unchanged."""
    if isinstance(value, torch.SymInt):
        parts = _compat.symint_parts(value)
        if parts is None:
            return int(value.node.expr) if value.node.expr.is_number else int(value)
        return _from_sympy(*parts)
    return value


def _from_sympy(expr: Any, shape_env: Any) -> Expr:
    kind = _compat.sympy_kind(expr)
    if kind == "integer":
        return as_expr(int(expr))
    if kind == "symbol":
        lo, hi = _compat.symbol_range(shape_env, expr)
        return size_expr(str(expr), lo, hi, _compat.symbol_hint(shape_env, expr))
    if kind == "ceildiv":  # ceil(a / b) of sizes is floor((a + b - 1) / b)
        a, b = (_from_sympy(e, shape_env) for e in _compat.ceildiv_operands(expr))
        return derived_size((a + b - 1) // b)
    args = [_from_sympy(a, shape_env) for a in expr.args]
    if kind == "add":
        total = as_expr(0)
        for a in args:
            total = total + a
        return total
    if kind == "mul":
        total = as_expr(1)
        for a in args:
            total = total * a
        return total
    if kind == "power":  # args: the base and the (positive integer) exponent
        total = as_expr(1)
        for _ in range(int(expr.args[1])):
            total = total * args[0]
        return total
    if kind == "floordiv":  # one atom, so that it can multiply sizes (a pooled extent)
        return derived_size(args[0] // args[1])
    if kind == "mod":
        return derived_size(args[0] % args[1])
    if kind in ("max", "min"):
        return _extreme(expr, args, largest=kind == "max")
    raise SymbolicShapeError(f"symbolic size {expr} is not a sum, product, power, floor or "
                             "ceiling division, modulo, max or min of sizes")


def _extreme(expr: Any, args: list[Expr], largest: bool) -> Expr:
    """The argument of a Max/Min that is the extreme one for every size (a slice's length
    `Max(0, s0 - 1)` is `s0 - 1`: sizes are at least 2); one that depends on the sizes raises."""
    for a in args:
        try:
            if all((a >= b) if largest else (a <= b) for b in args):
                return a
        except TypeError:  # the order depends on the sizes
            continue
    raise SymbolicShapeError(f"symbolic size {expr}: which argument is the "
                             f"{'largest' if largest else 'smallest'} depends on the sizes")


class SymMeta:
    """A fake tensor with symbolic sizes, seen by the rules with `Expr` sizes. `isinstance(m,
    torch.Tensor)` holds (rules branch on it); anything not defined here is the fake tensor's."""

    def __init__(self, fake: torch.Tensor) -> None:
        self._fake = fake
        self.shape = tuple(to_size(v) for v in fake.shape)
        self._stride = tuple(to_size(v) for v in fake.stride())
        self._offset = to_size(fake.storage_offset())

    @property
    def __class__(self) -> type:  # noqa: D401 - isinstance(meta, torch.Tensor) must hold
        return torch.Tensor

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    def stride(self, dim: int | None = None) -> Any:
        return self._stride if dim is None else self._stride[dim]

    def storage_offset(self) -> Any:
        return self._offset

    def dim(self) -> int:
        return len(self.shape)

    ndim = property(dim)

    def numel(self) -> Any:
        total: Any = 1
        for s in self.shape:
            total = s * total
        return total

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fake, name)

    def __repr__(self) -> str:
        return f"SymMeta({[str(s) for s in self.shape]}, {self._fake.dtype})"


def lower_metas(value: Any) -> Any:
    """`value` (nested) with symbolic fake tensors as `SymMeta`s and SymInts as `Expr`s."""
    if isinstance(value, (list, tuple)):
        return type(value)(lower_metas(v) for v in value)
    if isinstance(value, dict):
        return {k: lower_metas(v) for k, v in value.items()}
    if isinstance(value, torch.SymInt):
        return to_size(value)
    if type(value) is not SymMeta and isinstance(value, torch.Tensor) and _has_symbols(value):
        return SymMeta(value)
    return value


# the Python arithmetic a symbolic graph does on sizes (`sym_size(x, 0) * 64`)
PYTHON_OPS = {operator.add: operator.add, operator.sub: operator.sub,
              operator.mul: operator.mul, operator.floordiv: lambda a, b: _atom_of(a // b),
              operator.mod: lambda a, b: _atom_of(a % b), operator.neg: operator.neg}


def _atom_of(value: Any) -> Any:
    """A floor division or remainder of sizes as one atom (`derived_size`), so it can multiply
    sizes like the ShapeEnv's own `(s0 + 1)//2` (`to_size`)."""
    return derived_size(value) if isinstance(value, Expr) else value


PYTHON_OPS[operator.truediv] = operator.truediv  # of plain numbers; else a SizeScalar
PYTHON_OPS[torch.sym_float] = float
PYTHON_OPS[torch._sym_sqrt] = math.sqrt


def python_op(node: torch.fx.Node, args: tuple) -> Any:
    """The value of a size-arithmetic node, or raise for any other non-ATen target. A float
    that depends on the sizes (batch norm's `n / (n - 1)`) is a `SizeScalar` for the kernels
    to compute."""
    args = tuple(_plain(to_size(a)) for a in args)
    scalar = size_arithmetic(node.target, args)
    if scalar is not None:
        return scalar
    fn = PYTHON_OPS.get(node.target)
    if fn is None:
        raise SymbolicShapeError(f"node {node.name} calls {node.target}, which the symbolic "
                                 "lowering does not evaluate")
    return fn(*args)


def _plain(value: Any) -> Any:
    """A constant `Expr` as the int it is (Python's `/` then applies to it)."""
    return value.const if isinstance(value, Expr) and value.is_constant else value
