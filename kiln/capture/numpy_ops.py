"""NumPy on traced arrays as torch ops: the entry points capture calls, and elementwise maths.

Every traced NumPy operation goes the same way:
1. NumPy's answer on stand-ins (`numpy_ref.reference`): result dtype, shape, scalar or array, or
   the error eager NumPy would raise (then capture breaks at that call);
2. torch ops computing the same values, in the dtype NumPy computes in: operands are cast to it
   first, so torch's own promotion rules never decide anything (`int_arr / 2` is float64,
   `f32_arr.sum()` float32, `int32_arr.sum()` int64);
3. a check that the torch result has NumPy's dtype and shape (else capture breaks there).

Integer cases where torch and NumPy differ on *values* are handled or refused explicitly:
integer `//` and `%` by zero give 0 in NumPy (torch raises), integer powers with array exponents
raise in NumPy for negative exponents (refused), Python ints out of the dtype's range (refused).
Reductions, shape functions and the function tables are in `numpy_lowerings.py`.
"""
from __future__ import annotations

import dataclasses
import inspect
import operator
from typing import TYPE_CHECKING, Any, Callable

import torch

from kiln.capture import _compat
from kiln.capture.numpy_ref import (NumpyRef, check_python_ints, describe_result, np, reference,
                                    standin, torch_dtype)
from kiln.capture.unsupported import unsupported
from kiln.capture.variables.base import VT, ConstantVT
from kiln.capture.variables.containers import ListVT, SliceVT, TupleVT
from kiln.capture.variables.ndarray import NdarrayVT
from kiln.capture.variables.scalars import SymScalarVT
from kiln.capture.variables.tensor import TensorVT, graph_call, size_vt

if TYPE_CHECKING:
    from kiln.capture.translator import Translator
    from kiln.capture.variables.ndarray import NumpyFunctionVT

__all__ = ["Call", "call_method", "call_function", "binary", "unary", "getitem", "setitem",
           "torch_interop", "emit", "method", "cast", "finish", "elementwise", "operand",
           "has_array"]


@dataclasses.dataclass
class Call:
    """One traced NumPy call: the translator, NumPy's reference result and its description."""

    tx: Translator
    ref: NumpyRef
    value: Any  # what NumPy returned on the stand-ins
    what: str


# -- graph helpers -------------------------------------------------------------------------------
def _vt(x: Any) -> VT:
    return x if isinstance(x, VT) else ConstantVT(x)


def emit(tx: Translator, target: Any, *args: Any, **kwargs: Any) -> VT:
    args, kwargs = [_vt(a) for a in args], {k: _vt(v) for k, v in kwargs.items()}
    _probe_kernel(target, args, kwargs)
    return graph_call(tx, "call_function", target, args, kwargs)


def method(tx: Translator, name: str, t: TensorVT, *args: Any, **kwargs: Any) -> VT:
    args, kwargs = [t, *(_vt(a) for a in args)], {k: _vt(v) for k, v in kwargs.items()}
    _probe_kernel(lambda self, *rest, **kw: getattr(self, name)(*rest, **kw), args, kwargs)
    return graph_call(tx, "call_method", name, args, kwargs)


def _probe_kernel(target: Any, args: list[VT], kwargs: dict[str, VT]) -> None:
    """Run `target` once on real tensors of the traced dtypes and shapes (filled with ones, so
    no division by zero): fake tensors accept dtypes some CPU kernels lack (torch.abs on bool),
    and such an op must break at compile time, not raise when the graph runs."""
    def real(vt: Any) -> Any:
        if isinstance(vt, TensorVT):  # sizes as seen while tracing: a probe guards nothing
            return torch.ones([_compat.hint(d) for d in vt.fake.shape], dtype=vt.fake.dtype)
        if isinstance(vt, (ListVT, TupleVT)):
            return type(vt.items)(real(i) for i in vt.items)
        if isinstance(vt, SymScalarVT) and vt.is_size():
            return _compat.hint(vt.value)
        return vt.as_constant() if isinstance(vt, VT) else vt
    try:
        with torch.no_grad():
            target(*(real(a) for a in args), **{k: real(v) for k, v in kwargs.items()})
    except Exception as err:  # noqa: BLE001 - the kernel's own refusal
        name = getattr(target, "__name__", "the torch mapping")
        unsupported("numpy-no-kernel", f"{name} has no CPU kernel for these dtypes "
                    f"({type(err).__name__}: {err})", hint="eager NumPy runs it")


def cast(tx: Translator, t: TensorVT, dtype: torch.dtype) -> TensorVT:
    return t if t.fake.dtype == dtype else method(tx, "to", t, dtype)


def finish(call: Call, result: VT) -> NdarrayVT:
    """The traced result, after checking it is what NumPy returns."""
    if isinstance(result, NdarrayVT):
        result = result.tensor
    ref = call.ref
    want = ref.torch_dtype
    if not isinstance(result, TensorVT) or result.fake.dtype != want or \
            tuple(result.fake.shape) != ref.shape:
        got = f"{result.fake.dtype} {tuple(result.fake.shape)}" if isinstance(
            result, TensorVT) else result.describe()
        unsupported("numpy-mismatch", f"{call.what}: the torch mapping gives {got}, NumPy gives "
                    f"{ref.dtype} {ref.shape}", hint="kiln breaks the graph here rather than "
                    "return a different result")
    call.tx.output.numpy_traced = True
    return NdarrayVT(result, ref.scalar)


def operand(vt: VT) -> Any:
    """A traced array's tensor, or a Python number (NumPy scalars of known value included)."""
    if isinstance(vt, NdarrayVT):
        return vt.tensor
    if isinstance(vt, SymScalarVT):
        return vt.as_constant()
    if vt.is_constant():
        value = vt.as_constant()
        if np is not None and isinstance(value, np.generic):
            value = value.item()
        if isinstance(value, (bool, int, float)):
            return value
    unsupported("numpy-operand", f"{vt.describe()} as an operand of traced NumPy code",
                hint="traced NumPy code takes arrays from tensor.numpy() and Python numbers")


def has_array(values: Any) -> bool:
    if isinstance(values, NdarrayVT):
        return True
    if isinstance(values, (TupleVT, ListVT)):
        return has_array(values.items)
    if isinstance(values, dict):
        return has_array(list(values.values()))
    if isinstance(values, (list, tuple)):
        return any(has_array(v) for v in values)
    return False


def _bind_check(lower: Callable, args: list, kwargs: dict, what: str) -> None:
    try:
        inspect.signature(lower).bind(None, *args, **kwargs)
    except TypeError as err:
        unsupported("numpy-arguments", f"{what} with these arguments is not traced ({err})",
                    hint="kiln traces the common arguments (axis, keepdims, dtype, ddof)")


def traced_call(tx: Translator, what: str, lower: Callable, ref_call: Callable,
                args: list[VT], kwargs: dict[str, VT]) -> NdarrayVT:
    """NumPy's reference answer, then `lower(call, *args, **kwargs)` checked against it."""
    stands = [standin(a) for a in args]
    kw_stands = {k: standin(v) for k, v in kwargs.items()}
    value = reference(ref_call, stands, kw_stands, what)
    call = Call(tx, describe_result(value, what), value, what)
    _bind_check(lower, args, kwargs, what)
    return finish(call, lower(call, *args, **kwargs))


# -- entry points --------------------------------------------------------------------------------
def call_method(tx: Translator, arr: NdarrayVT, name: str, args: list[VT],
                kwargs: dict[str, VT]) -> VT:
    from kiln.capture.numpy_lowerings import METHODS
    lower = METHODS.get(name)
    if lower is None:
        unsupported("numpy-unsupported", f"ndarray.{name}() has no torch mapping in kiln",
                    hint="kiln runs this call natively on the real array at a graph break")

    def on_standin(target: Any, *rest: Any, **kw: Any) -> Any:
        return getattr(target, name)(*rest, **kw)
    return traced_call(tx, f"ndarray.{name}()", lower, on_standin, [arr, *args], kwargs)


def call_function(tx: Translator, fn_vt: NumpyFunctionVT, args: list[VT],
                  kwargs: dict[str, VT]) -> VT:
    from kiln.capture.numpy_lowerings import FUNCTIONS
    from kiln.capture.variables.functions import OpaqueCallableVT
    fn = fn_vt.fn
    if not has_array([args, kwargs]):  # NumPy on Python values: run natively, as before
        return OpaqueCallableVT.call(fn_vt, tx, args, kwargs)
    name = getattr(fn, "__name__", repr(fn))
    return traced_call(tx, f"numpy.{name}()", FUNCTIONS[fn], fn, list(args), dict(kwargs))


def is_traced_function(value: Any) -> bool:
    from kiln.capture.numpy_lowerings import FUNCTIONS
    try:
        return value in FUNCTIONS
    except Exception:  # noqa: BLE001 - unhashable, or an __eq__ that does not answer a bool
        return False


# -- elementwise ---------------------------------------------------------------------------------
def elementwise(call: Call, target: Any, operands: list[VT], *, tensors_only: bool = False) -> VT:
    """`target(*operands)` computed in the dtype NumPy computes in. For comparisons and other
    bool results that is the operands' common dtype; otherwise the result dtype."""
    stands = [standin(v) for v in operands]
    dtype = call.ref.dtype
    if dtype == np.bool_:
        dtype = _common_dtype(stands, call.what)
    check_python_ints([s for s in stands if type(s) is int], dtype, call.what)
    compute = torch_dtype(dtype)
    tx = call.tx
    values = []
    for vt in operands:
        value = operand(vt)
        if isinstance(value, TensorVT):
            value = cast(tx, value, compute)
        elif tensors_only:
            value = emit(tx, torch.full, (), value, dtype=compute)
        values.append(value)
    return _safe_target(call, target, values, compute)(tx, *values)


def _common_dtype(stands: list, what: str) -> Any:
    """The dtype NumPy compares (or combines) the operands in."""
    try:
        return np.result_type(*stands)
    except Exception as err:  # noqa: BLE001 - e.g. a Python int outside an unsigned dtype
        unsupported("numpy-int-range", f"{what}: NumPy has no common dtype for these operands "
                    f"({type(err).__name__}: {err})", hint="eager NumPy runs it")


def _safe_target(call: Call, target: Any, values: list, compute: torch.dtype) -> Callable:
    """The emitter for `target`, with NumPy's integer division and power semantics."""
    integer = not compute.is_floating_point
    if integer and target in (operator.floordiv, operator.mod, torch.fmod):
        return _int_division(target)
    if integer and target is operator.pow and any(isinstance(v, TensorVT) for v in values[1:]):
        unsupported("numpy-int-power", f"{call.what}: integer power with an array exponent "
                    "(NumPy raises for negative exponents)", hint="eager NumPy runs it")
    return lambda tx, *args: emit(tx, target, *args)


def _int_division(target: Any) -> Callable:
    """Integer `//`, `%`, fmod: NumPy gives 0 where the divisor is 0, torch would raise."""
    def divide(tx: Translator, a: Any, b: Any) -> VT:
        if not isinstance(b, TensorVT):
            if b == 0:
                unsupported("numpy-int-zero-division", "integer division by a constant 0",
                            hint="eager NumPy runs it")
            return emit(tx, target, a, b)
        zero = emit(tx, operator.eq, b, 0)
        safe = emit(tx, torch.where, zero, 1, b)
        return emit(tx, torch.where, zero, 0, emit(tx, target, a, safe))
    return divide


# -- operators -----------------------------------------------------------------------------------
_OPERATORS = {operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
              operator.mod, operator.pow, operator.and_, operator.or_, operator.xor,
              operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne}
_INPLACE = {operator.iadd: operator.add, operator.isub: operator.sub,
            operator.imul: operator.mul, operator.itruediv: operator.truediv,
            operator.iand: operator.and_, operator.ior: operator.or_,
            operator.ixor: operator.xor, operator.ipow: operator.pow}


def binary(tx: Translator, op: Callable, a: VT, b: VT) -> VT:
    """`a <op> b` where one side is a traced array or NumPy scalar."""
    if isinstance(a, TensorVT) or isinstance(b, TensorVT):
        unsupported("numpy-tensor-mix", "an operator between a tensor and a NumPy array",
                    hint="convert with torch.from_numpy(arr) or tensor.numpy() first")
    name = getattr(op, "__name__", str(op))
    if op in _INPLACE and isinstance(a, NdarrayVT) and not a.scalar:
        return _inplace(tx, op, a, b)
    plain = _INPLACE.get(op, op)
    if plain is operator.matmul or op is operator.imatmul:
        plain, target = operator.matmul, torch.matmul
    elif plain in _OPERATORS:
        target = plain
    else:
        unsupported("numpy-unsupported", f"operator {name} on NumPy arrays has no torch mapping",
                    hint="kiln runs this natively after a graph break")

    def lower(call: Call, x: VT, y: VT) -> VT:
        return elementwise(call, target, [x, y], tensors_only=target is torch.matmul)
    return traced_call(tx, f"operator {name}", lower, plain, [a, b], {})


def _inplace(tx: Translator, op: Callable, a: NdarrayVT, b: VT) -> VT:
    """`a += b` on an array: in place, in a's dtype (NumPy's same_kind rule is checked on a
    writable stand-in; a cast that changes the dtype is left to eager)."""
    what = f"operator {op.__name__}"
    stand_a, stand_b = standin(a, writable=True), standin(b)
    reference(op, [stand_a, stand_b], {}, what)
    if _common_dtype([stand_a, stand_b], what) != a.np_dtype:
        unsupported("numpy-inplace-cast", f"{what}: the result is cast back to {a.np_dtype}",
                    hint="eager NumPy runs it")
    plain = _INPLACE[op]
    if plain is operator.pow and not a.np_dtype.kind == "f" and isinstance(b, NdarrayVT):
        unsupported("numpy-int-power", f"{what}: integer power with an array exponent")
    check_python_ints([stand_b] if type(stand_b) is int else [], a.np_dtype, what)
    other = operand(b)
    if isinstance(other, TensorVT):
        other = cast(tx, other, a.tensor.fake.dtype)
    result = emit(tx, op, a.tensor, other)
    if result is not a.tensor:
        unsupported("numpy-mismatch", f"{what} did not run in place")
    return a


def unary(tx: Translator, op: Callable, value: NdarrayVT) -> VT:
    """`-arr`, `~arr`, `+arr`, `abs(arr)`."""
    target = torch.abs if op in (abs, operator.abs) else op

    def lower(call: Call, x: VT) -> VT:
        return elementwise(call, target, [x])
    return traced_call(tx, f"operator {getattr(op, '__name__', op)}", lower, op, [value], {})


# -- indexing ------------------------------------------------------------------------------------
def _index(key: VT) -> VT:
    """The key for torch indexing (NumPy's basic and integer-array indexing are torch's)."""
    if isinstance(key, NdarrayVT):
        if key.scalar:
            unsupported("numpy-index", "indexing with a NumPy scalar computed from tensors")
        return key.tensor
    if isinstance(key, TupleVT):
        return TupleVT([_index(k) for k in key.items])
    if isinstance(key, (SliceVT, ListVT, SymScalarVT)) or key.is_constant():
        return key
    unsupported("numpy-index", f"indexing a traced array with {key.describe()}")


def getitem(tx: Translator, arr: NdarrayVT, key: VT) -> VT:
    def lower(call: Call, a: NdarrayVT, k: VT) -> VT:
        return graph_call(tx, "call_function", operator.getitem, [a.tensor, _index(k)], {})
    return traced_call(tx, "ndarray[...]", lower, operator.getitem, [arr, key], {})


def setitem(tx: Translator, arr: NdarrayVT, key: VT, value: VT) -> None:
    """`arr[key] = value`: written into the array's tensor (shared with the tensor it came
    from, as in eager). NumPy casts the value unsafely, as torch's copy does."""
    what = "ndarray[...] = value"
    if arr.scalar:
        unsupported("numpy-setitem", "item assignment on a NumPy scalar", category="user-fixable")
    reference(operator.setitem, [standin(arr, writable=True), standin(key), standin(value)], {},
              what)
    new = operand(value)
    if isinstance(new, TensorVT):
        new = cast(tx, new, arr.tensor.fake.dtype)
    graph_call(tx, "call_function", operator.setitem, [arr.tensor, _index(key), _vt(new)], {},
               keep=True)


# -- torch functions on traced arrays --------------------------------------------------------------
def torch_interop(tx: Translator, fn: Any, args: list[VT], kwargs: dict[str, VT]) -> VT:
    """torch.from_numpy / torch.as_tensor / torch.tensor on a traced array: its tensor again (a
    view sharing memory where eager shares it, a copy where eager copies)."""
    if fn not in (torch.from_numpy, torch.as_tensor, torch.tensor) or len(args) != 1 or \
            not isinstance(args[0], NdarrayVT) or set(kwargs) - {"dtype"}:
        unsupported("numpy-tensor-mix", f"{getattr(fn, '__name__', fn)}() on a NumPy array "
                    "is not traced", hint="torch.from_numpy(arr) and torch.as_tensor(arr) are")
    arr = args[0]
    t = arr.tensor
    dtype = kwargs["dtype"].as_constant() if "dtype" in kwargs else None
    if fn is torch.from_numpy:
        if arr.scalar or dtype is not None:
            unsupported("numpy-tensor-mix", "torch.from_numpy() of a NumPy scalar",
                        category="user-fixable")
        return method(tx, "view", t, size_vt(tx, t))
    converted = cast(tx, t, dtype) if dtype is not None else t
    if fn is torch.tensor or arr.scalar:
        return converted if converted is not t else method(tx, "clone", t)
    return converted if converted is not t else method(tx, "view", t, size_vt(tx, t))
