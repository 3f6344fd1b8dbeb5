"""reductions: how `TritonPrinter.reduction` prints each reduction type.

Two forms, on the `[XBLOCK, RBLOCK]` tile of a reduction kernel (axis 1 is r):

- persistent (the whole row is one tile): mask the tile with the reduction's neutral element,
  reduce axis 1 once, keep it as `[XBLOCK, 1]`.
- looped (`for roffset in range(0, rnumel, RBLOCK)`): an `[XBLOCK, RBLOCK]` accumulator is
  initialised before the loop (`printer.loop_pre`), combined elementwise with each chunk inside
  it, and reduced along axis 1 after it (the printer switches to the code after the loop with
  `printer.exit_loop()`, so the rest of the member's body — its cast and store — runs there).

max/min propagate NaN (torch semantics); argmax/argmin return the first position of the extreme
(NaN counts as the extreme), reduced as (value, index) pairs so ties across lanes and chunks
keep the smallest index. Sums accumulate in the IR's accumulator dtype (float32 for bf16/fp16).
"""
from __future__ import annotations

import torch

from kiln.codegen.triton_types import TV, triton_dtype

__all__ = ["PRELUDE_HELPERS", "REDUCTIONS", "looped", "persistent"]

REDUCTIONS = ("sum", "prod", "max", "min", "argmax", "argmin", "any")

PRELUDE_HELPERS = '''
@triton.jit
def _max_combine(a, b):  # NaN wins, as in torch.amax: one max.NaN instruction on sm80+
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _min_combine(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _prod_combine(a, b):
    return a * b


@triton.jit
def _argmax_combine(a, ai, b, bi):
    a_nan = a != a
    b_nan = b != b
    tie = ((a == b) | (a_nan & b_nan)) & (ai < bi)
    pick = (a > b) | (a_nan & ~b_nan) | tie
    return tl.where(pick, a, b), tl.where(pick, ai, bi)


@triton.jit
def _argmin_combine(a, ai, b, bi):
    a_nan = a != a
    b_nan = b != b
    tie = ((a == b) | (a_nan & b_nan)) & (ai < bi)
    pick = (a < b) | (a_nan & ~b_nan) | tie
    return tl.where(pick, a, b), tl.where(pick, ai, bi)
'''


def _acc_dtype(dtype: torch.dtype, value: TV, src_dtype: torch.dtype, rtype: str) -> torch.dtype:
    if rtype in ("sum", "prod"):
        return dtype
    if rtype == "any":
        return torch.int8
    return value.dtype or src_dtype


def _neutral(rtype: str, acc: torch.dtype) -> str:
    if rtype in ("sum", "any"):
        return "0"
    if rtype == "prod":
        return "1"
    floating = acc.is_floating_point
    if rtype in ("max", "argmax"):
        return 'float("-inf")' if floating else str(_int_min(acc))
    return 'float("inf")' if floating else str(_int_max(acc))


def _int_min(dtype: torch.dtype) -> int:
    return 0 if dtype == torch.bool else torch.iinfo(dtype).min


def _int_max(dtype: torch.dtype) -> int:
    return 1 if dtype == torch.bool else torch.iinfo(dtype).max


def _source_value(printer, value: TV, acc: torch.dtype, rtype: str) -> str:
    """The value in the accumulator's dtype, broadcast to the whole tile."""
    v = value.name
    if rtype == "any":
        v = f"({v} != 0).to(tl.int8)"
    elif value.dtype != acc:
        v = f"{v}.to({triton_dtype(acc)})"
    return printer._emit(f"tl.broadcast_to({v}, [XBLOCK, RBLOCK])", None, cse=False).name


def _tile_mask(printer) -> str | None:
    parts = [m for m in (printer.xmask, printer.rmask) if m]
    return " & ".join(parts) if parts else None


def _index_dtype(printer) -> str:
    return "tl.int64" if printer.wide else "tl.int32"


def persistent(printer, dtype: torch.dtype, src_dtype: torch.dtype, rtype: str,
               value: TV) -> TV:
    acc = _acc_dtype(dtype, value, src_dtype, rtype)
    full = _source_value(printer, value, acc, rtype)
    mask = _tile_mask(printer)
    neutral = _neutral(rtype, acc)
    tile = printer._emit(f"tl.where({mask}, {full}, {neutral})", None, cse=False).name \
        if mask else full
    if rtype in ("argmax", "argmin"):
        idx = f"tl.broadcast_to(rindex, [XBLOCK, RBLOCK]).to({_index_dtype(printer)})"
        if mask:
            idx = f"tl.where({mask}, {idx}, {printer.rnumel})"
        idx_tile = printer._emit(idx, None, cse=False).name
        pair = printer.new_name("_red")
        printer.lines.append(f"_, {pair} = tl.reduce(({tile}, {idx_tile}), 1, _{rtype}_combine)")
        return printer._emit(f"{pair}[:, None].to(tl.int64)", dtype, cse=False)
    return printer._emit(f"({_final(rtype, tile, acc)})[:, None]", dtype, cse=False)


def _final(rtype: str, tile: str, acc: torch.dtype) -> str:
    floating = acc.is_floating_point
    if rtype == "sum":
        return f"tl.sum({tile}, 1)"
    if rtype == "prod":
        return f"tl.reduce({tile}, 1, _prod_combine)"
    if rtype in ("max", "min"):
        return f"tl.reduce({tile}, 1, _{rtype}_combine)" if floating else f"tl.{rtype}({tile}, 1)"
    return f"tl.max({tile}, 1) != 0"  # any


def _combine(rtype: str, accv: str, v: str, acc: torch.dtype) -> str:
    if rtype == "sum":
        return f"{accv} + {v}"
    if rtype == "prod":
        return f"{accv} * {v}"
    if rtype == "any":
        return f"tl.maximum({accv}, {v})"
    if acc.is_floating_point:
        return f"_{rtype}_combine({accv}, {v})"
    return f"tl.maximum({accv}, {v})" if rtype == "max" else f"tl.minimum({accv}, {v})"


def looped(printer, dtype: torch.dtype, src_dtype: torch.dtype, rtype: str, value: TV) -> TV:
    acc = _acc_dtype(dtype, value, src_dtype, rtype)
    accv = printer.new_name("_acc")
    neutral = _neutral(rtype, acc)
    printer.loop_pre.append(f"{accv} = tl.full([XBLOCK, RBLOCK], {neutral}, {triton_dtype(acc)})")
    full = _source_value(printer, value, acc, rtype)
    mask = _tile_mask(printer)
    if rtype in ("argmax", "argmin"):
        idxv = f"{accv}_idx"
        idt = _index_dtype(printer)
        printer.loop_pre.append(f"{idxv} = tl.full([XBLOCK, RBLOCK], {printer.rnumel}, {idt})")
        ridx = printer._emit(f"tl.broadcast_to(rindex, [XBLOCK, RBLOCK]).to({idt})", None,
                             cse=False).name
        nv, ni = printer.new_name("_next"), printer.new_name("_next")
        printer.lines.append(f"{nv}, {ni} = _{rtype}_combine({accv}, {idxv}, {full}, {ridx})")
        if mask:
            printer.lines.append(f"{accv} = tl.where({mask}, {nv}, {accv})")
            printer.lines.append(f"{idxv} = tl.where({mask}, {ni}, {idxv})")
        else:
            printer.lines += [f"{accv} = {nv}", f"{idxv} = {ni}"]
        printer.exit_loop()
        pair = printer.new_name("_red")
        printer.lines.append(f"_, {pair} = tl.reduce(({accv}, {idxv}), 1, _{rtype}_combine)")
        return printer._emit(f"{pair}[:, None].to(tl.int64)", dtype, cse=False)
    step = _combine(rtype, accv, full, acc)
    if mask:
        nxt = printer._emit(step, None, cse=False).name
        printer.lines.append(f"{accv} = tl.where({mask}, {nxt}, {accv})")
    else:
        printer.lines.append(f"{accv} = {step}")
    printer.exit_loop()
    return printer._emit(f"({_final(rtype, accv, acc)})[:, None]", dtype, cse=False)
