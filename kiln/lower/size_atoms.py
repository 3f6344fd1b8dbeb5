"""size_atoms: the atoms that make an index expression symbolic in the sizes (issue 15, stage C).

- `Size(name, lo, hi)`: a tensor size known only at run time (`s0`), an integer in `[lo, hi]`.
  Capture specializes the sizes 0 and 1, so `lo >= 2`; `hi` is the ShapeEnv's upper bound (an
  unbounded size gets `SIZE_MAX`, the largest extent int32 indexing allows: the wrapper checks
  the actual sizes at every call). `hint`: the example's value, which performance heuristics
  (block sizes, access classification) use; `Expr.evaluate` falls back to it for a size missing
  from its environment.
- `Mono(factors)`: a product of two or more atoms, at least one a `Size` (`s0*x1`: a loop
  variable times a symbolic stride, `s0*s1`: a numel). Index expressions stay affine in the loop
  variables; sizes are what multiplies them.

Both behave like `index.Sym` / `index.Div` atoms (bounds, sort_key, str) so the index algebra
treats them as opaque atoms with numeric bounds; `index.py` adds the rules that reason about
them symbolically (exact division by a size, ranges below a size).
"""
from __future__ import annotations

from typing import Any

__all__ = ["DerivedSize", "Mono", "SIZE_MAX", "Size", "flatten_factors", "interval_product",
           "make_product"]

SIZE_MAX = 2**31 - 1


class Size:
    """A symbolic tensor size: an integer in `[lo, hi]`, the same value everywhere in a graph."""

    __slots__ = ("name", "lo", "hi", "hint", "_hash")

    def __init__(self, name: str, lo: int = 2, hi: int = SIZE_MAX, hint: int | None = None
                 ) -> None:
        self.name = name
        self.lo = int(lo)
        self.hi = int(hi)
        self.hint = self.lo if hint is None else int(hint)  # the example's value: heuristics
        self._hash = hash(("Size", name))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Size) and other.name == self.name

    def __hash__(self) -> int:
        return self._hash

    def bounds(self) -> tuple[int, int]:
        return self.lo, self.hi

    def sort_key(self) -> tuple:
        head = self.name.rstrip("0123456789")
        tail = self.name[len(head):]
        return (-1, head, int(tail) if tail else -1)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"Size({self.name!r}, {self.lo}, {self.hi})"


class DerivedSize(Size):
    """A size that is a floor division or remainder of sizes (`(s0 + 1)//2`: a pooled or
    strided extent), kept as one atom so it can multiply other sizes (`s1*((s0 + 1)//2)` is a
    stride) where the index algebra keeps products of `Size` atoms only. It is no kernel
    argument of its own: it prints as its definition over the sizes that are
    (`size_names`, the printers), and evaluates from them."""

    __slots__ = ("definition",)

    def __init__(self, definition: Any) -> None:
        lo, hi = definition.bounds()
        super().__init__(f"({definition})", lo, hi, definition.evaluate({}))
        self.definition = definition  # an index.Expr over sizes, not constant

    def sort_key(self) -> tuple:
        return (-1, self.name, 0)

    def __repr__(self) -> str:
        return f"DerivedSize({self.name!r}, {self.lo}, {self.hi})"


class Mono:
    """A product of atoms (factors sorted, at least two, at least one `Size`)."""

    __slots__ = ("factors", "_hash", "_bounds")

    def __init__(self, factors: tuple) -> None:
        self.factors = tuple(sorted(factors, key=lambda a: a.sort_key()))
        self._hash = hash(("Mono", self.factors))
        self._bounds: tuple[int, int] | None = None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mono) and other.factors == self.factors

    def __hash__(self) -> int:
        return self._hash

    def bounds(self) -> tuple[int, int]:
        if self._bounds is None:
            lo = hi = 1
            for factor in self.factors:
                lo, hi = interval_product((lo, hi), factor.bounds())
            self._bounds = (lo, hi)
        return self._bounds

    def sort_key(self) -> tuple:
        return (2, str(self))

    def sizes_only(self) -> bool:
        return all(isinstance(f, Size) for f in self.factors)

    def __str__(self) -> str:
        return "*".join(_factor_text(f) for f in self.factors)

    def __repr__(self) -> str:
        return f"Mono({self.factors!r})"


def _factor_text(atom: Any) -> str:
    text = str(atom)
    return text if isinstance(atom, Size) or text.isidentifier() else f"({text})"


def interval_product(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    corners = [x * y for x in a for y in b]
    return min(corners), max(corners)


def flatten_factors(atom: Any) -> tuple:
    return atom.factors if isinstance(atom, Mono) else (atom,)


def make_product(a: Any, b: Any) -> Any:
    """The atom `a * b` (a `Mono`, flattened)."""
    factors = flatten_factors(a) + flatten_factors(b)
    return Mono(factors)
