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

__all__ = ["Div", "Expr", "IndexLike", "Sym", "affine_form", "as_expr", "sym"]

IndexLike = Union["Expr", int]


class Sym:
    """A symbol ranging over `[0, size)`: a loop variable or an indirect index."""

    __slots__ = ("name", "size", "_hash")

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.size = int(size)
        self._hash = hash(("Sym", name, self.size))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sym) and other.name == self.name and other.size == self.size

    def __hash__(self) -> int:
        return self._hash

    def bounds(self) -> tuple[int, int]:
        return 0, self.size - 1

    def sort_key(self) -> tuple:
        return (0, _natural_key(self.name), self.size)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"Sym({self.name!r}, {self.size})"


class Div:
    """`(arg // div) % mod` with floor semantics; `mod is None` means no modulo."""

    __slots__ = ("arg", "div", "mod", "_hash", "_str")

    def __init__(self, arg: Expr, div: int, mod: int | None) -> None:
        self.arg = arg
        self.div = int(div)
        self.mod = None if mod is None else int(mod)
        self._hash = hash(("Div", arg, self.div, self.mod))
        self._str: str | None = None

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Div) and other.div == self.div and other.mod == self.mod
                and other.arg == self.arg)

    def __hash__(self) -> int:
        return self._hash

    def bounds(self) -> tuple[int, int]:
        lo, hi = self.arg.bounds()
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
            text = arg if self.div == 1 else f"{arg}//{self.div}"
            if self.mod is not None:
                text = f"({text}) % {self.mod}" if self.div != 1 else f"{arg} % {self.mod}"
            self._str = text
        return self._str

    def __repr__(self) -> str:
        return f"Div({self.arg!r}, {self.div}, {self.mod})"


Atom = Union[Sym, Div]


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
            raise TypeError(f"index expressions stay affine: cannot multiply {self} by {other}")
        k = other.const
        return Expr.make([(a, c * k) for a, c in self.terms], self.const * k)

    __rmul__ = __mul__

    def __floordiv__(self, other: IndexLike) -> Expr:
        return floordiv(self, _int_of(other))

    def __mod__(self, other: IndexLike) -> Expr:
        return modulo(self, _int_of(other))

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
            out |= {atom} if isinstance(atom, Sym) else atom.arg.free_symbols()
        return out

    def linear_coefficients(self) -> dict[Sym, int] | None:
        """`{sym: coef}` when the expression is `const + sum(coef * sym)`, else None."""
        out: dict[Sym, int] = {}
        for atom, coef in self.terms:
            if not isinstance(atom, Sym):
                return None
            out[atom] = coef
        return out

    def subs(self, mapping: Mapping[Sym, IndexLike]) -> Expr:
        total = Expr((), self.const)
        for atom, coef in self.terms:
            if isinstance(atom, Sym):
                value = as_expr(mapping[atom]) if atom in mapping else Expr({atom: 1})
            else:
                inner = atom.arg.subs(mapping)
                value = floordiv(inner, atom.div) if atom.mod is None else \
                    modulo(floordiv(inner, atom.div), atom.mod)
            total = total + value * coef
        return total

    def evaluate(self, env: Mapping[str, Any]) -> Any:
        """The value with each symbol name bound in `env` (ints or integer torch tensors)."""
        total: Any = self.const
        for atom, coef in self.terms:
            if isinstance(atom, Sym):
                value = env[atom.name]
            else:
                value = atom.arg.evaluate(env)
                if atom.div != 1:
                    value = value // atom.div
                if atom.mod is not None:
                    value = value % atom.mod
            total = total + (value if coef == 1 else value * coef)
        return total

    # -- printing and identity -----------------------------------------------------------------

    def __str__(self) -> str:
        if self._str is None:
            self._str = _format(self)
        return self._str

    def __repr__(self) -> str:
        return f"Expr({self})"

    def str_operand(self) -> str:
        """str(self), parenthesized unless it is a single symbol or a non-negative constant."""
        text = str(self)
        atom = self.atom()
        if isinstance(atom, Sym) or (self.is_constant and self.const >= 0):
            return text
        return f"({text})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, int):
            return self.is_constant and self.const == other
        return isinstance(other, Expr) and self.const == other.const and self.terms == other.terms

    def __hash__(self) -> int:
        return self._hash

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


def _natural_key(name: str) -> tuple:
    head = name.rstrip("0123456789")
    tail = name[len(head):]
    return (head, int(tail) if tail else -1)


def floordiv(expr: Expr, d: int) -> Expr:
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


def modulo(expr: Expr, m: int) -> Expr:
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


def _find_div_pair(acc: dict[Atom, int]) -> tuple[Div, Div, int] | None:
    for atom, coef in acc.items():
        if not isinstance(atom, Div) or atom.mod is None or coef == 0:
            continue
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
        syms = {atom} if isinstance(atom, Sym) else atom.arg.free_symbols()
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
