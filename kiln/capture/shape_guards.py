"""Guards on symbolic sizes: what a trace assumed about them, in the dispatcher's terms.

Each symbolic dim of a graph input is a ShapeEnv symbol; this module remembers where each came
from (`x.shape[0]`) and, once the trace is done, turns the ShapeEnv's facts into `Guard`s:

- every symbol that stayed free: `x.shape[0] >= 2` (sizes 0 and 1 were specialized, so a call
  with one must not reuse a graph that assumed neither); an int argument is made like a size
  and also bounded above (`n >= 2`, `n <= 2147483647`: the kernels' sizes are int32);
- every symbol the trace replaced: `x.shape[0] == 8` (specialized) or `y.shape[1] ==
  x.shape[0]` (two sizes found equal);
- every recorded relation, simplified: `x.shape[0] > 4`, `(x.shape[0] % 2) == 0`;
- the strides of each symbolic tensor as functions of its sizes: `x.stride() ==
  (x.shape[1]*8, 8, 1)`.

They are appended after every other guard of the entry, so the type and `dim()` checks of a
tensor run before any of its `shape[i]` is read.
"""
from __future__ import annotations

from typing import Any

import torch

from kiln.capture import _compat
from kiln.capture.guards import Guard
from kiln.capture.sources import Source

__all__ = ["INT_ARGUMENT_MAX", "SymbolicInputs"]

# the largest value an int argument's symbol stands for: the kernels' size arguments and index
# math are int32 (`lower/size_atoms.SIZE_MAX`); a larger int stays a plain value
INT_ARGUMENT_MAX = 2**31 - 1


class SymbolicInputs:
    """The symbolic dims of one capture's graph inputs (first source of each symbol wins)."""

    def __init__(self) -> None:
        self.exprs: dict[Any, str] = {}  # symbol -> dispatcher expression of the size
        self.users: dict[Any, str] = {}  # symbol -> the same size as the user writes it
        self.module_state: dict[Any, bool] = {}
        self.why: dict[Any, str] = {}  # symbol -> why it is symbolic (dynamic_dims.DynamicPolicy)
        self.tensors: list[tuple[Source, torch.Tensor, bool]] = []
        self.numbers: set[Any] = set()  # symbols of int arguments (`add_number`)

    def add(self, source: Source, fake: torch.Tensor, module_state: bool,
            why: dict[int, str]) -> None:
        """`fake` read from `source`, made with symbolic dims for the reasons `why` (per dim)."""
        found = False
        for dim, size in enumerate(fake.shape):
            found |= self._read_from(size, source, f"shape[{dim}]", module_state,
                                     why.get(dim, ""))
        for dim, stride in enumerate(fake.stride()):  # a stride that is a symbol of its own
            found |= self._read_from(stride, source, f"stride({dim})", module_state,
                                     "it changed between calls")
        if found:
            self.tensors.append((source, fake, module_state))

    def _read_from(self, value: Any, source: Source, accessor: str, module_state: bool,
                   why: str) -> bool:
        """Record `source.<accessor>` (`shape[0]`, `stride(1)`) as where the symbol `value` is
        read, unless it is no fresh symbol or an earlier source has it; whether it did."""
        symbol = _compat.symbol_of(value)
        if symbol is None or symbol in self.exprs:
            return False
        self.exprs[symbol] = f"{source.expr()}.{accessor}"
        self.users[symbol] = f"{source.name()}.{accessor}"
        self.module_state[symbol] = module_state
        self.why[symbol] = why
        return True

    def add_number(self, source: Source, value: torch.SymInt, why: str) -> None:
        """An int argument read from `source` as the symbol of `value` (`symbolic_int`)."""
        symbol = _compat.symbol_of(value)
        self.exprs[symbol] = source.expr()
        self.users[symbol] = source.name()
        self.module_state[symbol] = False
        self.why[symbol] = why
        self.numbers.add(symbol)

    def describe(self, fake_mode: Any) -> tuple[str, ...]:
        """Each symbolic dim in words, for explain: `x.shape[0] (dynamic=True)`, or what became
        of it when the trace needed its value (`... specialized to 8`)."""
        if not self.exprs:
            return ()
        _, replaced = _compat.shape_env_facts(fake_mode, self.exprs)
        found = []
        for symbol, user in self.users.items():
            target = replaced[symbol]
            fate = "" if target == symbol else \
                f"; specialized: the code needs {user} == " \
                f"{_compat.SymbolPrinter(self.users).doprint(target)}"
            found.append(f"{user} ({self.why[symbol]}{fate})")
        return tuple(found)

    def __bool__(self) -> bool:
        return bool(self.exprs)

    def guards(self, fake_mode: Any) -> list[Guard]:
        """The guards that make reusing this trace safe (see the module docstring)."""
        if not self.exprs:
            return []
        facts, replaced = _compat.shape_env_facts(fake_mode, self.exprs)
        found = []
        for symbol, target in replaced.items():
            relation = _ge_two(symbol) if target == symbol else _eq(symbol, target)
            found.append(self._guard(relation))
            if target == symbol and symbol in self.numbers:  # no tensor bounds an int argument
                found.append(self._guard(symbol <= INT_ARGUMENT_MAX))
        found.extend(self._guard(fact) for fact in facts)
        found.extend(self._stride_guard(src, fake, mod) for src, fake, mod in self.tensors)
        return found

    def _guard(self, relation: Any) -> Guard:
        code = _compat.SymbolPrinter(self.exprs).doprint(relation)
        user = _compat.SymbolPrinter(self.users).doprint(relation)
        module = all(self.module_state.get(s, False) for s in relation.free_symbols)
        return Guard(f"({code})", "is", "True", True, user, "shape", module, None, display=user)

    def _stride_guard(self, source: Source, fake: torch.Tensor, module: bool) -> Guard:
        env = fake.fake_mode.shape_env
        code_parts, user_parts = [], []
        for stride in fake.stride():
            if not isinstance(stride, torch.SymInt):
                code_parts.append(str(stride))
                user_parts.append(str(stride))
                continue
            expr = env.simplify(stride.node.expr)
            code_parts.append(_compat.SymbolPrinter(self.exprs).doprint(expr))
            user_parts.append(_compat.SymbolPrinter(self.users).doprint(expr))
        code = f"({', '.join(code_parts)}{',' if len(code_parts) == 1 else ''})"
        user = f"({', '.join(user_parts)}{',' if len(user_parts) == 1 else ''})"
        return Guard(f"{source.expr()}.stride()", "==", code, user, f"{source.name()}.stride()",
                     "stride", module, None, display=f"{source.name()}.stride() == {user}")


def _ge_two(symbol: Any) -> Any:
    return symbol >= 2


def _eq(symbol: Any, target: Any) -> Any:
    import sympy
    return sympy.Eq(symbol, target)
