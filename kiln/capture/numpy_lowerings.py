"""The NumPy functions and ndarray methods kiln traces, each as torch ops (see numpy_ops.py).

A lowering is `lower(call, *args, **kwargs)` with NumPy's parameter names for the subset kiln
maps; arguments it does not accept (`out=`, `where=`, `initial=`, `order='F'`, ...) make the
call break. `call.ref` is NumPy's own answer on stand-ins: its dtype is the dtype to compute in
and its shape the shape to produce, and the result is checked against both afterwards.
"""
from __future__ import annotations

import operator
from typing import Any, Callable

import torch

from kiln.capture.numpy_ops import Call, cast, elementwise, emit, method, operand
from kiln.capture.numpy_ref import check_python_ints, np
from kiln.capture.unsupported import unsupported
from kiln.capture.variables.base import VT, NotConstant
from kiln.capture.variables.containers import ListVT, TupleVT
from kiln.capture.variables.ndarray import NdarrayVT
from kiln.capture.variables.tensor import TensorVT

__all__ = ["METHODS", "FUNCTIONS"]


# -- argument helpers ----------------------------------------------------------------------------
def _c(value: Any) -> Any:
    """The Python value of an argument (trackers of constants, or a lowering's default)."""
    if not isinstance(value, VT):
        return value
    try:
        return value.as_constant()
    except NotConstant:
        unsupported("numpy-arguments", f"{value.describe()} as a NumPy argument must be known "
                    "at compile time")


def _array(value: Any) -> TensorVT:
    if not isinstance(value, NdarrayVT):
        unsupported("numpy-arguments", "a NumPy function on a value that is not a traced array",
                    hint="arrays from tensor.numpy() are traced")
    return value.tensor


def _refuse(call: Call, **given: Any) -> None:
    """Arguments kiln does not map: anything but their default breaks."""
    for name, value in given.items():
        if _c(value) is not None:
            unsupported("numpy-arguments", f"{call.what} with {name}= is not traced")


def _order_c(call: Call, order: Any, allowed: str = "C") -> None:
    if _c(order) not in tuple(allowed):
        unsupported("numpy-arguments", f"{call.what} with order={_c(order)!r} is not traced")


def _axes(t: TensorVT, axis: Any) -> tuple[int, ...] | None:
    axis = _c(axis)
    if axis is None:
        return None
    ndim = t.fake.dim()
    axes = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
    return tuple(operator.index(a) % max(ndim, 1) for a in axes)


def _to_ref_shape(call: Call, result: VT) -> VT:
    """keepdims=True with axis=None: torch reduces to 0-d, NumPy keeps every axis as 1."""
    if isinstance(result, TensorVT) and tuple(result.fake.shape) != call.ref.shape:
        return method(call.tx, "reshape", result, call.ref.shape)
    return result


# -- reductions ----------------------------------------------------------------------------------
def _reduce(call: Call, target: Any, t: TensorVT, axis: Any, keepdims: Any, **extra: Any) -> VT:
    dims = _axes(t, axis)
    if dims == ():
        unsupported("numpy-arguments", f"{call.what} with axis=() is not traced")
    if dims is None:
        return _to_ref_shape(call, emit(call.tx, target, t, **extra))
    return emit(call.tx, target, t, dim=dims, keepdim=bool(_c(keepdims)), **extra)


def _sum(call: Call, a: VT, axis: Any = None, dtype: Any = None, out: Any = None,
         keepdims: Any = False) -> VT:
    _refuse(call, out=out)
    if call.ref.dtype == np.bool_:
        unsupported("numpy-arguments", f"{call.what} in bool is not traced")
    return _reduce(call, torch.sum, _array(a), axis, keepdims, dtype=call.ref.torch_dtype)


def _prod(call: Call, a: VT, axis: Any = None, dtype: Any = None, out: Any = None,
          keepdims: Any = False) -> VT:
    _refuse(call, out=out)
    t, dims = _array(a), _axes(_array(a), axis)
    if call.ref.dtype == np.bool_ or (dims is not None and len(dims) != 1):
        unsupported("numpy-arguments", f"{call.what} over several axes or in bool is not traced")
    if dims is None:
        return _to_ref_shape(call, emit(call.tx, torch.prod, t, dtype=call.ref.torch_dtype))
    return emit(call.tx, torch.prod, t, dims[0], keepdim=bool(_c(keepdims)),
                dtype=call.ref.torch_dtype)


def _float_reduce(target: Any) -> Callable:
    """mean/std/var: computed in NumPy's result dtype (float64 for integer arrays)."""
    def lower(call: Call, a: VT, axis: Any = None, dtype: Any = None, out: Any = None,
              ddof: Any = 0, keepdims: Any = False) -> VT:
        _refuse(call, out=out)
        if call.ref.dtype.kind != "f":
            unsupported("numpy-arguments", f"{call.what} in {call.ref.dtype} is not traced")
        t = cast(call.tx, _array(a), call.ref.torch_dtype)
        extra = {} if target is torch.mean else {"correction": operator.index(_c(ddof))}
        if target is torch.mean and _c(ddof) != 0:
            unsupported("numpy-arguments", "mean() has no ddof")
        return _reduce(call, target, t, axis, keepdims, **extra)
    if target is torch.mean:
        def mean(call: Call, a: VT, axis: Any = None, dtype: Any = None, out: Any = None,
                 keepdims: Any = False) -> VT:
            return lower(call, a, axis, dtype, out, 0, keepdims)
        return mean
    return lower


def _extreme(target: Any) -> Callable:
    """max/min (NaN-propagating, like torch.amax/amin) and any/all."""
    def lower(call: Call, a: VT, axis: Any = None, out: Any = None, keepdims: Any = False) -> VT:
        _refuse(call, out=out)
        return _reduce(call, target, _array(a), axis, keepdims)
    return lower


def _arg_extreme(target: Any) -> Callable:
    def lower(call: Call, a: VT, axis: Any = None, out: Any = None, *,
              keepdims: Any = False) -> VT:
        _refuse(call, out=out)
        t, axis = _array(a), _c(axis)
        if axis is None:
            return _to_ref_shape(call, emit(call.tx, target, t))
        return emit(call.tx, target, t, operator.index(axis), keepdim=bool(_c(keepdims)))
    return lower


def _cumsum(call: Call, a: VT, axis: Any = None, dtype: Any = None, out: Any = None) -> VT:
    _refuse(call, out=out)
    t, axis = _array(a), _c(axis)
    if axis is None:
        t, axis = method(call.tx, "reshape", t, (-1,)), 0
    return emit(call.tx, torch.cumsum, t, operator.index(axis), dtype=call.ref.torch_dtype)


# -- shapes --------------------------------------------------------------------------------------
def _reshape(call: Call, a: VT, *shape: Any, order: Any = "C", copy: Any = None,
             newshape: Any = None, **named: Any) -> VT:
    """reshape/squeeze/expand_dims/ravel: NumPy already resolved the target shape (a view where
    NumPy views, as torch's reshape)."""
    strings = [s for s in (*shape, order) if isinstance(_c(s), str)]
    for s in strings:
        _order_c(call, s)
    if _c(copy) is not None and _c(copy) is not True:
        unsupported("numpy-arguments", f"{call.what} with copy=False is not traced")
    result = method(call.tx, "reshape", _array(a), call.ref.shape)
    return method(call.tx, "clone", result) if _c(copy) is True else result


def _ravel(call: Call, a: VT, order: Any = "C") -> VT:
    _order_c(call, order)
    return method(call.tx, "reshape", _array(a), call.ref.shape)


def _flatten(call: Call, a: VT, order: Any = "C") -> VT:
    _order_c(call, order)
    flat = method(call.tx, "reshape", _array(a), call.ref.shape)
    return emit(call.tx, torch.clone, flat, memory_format=torch.contiguous_format)


def _squeeze(call: Call, a: VT, axis: Any = None) -> VT:
    return method(call.tx, "reshape", _array(a), call.ref.shape)


def _expand_dims(call: Call, a: VT, axis: Any) -> VT:
    return method(call.tx, "reshape", _array(a), call.ref.shape)


def _transpose(call: Call, a: VT, *axes: Any, **named: Any) -> VT:
    t = _array(a)
    if set(named) - {"axes"}:
        unsupported("numpy-arguments", f"{call.what} with {sorted(named)} is not traced")
    given = [_c(x) for x in axes] + ([_c(named["axes"])] if "axes" in named else [])
    if len(given) == 1 and (given[0] is None or isinstance(given[0], (tuple, list))):
        given = given[0]
    ndim = t.fake.dim()
    perm = tuple(range(ndim))[::-1] if not given else tuple(operator.index(x) % ndim
                                                            for x in given)
    return emit(call.tx, torch.permute, t, perm)


def _swapaxes(call: Call, a: VT, axis1: Any, axis2: Any) -> VT:
    return emit(call.tx, torch.transpose, _array(a), operator.index(_c(axis1)),
                operator.index(_c(axis2)))


def _moveaxis(call: Call, a: VT, source: Any, destination: Any) -> VT:
    return emit(call.tx, torch.movedim, _array(a), _c(source), _c(destination))


def _copy_method(call: Call, a: VT, order: Any = "C") -> VT:
    _order_c(call, order, "CKA")
    layout = torch.contiguous_format if _c(order) == "C" else torch.preserve_format
    return emit(call.tx, torch.clone, _array(a), memory_format=layout)


def _copy_function(call: Call, a: VT, order: Any = "K", subok: Any = False) -> VT:
    return _copy_method(call, a, order)


def _astype(call: Call, a: VT, dtype: Any, order: Any = "K", casting: Any = "unsafe",
            subok: Any = True, copy: Any = True) -> VT:
    _order_c(call, order, "CKA")
    t = _array(a)
    if not _c(copy) and t.fake.dtype == call.ref.torch_dtype:
        return a  # astype(copy=False) to the same dtype is the array itself
    converted = cast(call.tx, t, call.ref.torch_dtype)
    return converted if converted is not t else method(call.tx, "clone", t)


# -- elementwise functions -----------------------------------------------------------------------
def _ufunc(target: Any, nin: int, tensors_only: bool) -> Callable:
    """A ufunc called with its operands only (out=, where=, dtype=, casting= break)."""
    def lower(call: Call, *operands: VT) -> VT:
        if len(operands) != nin:
            unsupported("numpy-arguments", f"{call.what} with {len(operands)} operands")
        return elementwise(call, target, list(operands), tensors_only=tensors_only)
    return lower


def _as_tensor(call: Call, vt: VT, dtype: torch.dtype) -> TensorVT:
    value = operand(vt)
    if isinstance(value, TensorVT):
        return cast(call.tx, value, dtype)
    check_python_ints([value] if type(value) is int else [], call.ref.dtype, call.what)
    return emit(call.tx, torch.full, (), value, dtype=dtype)


def _where(call: Call, condition: VT, x: VT, y: VT) -> VT:
    cond = _array(condition)
    if cond.fake.dtype is not torch.bool:
        cond = cast(call.tx, cond, torch.bool)  # NumPy: nonzero (NaN included) is True
    dtype = call.ref.torch_dtype
    return emit(call.tx, torch.where, cond, _as_tensor(call, x, dtype), _as_tensor(call, y, dtype))


def _clip(call: Call, a: VT, a_min: Any = None, a_max: Any = None, out: Any = None, *,
          min: Any = None, max: Any = None) -> VT:
    """np.clip is minimum(maximum(a, a_min), a_max), in NumPy's result dtype."""
    _refuse(call, out=out)
    dtype = call.ref.torch_dtype
    result = cast(call.tx, _array(a), dtype)
    low = a_min if _given(a_min) else min
    high = a_max if _given(a_max) else max
    if _given(low):
        result = emit(call.tx, torch.maximum, result, _as_tensor(call, low, dtype))
    if _given(high):
        result = emit(call.tx, torch.minimum, result, _as_tensor(call, high, dtype))
    return result


def _given(value: Any) -> bool:
    return value is not None and not (isinstance(value, VT) and value.is_constant()
                                      and value.as_constant() is None)


def _sequence(value: VT) -> list[VT]:
    if not isinstance(value, (TupleVT, ListVT)):
        unsupported("numpy-arguments", "a sequence of arrays must be a tuple or a list")
    return list(value.items)


def _join(target: Any) -> Callable:
    """concatenate/stack: every array cast to NumPy's result dtype first."""
    def lower(call: Call, arrays: VT, axis: Any = 0, out: Any = None, *, dtype: Any = None,
              casting: Any = "same_kind") -> VT:
        _refuse(call, out=out)
        tensors = [cast(call.tx, _array(v), call.ref.torch_dtype) for v in _sequence(arrays)]
        axis = _c(axis)
        if axis is None:  # concatenate(axis=None) joins the flattened arrays
            tensors = [method(call.tx, "reshape", t, (-1,)) for t in tensors]
            axis = 0
        return emit(call.tx, target, ListVT(tensors), operator.index(axis))
    return lower


def _dot(call: Call, a: VT, b: VT, out: Any = None) -> VT:
    _refuse(call, out=out)
    x, y = (cast(call.tx, _array(v), call.ref.torch_dtype) for v in (a, b))
    if x.fake.dim() == 0 or y.fake.dim() == 0:
        return emit(call.tx, operator.mul, x, y)
    if x.fake.dim() > 2 or y.fake.dim() > 2:
        unsupported("numpy-arguments", "numpy.dot() of arrays with more than 2 dimensions")
    return emit(call.tx, torch.matmul, x, y)


def _filled(call: Call, *args: Any, **kwargs: Any) -> VT:
    """zeros_like/ones_like/full_like: NumPy's own result gives the (cast) fill value."""
    if any(isinstance(v, NdarrayVT) for v in (*args[1:], *kwargs.values())):
        unsupported("numpy-arguments", f"{call.what} with an array fill value is not traced")
    value = np.asarray(call.value)
    fill = value.flat[0].item() if value.size else 0
    return emit(call.tx, torch.full, call.ref.shape, fill, dtype=call.ref.torch_dtype)


# -- tables --------------------------------------------------------------------------------------
_UNARY = {
    "exp": torch.exp, "exp2": torch.exp2, "expm1": torch.expm1, "log": torch.log,
    "log2": torch.log2, "log10": torch.log10, "log1p": torch.log1p, "sqrt": torch.sqrt,
    "absolute": torch.abs, "negative": operator.neg, "sin": torch.sin, "cos": torch.cos,
    "tan": torch.tan, "arcsin": torch.asin, "arccos": torch.acos, "arctan": torch.atan,
    "sinh": torch.sinh, "cosh": torch.cosh, "tanh": torch.tanh, "arcsinh": torch.asinh,
    "arccosh": torch.acosh, "arctanh": torch.atanh, "floor": torch.floor, "ceil": torch.ceil,
    "trunc": torch.trunc, "rint": torch.round, "square": torch.square, "isnan": torch.isnan,
    "isinf": torch.isinf, "isfinite": torch.isfinite, "logical_not": torch.logical_not,
    "invert": operator.invert,
}
_BINARY = {
    "add": operator.add, "subtract": operator.sub, "multiply": operator.mul,
    "true_divide": operator.truediv, "floor_divide": operator.floordiv,
    "remainder": operator.mod, "fmod": torch.fmod, "power": operator.pow,
    "maximum": torch.maximum, "minimum": torch.minimum, "arctan2": torch.atan2,
    "hypot": torch.hypot, "logical_and": torch.logical_and, "logical_or": torch.logical_or,
    "logical_xor": torch.logical_xor, "bitwise_and": operator.and_,
    "bitwise_or": operator.or_, "bitwise_xor": operator.xor, "equal": operator.eq,
    "not_equal": operator.ne, "less": operator.lt, "less_equal": operator.le,
    "greater": operator.gt, "greater_equal": operator.ge, "matmul": torch.matmul,
}
_REDUCTIONS = {
    "sum": _sum, "prod": _prod, "mean": _float_reduce(torch.mean), "std": _float_reduce(torch.std),
    "var": _float_reduce(torch.var), "max": _extreme(torch.amax), "min": _extreme(torch.amin),
    "any": _extreme(torch.any), "all": _extreme(torch.all), "argmax": _arg_extreme(torch.argmax),
    "argmin": _arg_extreme(torch.argmin), "cumsum": _cumsum,
}
METHODS: dict[str, Callable] = {
    **_REDUCTIONS, "reshape": _reshape, "transpose": _transpose, "squeeze": _squeeze,
    "ravel": _ravel, "flatten": _flatten, "swapaxes": _swapaxes, "copy": _copy_method,
    "astype": _astype, "clip": _clip, "dot": _dot,
}


def _needs_tensors(target: Any) -> bool:
    """torch functions (maximum, atan2, ...) take tensors; operators take Python numbers too."""
    return getattr(target, "__module__", None) not in ("_operator", "operator")


def _functions() -> dict[Any, Callable]:
    if np is None:
        return {}
    table: dict[Any, Callable] = {}
    for name, target in _UNARY.items():
        table[getattr(np, name)] = _ufunc(target, 1, False)
    for name, target in _BINARY.items():
        table[getattr(np, name)] = _ufunc(target, 2, _needs_tensors(target))
    named = {**_REDUCTIONS, "amax": _REDUCTIONS["max"], "amin": _REDUCTIONS["min"],
             "reshape": _reshape, "transpose": _transpose, "squeeze": _squeeze,
             "expand_dims": _expand_dims, "ravel": _ravel, "swapaxes": _swapaxes,
             "moveaxis": _moveaxis, "copy": _copy_function, "where": _where, "clip": _clip,
             "concatenate": _join(torch.cat), "stack": _join(torch.stack), "dot": _dot,
             "zeros_like": _filled, "ones_like": _filled, "full_like": _filled}
    for name, lower in named.items():
        fn = getattr(np, name, None)
        if fn is not None:
            table[fn] = lower
    return table


FUNCTIONS: dict[Any, Callable] = _functions()
