"""Value-only Python numbers as 0-dim tensor graph inputs (issue 15): a float argument that
changes between calls, or an int no size symbol holds (negative, past int32), is one graph for
every value, traced by the autograd stage like any tensor input, with eager's dtypes and values:
arithmetic among numbers is Python's (float64 / int64), a tensor op gets the number in the dtype
eager computes in, a number leaving the graph is a Python number again, and any other use (a
branch, a shape) specializes it.

Every test compares with eager on fresh random inputs per call and counts captures."""
from __future__ import annotations

import logging
import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import kiln
from helpers import CountingAot

# aot_eager graphs (no generated kernels): CPU tensors also in the CUDA suite
pytestmark = pytest.mark.explicit_device


def _same(actual: Any, expected: Any) -> None:
    """Equal types, dtypes and values (to rounding: a number a tensor op reads as a tensor may
    take another kernel path than a Python scalar, `x ** s` one ulp apart)."""
    assert type(actual) is type(expected), (actual, expected)
    if isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            _same(a, e)
    elif isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
        torch.testing.assert_close(actual, expected, equal_nan=True)
    else:
        assert actual == expected or (math.isnan(actual) and math.isnan(expected))


def _run(fn, calls, backend=None, **options) -> CountingAot:
    backend = backend or CountingAot()
    compiled = kiln.compile(fn, backend=backend, **options)
    for args in calls:
        fresh = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        _same(compiled(*args), fn(*fresh))  # each on its own copy: some ops write in place
    return backend


def _number_placeholders(gm: torch.fx.GraphModule) -> list[torch.Tensor]:
    return [p.meta["val"] for p in gm.graph.nodes if p.op == "placeholder"
            and isinstance(p.meta.get("val"), torch.Tensor) and p.meta["val"].dim() == 0
            and p.meta["val"].dtype in (torch.float64, torch.int64)]


def _scaled(x: torch.Tensor, scale: float) -> torch.Tensor:
    return x * scale + scale ** 2


def test_a_changing_float_argument_is_one_traced_graph(recorder, caplog):
    with caplog.at_level(logging.WARNING, logger="kiln"):
        backend = _run(_scaled, [(torch.randn(4, 3), s) for s in (0.5, 1.5, -2.25, 3.0, 1e-3)])
    assert len(backend.gms) == 2, f"{len(backend.gms)} captures for 5 values"
    assert [t.dtype for t in _number_placeholders(backend.gms[-1])] == [torch.float64]
    assert "running it eagerly" not in caplog.text, caplog.text
    assert recorder.autograd_traces, "the graph taking the float was not traced"


def test_dynamic_false_still_specializes_floats():
    backend = _run(_scaled, [(torch.randn(4), s) for s in (0.5, 1.5, 2.5)], dynamic=False)
    assert len(backend.gms) == 3
    assert not any(_number_placeholders(gm) for gm in backend.gms)


_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64,
           torch.int32, torch.uint8, torch.bool)


def _tensor(dtype: torch.dtype, shape=(5, 4)) -> torch.Tensor:
    if dtype is torch.bool:
        return torch.randn(shape) > 0
    if not dtype.is_floating_point:
        return torch.randint(0, 9, shape, dtype=dtype)
    return (torch.randn(shape) * 3).to(dtype)


def _binary_idioms(x: torch.Tensor, s: float) -> tuple:
    out = [x * s, x > s, x <= s, torch.add(x, s), torch.mul(s, x)]
    if x.dtype is not torch.bool:
        out += [s - x]
    if x.is_floating_point():
        out += [x / s, x ** s, x.add_(s), x.mul(s).div(s), torch.pow(x, s)]
    return tuple(out)


@pytest.mark.parametrize("dtype", _DTYPES, ids=str)
@pytest.mark.parametrize("zero_dim", [False, True], ids=["dims", "0-dim"])
def test_tensor_ops_with_a_float_get_eagers_dtype_and_value(dtype, zero_dim):
    """The number reaches the op in the dtype eager computes in: float32 beside a float16 tensor
    with dims (eager's opmath for a Python scalar), the tensor's dtype beside a 0-dim one (a
    float32 0-dim tensor would promote it), the default dtype beside ints and bools."""
    shape = () if zero_dim else (5, 4)
    backend = _run(_binary_idioms, [(_tensor(dtype, shape), s) for s in (0.3, 1.7, -0.45, 2.0)])
    assert len(backend.gms) == 2 and _number_placeholders(backend.gms[-1])


def _checked_idioms(x: torch.Tensor, s: float) -> tuple:
    return x.clamp(min=s), x.masked_fill(x > 2, s), torch.clamp(x, max=s)


@pytest.mark.parametrize("dtype", _DTYPES[:6], ids=str)
def test_ops_that_check_the_value_fits_take_it_behind_a_range_guard(dtype):
    """clamp and masked_fill raise where a Python number does not fit the tensor's dtype; a
    tensor value would not: the number is guarded to the dtype's range instead."""
    backend = _run(_checked_idioms, [(_tensor(dtype), s) for s in (0.3, 1.7, 2.5, 4.0)])
    assert len(backend.gms) == 2 and _number_placeholders(backend.gms[-1])


def test_a_number_past_the_dtypes_range_raises_like_eager():
    x = torch.randn(4).half()
    compiled = kiln.compile(_checked_idioms, backend=CountingAot())
    for s in (0.5, 1.5):
        _same(compiled(x, s), _checked_idioms(x, s))
    with pytest.raises(RuntimeError, match="without overflow"):
        _checked_idioms(x, 1e6)
    with pytest.raises(RuntimeError, match="without overflow"):
        compiled(x, 1e6)
    _same(compiled(x, 2.5), _checked_idioms(x, 2.5))


def _int_idioms(x: torch.Tensor, n: int) -> tuple:
    return x * n, x + n, x // n, x % n, x.masked_fill(x > 0, n), x / n, x.to(torch.int32) - n


@pytest.mark.parametrize("dtype", (torch.float32, torch.int64, torch.int32, torch.float16),
                         ids=str)
def test_a_negative_int_argument_is_one_graph_with_eagers_dtypes(dtype):
    backend = _run(_int_idioms, [(_tensor(dtype), n) for n in (-3, -7, -2, -11)])
    assert len(backend.gms) == 2
    assert [t.dtype for t in _number_placeholders(backend.gms[-1])] == [torch.int64]


def _number_arithmetic(x: torch.Tensor, s: float, n: int, r: float) -> tuple:
    t = s * 2 - 1.5
    k = n // 3 + n % 4  # Python's floor division and modulo of a negative int
    return x * t, s / n, n * 0.5, k, n ** 2, math.sqrt(r) * x, -s, abs(t), t, s * n, 1.0 / s


def test_arithmetic_among_numbers_keeps_pythons_types_and_values():
    """float64 and int64 arithmetic, an int made float where Python makes it one (`s / n`,
    `n * 0.5`), and numbers returned out of the graph as Python numbers again."""
    calls = [(torch.randn(3), s, n, r) for s, n, r in
             ((0.7, -5, 2.0), (1.3, -9, 0.5), (-2.5, -4, 3.0), (0.1, -13, 7.5))]
    backend = _run(_number_arithmetic, calls)
    assert len(backend.gms) == 2
    assert len(_number_placeholders(backend.gms[-1])) == 3


def test_what_would_raise_in_python_is_guarded():
    """A divisor, a square root's argument and an int that could overflow int64 are guarded
    (`s != 0`, `r >= 0`, `-2**31 <= n <= 2**31`): a value outside raises as in eager."""
    def fn(x, s, r, n):
        return x / s + 1.0 / s, math.sqrt(r) + s, x * (n * n)

    compiled = kiln.compile(fn, backend=CountingAot())
    for s, r, n in ((0.5, 2.0, -3), (1.5, 4.0, -7)):
        x = torch.randn(3)
        _same(compiled(x, s, r, n), fn(x, s, r, n))
    x = torch.randn(3)
    with pytest.raises(ZeroDivisionError):
        compiled(x, 0.0, 2.0, -3)
    with pytest.raises(ValueError):
        compiled(x, 0.5, -1.0, -3)
    with pytest.raises(OverflowError):  # n * n past int64: eager cannot take it either
        fn(x, 0.5, 2.0, -2**40)
    with pytest.raises(OverflowError):
        compiled(x, 0.5, 2.0, -2**40)
    _same(compiled(x, 2.5, 3.0, -2**20), fn(x, 2.5, 3.0, -2**20))


def test_a_branch_on_a_float_specializes_it_with_eagers_answers():
    def fn(x, s):
        y = x * s
        if s > 1.0:  # needs the value: guarded
            return y.cos()
        return y.sin() + s

    _run(fn, [(torch.randn(4), s) for s in (0.5, 0.7, 1.5, 2.5, 0.2, 0.9)])


def test_a_float_used_as_a_shape_or_in_an_unlisted_op_is_specialized():
    def fn(x, s):
        return F.dropout(x, p=0.0) * s, torch.full((2,), s), x.new_full((3,), s), \
            torch.where(x > 0, x, s), F.leaky_relu(x, s)

    _run(fn, [(torch.randn(4), s) for s in (0.5, 0.25, 0.125)])


def _item_then_scale(x: torch.Tensor) -> torch.Tensor:
    s = x.abs().max().item()  # a graph break: s reaches the rest of the function as a float
    return x / s + s


def test_a_float_from_item_crossing_a_break_is_not_recompiled_per_value(caplog):
    backend = CountingAot()
    with caplog.at_level(logging.WARNING, logger="kiln"):
        _run(_item_then_scale, [(torch.randn(6),) for _ in range(6)], backend)
    assert len(backend.gms) <= 4, f"{len(backend.gms)} captures for 6 calls"
    assert "running it eagerly" not in caplog.text, caplog.text


def test_training_with_a_changing_float_matches_eagers_gradients():
    w = torch.randn(4, 3, requires_grad=True)
    w_ref = w.detach().clone().requires_grad_()

    def loss(weight, x, s):
        return ((x @ weight) * s).pow(2).sum() / s

    compiled = kiln.compile(loss, backend=CountingAot())
    for s in (0.5, 1.25, 2.0, -0.75):
        x = torch.randn(5, 4)
        got, want = compiled(w, x, s), loss(w_ref, x, s)
        torch.testing.assert_close(got, want)
        got.backward()
        want.backward()
        torch.testing.assert_close(w.grad, w_ref.grad)


def test_torch_tensor_of_a_float_keeps_the_default_dtype():
    def fn(x, s):
        return torch.tensor([s, 1.0]) * x[:2], torch.tensor(s, dtype=torch.float64) + 1, \
            torch.as_tensor(s) * x

    backend = _run(fn, [(torch.randn(4), s) for s in (0.5, 1.5, 2.75)])
    assert len(backend.gms) == 2


def test_an_int_past_int64_stays_a_constant():
    def fn(x, n):
        return x * (n % 1000)

    _run(fn, [(torch.randn(3), n) for n in (2**70 + 1, 2**70 + 5, 2**71)])
