"""The index algebra: simplification rules, printing round trip, evaluation against Python ints."""
from __future__ import annotations

import itertools
import random

import pytest
import torch

from kiln.lower.index import Div, Expr, Sym, as_expr, sym


def _check_exact(expr: Expr, build, names: list[str], sizes: list[int]) -> None:
    """`expr` (simplified) equals `build` evaluated on every point of the symbols' ranges."""
    for point in itertools.product(*[range(n) for n in sizes]):
        env = dict(zip(names, point))
        assert expr.evaluate(env) == build(*point), (str(expr), env)


def test_reshape_round_trip_simplifies_to_plain_variables():
    x0, x1 = sym("x0", 16), sym("x1", 32)
    flat = 32 * x0 + x1
    b0, b1, b2 = flat // 256 % 2, flat // 32 % 8, flat % 32
    assert (str(b0), str(b1), str(b2)) == ("x0//8", "x0 % 8", "x1")
    assert 256 * b0 + 32 * b1 + b2 == 32 * x0 + x1


def test_split_then_merge_is_identity():
    y0, y1, y2 = sym("y0", 2), sym("y1", 8), sym("y2", 32)
    flat = 256 * y0 + 32 * y1 + y2
    assert str(flat // 32 % 16) == "8*y0 + y1"
    assert flat % 32 == y2


def test_size_one_symbols_vanish_and_constants_fold():
    assert sym("x0", 1) == 0
    x = sym("x", 10)
    assert (x + 3) - 3 == x
    assert (4 * x) // 2 == 2 * x
    assert (4 * x + 2) % 2 == 0
    assert x // 10 == 0 and x % 10 == x


def test_nested_div_mod_normalize():
    x = sym("x", 64)
    assert (x // 4) // 2 == x // 8
    assert ((x // 2) % 8) // 2 == (x // 4) % 4
    assert ((x // 4) % 8) % 4 == (x // 4) % 4


def test_printing_is_python_that_rebuilds_the_expression():
    x0, x1, x2 = sym("x0", 16), sym("x1", 7), sym("x2", 9)
    exprs = [(x0 // 4) % 2, 3 * ((x0 + 1) // 4) - 2 * x1, -(x1 % 3) + 5, x0 * 9 + x2 - 40,
             (2 * x0 + x1) // 3 % 5]
    env = {"x0": x0, "x1": x1, "x2": x2}
    for e in exprs:
        assert eval(str(e), {}, env) == e, str(e)


def test_evaluate_with_tensors_matches_ints():
    x0, x1 = sym("x0", 6), sym("x1", 5)
    e = ((3 * x0 + x1) // 4) % 3 + 7 * (x1 % 2) - x0
    t0, t1 = torch.arange(6).view(6, 1), torch.arange(5).view(1, 5)
    got = e.evaluate({"x0": t0, "x1": t1})
    for i in range(6):
        for j in range(5):
            assert got[i, j].item() == ((3 * i + j) // 4) % 3 + 7 * (j % 2) - i


@pytest.mark.parametrize("seed", range(40))
def test_random_affine_div_mod_is_exact(seed):
    rng = random.Random(seed)
    sizes = [rng.randint(1, 7) for _ in range(3)]
    names = [f"x{i}" for i in range(3)]
    syms = [sym(n, s) for n, s in zip(names, sizes)]
    coefs = [rng.choice([0, 1, 2, 3, 4, 6, 8, 12, -1]) for _ in syms]
    const = rng.randint(-5, 20)
    div, mod = rng.choice([1, 2, 3, 4, 8]), rng.choice([2, 3, 4, 6, 16])
    expr = const + sum(c * s for c, s in zip(coefs, syms))
    simplified = (expr // div) % mod * 3 + expr // (div * mod) - expr % div

    def build(*p):
        e = const + sum(c * v for c, v in zip(coefs, p))
        return (e // div) % mod * 3 + e // (div * mod) - e % div

    _check_exact(simplified, build, names, sizes)


def test_bounds_and_linear_coefficients():
    x, y = sym("x", 4), sym("y", 3)
    e = 5 * x - 2 * y + 1
    assert e.bounds() == (-3, 16)
    assert e.linear_coefficients() == {Sym("x", 4): 5, Sym("y", 3): -2}
    assert (x // 2).linear_coefficients() is None
    assert isinstance((x // 3).terms[0][0], Div)
    assert as_expr(7) == 7 and int(as_expr(7)) == 7


def test_non_affine_product_is_refused():
    x, y = sym("x", 4), sym("y", 3)
    with pytest.raises(TypeError, match="affine"):
        _ = x * y
