"""A stand-in for `triton.language.extra.libdevice` under `TRITON_INTERPRET=1`.

Triton's interpreter patches `tl` and `tl.math` but not libdevice (its functions return None
there), so generated modules import this instead when interpreting. Each function applies the
numpy equivalent to the interpreter tensor's data (float32/float64 only; an interpreter
internal: `tensor.handle` is a `TensorHandle(data, dtype)`, checked on triton 3.7 and 3.9).
The functions and their numpy equivalents are the math-op table's (`op_table.LIBDEVICE`).
"""
from __future__ import annotations

import numpy as np
import triton.language as tl
from triton.runtime.interpreter import TensorHandle

from kiln.lower.op_table import LIBDEVICE

__all__ = sorted([*LIBDEVICE, "check_index", "to_bf16"])


def _wrap(np_fn):
    def fn(*args):
        ref = next(a for a in args if isinstance(a, tl.tensor))
        data = [a.handle.data if isinstance(a, tl.tensor) else a for a in args]
        out = np.asarray(np_fn(*data)).astype(ref.handle.data.dtype)
        return tl.tensor(TensorHandle(out, ref.handle.dtype.scalar), ref.type)

    fn.__name__ = np_fn.__name__
    return fn


for _name, _numpy_name in LIBDEVICE.items():  # libdevice.tanh = np.tanh on the data, ...
    globals()[_name] = _wrap(getattr(np, _numpy_name))


class KernelIndexError(IndexError, RuntimeError):
    """An out-of-range index in a generated kernel. Eager raises IndexError for some ops (`x[i]`,
    embedding) and RuntimeError for others (gather, index_select); this is both, so a caller's
    `except` written against eager still catches it."""


def check_index(ok: tl.tensor) -> None:
    """The interpreter's `_check_index`: Triton's interpreter drops `tl.device_assert` (it reads
    no debug option), so a kernel that would read outside a buffer raises here instead."""
    data = np.asarray(ok.handle.data)
    if not data.all():
        raise KernelIndexError(f"kiln: index out of bounds in a generated kernel "
                         f"({int((~data.astype(bool)).sum())} lanes)")


def to_bf16(x: tl.tensor) -> tl.tensor:
    """The interpreter's `_to_bf16`: `x.to(tl.bfloat16)` rounded to nearest even, as the GPU
    (`cvt.rn.bf16.f32`) and torch round. Triton's interpreter truncates the mantissa of an
    fp32 -> bf16 cast (checked on triton 3.9: 0.16272 became 0.16211, torch gives 0.16309) and
    reinterprets the bits of an fp64 one. float64 goes through float32, as torch converts."""
    data = np.asarray(x.handle.data).astype(np.float32)
    bits = data.view(np.uint32)
    one, half = np.uint32(1), np.uint32(0x7FFF)
    rounded = (bits + half + ((bits >> np.uint32(16)) & one)) >> np.uint32(16)
    quiet_nan = (bits >> np.uint32(16)) | np.uint32(0x40)  # keep the sign, never round to inf
    out = np.where(np.isnan(data), quiet_nan, rounded).astype(np.uint16)
    ty = x.type.with_element_ty(tl.bfloat16) if x.type.is_block() else tl.bfloat16
    return tl.tensor(TensorHandle(out, tl.bfloat16), ty)
