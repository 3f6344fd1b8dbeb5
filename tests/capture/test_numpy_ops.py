"""NumPy code on arrays from `tensor.numpy()`, traced as torch ops (issue 5): every mapped method,
function and operator against eager NumPy on fresh random inputs.

Each case is compiled with fullgraph=True (so it must be traced, not broken) and a counting
backend (one graph), then its result is compared with eager: the same Python types (an ndarray,
or the same NumPy scalar type such as np.float32 / np.int64 / np.float64), the same dtypes and
shapes, values within assert_close's tolerances (traced sums add in torch's order, NumPy's are
pairwise). Inputs are float32, float64, int32, int64, uint8 and bool tensors.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kiln
from helpers import CountingBackend


def assert_numpy_equal(expected, actual, path="out"):
    """Same structure; arrays and NumPy scalars of the same type, dtype, shape and values."""
    if isinstance(expected, (tuple, list)):
        assert type(actual) is type(expected) and len(actual) == len(expected), \
            f"{path}: {type(actual)} != {type(expected)}"
        for i, (e, a) in enumerate(zip(expected, actual)):
            assert_numpy_equal(e, a, f"{path}[{i}]")
        return
    assert type(actual) is type(expected), f"{path}: {type(actual)} != {type(expected)}"
    if isinstance(expected, torch.Tensor):
        torch.testing.assert_close(actual, expected, equal_nan=True, msg=lambda m: f"{path}: {m}")
    elif isinstance(expected, (np.ndarray, np.generic)):
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        assert np.shape(actual) == np.shape(expected), f"{path}: shape"
        torch.testing.assert_close(torch.as_tensor(np.array(actual)),
                                   torch.as_tensor(np.array(expected)), equal_nan=True,
                                   msg=lambda m: f"{path}: {m}")
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def run_traced(fn, make, graphs=1, calls=2):
    """fn compiled with fullgraph=True against eager on `calls` fresh inputs."""
    backend = CountingBackend()
    compiled = kiln.compile(fn, backend=backend, fullgraph=True)
    for _ in range(calls):
        args = make()
        eager_args = [a.clone() for a in args]
        expected = fn(*eager_args)
        actual = compiled(*args)
        assert_numpy_equal(expected, actual)
        for e, a in zip(eager_args, args):  # writes through arrays reach the tensors as in eager
            torch.testing.assert_close(a, e, equal_nan=True)
    assert backend.count == graphs, f"{backend.count} graphs"
    return backend


def f32(*shape):
    return lambda: (torch.randn(*shape),)


def f64(*shape):
    return lambda: (torch.randn(*shape, dtype=torch.float64),)


def ints(*shape, dtype=torch.int32, low=-9, high=10):
    return lambda: (torch.randint(low, high, shape, dtype=dtype),)


def bools(*shape):
    return lambda: (torch.rand(*shape) > 0.5,)


# --- reductions ---------------------------------------------------------------------------------
REDUCTIONS = {
    "sum_f32": (lambda x: x.numpy().sum(), f32(3, 4)),
    "sum_axis_keepdims": (lambda x: x.numpy().sum(axis=0, keepdims=True), f32(3, 4)),
    "sum_axes_tuple": (lambda x: np.sum(x.numpy(), axis=(0, 2)), f32(2, 3, 4)),
    "sum_negative_axis": (lambda x: np.sum(x.numpy(), -1), f64(3, 4)),
    "sum_int32_to_int64": (lambda x: x.numpy().sum(), ints(3, 4)),
    "sum_int32_axis": (lambda x: x.numpy().sum(1), ints(3, 4)),
    "sum_bool_to_int64": (lambda x: x.numpy().sum(), bools(5)),
    "sum_dtype_arg": (lambda x: x.numpy().sum(dtype=np.float64), f32(6)),
    "sum_keepdims_all": (lambda x: np.sum(x.numpy(), keepdims=True), f32(2, 3)),
    "prod_axis": (lambda x: x.numpy().prod(axis=1), f64(3, 4)),
    "prod_int": (lambda x: np.prod(x.numpy()), ints(5, low=1, high=4)),
    "mean_f32": (lambda x: x.numpy().mean(), f32(3, 4)),
    "mean_axis": (lambda x: np.mean(x.numpy(), axis=1, keepdims=True), f32(3, 4)),
    "mean_int_to_float64": (lambda x: x.numpy().mean(), ints(3, 4)),
    "mean_bool": (lambda x: x.numpy().mean(axis=0), bools(3, 4)),
    "std": (lambda x: x.numpy().std(), f32(3, 4)),
    "std_ddof_axis": (lambda x: np.std(x.numpy(), axis=0, ddof=1), f64(5, 3)),
    "var_int": (lambda x: x.numpy().var(axis=1), ints(3, 4)),
    "max_all": (lambda x: x.numpy().max(), f32(3, 4)),
    "min_axis_keepdims": (lambda x: x.numpy().min(axis=1, keepdims=True), ints(3, 4)),
    "amax_int64": (lambda x: np.amax(x.numpy(), axis=0), ints(3, 4, dtype=torch.int64)),
    "np_min": (lambda x: np.min(x.numpy()), f64(7)),
    "max_bool": (lambda x: x.numpy().max(axis=0), bools(3, 4)),
    "argmax": (lambda x: x.numpy().argmax(), f32(3, 4)),
    "argmin_axis": (lambda x: np.argmin(x.numpy(), axis=0), f32(3, 4)),
    "argmax_keepdims": (lambda x: np.argmax(x.numpy(), axis=1, keepdims=True), f32(3, 4)),
    "any_axis": (lambda x: (x.numpy() > 1).any(axis=0), f32(3, 4)),
    "all": (lambda x: np.all(x.numpy() > -3), f32(3, 4)),
    "cumsum_flat": (lambda x: x.numpy().cumsum(), f32(3, 4)),
    "cumsum_int_axis": (lambda x: np.cumsum(x.numpy(), axis=1), ints(3, 4, dtype=torch.int8)),
}


@pytest.mark.parametrize("name", list(REDUCTIONS))
def test_reduction_matches_numpy(name):
    fn, make = REDUCTIONS[name]
    run_traced(fn, make)


def test_reduction_dtypes_follow_numpy():
    """float32 sums stay float32, integer sums go to int64, integer means to float64 (NumPy
    scalars of those types, not Python numbers or 0-d arrays)."""
    def stats(x, i, b):
        a, n, m = x.numpy(), i.numpy(), b.numpy()
        return a.sum(), n.sum(), m.sum(), n.mean(), a.mean(), n.max(), (a * 2).sum(axis=0)

    def make():
        return (torch.randn(4, 3), torch.randint(-5, 5, (4, 3), dtype=torch.int32),
                torch.rand(4) > 0.5)
    backend = CountingBackend()
    out = kiln.compile(stats, backend=backend, fullgraph=True)(*make())
    assert [type(v) for v in out[:6]] == [np.float32, np.int64, np.int64, np.float64,
                                          np.float32, np.int32]
    assert isinstance(out[6], np.ndarray) and out[6].dtype == np.float32
    run_traced(stats, make)


# --- elementwise functions and operators ----------------------------------------------------------
ELEMENTWISE = {
    "add_scalar": (lambda x: x.numpy() + 1, f32(3, 4)),
    "mul_float_into_int": (lambda x: x.numpy() * 2.5, ints(3, 4)),
    "truediv_int_to_float64": (lambda x: x.numpy() / 3, ints(3, 4)),
    "floordiv_float": (lambda x: x.numpy() // 0.7, f32(3, 4)),
    "mod_float": (lambda x: x.numpy() % 0.7, f64(3, 4)),
    "floordiv_int": (lambda x: x.numpy() // 4, ints(3, 4)),
    "mod_int_negative": (lambda x: x.numpy() % -3, ints(3, 4)),
    "pow_int": (lambda x: x.numpy() ** 2, ints(3, 4)),
    "pow_float": (lambda x: np.abs(x.numpy()) ** 0.5, f32(3, 4)),
    "rsub": (lambda x: 2 - x.numpy(), f32(3, 4)),
    "rpow": (lambda x: 2.0 ** x.numpy(), f32(3, 4)),
    "neg": (lambda x: -x.numpy(), ints(3, 4)),
    "pos_abs": (lambda x: abs(+x.numpy()), f32(3, 4)),
    "invert_bool": (lambda x: ~x.numpy(), bools(3, 4)),
    "invert_int": (lambda x: ~x.numpy(), ints(3, 4)),
    "and_or_xor": (lambda x: ((x.numpy() & 6) | 1) ^ 3, ints(3, 4)),
    "uint8_wraps": (lambda x: x.numpy() - 7, ints(3, 4, dtype=torch.uint8, low=0, high=20)),
    "compare_int_float": (lambda x: x.numpy() > 1.5, ints(3, 4)),
    "compare_arrays": (lambda x: x.numpy() == np.abs(x.numpy()), f32(3, 4)),
    "matmul_op": (lambda x: x.numpy() @ x.numpy().T, f32(3, 4)),
    "matmul_1d_scalar": (lambda x: x.numpy()[0] @ x.numpy()[1], f64(3, 4)),
    "matmul_int": (lambda x: np.matmul(x.numpy(), x.numpy().T), ints(3, 4)),
    "dot": (lambda x: np.dot(x.numpy(), x.numpy().T), f32(3, 4)),
    "dot_method_1d": (lambda x: x.numpy()[0].dot(x.numpy()[1]), f32(3, 4)),
    "exp_f32": (lambda x: np.exp(x.numpy()), f32(3, 4)),
    "exp_int_to_float64": (lambda x: np.exp(x.numpy()), ints(3, 4)),
    "log_sqrt": (lambda x: np.log(np.sqrt(np.abs(x.numpy()) + 1.0)), f32(3, 4)),
    "log_int": (lambda x: np.log1p(np.abs(x.numpy())), ints(3, 4)),
    "trig": (lambda x: np.tanh(np.sin(x.numpy())) + np.cos(x.numpy()), f64(3, 4)),
    "arctan2": (lambda x: np.arctan2(x.numpy(), 0.5), f32(3, 4)),
    "floor_ceil_rint": (lambda x: (np.floor(x.numpy() * 3), np.ceil(x.numpy()),
                                   np.rint(x.numpy() * 2)), f32(3, 4)),
    "square_int": (lambda x: np.square(x.numpy()), ints(3, 4)),
    "isnan": (lambda x: np.isnan(np.log(x.numpy())), f32(3, 4)),
    "logical": (lambda x: np.logical_and(x.numpy() > 0, np.logical_not(x.numpy() > 1)), f32(6)),
    "maximum_scalar": (lambda x: np.maximum(x.numpy(), 0), f32(3, 4)),
    "minimum_arrays": (lambda x: np.minimum(x.numpy(), x.numpy()[::2].sum()), ints(3, 4)),
    "ufunc_add_subtract": (lambda x: np.subtract(np.add(x.numpy(), 2), 0.5), ints(3, 4)),
    "divide_ufunc": (lambda x: np.divide(x.numpy(), 4), ints(3, 4, dtype=torch.int64)),
    "where": (lambda x: np.where(x.numpy() > 0, x.numpy(), -1.0), f32(3, 4)),
    "where_scalars_float64": (lambda x: np.where(x.numpy() > 0, 0.1, 0.2), f32(3, 4)),
    "where_int_cond": (lambda x: np.where(x.numpy(), 1, 0), ints(3, 4, low=-1, high=2)),
    "clip": (lambda x: np.clip(x.numpy(), -0.5, 0.5), f32(3, 4)),
    "clip_method_int": (lambda x: x.numpy().clip(-3, 4), ints(3, 4)),
    "clip_upper_only": (lambda x: np.clip(x.numpy(), None, 0.25), f64(3, 4)),
    "float32_scalar_ops": (lambda x: x.numpy().sum() * 2 + 1, f32(3, 4)),
    "np_float64_constant_promotes": (lambda x: x.numpy() + np.float64(1.5), f32(3, 4)),
    "np_float32_scalar_result": (lambda x: x.numpy().max() > 0, f32(3, 4)),
}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # eager NumPy's log of negatives
@pytest.mark.parametrize("name", list(ELEMENTWISE))
def test_elementwise_matches_numpy(name):
    fn, make = ELEMENTWISE[name]
    run_traced(fn, make)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # eager NumPy warns on division by zero
def test_integer_division_by_zero_gives_zero_like_numpy():
    """NumPy's integer // and % give 0 where the divisor is 0 (torch would raise). The traced
    code does not repeat NumPy's RuntimeWarning (as with TorchDynamo)."""
    def divide(x, y):
        a, b = x.numpy(), y.numpy()
        return a // b, a % b, np.fmod(a, b)

    def make():
        y = torch.randint(-3, 4, (3, 4), dtype=torch.int32)
        y[0, 0] = 0
        return torch.randint(-20, 20, (3, 4), dtype=torch.int32), y
    run_traced(divide, make)


# --- shapes, copies, dtypes ---------------------------------------------------------------------
SHAPES = {
    "reshape_args": (lambda x: x.numpy().reshape(4, 3), f32(3, 4)),
    "reshape_tuple_minus_one": (lambda x: np.reshape(x.numpy(), (-1,)), ints(3, 4)),
    "reshape_from_shape": (lambda x: x.numpy().reshape(x.numpy().shape[1], -1), f32(3, 4)),
    "transpose": (lambda x: x.numpy().transpose(), f32(2, 3, 4)),
    "transpose_axes": (lambda x: np.transpose(x.numpy(), (1, 0, 2)), f32(2, 3, 4)),
    "T": (lambda x: x.numpy().T + 0, f64(3, 4)),
    "swapaxes_moveaxis": (lambda x: (np.swapaxes(x.numpy(), 0, 2), np.moveaxis(x.numpy(), 0, -1)),
                          f32(2, 3, 4)),
    "squeeze_expand_dims": (lambda x: np.expand_dims(x.numpy().squeeze(1), 0), f32(3, 1, 4)),
    "ravel_flatten": (lambda x: (x.numpy().ravel(), x.numpy().flatten()), ints(3, 4)),
    "copy": (lambda x: (x.numpy().copy(), np.copy(x.numpy()).T), f32(3, 4)),
    "astype_float64": (lambda x: x.numpy().astype(np.float64), f32(3, 4)),
    "astype_int_truncates": (lambda x: (x.numpy() * 3).astype(np.int32), f32(3, 4)),
    "astype_bool_str": (lambda x: x.numpy().astype("bool"), ints(3, 4, low=-1, high=2)),
    "concatenate": (lambda x: np.concatenate([x.numpy(), x.numpy() * 2], axis=1), f32(3, 4)),
    "concatenate_promotes": (lambda x: np.concatenate((x.numpy(), x.numpy() / 2)), ints(3, 4)),
    "concatenate_axis_none": (lambda x: np.concatenate([x.numpy(), x.numpy()], axis=None),
                              f32(2, 3)),
    "stack": (lambda x: np.stack([x.numpy(), -x.numpy()], axis=1), f32(3, 4)),
    "zeros_ones_like": (lambda x: (np.zeros_like(x.numpy()),
                                   np.ones_like(x.numpy(), dtype=np.int64),
                                   np.full_like(x.numpy(), 2.7)), ints(3, 4)),
    "zeros_like_plus": (lambda x: np.zeros_like(x.numpy()) + x.numpy(), f32(3, 4)),
}


@pytest.mark.parametrize("name", list(SHAPES))
def test_shape_function_matches_numpy(name):
    fn, make = SHAPES[name]
    run_traced(fn, make)


def test_metadata_is_constant():
    """shape/ndim/size/dtype/len are answered at compile time (no graph at all)."""
    def meta(x):
        a = x.numpy()
        return a.shape, a.ndim, a.size, a.dtype, a.itemsize, a.nbytes, len(a), a.dtype == np.int32

    run_traced(meta, ints(3, 4), graphs=0)


# --- indexing -----------------------------------------------------------------------------------
INDEXING = {
    "row": (lambda x: x.numpy()[0], f32(3, 4)),
    "element_is_scalar": (lambda x: x.numpy()[1, 2], ints(3, 4)),
    "slices": (lambda x: x.numpy()[1:, ::2], f32(3, 4)),
    "ellipsis_none": (lambda x: x.numpy()[..., None, 1], f32(2, 3, 4)),
    "negative_index": (lambda x: x.numpy()[-1], f64(3, 4)),
    "list_index": (lambda x: x.numpy()[[0, 2]], f32(3, 4)),
    "int_array_index": (lambda x: x.numpy()[np.argmax(x.numpy(), axis=0)], f32(3, 4)),
    "iterate_rows": (lambda x: [row.sum() for row in x.numpy()], f32(3, 4)),
}


@pytest.mark.parametrize("name", list(INDEXING))
def test_indexing_matches_numpy(name):
    fn, make = INDEXING[name]
    run_traced(fn, make)


# --- writes through arrays ----------------------------------------------------------------------
def set_items(x):
    a = x.numpy()
    a[0] = 1.5
    a[:, 1] = a[:, 0] * 2
    return a.sum(), x


def set_int_from_float(x):
    a = x.numpy()
    a[1] = 2.7  # NumPy truncates into the int array
    a[0] = a[2] / 4
    return a


def masked_set(x):
    a = (x * 3).numpy()
    a[a > 0] = 0  # a boolean mask in a write has no data-dependent shape
    a[np.isnan(a)] = a.min()
    return a


def add_in_place(x):
    a = x.numpy()
    b = a
    a += 1
    a *= 2
    return b is a, a, x


@pytest.mark.parametrize("fn,make", [(set_items, f32(3, 4)), (set_int_from_float, ints(3, 4)),
                                     (masked_set, f32(3, 4)), (add_in_place, f32(3, 4))],
                         ids=["set_items", "set_int_from_float", "masked_set", "add_in_place"])
def test_writes_reach_the_tensor_as_in_eager(fn, make):
    """An array from .numpy() shares memory with its tensor: writes through it change the
    tensor (the input here), in the compiled function exactly as in eager."""
    run_traced(fn, make)


# --- back to torch --------------------------------------------------------------------------------
def round_trip(x):
    a = np.exp(x.numpy()) * 2
    t = torch.from_numpy(a)
    u = torch.as_tensor(a.sum(axis=0))
    return t + x, u.dtype, torch.as_tensor(a, dtype=torch.float64), torch.tensor(a).relu()


def test_from_numpy_and_as_tensor_give_tensors_back():
    run_traced(round_trip, f32(3, 4))
