"""The index algebra with symbolic sizes (`Size` atoms): every simplification agrees with
exact integer arithmetic at several values of the sizes, a flat index over a symbolic dim
merges back, and order questions answer only what holds for every size."""
from __future__ import annotations

import itertools

import pytest

from kiln.lower.index import as_expr, derived_size, size_expr, sym

S0, S1 = size_expr("s0"), size_expr("s1")
SIZES = [(a, b) for a in (2, 3, 5, 8) for b in (2, 3, 7)]


def _check(expr, reference, ranges):
    """expr.evaluate == reference at every size and (up to 300) points of `ranges`."""
    for s0, s1 in SIZES:
        env = {"s0": s0, "s1": s1}
        grids = [range(r(s0, s1)) for r in ranges.values()]
        for point in itertools.islice(itertools.product(*grids), 300):
            env.update(zip(ranges, point))
            assert expr.evaluate(env) == reference(env), (str(expr), env)


def _vars():
    x0, x1, x2 = sym("x0", 64), sym("x1", S1), sym("x2", S0)
    return x0, x1, x2, {"x0": lambda a, b: 64, "x1": lambda a, b: b, "x2": lambda a, b: a}


def test_flat_index_over_a_symbolic_dim_merges_back():
    x0, x1, x2, _ = _vars()
    xindex = sym("xindex", 64 * S1 * S0)
    (v0,), (v1,), (v2,) = x0.free_symbols(), x1.free_symbols(), x2.free_symbols()
    flat = (x0 + 64 * x1 + 64 * S1 * x2).subs(
        {v0: xindex % 64, v1: (xindex // 64) % S1, v2: xindex // (64 * S1)})
    assert str(flat) == "xindex"
    two = (x1 + S1 * x2).subs({v1: xindex % S1, v2: xindex // S1})
    assert str(two) == "xindex"


@pytest.mark.parametrize("divisor", ["64*s1", "s1", "64", "32*s1", "64*s0*s1", "s0"])
def test_division_by_sizes_is_exact(divisor):
    x0, x1, x2, ranges = _vars()
    d = eval(divisor, {"s0": S0, "s1": S1})  # noqa: S307 - test expressions
    expr = x0 + 64 * x1 + 64 * S1 * x2

    def value(env):
        return env["x0"] + 64 * env["x1"] + 64 * env["s1"] * env["x2"]

    _check(expr // d, lambda env: value(env) // as_expr(d).evaluate(env), ranges)
    _check(expr % d, lambda env: value(env) % as_expr(d).evaluate(env), ranges)


def test_dividing_by_a_quotient_of_sizes_is_exact():
    """`x.view(-1, n)` of an (s0, s1) input has the dim `(s0*s1)//n`, and a later shape divides
    by it: the divisor's bounds start at 0 (`4 // huge`), which divided by zero (the symbolic
    trace failed, and the graph was compiled per size). A divisor that runs is at least 1."""
    s2 = size_expr("s2")
    rows = derived_size((S0 * S1) // s2)  # one atom, as lowering makes a view's dim
    expr = (S0 * S1) // rows
    for s0, s1 in SIZES:
        for n in (2, 3, s0 * s1):
            env = {"s0": s0, "s1": s1, "s2": n}
            assert expr.evaluate(env) == s0 * s1 // (s0 * s1 // n), env


def test_simplifications_need_a_proof():
    x0, x1, x2, _ = _vars()
    assert str((x0 + 64 * x1) // (64 * S1)) == "0"  # below the divisor for every s1
    assert str((x0 + 64 * x1) % S0) == "(x0 + 64*x1) % s0"  # no bound relates s1 and s0
    assert (x1 // S0).terms  # x1 < s1, not known < s0: stays a division


def test_order_comparisons_hold_for_every_size():
    assert S0 > 1 and S0 >= 2 and not (S0 < 2) and S0 != 1 and S0 != 0
    with pytest.raises(TypeError, match="depends on the sizes"):
        _ = S0 > 4
    with pytest.raises(TypeError):
        int(S0)


def test_a_sign_shared_terms_decide_is_decided():
    """`16*s0*s1 - 16*s0` is 16*s0*(s1 - 1) > 0 for sizes >= 2, which bounds taken term by
    term cannot see (a symbolic causal attention's backward asked exactly this, and the
    lowering failed over to per-size compiles); a sign that does depend on the sizes still
    raises."""
    grows = 16 * S0 * S1 - 16 * S0
    assert grows > 0 and grows >= 32 and not (grows < 32)
    assert (16 * S0 - 16 * S0 * S1) < 0
    assert S0 * S0 - S0 >= 2  # s0*(s0 - 1), a square among the terms
    for depends in (S0 * S1 - 3 * S1, S0 - S1, S0 * S1 - S0 * S0):
        with pytest.raises(TypeError, match="depends on the sizes"):
            _ = depends > 0
    for s0, s1 in itertools.product((2, 3, 7, 100), repeat=2):
        assert grows.evaluate({"s0": s0, "s1": s1}) >= 32


def test_a_size_prints_as_source():
    assert repr((S0 * 64, 16)) == "(64*s0, 16)"
    assert repr(sym("x0", 4)) == "Expr(x0)"  # static expressions print as before


def test_a_squared_size_from_torch_becomes_a_product_of_sizes():
    """The stride of an [L, L] block is L**2 in sympy (seen on CUDA in an attention graph);
    it converts to s*s instead of sending the graph per size."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import (DimDynamic, ShapeEnv,
                                                       StatelessSymbolicContext)

    from kiln.lower.symbolic import to_size

    mode = FakeTensorMode(shape_env=ShapeEnv())
    fake = mode.from_tensor(torch.empty(5, 7), symbolic_context=StatelessSymbolicContext(
        dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.DYNAMIC]))
    length = fake.shape[0]
    square = to_size(length * length * 3 + fake.shape[1])
    name = str(to_size(length))
    assert str(square).replace(" ", "") in (f"{fake.shape[1].node.expr}+3*{name}*{name}",
                                            f"3*{name}*{name}+{fake.shape[1].node.expr}")


def test_a_ceiling_division_from_torch_becomes_a_floor_division_of_sizes():
    """The efficient attention kernel's logsumexp has `32*ceil(L/32)` rows (CeilToInt of an
    IntTrueDiv in sympy); seen on CUDA, where it sent causal attention training per size."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import (DimDynamic, ShapeEnv,
                                                       StatelessSymbolicContext)

    from kiln.lower.symbolic import to_size

    mode = FakeTensorMode(shape_env=ShapeEnv())
    fake = mode.from_tensor(torch.empty(5), symbolic_context=StatelessSymbolicContext(
        dynamic_sizes=[DimDynamic.DYNAMIC]))
    with mode:
        q = torch.empty(1, 1, fake.shape[0], 8, device="cuda")
        _, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(q, q, q, None, True)
    rows, name = to_size(lse.shape[-1]), str(to_size(fake.shape[0]))
    for length in (1, 5, 32, 33, 70):
        assert rows.evaluate({name: length}) == 32 * -(-length // 32)
