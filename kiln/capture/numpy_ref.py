"""NumPy's own answer for a traced NumPy call: the reference every mapping is checked against.

Before a NumPy call on traced arrays becomes torch ops, kiln runs the *real* NumPy callable at
compile time on stand-ins: read-only zero arrays with the traced dtypes and shapes (made with
`np.broadcast_to`, so they cost no memory) and NumPy scalars where the traced value is a scalar.
NumPy then says what the result is (its dtype, its shape, whether it is a scalar or an array) and
whether the call raises at all: result dtypes never depend on values in NumPy 2 (NEP 50), so the
stand-ins answer exactly. A call that raises on the stand-ins breaks the graph there, so eager
NumPy raises the real error. The torch result must then agree on dtype and shape, or capture
breaks at that call (never a wrong answer).
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import TYPE_CHECKING, Any, Callable

import torch

from kiln.capture.unsupported import unsupported

try:
    import numpy as np
except ImportError:  # pragma: no cover - NumPy is optional
    np = None

if TYPE_CHECKING:
    from kiln.capture.variables.base import VT

__all__ = ["np", "NumpyRef", "torch_dtype", "numpy_dtype", "reference", "standin",
           "MAX_REFERENCE_ELEMENTS", "check_python_ints"]

# The dtypes traced NumPy code may carry: the ones NumPy and torch compute alike. float16
# (NumPy rounds some ops differently), complex, and unsigned types wider than 8 bits (torch has
# no full kernels for them) break instead.
_DTYPES = ({} if np is None else {
    np.dtype(np.bool_): torch.bool, np.dtype(np.uint8): torch.uint8,
    np.dtype(np.int8): torch.int8, np.dtype(np.int16): torch.int16,
    np.dtype(np.int32): torch.int32, np.dtype(np.int64): torch.int64,
    np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64,
})
_NUMPY_OF = {v: k for k, v in _DTYPES.items()}

# Stand-in results are real allocations: beyond this many elements in the inputs, capture breaks
# instead of checking (the check would cost more than the graph saves at compile time).
MAX_REFERENCE_ELEMENTS = 1 << 22


def torch_dtype(dtype: Any) -> torch.dtype:
    """The torch dtype of a NumPy dtype; Unsupported when kiln does not trace that dtype."""
    found = _DTYPES.get(np.dtype(dtype))
    if found is None:
        unsupported("numpy-dtype", f"NumPy dtype {np.dtype(dtype)} is not traced as a tensor",
                    hint="bool, uint8, int8/16/32/64, float32 and float64 are")
    return found


def numpy_dtype(dtype: torch.dtype) -> Any:
    """The NumPy dtype of a torch dtype; None when kiln does not trace that dtype."""
    return _NUMPY_OF.get(dtype)


@dataclasses.dataclass(frozen=True)
class NumpyRef:
    """What NumPy returns for a call: an ndarray or a NumPy scalar, its dtype and shape."""

    dtype: Any  # numpy dtype
    shape: tuple[int, ...]
    scalar: bool

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch_dtype(self.dtype)


def standin(vt: VT, *, writable: bool = False) -> Any:
    """The NumPy value a tracker stands for during the reference run (trackers that are not
    NumPy values, numbers or containers of them raise Unsupported)."""
    from kiln.capture.variables.containers import ListVT, SliceVT, TupleVT
    from kiln.capture.variables.ndarray import NdarrayVT
    if isinstance(vt, NdarrayVT):
        dtype = vt.np_dtype
        if vt.scalar:
            return np.zeros((), dtype)[()]
        if writable:
            return np.zeros(vt.shape, dtype)
        return np.broadcast_to(np.zeros((), dtype), vt.shape)
    if isinstance(vt, TupleVT):
        return tuple(standin(i) for i in vt.items)
    if isinstance(vt, ListVT):
        return [standin(i) for i in vt.items]
    if isinstance(vt, SliceVT):
        return slice(*(standin(p) for p in (vt.start, vt.stop, vt.step)))
    from kiln.capture.variables.scalars import SymScalarVT
    if isinstance(vt, SymScalarVT) or vt.is_constant():
        value = vt.as_constant()
        if _plain_value(value):
            return value
    unsupported("numpy-argument", f"{vt.describe()} cannot be passed to traced NumPy code",
                hint="only arrays from tensor.numpy(), Python numbers, dtypes and tuples of "
                     "them are traced")


def _plain_value(value: Any) -> bool:
    if value is None or value is Ellipsis or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (np.dtype, np.generic)):
        return not isinstance(value, np.generic) or np.dtype(type(value)) in _DTYPES
    if isinstance(value, type) and issubclass(value, (np.generic, bool, int, float)):
        return True
    if isinstance(value, (tuple, list)):
        return all(_plain_value(v) for v in value)
    return False


def _elements(value: Any) -> int:
    if isinstance(value, np.ndarray):
        return value.size
    if isinstance(value, (tuple, list)):
        return sum(_elements(v) for v in value)
    return 1


def reference(call: Callable[..., Any], args: list, kwargs: dict, what: str) -> Any:
    """Run `call(*args, **kwargs)` on stand-ins (already made) and return what NumPy returned;
    an exception becomes Unsupported (eager NumPy raises it at the graph break)."""
    if _elements(args) + _elements(list(kwargs.values())) > MAX_REFERENCE_ELEMENTS:
        unsupported("numpy-too-large", f"{what} on arrays of more than "
                    f"{MAX_REFERENCE_ELEMENTS} elements is not traced",
                    hint="kiln checks each NumPy call on stand-in arrays at compile time")
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return call(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - NumPy's own error, raised again by eager code
        unsupported("numpy-raises", f"{what} raises {type(err).__name__} in NumPy: {err}",
                    category="user-fixable", hint="eager NumPy runs this call at a graph break")


def describe_result(value: Any, what: str) -> NumpyRef:
    """The NumpyRef of a reference result that must be one array or NumPy scalar."""
    if isinstance(value, np.ndarray):
        return NumpyRef(value.dtype, tuple(value.shape), False)
    if isinstance(value, np.generic):
        return NumpyRef(np.dtype(type(value)), (), True)
    unsupported("numpy-result", f"{what} returns {type(value).__name__}, which is not traced")


def check_python_ints(values: list[Any], dtype: Any, what: str) -> None:
    """Python ints in integer arithmetic must fit the computation dtype: NumPy compares or clips
    out-of-range ints exactly, torch would wrap them around."""
    if dtype.kind not in "iub":
        return
    info = np.iinfo(dtype) if dtype.kind != "b" else None
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool):
            if info is None or not info.min <= value <= info.max:
                unsupported("numpy-int-range", f"{what}: the Python int {value} does not fit "
                            f"{dtype}", hint="NumPy handles this case; eager runs it")
