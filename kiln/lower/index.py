"""index: the integer index algebra of the loop IR.

An `Expr` is an integer linear combination of *atoms* plus a constant:

    Expr = const + sum(coef * atom)          atom = Sym | Div

- `Sym(name, size)`: a loop variable (`x0`, `r1`) or an indirect index (`i0`) ranging over
  `[0, size)`. The range travels with the symbol, so every expression knows its own bounds.
- `Div(arg, div, mod)`: `(arg // div) % mod`, floor division, with `mod=None` meaning no modulo
  (Inductor's `ModularIndexing` / `FloorDiv`). This is what a reshape of a non-matching shape needs.

Expressions are immutable, hashable and always kept in one canonical, simplified form, so two
indexings of the same memory compare equal with `==` (the vertical-fusion test of the schedule
stage). Simplification is exact integer arithmetic plus range facts:

- `(d*q + r) // d == q + r // d` and `(m*q + r) % m == r % m` (always true);
- `e // d == 0` and `e % m == e` when `0 <= e < d` (resp. `< m`) by bounds;
- `(g*h + l) // (g*k) == h // k` and `(g*h + l) % (g*k) == g*(h % k) + l` when `0 <= l < g`;
- `c*(e % m) + c*m*(e // m) == c*e` (a split dimension merged back), and its `Div` generalization;
- an atom whose bounds are a single value is that constant (size-1 loop variables vanish).

`str(expr)` is Python source (`8*x0 + (x1//4) % 2`) that rebuilds the same `Expr` when evaluated
with `Sym` values bound to the names, and `evaluate(env)` computes it with ints or torch tensors.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Iterable, Mapping, Union

from kiln.lower.size_atoms import (SIZE_MAX, DerivedSize, Mono, Size, flatten_factors,
                                   make_product)

__all__ = ["DerivedSize", "Div", "Expr", "IndexLike", "Mono", "Size", "Sym", "affine_form",
           "as_expr", "as_size", "derived_size", "is_static", "size_expr", "size_hint",
           "size_names", "sym"]

IndexLike = Union["Expr", int]
SizeLike = Union["Expr", int]  # an int, or an Expr over `Size` atoms only (a symbolic size)


class Sym:
    """A symbol ranging over `[0, size)`: a loop variable or an indirect index."""

    __slots__ = ("name", "size", "_hash")

    def __init__(self, name: str, size: SizeLike) -> None:
        self.name = name
        self.size = as_size(size)
        self._hash = hash(("Sym", name, self.size))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sym) and other.name == self.name and other.size == self.size

    def __hash__(self) -> int:
        return self._hash

    def bounds(self) -> tuple[int, int]:
        if isinstance(self.size, Expr):
            return 0, self.size.bounds()[1] - 1
        return 0, self.size - 1

    def sort_key(self) -> tuple:
        return (0, _natural_key(self.name), str(self.size))

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"Sym({self.name!r}, {self.size})"


class Div:
    """`(arg // div) % mod` with floor semantics; `mod is None` means no modulo."""

    __slots__ = ("arg", "div", "mod", "_hash", "_str")

    def __init__(self, arg: Expr, div: SizeLike, mod: SizeLike | None) -> None:
        self.arg = arg
        self.div = as_size(div)
        self.mod = None if mod is None else as_size(mod)
        self._hash = hash(("Div", arg, self.div, self.mod))
        self._str: str | None = None

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Div) and other.div == self.div and other.mod == self.mod
                and other.arg == self.arg)

    def __hash__(self) -> int:
        return self._hash

    def bounds(self) -> tuple[int, int]:
        lo, hi = self.arg.bounds()
        if isinstance(self.div, Expr) or isinstance(self.mod, Expr):
            return _symbolic_div_bounds(lo, hi, self.div, self.mod)
        if self.div != 1:
            lo, hi = lo // self.div, hi // self.div
        if self.mod is None:
            return lo, hi
        if lo >= 0 and hi < self.mod:
            return lo, hi
        return 0, self.mod - 1

    def sort_key(self) -> tuple:
        return (1, str(self))

    def __str__(self) -> str:
        if self._str is None:
            arg = self.arg.str_operand()
            div, mod = _size_operand(self.div), _size_operand(self.mod)
            text = arg if self.div == 1 else f"{arg}//{div}"
            if self.mod is not None:
                text = f"({text}) % {mod}" if self.div != 1 else f"{arg} % {mod}"
            self._str = text
        return self._str

    def __repr__(self) -> str:
        return f"Div({self.arg!r}, {self.div}, {self.mod})"


Atom = Union[Sym, Div, Size, Mono]


class Expr:
    """An integer index expression in canonical form: `const + sum(coef * atom)`."""

    __slots__ = ("terms", "const", "_hash", "_str", "_bounds")

    def __init__(self, terms: Mapping[Atom, int] | Iterable[tuple[Atom, int]] = (),
                 const: int = 0) -> None:
        # Use Expr.make for a simplified expression; this constructor trusts its input.
        items = terms.items() if isinstance(terms, Mapping) else terms
        self.terms: tuple[tuple[Atom, int], ...] = tuple(
            sorted(((a, c) for a, c in items if c != 0), key=lambda t: t[0].sort_key()))
        self.const = int(const)
        self._hash = hash((self.terms, self.const))
        self._str: str | None = None
        self._bounds: tuple[int, int] | None = None

    # -- construction --------------------------------------------------------------------------

    @staticmethod
    def make(terms: Iterable[tuple[Atom, int]], const: int = 0) -> Expr:
        acc: dict[Atom, int] = {}
        for atom, coef in terms:
            if coef == 0:
                continue
            lo, hi = atom.bounds()
            if lo == hi:
                const += coef * lo
                continue
            acc[atom] = acc.get(atom, 0) + coef
        const += _merge_div_pairs(acc)
        if any(isinstance(a, Mono) for a in acc):
            _merge_size_div_pairs(acc)
        return Expr({a: c for a, c in acc.items() if c != 0}, const)

    @property
    def is_constant(self) -> bool:
        return not self.terms

    def atom(self) -> Atom | None:
        """The single atom when this is exactly `1 * atom`."""
        if self.const == 0 and len(self.terms) == 1 and self.terms[0][1] == 1:
            return self.terms[0][0]
        return None

    # -- arithmetic ----------------------------------------------------------------------------

    def __add__(self, other: IndexLike) -> Expr:
        other = as_expr(other)
        return Expr.make(self.terms + other.terms, self.const + other.const)

    __radd__ = __add__

    def __neg__(self) -> Expr:
        return Expr.make([(a, -c) for a, c in self.terms], -self.const)

    def __sub__(self, other: IndexLike) -> Expr:
        return self + (-as_expr(other))

    def __rsub__(self, other: IndexLike) -> Expr:
        return as_expr(other) + (-self)

    def __mul__(self, other: IndexLike) -> Expr:
        other = as_expr(other)
        if not other.is_constant:
            if self.is_constant:
                return other * self.const
            if not (self.is_size() or other.is_size()):
                raise TypeError(f"index expressions stay affine: cannot multiply {self} by "
                                f"{other}")
            return _product(self, other)
        k = other.const
        return Expr.make([(a, c * k) for a, c in self.terms], self.const * k)

    __rmul__ = __mul__

    def __floordiv__(self, other: IndexLike) -> Expr:
        return floordiv(self, as_size(other))

    def __mod__(self, other: IndexLike) -> Expr:
        return modulo(self, as_size(other))

    def is_size(self) -> bool:
        """Whether this is a symbolic size: only `Size` atoms and their products."""
        return bool(self.terms) and all(
            isinstance(a, Size) or (isinstance(a, Mono) and a.sizes_only())
            for a, _ in self.terms)

    # -- queries -------------------------------------------------------------------------------

    def bounds(self) -> tuple[int, int]:
        if self._bounds is None:
            lo = hi = self.const
            for atom, coef in self.terms:
                a_lo, a_hi = atom.bounds()
                if coef > 0:
                    lo, hi = lo + coef * a_lo, hi + coef * a_hi
                else:
                    lo, hi = lo + coef * a_hi, hi + coef * a_lo
            self._bounds = (lo, hi)
        return self._bounds

    def free_symbols(self) -> set[Sym]:
        out: set[Sym] = set()
        for atom, _ in self.terms:
            for factor in flatten_factors(atom):
                if isinstance(factor, Sym):
                    out.add(factor)
                elif isinstance(factor, Div):
                    out |= factor.arg.free_symbols()
        return out

    def linear_coefficients(self) -> dict[Sym, int] | None:
        """`{sym: coef}` when the expression is `const + sum(coef * sym)`, else None."""
        out: dict[Sym, int] = {}
        for atom, coef in self.terms:
            if not isinstance(atom, Sym):
                return None
            out[atom] = coef
        return out

    def size_coefficients(self) -> tuple[dict[Sym, SizeLike], SizeLike] | None:
        """`({sym: coef}, const)` when the expression is `const + sum(coef * sym)` with each
        coef and const an int or a symbolic size (`s0*x1 + 64*x0`), else None."""
        coefs: dict[Sym, Expr] = {}
        const = as_expr(self.const)
        for atom, coef in self.terms:
            factors = flatten_factors(atom)
            syms = [f for f in factors if not isinstance(f, Size)]
            if any(not isinstance(f, (Sym, Size)) for f in factors) or len(syms) > 1:
                return None
            scale = as_expr(coef)
            for f in factors:
                if isinstance(f, Size):
                    scale = scale * Expr({f: 1})
            if syms:
                coefs[syms[0]] = coefs.get(syms[0], as_expr(0)) + scale
            else:
                const = const + scale
        return {k: as_size(v) for k, v in coefs.items()}, as_size(const)

    def subs(self, mapping: Mapping[Sym, IndexLike]) -> Expr:
        total = Expr((), self.const)
        for atom, coef in self.terms:
            value = as_expr(1)
            for factor in flatten_factors(atom):
                value = value * _subs_atom(factor, mapping)
            total = total + value * coef
        return total

    def evaluate(self, env: Mapping[str, Any]) -> Any:
        """The value with each symbol name bound in `env` (ints or integer torch tensors)."""
        total: Any = self.const
        for atom, coef in self.terms:
            value: Any = None
            for factor in flatten_factors(atom):
                part = _evaluate_atom(factor, env)
                value = part if value is None else value * part
            total = total + (value if coef == 1 else value * coef)
        return total

    # -- printing and identity -----------------------------------------------------------------

    def __str__(self) -> str:
        if self._str is None:
            self._str = _format(self)
        return self._str

    def __repr__(self) -> str:
        # a symbolic size prints as the Python source of itself (wrapper text, IR dumps), and so
        # does a constant one (a slice `(s0 + 2)//3` the ShapeEnv pinned to 1 reached a
        # wrapper's as_strided as `Expr(1)`: NameError, fuzz seed 3202608 with --grow)
        return str(self) if self.is_size() or self.is_constant else f"Expr({self})"

    def str_operand(self) -> str:
        """str(self), parenthesized unless it is a single symbol or a non-negative constant."""
        text = str(self)
        atom = self.atom()
        if isinstance(atom, (Sym, Size)) or (self.is_constant and self.const >= 0):
            return text
        return f"({text})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, int):
            return self.is_constant and self.const == other
        return isinstance(other, Expr) and self.const == other.const and self.terms == other.terms

    def __hash__(self) -> int:
        return self._hash

    # Order comparisons answer only what holds for every value of the symbols (by bounds);
    # anything else raises, so no decision silently holds for one size only.
    def __lt__(self, other: IndexLike) -> bool:
        return _decide(self - other, lambda lo, hi: (hi < 0, lo >= 0))

    def __le__(self, other: IndexLike) -> bool:
        return _decide(self - other, lambda lo, hi: (hi <= 0, lo > 0))

    def __gt__(self, other: IndexLike) -> bool:
        return _decide(self - other, lambda lo, hi: (lo > 0, hi <= 0))

    def __ge__(self, other: IndexLike) -> bool:
        return _decide(self - other, lambda lo, hi: (lo >= 0, hi < 0))

    def __index__(self) -> int:
        if not self.is_constant:
            raise TypeError(f"index expression {self} is not a constant")
        return self.const

    __int__ = __index__


# -- helpers ---------------------------------------------------------------------------------------

def sym(name: str, size: int) -> Expr:
    """The expression of a fresh symbol `name` ranging over `[0, size)`."""
    return Expr.make([(Sym(name, size), 1)])


def as_expr(value: IndexLike) -> Expr:
    if isinstance(value, Expr):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        value = _int_of(value)
    return Expr((), value)


def _int_of(value: Any) -> int:
    if isinstance(value, Expr):
        return value.__index__()
    return int(value)


def _decide(diff: Expr, test: Any) -> bool:
    yes, no = test(*diff.bounds())
    if yes or no:
        return bool(yes)
    yes, no = test(*_shifted_bounds(diff))
    if yes or no:
        return bool(yes)
    raise TypeError(f"the sign of {diff} depends on the sizes")


def _shifted_bounds(value: Expr) -> tuple[int, int]:
    """Bounds of a polynomial in sizes tighter than term-by-term intervals, which lose what the
    terms share: `16*s0*s1 - 16*s0` (s0, s1 >= 2) spans [-huge, huge] term by term. With each
    size written `lo + t` (t >= 0) and expanded, the constant term is the value at every
    size's lower bound; when every other coefficient is >= 0 the polynomial only grows, so
    that value is its minimum (here 32 + 16*t0 + 32*t1 + 16*t0*t1: >= 32); when every other
    coefficient is <= 0, its maximum. Sizes are taken as independent: sound for a derived
    size too (its true values are a subset)."""
    lo, hi = value.bounds()
    shifted: dict[tuple[str, ...], int] = {(): value.const}
    for atom, coef in value.terms:
        factors = flatten_factors(atom)
        if not all(isinstance(f, Size) for f in factors):
            return lo, hi
        partial: dict[tuple[str, ...], int] = {(): coef}
        for factor in factors:  # times (factor.lo + t_factor)
            grown: dict[tuple[str, ...], int] = {}
            for mono, c in partial.items():
                grown[mono] = grown.get(mono, 0) + c * factor.lo
                wider = tuple(sorted((*mono, factor.name)))
                grown[wider] = grown.get(wider, 0) + c
            partial = grown
        for mono, c in partial.items():
            shifted[mono] = shifted.get(mono, 0) + c
    at_lower = shifted.pop(())
    if all(c >= 0 for c in shifted.values()):
        lo = max(lo, at_lower)
    if all(c <= 0 for c in shifted.values()):
        hi = min(hi, at_lower)
    return lo, hi


def size_expr(name: str, lo: int = 2, hi: int | None = None, hint: int | None = None) -> Expr:
    """The expression of a symbolic size `name` in `[lo, hi]` (see `size_atoms.Size`)."""
    return Expr.make([(Size(name, lo, SIZE_MAX if hi is None else hi, hint), 1)])


def derived_size(value: Expr) -> Expr:
    """A floor division or remainder of sizes (`(s0 + 1)//2`) as one `DerivedSize` atom, so it
    can multiply sizes; a constant or a plain size stays as it is."""
    if value.is_constant or value.is_size():
        return value
    if any(isinstance(f, Sym) for a, _ in value.terms for f in flatten_factors(a)) \
            or value.bounds()[0] < 0:
        raise TypeError(f"{value} is not a size")
    return Expr.make([(DerivedSize(value), 1)])


def size_names(value: Any) -> set[str]:
    """Names of the `Size` atoms in `value` (an int has none)."""
    if not isinstance(value, Expr):
        return set()
    out: set[str] = set()
    for atom, _ in value.terms:
        for factor in flatten_factors(atom):
            if isinstance(factor, DerivedSize):
                out |= size_names(factor.definition)
            elif isinstance(factor, Size):
                out.add(factor.name)
            elif isinstance(factor, Div):
                out |= size_names(factor.arg) | size_names(factor.div) | size_names(factor.mod)
            elif isinstance(factor, Sym):
                out |= size_names(factor.size)
    return out


def size_hint(value: Any) -> int:
    """An int as it is; a symbolic size at the example's sizes (for heuristics only)."""
    return value.evaluate({}) if isinstance(value, Expr) else int(value)


def is_static(value: Any) -> bool:
    """Whether a size, stride or index is a known integer (not symbolic in the sizes)."""
    return not isinstance(value, Expr) or value.is_constant


def as_size(value: Any) -> SizeLike:
    """An int, or the symbolic size `value` (an Expr over sizes); anything else raises."""
    if isinstance(value, Expr):
        if value.is_constant:
            return value.const
        if not value.is_size():
            raise TypeError(f"{value} is not a size (it depends on a loop variable)")
        return value
    return _int_of(value)


def _size_operand(value: SizeLike | None) -> str:
    if isinstance(value, Expr):
        return value.str_operand() if value.atom() is not None else f"({value})"
    return str(value)


def _symbolic_div_bounds(lo: int, hi: int, div: SizeLike, mod: SizeLike | None
                         ) -> tuple[int, int]:
    d_lo, d_hi = as_expr(div).bounds()
    # a divisor of a floor division that runs is not 0; a derived size (`(s0*s1)//s2`) has
    # bounds from 0 (`6 // inf`), so its lower bound counts as 1
    d_lo = max(d_lo, 1)
    if lo >= 0:
        lo, hi = lo // d_hi, hi // d_lo
    else:
        lo, hi = lo // d_lo, max(hi // d_lo, hi // d_hi)
    if mod is None:
        return lo, hi
    m_lo, m_hi = as_expr(mod).bounds()
    if lo >= 0 and hi < m_lo:
        return lo, hi
    return 0, m_hi - 1


def _product(a: Expr, b: Expr) -> Expr:
    """`a * b` where one side is a symbolic size (the result stays affine in loop variables)."""
    terms = [(make_product(x, y), cx * cy) for x, cx in a.terms for y, cy in b.terms]
    terms += [(x, cx * b.const) for x, cx in a.terms]
    terms += [(y, cy * a.const) for y, cy in b.terms]
    return Expr.make(terms, a.const * b.const)


def _subs_atom(atom: Atom, mapping: Mapping[Sym, IndexLike]) -> Expr:
    if isinstance(atom, Sym):
        return as_expr(mapping[atom]) if atom in mapping else Expr({atom: 1})
    if isinstance(atom, Size):
        return Expr({atom: 1})
    inner = atom.arg.subs(mapping)
    value = floordiv(inner, atom.div)
    return value if atom.mod is None else modulo(value, atom.mod)


def _evaluate_atom(atom: Atom, env: Mapping[str, Any]) -> Any:
    if isinstance(atom, DerivedSize):
        return atom.definition.evaluate(env)
    if isinstance(atom, Size):
        return env.get(atom.name, atom.hint)  # heuristics evaluate at the example's sizes
    if isinstance(atom, Sym):
        return env[atom.name]
    value = atom.arg.evaluate(env)
    div = atom.div.evaluate(env) if isinstance(atom.div, Expr) else atom.div
    if not (isinstance(div, int) and div == 1):
        value = value // div
    if atom.mod is not None:
        value = value % (atom.mod.evaluate(env) if isinstance(atom.mod, Expr) else atom.mod)
    return value


def _natural_key(name: str) -> tuple:
    head = name.rstrip("0123456789")
    tail = name[len(head):]
    return (head, int(tail) if tail else -1)


def floordiv(expr: Expr, d: SizeLike) -> Expr:
    if isinstance(d, Expr):
        return _floordiv_size(expr, d)
    if d <= 0:
        raise ValueError(f"index floor division by {d}")
    if d == 1:
        return expr
    exact = [(a, c // d) for a, c in expr.terms if c % d == 0]
    rest = Expr([(a, c) for a, c in expr.terms if c % d != 0], expr.const % d)
    base = Expr.make(exact, expr.const // d)
    return base + _floordiv_rest(rest, d)


def _floordiv_rest(rest: Expr, d: int) -> Expr:
    lo, hi = rest.bounds()
    if lo // d == hi // d:
        return Expr((), lo // d)
    split = _split_low(rest)
    if split is not None:
        g, high, low = split
        if d % g == 0:
            return floordiv(high, d // g)
        if g % d == 0:
            return high * (g // d) + floordiv(low, d)
    inner = rest.atom()
    if isinstance(inner, Div) and inner.mod is None:
        return Expr.make([(Div(inner.arg, inner.div * d, None), 1)])
    if isinstance(inner, Div) and inner.mod % d == 0:
        return Expr.make([(Div(inner.arg, inner.div * d, inner.mod // d), 1)])
    return Expr.make([(Div(rest, d, None), 1)])


def modulo(expr: Expr, m: SizeLike) -> Expr:
    if isinstance(m, Expr):
        return _modulo_size(expr, m)
    if m <= 0:
        raise ValueError(f"index modulo by {m}")
    rest = Expr([(a, c) for a, c in expr.terms if c % m != 0], expr.const % m)
    lo, hi = rest.bounds()
    if lo >= 0 and hi < m:
        return Expr.make(rest.terms, rest.const)
    if lo // m == hi // m:
        return Expr.make(rest.terms, rest.const) - (lo // m) * m
    split = _split_low(rest)
    if split is not None:
        g, high, low = split
        if m % g == 0:
            return modulo(high, m // g) * g + low
    inner = rest.atom()
    if isinstance(inner, Div) and inner.mod is None:
        return Expr.make([(Div(inner.arg, inner.div, m), 1)])
    if isinstance(inner, Div) and inner.mod % m == 0:
        return Expr.make([(Div(inner.arg, inner.div, m), 1)])
    return Expr.make([(Div(rest, 1, m), 1)])


# -- division by a symbolic size -------------------------------------------------------------------
# Only rules that hold for every value of the sizes: exact division of the terms that are
# multiples of the divisor, and a remainder proved to lie in [0, divisor) by a symbolic bound.

def _floordiv_size(expr: Expr, d: Expr) -> Expr:
    quotient, rest = _split_multiples(expr, d)
    if rest == 0 or _provably_below(rest, d):
        return quotient
    inner = rest.atom()
    if isinstance(inner, Div) and inner.mod is None:
        return quotient + Expr.make([(Div(inner.arg, as_expr(inner.div) * d, None), 1)])
    return quotient + Expr.make([(Div(rest, d, None), 1)])


def _modulo_size(expr: Expr, m: Expr) -> Expr:
    _, rest = _split_multiples(expr, m)
    if _provably_below(rest, m):
        return rest
    inner = rest.atom()
    if isinstance(inner, Div) and inner.mod == m:
        return rest
    if isinstance(inner, Div) and inner.mod is None:
        return Expr.make([(Div(inner.arg, inner.div, m), 1)])
    return Expr.make([(Div(rest, 1, m), 1)])


def _split_multiples(expr: Expr, d: Expr) -> tuple[Expr, Expr]:
    """(q, r) with `expr == d*q + r`: q collects the terms that are multiples of `d` (a single
    monomial `k*s0*s1`); r is the rest."""
    if d.const != 0 or len(d.terms) != 1:
        return as_expr(0), expr
    (dmono, dcoef), = d.terms
    want = list(flatten_factors(dmono))
    quotient: list[tuple[Atom, int]] = []
    rest: list[tuple[Atom, int]] = []
    for atom, coef in expr.terms:
        left = _remove_factors(list(flatten_factors(atom)), want)
        if left is None or coef % dcoef != 0:
            rest.append((atom, coef))
        elif not left:
            quotient.append((None, coef // dcoef))
        else:
            quotient.append((left[0] if len(left) == 1 else Mono(tuple(left)), coef // dcoef))
    const = sum(c for a, c in quotient if a is None)
    q = Expr.make([(a, c) for a, c in quotient if a is not None], const)
    return q, Expr.make(rest, expr.const)


def _remove_factors(factors: list, want: list) -> list | None:
    for factor in want:
        if factor not in factors:
            return None
        factors.remove(factor)
    return factors


def _provably_below(rest: Expr, d: Expr) -> bool:
    """Whether `0 <= rest < d` for every value of the sizes."""
    if rest.bounds()[0] < 0:
        return False
    upper = symbolic_upper(rest)
    if upper is None:
        return False
    gap = d - upper - 1
    return gap.bounds()[0] >= 0 and all(isinstance(a, (Size, Mono)) for a, _ in gap.terms)


def symbolic_upper(expr: Expr) -> Expr | None:
    """An upper bound of `expr` as an expression of the sizes (None when none is known):
    a loop variable over `[0, n)` is at most `n - 1`, a size is itself."""
    total = as_expr(expr.const)
    for atom, coef in expr.terms:
        lo, hi = _atom_range(atom)
        if lo is None or hi is None:
            return None
        total = total + (hi if coef > 0 else lo) * coef
    return total


def _atom_range(atom: Atom) -> tuple[Expr | None, Expr | None]:
    if isinstance(atom, Size):
        return Expr({atom: 1}), Expr({atom: 1})
    if isinstance(atom, Sym):
        return as_expr(0), as_expr(atom.size) - 1
    if isinstance(atom, Div):
        if atom.mod is None or atom.arg.bounds()[0] < 0:
            return None, None
        return as_expr(0), as_expr(atom.mod) - 1
    sizes = [f for f in atom.factors if isinstance(f, Size)]
    others = [f for f in atom.factors if not isinstance(f, Size)]
    if len(others) != 1:
        return None, None
    lo, hi = _atom_range(others[0])
    if lo is None or hi is None or lo.bounds()[0] < 0:
        return None, None
    scale = Expr.make([(sizes[0] if len(sizes) == 1 else Mono(tuple(sizes)), 1)])
    return lo * scale, hi * scale


def _split_low(expr: Expr) -> tuple[int, Expr, Expr] | None:
    """Split `expr` as `g*high + low` with `0 <= low < g` and g > 1, for the largest such g."""
    terms = sorted(expr.terms, key=lambda t: abs(t[1]))
    for k in range(len(terms)):
        high_terms = terms[k:]
        g = functools.reduce(math.gcd, (abs(c) for _, c in high_terms))
        if g <= 1:
            continue
        low = Expr(terms[:k], expr.const % g)
        lo, hi = low.bounds()
        if lo >= 0 and hi < g:
            high = Expr([(a, c // g) for a, c in high_terms], expr.const // g)
            return g, high, low
    return None


def _merge_div_pairs(acc: dict[Atom, int]) -> int:
    """Fold `c*((e//d) % m) + c*m*((e//(d*m)) % m2)` into `c*((e//d) % (m*m2))` in place (and
    `c*(e % m) + c*m*(e//m)` into `c*e`); returns the constant that folding moved out of atoms."""
    const = 0
    while True:
        pair = _find_div_pair(acc)
        if pair is None:
            return const
        atom, other, take = pair
        acc[atom] -= take
        acc[other] -= take * atom.mod
        mod = None if other.mod is None else atom.mod * other.mod
        if atom.div == 1 and mod is None:
            for a, c in atom.arg.terms:
                acc[a] = acc.get(a, 0) + c * take
            const += atom.arg.const * take
        else:
            new = Div(atom.arg, atom.div, mod)
            acc[new] = acc.get(new, 0) + take


def _merge_size_div_pairs(acc: dict[Atom, int]) -> None:
    """The symbolic form of `_merge_div_pairs`: `c*((e//d) % m) + c*m*(e//(d*m))` is
    `c*(e//d)` for a size `m` (the flat index of a reshape over a symbolic dim, read back)."""
    while True:
        pair = _find_size_div_pair(acc)
        if pair is None:
            return
        low, high, take, k = pair
        acc[low] -= take
        acc[high] -= take * k
        merged = floordiv(low.arg, low.div)
        for a, c in merged.terms:
            acc[a] = acc.get(a, 0) + c * take


def _find_size_div_pair(acc: dict[Atom, int]) -> tuple[Div, Atom, int, int] | None:
    for atom, coef in acc.items():
        if not (isinstance(atom, Div) and isinstance(atom.mod, Expr)) or coef == 0 \
                or len(atom.mod.terms) != 1 or atom.mod.const != 0:
            continue
        (mono, k), = atom.mod.terms
        outer = Div(atom.arg, as_expr(atom.div) * atom.mod, None)
        high = make_product(mono, outer)
        if acc.get(high, 0) == coef * k:
            return atom, high, coef, k
    return None


def _find_div_pair(acc: dict[Atom, int]) -> tuple[Div, Div, int] | None:
    for atom, coef in acc.items():
        if not isinstance(atom, Div) or atom.mod is None or coef == 0:
            continue
        if isinstance(atom.mod, Expr):
            continue  # see _merge_size_div_pairs
        for other, other_coef in acc.items():
            if (isinstance(other, Div) and other.arg == atom.arg
                    and other.div == atom.div * atom.mod and other_coef == coef * atom.mod):
                return atom, other, coef
    return None


def _format(expr: Expr) -> str:
    parts: list[str] = []
    for atom, coef in expr.terms:
        text = str(atom)
        if isinstance(atom, Div) and coef not in (1, -1):
            text = f"({text})"
        elif isinstance(atom, Div) and coef == -1 and not text.startswith("("):
            text = f"({text})"
        if coef == 1:
            parts.append(("+", text))
        elif coef == -1:
            parts.append(("-", text))
        elif coef > 0:
            parts.append(("+", f"{coef}*{text}"))
        else:
            parts.append(("-", f"{-coef}*{text}"))
    if expr.const or not parts:
        parts.append(("+" if expr.const >= 0 else "-", str(abs(expr.const))))
    head_sign, head = parts[0]
    out = head if head_sign == "+" else f"-{head}"
    for sign, text in parts[1:]:
        out += f" {sign} {text}"
    return out



# -- affine recovery -------------------------------------------------------------------------------

AFFINE_CHECK_LIMIT = 1 << 18
_affine_cache: dict[Expr, Expr] = {}


def affine_form(expr: Expr) -> Expr:
    """`expr` with every group of terms that is affine in its symbols rewritten as that affine
    form. The rewrite rules cannot always see that, e.g., `36*(v0//2) + 12*(((3*v0 + v1)//2) % 3)
    + ...` is `18*v0 + 6*v1 + v2` (a reshape of a reshape, read back contiguously): terms are
    grouped by the symbols they share, and each group whose grid has at most
    `AFFINE_CHECK_LIMIT` points is evaluated exhaustively (exact integer arithmetic)."""
    if expr.linear_coefficients() is not None:
        return expr
    cached = _affine_cache.get(expr)
    if cached is None:
        cached = _affine_cache[expr] = _affine_groups(expr)
    return cached


def _affine_groups(expr: Expr) -> Expr:
    groups: list[tuple[set[Sym], list[tuple[Atom, int]]]] = []
    for atom, coef in expr.terms:
        syms = Expr({atom: 1}).free_symbols()
        merged = [g for g in groups if g[0] & syms]
        for g in merged:
            groups.remove(g)
            syms |= g[0]
        terms = [t for g in merged for t in g[1]] + [(atom, coef)]
        groups.append((syms, terms))
    out: list[tuple[Atom, int]] = []
    const = expr.const
    for syms, terms in groups:
        part = Expr(terms, 0)
        linear = None if part.linear_coefficients() is not None else _prove_affine(part, syms)
        if linear is None:
            out += terms
        else:
            out += linear.terms
            const += linear.const
    return Expr.make(out, const)


def _prove_affine(part: Expr, syms: set[Sym]) -> Expr | None:
    import torch

    order = sorted(syms, key=lambda s: s.sort_key())
    if part.free_symbols() != syms or any(not isinstance(s.size, int) for s in order) \
            or any(not isinstance(f, (Sym, Div)) for a, _ in part.terms
                   for f in flatten_factors(a)):
        return None  # symbolic sizes: an exhaustive check proves nothing for other sizes
    if math.prod(s.size for s in order) > AFFINE_CHECK_LIMIT:
        return None
    env = {}
    for d, s in enumerate(order):
        shape = [1] * len(order)
        shape[d] = s.size
        env[s.name] = torch.arange(s.size).view(shape)
    values = torch.as_tensor(part.evaluate(env)).expand([s.size for s in order])
    base = int(values[(0,) * len(order)])
    affine = torch.full_like(values, base)
    coefs = []
    for d, s in enumerate(order):
        step = [0] * len(order)
        step[d] = 1
        coef = int(values[tuple(step)]) - base if s.size > 1 else 0
        coefs.append((s, coef))
        affine = affine + env[s.name] * coef
    if not torch.equal(values, affine):
        return None
    return Expr.make(coefs, base)
