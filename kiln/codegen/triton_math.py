"""triton_math: the Triton forms of the loop-IR math ops, read from `kiln.lower.op_table`.

`print_math(printer, name, args)` is what `TritonPrinter.math` does: it looks up the op's row,
refuses operands of unknown dtype where the row `needs_dtype`, tries the row's
`triton_special` (a function in `SPECIAL_FORMS`, for forms that need code) and otherwise formats
the row's `triton` template with the operands, typing the result by the row's `result` rule.

The special forms are small functions `form(printer, dtype, *operands) -> TV | None`, `dtype`
being the operands' promoted dtype (None when unknown); None means "the template applies".
"""
from __future__ import annotations

from typing import Callable

import torch

from kiln.codegen.triton_types import TV, triton_dtype
from kiln.errors import CodegenError
from kiln.lower.op_table import MATH_OPS

__all__ = ["SPECIAL_FORMS", "print_math", "promote"]

_FAST_ERF_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # float64 keeps libdevice


def promote(*dtypes: torch.dtype | None) -> torch.dtype | None:
    """torch's promotion of the known dtypes (None when none is known)."""
    known = [d for d in dtypes if d is not None]
    if not known:
        return None
    out = known[0]
    for d in known[1:]:
        out = torch.promote_types(out, d)
    return out


def print_math(printer, name: str, args: tuple[TV, ...]) -> TV:
    """Emit `ops.<name>(*args)` into `printer` (a `TritonPrinter`) and return its value."""
    op = MATH_OPS.get(name)
    if op is None:
        raise CodegenError(f"ops.{name}: not in kiln.lower.op_table.MATH_OPS")
    dtype = promote(*(a.dtype for a in args))
    if op.needs_dtype and dtype is None:
        raise CodegenError(f"ops.{name} needs operand dtypes (pass the graph to emit_kernel)")
    if op.triton_special is not None:
        form = SPECIAL_FORMS.get(op.triton_special)
        if form is None:
            raise CodegenError(f"ops.{name}: no Triton special form {op.triton_special!r}")
        value = form(printer, dtype, *args)
        if value is not None:
            return value
    return printer._emit(op.triton.format(*args), op.result_dtype(dtype))


def _floating(dtype: torch.dtype | None) -> bool:
    return dtype is not None and dtype.is_floating_point


def true_div_text(a: TV, b: TV) -> str:
    """Floating `a / b`: IEEE-rounded `div_rn` in float32, where integer operands are converted
    first (true division of integers gives float32); `/` in the other float dtypes (float64
    division is div.rn already; half types compute in float32) and for operands of unknown dtype
    (a float64 must not be cast down). CUDA's `/` is div.full.f32 (up to 2 ulp) where eager
    divides with IEEE rounding (a mean of equal values must give the value back exactly)."""
    dtype = promote(a.dtype, b.dtype)
    if None in (a.dtype, b.dtype) or (dtype.is_floating_point and dtype != torch.float32):
        return f"{a} / {b}"
    x, y = (v.name if v.dtype == torch.float32 else f"{v}.to(tl.float32)" for v in (a, b))
    return f"tl.math.div_rn({x}, {y})"


# -- unary ---------------------------------------------------------------------------------------

def _fast_erf(p, dtype: torch.dtype | None, a: TV) -> TV | None:
    """kiln's float32 erf (`fast_math._erf_f32`): libdevice's made erf-GELU + LayerNorm
    ALU-bound. 16-bit values are computed in float32 and rounded back."""
    if dtype not in _FAST_ERF_DTYPES:
        return None
    if dtype == torch.float32:
        return p._emit(f"_erf_f32({a})", dtype)
    return p.to_dtype(p._emit(f"_erf_f32({a}.to(tl.float32))", torch.float32), dtype)


# Correctly rounded float32 forms of ops whose plain Triton spelling is approximate on CUDA:
# tl.sqrt is sqrt.approx.f32 and `/` div.full.f32, where eager's kernels use IEEE rounding.
def _ieee_sqrt(p, dtype: torch.dtype | None, a: TV) -> TV | None:
    return p._emit(f"tl.math.sqrt_rn({a})", dtype) if dtype == torch.float32 else None


def _ieee_reciprocal(p, dtype: torch.dtype | None, a: TV) -> TV | None:
    if dtype != torch.float32:
        return None
    one = p.constant(1.0, dtype)
    return p._emit(f"tl.math.div_rn({one}, {a})", dtype)


def _sign(p, dtype: torch.dtype | None, a: TV) -> TV:
    ty = triton_dtype(dtype)
    return p._emit(f"(({a} > 0).to({ty}) - ({a} < 0).to({ty}))", dtype)


# -- binary --------------------------------------------------------------------------------------

# torch computes bool + bool and bool * bool as bytes and stores them as bool: or / and (i1
# arithmetic would wrap: 1 + 1 == 0).
def _bool_or(p, dtype: torch.dtype | None, a: TV, b: TV) -> TV | None:
    return p._emit(f"{a} | {b}", dtype) if dtype == torch.bool else None


def _bool_and(p, dtype: torch.dtype | None, a: TV, b: TV) -> TV | None:
    return p._emit(f"{a} & {b}", dtype) if dtype == torch.bool else None


def _true_div(p, dtype: torch.dtype | None, a: TV, b: TV) -> TV:
    return p._emit(true_div_text(a, b), dtype if _floating(dtype) else torch.float32)


def _nan_extremum(p, dtype: torch.dtype | None, a: TV, b: TV, cmp: str) -> TV | None:
    """torch's maximum / minimum propagate NaN; tl.maximum / tl.minimum do not."""
    if not _floating(dtype):
        return None
    return p._emit(f"tl.where(({a} {cmp} {b}) | ({a} != {a}), {a}, {b})", dtype)


def _nan_maximum(p, dtype: torch.dtype | None, a: TV, b: TV) -> TV | None:
    return _nan_extremum(p, dtype, a, b, ">")


def _nan_minimum(p, dtype: torch.dtype | None, a: TV, b: TV) -> TV | None:
    return _nan_extremum(p, dtype, a, b, "<")


def _pow(p, dtype: torch.dtype, a: TV, b: TV) -> TV:
    """x ** c for a small constant c as multiplies (what torch's kernels do too);
    libdevice.pow is dozens of instructions per element and made RMSNorm ALU-bound."""
    c = p._constants.get(b.name)
    if c is not None and (dtype.is_floating_point or c in (1, 2, 3)):
        if c == 2:
            return p._emit(f"{a} * {a}", dtype)
        if c == 3:
            return p._emit(f"{a} * {a} * {a}", dtype)
        if c == 1:
            return a
    if not dtype.is_floating_point and dtype != torch.bool:  # libdevice.pow is float-only
        return p._emit(f"_pow_int({a}, {b}, {torch.iinfo(dtype).bits}, {dtype.is_signed})", dtype)
    return p._emit(f"libdevice.pow({a}, {b})", dtype)


def _truncdiv(p, dtype: torch.dtype, a: TV, b: TV) -> TV:
    text = f"libdevice.trunc({true_div_text(a, b)})" if _floating(dtype) else f"{a} // {b}"
    return p._emit(text, dtype)


def _fmod(p, dtype: torch.dtype, a: TV, b: TV) -> TV:
    return p._emit(f"libdevice.fmod({a}, {b})" if _floating(dtype) else f"{a} % {b}", dtype)


def _floordiv(p, dtype: torch.dtype, a: TV, b: TV) -> TV:
    """Triton's integer `//` truncates: step the quotient down where the signs differ and the
    division is inexact."""
    if _floating(dtype):
        return p._emit(f"tl.floor({true_div_text(a, b)})", dtype)
    q = p._emit(f"{a} // {b}", dtype)
    fix = f"(({a} % {b} != 0) & (({a} < 0) != ({b} < 0))).to({triton_dtype(dtype)})"
    return p._emit(f"{q} - {fix}", dtype)


def _remainder(p, dtype: torch.dtype, a: TV, b: TV) -> TV:
    """torch's remainder takes the divisor's sign; fmod (and Triton's `%`) the dividend's."""
    r = _fmod(p, dtype, a, b)
    return p._emit(f"tl.where(({r} != 0) & (({r} < 0) != ({b} < 0)), {r} + {b}, {r})", dtype)


def _integer_unchanged(p, dtype: torch.dtype | None, a: TV) -> TV | None:
    """floor/ceil/trunc/round of an integer or bool value is the value (eager returns it
    unchanged); tl.floor/tl.ceil and libdevice's trunc/nearbyint take floats only."""
    if dtype is None or dtype.is_floating_point:
        return None
    return a


SPECIAL_FORMS: dict[str, Callable[..., TV | None]] = {
    "integer_unchanged": _integer_unchanged,
    "fast_erf": _fast_erf,
    "ieee_sqrt": _ieee_sqrt,
    "ieee_reciprocal": _ieee_reciprocal,
    "sign": _sign,
    "bool_or": _bool_or,
    "bool_and": _bool_and,
    "true_div": _true_div,
    "nan_maximum": _nan_maximum,
    "nan_minimum": _nan_minimum,
    "pow": _pow,
    "truncdiv": _truncdiv,
    "fmod": _fmod,
    "floordiv": _floordiv,
    "remainder": _remainder,
}
"""The printer functions `MathOp.triton_special` names."""
