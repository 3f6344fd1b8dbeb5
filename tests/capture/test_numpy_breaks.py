"""Traced NumPy code at its edges (issue 5): where it breaks, what crosses a break or is returned.

- NumPy code with no torch mapping breaks at that call and runs natively on real arrays (the
  result is still eager's); an operator with no mapping (not a resumable instruction) makes kiln
  trace again with `.numpy()` itself breaking, as before NumPy tracing;
- `float(arr.sum())` breaks at float() (a Python number needs the value), like TorchDynamo;
- arrays returned or live across a break are real `numpy.ndarray`s that share memory with the
  tensor they came from wherever eager's do;
- `.numpy()` on a tensor requiring grad, or not on the CPU, behaves exactly as in eager.
"""

from __future__ import annotations

import io
import contextlib
import os
import zlib

import numpy as np
import pytest
import torch

import kiln
import kiln.errors
from helpers import CountingBackend, line_of
from test_numpy_ops import assert_numpy_equal

THIS_FILE = os.path.basename(__file__)


def _line_of(marker: str) -> int:
    return line_of(__file__, marker)


def _break_lines(out) -> list[int]:
    return [r.location.lineno for r in out.break_reasons
            if r.location is not None and os.path.basename(r.location.filename) == THIS_FILE]


def _compare(fn, make, calls=3):
    """Compiled (default settings: breaks allowed) against eager on fresh inputs. Returns the
    number of graphs after the first call (a Python number crossing a break later becomes a
    graph input: one recompile, kiln's automatic dynamic)."""
    backend = CountingBackend()
    compiled = kiln.compile(fn, backend=backend)
    first = None
    for _ in range(calls):
        args = make()
        eager_args = [a.clone() for a in args]
        with contextlib.redirect_stdout(io.StringIO()):
            expected = fn(*eager_args)
            actual = compiled(*args)
        assert_numpy_equal(expected, actual)
        first = backend.count if first is None else first
    return first


def _data(a) -> int:
    return a.__array_interface__["data"][0]


# --- float() of a traced value --------------------------------------------------------------------
def numpy_sum(x):
    y = x.sin()
    arr = y.numpy()
    return y.cos() + float(arr.sum())  # BRK-FLOAT


def test_float_of_numpy_sum_breaks_at_float_like_dynamo():
    graphs = _compare(numpy_sum, lambda: (torch.randn(8),))
    # graph 1: sin, cos, sum (the array is traced); float() runs natively; graph 2: the add
    assert graphs == 2, graphs
    out = kiln.explain(numpy_sum)(torch.randn(8))
    assert out.graph_count == 2 and _break_lines(out) == [_line_of("BRK-FLOAT")], out


# --- NumPy code with no mapping -------------------------------------------------------------------
def unmapped_function(x):
    a = (x * 2).numpy()
    s = np.sort(a, axis=0)  # BRK-SORT
    return x.cos() + 1, s, a.mean()


def unmapped_method(x):
    y = x * 2
    c = zlib.crc32(y.numpy().tobytes())  # BRK-TOBYTES
    return y + (c % 7)


def unmapped_dtype(x):
    a = x.numpy()
    # NumPy sums uint8 into uint64, a dtype kiln does not trace
    return a.sum(axis=0), x.sin()  # BRK-UINT8


@pytest.mark.parametrize("fn,make,marker,graphs", [
    (unmapped_function, lambda: (torch.randn(3, 4),), "BRK-SORT", 2),
    (unmapped_method, lambda: (torch.randn(8),), "BRK-TOBYTES", 2),
    (unmapped_dtype, lambda: (torch.randint(0, 255, (3, 4), dtype=torch.uint8),), "BRK-UINT8", 1),
], ids=["np.sort", "ndarray.tobytes", "uint8_sum"])
def test_numpy_call_without_mapping_breaks_there(fn, make, marker, graphs):
    """The graph breaks at the unmapped call (not at .numpy()), which runs natively on the
    rebuilt array; the results are eager's."""
    assert _compare(fn, make) == graphs
    out = kiln.explain(fn)(*make())
    assert _line_of(marker) in _break_lines(out), [r.render() for r in out.break_reasons]


def unmapped_operator(x):
    a = x.numpy()
    b = a << 1  # not mapped, and not an instruction capture can resume after
    return torch.from_numpy(b) + 1


def tensor_plus_array(x):
    y = x.sin()
    return y + y.numpy()  # a torch/NumPy mix: eager's own rules


@pytest.mark.parametrize("fn,make", [
    (unmapped_operator, lambda: (torch.randint(-8, 8, (5,), dtype=torch.int64),)),
    (tensor_plus_array, lambda: (torch.randn(5),)),
], ids=["lshift", "tensor_plus_array"])
def test_unmapped_operator_falls_back_to_breaking_at_numpy(fn, make):
    _compare(fn, make)
    out = kiln.explain(fn)(*make())
    assert any("numpy" in r.message for r in out.break_reasons), out


def test_fullgraph_reports_the_unmapped_call():
    with pytest.raises(kiln.errors.UnsupportedError, match="numpy-raises|numpy.sort|sort"):
        kiln.compile(unmapped_function, backend="eager", fullgraph=True)(torch.randn(3, 4))


# --- arrays returned and live across breaks -------------------------------------------------------
def returns_array_and_tensor(x):
    y = x.sin()
    a = y.numpy()
    return a, y, a.T, a.sum(axis=1)


def test_returned_arrays_are_real_and_alias_like_eager():
    assert _compare(returns_array_and_tensor, lambda: (torch.randn(3, 4),)) == 1
    compiled = kiln.compile(returns_array_and_tensor, backend="eager")
    a, y, at, s = compiled(torch.randn(3, 4))
    assert type(a) is np.ndarray and type(at) is np.ndarray and type(s) is np.ndarray
    assert _data(a) == y.data_ptr() == _data(at)  # one buffer, as y.numpy() and y share in eager
    a[0, 0] = 123.0  # writes through the array show in the tensor and the transposed view
    assert y[0, 0].item() == 123.0 and at[0, 0] == 123.0


def numpy_of_input(x):
    a = x.numpy()
    return a, a * 2


def test_numpy_of_an_input_shares_the_input_memory():
    x = torch.randn(4)
    a, doubled = kiln.compile(numpy_of_input, backend="eager")(x)
    assert _data(a) == x.data_ptr()
    np.testing.assert_allclose(doubled, x.numpy() * 2)


def live_across_print(x):
    y = x.cos()
    a = y.numpy()
    b = a * 2
    print("between graphs")  # BRK-PRINT
    return a, b, y, b.sum()


def test_arrays_live_across_a_break_are_real_and_alias_like_eager():
    # graph 1: cos, mul; a, b, y cross the break as real values; b.sum() after the print runs on
    # the real array b (kiln traces arrays made from tensors, not arrays passed in)
    assert _compare(live_across_print, lambda: (torch.randn(3, 4),)) == 1
    compiled = kiln.compile(live_across_print, backend="eager")
    with contextlib.redirect_stdout(io.StringIO()) as text:
        a, b, y, total = compiled(torch.randn(3, 4))
    assert text.getvalue() == "between graphs\n"
    assert type(a) is np.ndarray and type(b) is np.ndarray and type(total) is np.float32
    assert _data(a) == y.data_ptr()
    out = kiln.explain(live_across_print)(torch.randn(3, 4))
    assert _line_of("BRK-PRINT") in _break_lines(out)


# --- .numpy() where eager refuses it --------------------------------------------------------------
def numpy_then_sum(x):
    y = x * 2
    return y.numpy().sum()


def _raises_like_eager(fn, x):
    with pytest.raises(Exception) as eager:
        fn(x)
    with pytest.raises(type(eager.value)) as compiled:
        kiln.compile(fn, backend="eager")(x)
    assert str(compiled.value) == str(eager.value)


def test_numpy_of_tensor_requiring_grad_raises_like_eager():
    _raises_like_eager(numpy_then_sum, torch.randn(4, requires_grad=True))


def test_numpy_under_no_grad_is_traced():
    x = torch.randn(4, requires_grad=True)
    backend = CountingBackend()
    with torch.no_grad():
        actual = kiln.compile(numpy_then_sum, backend=backend, fullgraph=True)(x)
        expected = numpy_then_sum(x)
    assert_numpy_equal(expected, actual)
    assert backend.count == 1


def test_numpy_of_meta_tensor_raises_like_eager():
    _raises_like_eager(numpy_then_sum, torch.randn(4, device="meta"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_numpy_of_cuda_tensor_raises_like_eager():
    _raises_like_eager(numpy_then_sum, torch.randn(4, device="cuda"))


def test_numpy_of_bfloat16_raises_like_eager():
    _raises_like_eager(numpy_then_sum, torch.randn(4).to(torch.bfloat16))


def test_new_dtype_recompiles_and_stays_right():
    """Guards on the tensor's dtype: an int input after a float one gets its own NumPy dtypes."""
    backend = CountingBackend()
    compiled = kiln.compile(numpy_then_sum, backend=backend)
    for x in (torch.randn(5), torch.randint(-4, 4, (5,), dtype=torch.int32), torch.randn(5)):
        assert_numpy_equal(numpy_then_sum(x.clone()), compiled(x))
    assert backend.count == 2


# --- cases NumPy and torch treat differently: kiln must give eager's answer (or eager's error) ----
def _i8():
    return (torch.randint(-5, 5, (5,), dtype=torch.int8),)


EDGE_CASES = {
    "uint8_compared_to_negative": (lambda x: x.numpy() > -1,
                                   lambda: (torch.randint(0, 255, (5,), dtype=torch.uint8),)),
    "int8_plus_out_of_range_int": (lambda x: x.numpy() + 300, _i8),
    "int8_equals_out_of_range_int": (lambda x: x.numpy() == 1000, _i8),
    "int_power_negative": (lambda x: x.numpy() ** -1, lambda: (torch.randint(1, 5, (5,)),)),
    "int_power_array": (lambda x: x.numpy() ** x.numpy(), lambda: (torch.randint(-3, 5, (5,)),)),
    "int_floordiv_constant_zero": (lambda x: x.numpy() // 0, lambda: (torch.randint(-3, 5, (5,)),)),
    "negative_of_bool": (lambda x: -x.numpy(), lambda: (torch.rand(5) > 0.5,)),
    "abs_of_bool_no_torch_kernel": (lambda x: np.abs(x.numpy()), lambda: (torch.rand(5) > 0.5,)),
    "max_of_empty": (lambda x: x.numpy().max(), lambda: (torch.randn(0),)),
    "setitem_out_of_range": (lambda x: x.numpy().__setitem__(0, 300), _i8),
    "inplace_add_float_to_int": (lambda x: x.numpy().__iadd__(1.5),
                                 lambda: (torch.randint(-5, 5, (5,)),)),
    "float16_sum": (lambda x: x.numpy().sum(), lambda: (torch.randn(5).half(),)),
    "negative_step": (lambda x: x.numpy()[::-1], lambda: (torch.randn(5),)),
    "bool_mask": (lambda x: x.numpy()[x.numpy() > 0], lambda: (torch.randn(5),)),
    "round_decimals": (lambda x: np.round(x.numpy(), 2), lambda: (torch.randn(5),)),
    "format_string": (lambda x: f"{x.numpy().max():.3f}", lambda: (torch.randn(5),)),
    "isinstance": (lambda x: isinstance(x.numpy() * 2, np.ndarray), lambda: (torch.randn(5),)),
}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name", list(EDGE_CASES))
def test_edge_case_matches_eager(name):
    """Where NumPy's rules and torch's differ (out-of-range Python ints, integer powers and
    division by zero, kernels torch lacks, data-dependent shapes, dtypes kiln does not trace),
    the compiled function returns what eager returns, or raises what eager raises."""
    fn, make = EDGE_CASES[name]
    args = make()
    try:
        expected, expected_error = fn(*[a.clone() for a in args]), None
    except Exception as err:  # noqa: BLE001 - eager's own error is the expectation
        expected, expected_error = None, err
    compiled = kiln.compile(fn, backend="eager")
    if expected_error is not None:
        with pytest.raises(type(expected_error)) as raised:
            compiled(*args)
        assert str(raised.value) == str(expected_error)
    else:
        assert_numpy_equal(expected, compiled(*args))


def same_array_across_break(x):
    a = (x * 2).numpy()
    b = np.asarray(a)  # not mapped: a break, and eager gives back the same object
    return a is b, a.__class__ is np.ndarray, b


def test_one_array_object_per_traced_array_at_a_break():
    """A traced array used twice at a break (a live local and a call argument) is one real
    array object, as in eager."""
    assert _compare(same_array_across_break, lambda: (torch.randn(4),)) == 1
    is_same, is_ndarray, _ = kiln.compile(same_array_across_break)(torch.randn(4))
    assert is_same is True and is_ndarray is True


def compare_argument(x, arr):
    return x + 1, arr == 3, arr != 3


def test_numpy_argument_compared_with_constant_gives_eager_answer():
    """A real array passed in (not traced) compared with a constant: NumPy's elementwise answer,
    never folded to False as for objects whose == is identity."""
    x, arr = torch.randn(3), np.array([1, 3, 5])
    expected = compare_argument(x, arr)
    actual = kiln.compile(compare_argument, backend="eager")(x, arr)
    assert_numpy_equal(expected, actual)
