"""NumPy arrays made from tensors, traced as tensors (as TorchDynamo does with torch._numpy).

`t.numpy()` on a CPU tensor that does not require grad gives an `NdarrayVT` backed by the
tensor's own graph value: the array and the tensor share memory, as in eager. NumPy methods,
functions and operators on it become torch ops with NumPy's semantics (`kiln/capture/numpy_ops.py`)
and give `NdarrayVT`s again: arrays, or NumPy scalars (`scalar=True`, a 0-d tensor) where NumPy
returns `np.float32(...)` and friends. Whatever has no faithful mapping stops capture at that call,
where a graph break runs it natively on real arrays (rebuilt by the entry as `tensor.numpy()` of
the graph output, so aliasing between the array and its tensor is kept).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from kiln.capture.numpy_ref import np, numpy_dtype
from kiln.capture.unsupported import unsupported
from kiln.capture.variables.base import VT, ConstantVT
from kiln.capture.variables.functions import OpaqueCallableVT
from kiln.capture.variables.objects import OpaqueMethodVT
from kiln.capture.variables.tensor import TensorVT

if TYPE_CHECKING:
    from kiln.capture.translator import Translator

__all__ = ["NdarrayVT", "NdarrayMethodVT", "NumpyFunctionVT", "ndarray_from_tensor"]

# Attributes answered at compile time (shapes are static, dtypes known).
_METADATA = ("shape", "ndim", "size", "dtype", "itemsize", "nbytes")


class NdarrayVT(VT):
    """A NumPy array (or NumPy scalar) whose values are the tensor `tensor` in the graph."""

    def __init__(self, tensor: TensorVT, scalar: bool = False) -> None:
        self.tensor = tensor
        self.scalar = scalar

    @property
    def np_dtype(self) -> Any:
        return numpy_dtype(self.tensor.fake.dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.tensor.fake.shape)

    def python_type(self) -> type:
        return self.np_dtype.type if self.scalar else np.ndarray

    def getattr(self, tx: Translator, name: str) -> VT:
        from kiln.capture import numpy_ops
        if name in _METADATA:
            return _metadata(self, name)
        if name == "__class__":
            from kiln.capture.variables.objects import ClassVT
            return ClassVT(self.python_type())
        if name == "T":
            return numpy_ops.call_method(tx, self, "transpose", [], {})
        owner = np.generic if self.scalar else np.ndarray
        if callable(getattr(owner, name, None)):
            return NdarrayMethodVT(self, name)
        unsupported("numpy-attribute", f"ndarray.{name} is not traced",
                    hint="kiln breaks the graph where the array is used this way")

    def call_method(self, tx: Translator, name: str, args: list[VT],
                    kwargs: dict[str, VT]) -> VT:
        return self.getattr(tx, name).call(tx, args, kwargs)

    def unpack(self, tx: Translator) -> list[VT]:
        from kiln.capture import numpy_ops
        if not self.shape:
            unsupported("not-iterable", "iteration over a 0-d array", category="user-fixable")
        return [numpy_ops.getitem(tx, self, ConstantVT(i)) for i in range(self.shape[0])]

    def truth(self, tx: Translator) -> bool:
        unsupported("data-dependent-branch", "a Python branch on a NumPy value computed from "
                    "tensors needs the value at compile time",
                    hint="use np.where, or compute the condition outside the compiled function")

    def describe(self) -> str:
        kind = f"NumPy {self.np_dtype} scalar" if self.scalar else \
            f"ndarray {self.shape} {self.np_dtype}"
        return f"{kind} (traced)"


def _metadata(arr: NdarrayVT, name: str) -> VT:
    from kiln.capture.variables.containers import TupleVT
    shape = arr.shape
    if name == "shape":
        return TupleVT([ConstantVT(d) for d in shape])
    if name == "dtype":
        return ConstantVT(arr.np_dtype)
    size = 1
    for d in shape:
        size *= d
    values = {"ndim": len(shape), "size": size, "itemsize": arr.np_dtype.itemsize,
              "nbytes": size * arr.np_dtype.itemsize}
    return ConstantVT(values[name])


class NdarrayMethodVT(OpaqueMethodVT):
    """`arr.method` before the call: traced when numpy_ops maps it, else the call breaks (and the
    break runs `array.method(...)` on the rebuilt array)."""

    def call(self, tx: Translator, args: list[VT], kwargs: dict[str, VT]) -> VT:
        from kiln.capture import numpy_ops
        return numpy_ops.call_method(tx, self.owner, self.name, args, kwargs)


class NumpyFunctionVT(OpaqueCallableVT):
    """A NumPy function or ufunc with a torch mapping. Called on traced arrays it is traced;
    called on anything else it breaks the graph, as any opaque callable does."""

    kind = "NumPy function"

    def call(self, tx: Translator, args: list[VT], kwargs: dict[str, VT]) -> VT:
        from kiln.capture import numpy_ops
        return numpy_ops.call_function(tx, self, args, kwargs)


def ndarray_from_tensor(tx: Translator, tensor: TensorVT, args: list[VT],
                        kwargs: dict[str, VT]) -> VT | None:
    """`tensor.numpy()` as a traced array, or None where eager would raise or do more than share
    memory (a tensor requiring grad, not on the CPU, of a dtype kiln does not trace, force=)."""
    fake = tensor.fake
    if np is None or not tx.output.trace_numpy or args or kwargs:
        return None
    if fake.device.type != "cpu" or fake.requires_grad or fake.layout is not torch.strided:
        return None
    if numpy_dtype(fake.dtype) is None or fake.is_conj() or fake.is_neg():
        return None
    tx.output.numpy_traced = True
    return NdarrayVT(tensor)
