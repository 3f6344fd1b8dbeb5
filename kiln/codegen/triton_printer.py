"""triton_printer: the ops handler that prints a loop body as Triton source.

`TritonPrinter` is one more `kiln.lower.ops.OpsHandler` (beside `Evaluator`, `Printer`,
`DepsCollector`): running a `ComputedBuffer`'s body under it appends Triton statements to
`printer.lines`, one `tmpN = ...` per op, with common subexpressions shared by text.

Conventions of the kernel it prints into (see `kernel.py`, which writes the prologue):

- pointwise: 1-D blocks; `xindex` is `[XBLOCK]`, `xmask = xindex < xnumel`, and the loop
  variables `x0, x1, ...` are defined from `xindex` by div/mod.
- reduction: 2-D blocks `[XBLOCK, RBLOCK]`; `xindex` is `[XBLOCK, 1]`, `rindex` `[1, RBLOCK]`,
  `r0, r1, ...` come from `rindex`; `reduction` reduces axis 1 and keeps it (`[:, None]`).

Values carry their torch dtype (`TV`), so dtype-dependent ops (floor division, remainder,
reduction identities) print the right form. Index expressions (`index.Expr`) print with Triton's
truncating `//` and `%` only where the dividend's `bounds()` are non-negative; elsewhere (inside
`masked` bodies, e.g. padding) they print a floor-correct form. Loads are masked by the masks of
the loop axes their index uses plus every enclosing `masked` condition.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from kiln.codegen import reductions
from kiln.codegen.triton_types import TV, triton_dtype
from kiln.errors import CodegenError
from kiln.lower.index import Div, Expr, Sym, sym
from kiln.lower.ops import OpsHandler
from kiln.lower.printer import format_value

__all__ = ["CodegenError", "TV", "TritonPrinter", "triton_dtype"]


def _literal(value: Any) -> str:
    """Python source for a constant: bools and floats (nan, ±inf too) as the lower stage's
    printer writes them, anything else as an int."""
    if isinstance(value, (bool, float)):
        return format_value(value)
    return repr(int(value))


_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
# torch computes bool + bool and bool * bool as bytes and stores them as bool: or / and.
_BOOL_ARITHMETIC = {"add": "bitwise_or", "mul": "bitwise_and"}
_UNARY = {
    "abs": "tl.abs({0})", "neg": "-{0}", "exp": "tl.exp({0})", "exp2": "tl.exp2({0})",
    "expm1": "libdevice.expm1({0})", "log": "tl.log({0})", "log1p": "libdevice.log1p({0})",
    "log2": "tl.log2({0})", "sqrt": "tl.sqrt({0})", "rsqrt": "tl.rsqrt({0})",
    "sin": "tl.sin({0})", "cos": "tl.cos({0})", "tan": "libdevice.tan({0})",
    "tanh": "libdevice.tanh({0})", "sigmoid": "tl.sigmoid({0})", "erf": "tl.erf({0})",
    "reciprocal": "1.0 / {0}", "floor": "tl.floor({0})", "ceil": "tl.ceil({0})",
    "trunc": "libdevice.trunc({0})", "round": "libdevice.nearbyint({0})",
    "bitwise_not": "~{0}", "isnan": "{0} != {0}", "isinf": "tl.abs({0}) == float(\"inf\")",
    "square": "{0} * {0}",
}
_FAST_ERF_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # float64 keeps libdevice
# Correctly rounded float32 forms of ops whose plain Triton spelling is approximate on CUDA: `/`
# is div.full.f32 (up to 2 ulp) and tl.sqrt sqrt.approx.f32, where eager's kernels divide and take
# square roots with IEEE rounding (a mean of equal values must give the value back exactly).
_IEEE_F32 = {"sqrt": "tl.math.sqrt_rn({0})", "reciprocal": "tl.math.div_rn({1}, {0})"}
_BOOL_RESULT = {"logical_not", "isnan", "isinf", "eq", "ne", "lt", "le", "gt", "ge",
                "logical_and", "logical_or", "logical_xor"}


def _promote(*dtypes: torch.dtype | None) -> torch.dtype | None:
    known = [d for d in dtypes if d is not None]
    if not known:
        return None
    out = known[0]
    for d in known[1:]:
        out = torch.promote_types(out, d)
    return out


class TritonPrinter(OpsHandler):
    """Prints a body into `lines`. `reduction`: whether the kernel is 2-D `[XBLOCK, RBLOCK]`.
    `buffer_dtypes`: dtypes of buffers the body loads (unknown loads have dtype None, which
    only dtype-dependent ops refuse). `loads`/`stores` map buffer names to pointer args in
    first-use order."""

    def __init__(self, reduction: bool = False,
                 buffer_dtypes: Mapping[str, torch.dtype] | None = None) -> None:
        self.is_reduction = reduction
        self.two_d = reduction  # [XBLOCK, RBLOCK] tiles (also a 2-D tiled pointwise kernel)
        self.inner_prefix = "r"  # loop symbols of the tile's second axis ("y" when 2-D pointwise)
        self.buffer_dtypes = dict(buffer_dtypes or {})
        self.lines: list[str] = []
        self.loads: dict[str, str] = {}
        self.stores: dict[str, str] = {}
        self.masks: list[str] = []
        self._cse: dict[str, TV] = {}
        self._count = 0
        self._indirect: set[str] = set()
        self.index_checks = 0  # bounds checks emitted (the kernel then compiles with debug=True)
        self.reductions: list[str] = []
        self._constants: dict[str, Any] = {}  # variable name -> the Python constant it holds
        # Kernel-shape hooks, set by the group emitter (`group.py`):
        self.xmask: str | None = "xmask"  # None where XBLOCK divides numel (mask elided)
        self.rmask: str | None = "rmask"  # None where the tile covers r exactly
        self.wide = False  # int64 indices
        self.rnumel = 1
        self.eviction: str | None = None  # eviction policy of loads that use r
        # load(name, index) -> an in-register value (a fused producer's) or None for memory
        self.resolve_load: Callable[[str, Expr], TV | None] | None = None
        # store(name, index, value) -> whether the value is also written to memory
        self.on_store: Callable[[str, Expr, TV], bool] | None = None
        # looped reductions: the accumulators' init lines (before the r loop) and the switch to
        # the code after the loop (where the reduced value lives); None when persistent
        self.loop_pre: list[str] | None = None
        self.exit_loop: Callable[[], None] | None = None

    # -- helpers -----------------------------------------------------------------------------

    @property
    def _one(self) -> str:
        return "[1, 1]" if self.two_d else "[1]"

    def new_name(self, prefix: str = "tmp") -> str:
        name = f"{prefix}{self._count}"
        self._count += 1
        return name

    def _emit(self, expr: str, dtype: torch.dtype | None, cse: bool = True) -> TV:
        key = f"{expr}|{dtype}"
        if cse and key in self._cse:
            return self._cse[key]
        name = f"tmp{self._count}"
        self._count += 1
        self.lines.append(f"{name} = {expr}")
        value = TV(name, dtype)
        if cse:
            self._cse[key] = value
        return value

    def index(self, expr: Expr) -> str:
        """Triton source for an index expression (floor-correct where it can go negative)."""
        parts: list[str] = []
        for atom, coef in expr.terms:
            text = atom.name if isinstance(atom, Sym) else self._div(atom)
            if coef == 1:
                parts.append(text)
            else:
                parts.append(f"({coef})*{text}" if coef < 0 else f"{coef}*{text}")
        if expr.const or not parts:
            parts.append(f"({expr.const})" if expr.const < 0 else str(expr.const))
        return " + ".join(parts)

    def _div(self, atom: Div) -> str:
        arg = self.index(atom.arg)
        d, m = atom.div, atom.mod
        if atom.arg.bounds()[0] >= 0:
            text = f"(({arg}) // {d})" if d != 1 else f"({arg})"
            return f"({text} % {m})" if m is not None else text
        # floor semantics from truncating // and %: ((a % d) + d) % d is the floor remainder
        text = f"(({arg}) - ((({arg}) % {d}) + {d}) % {d}) // {d}" if d != 1 else f"({arg})"
        text = f"({text})"
        return f"((({text} % {m}) + {m}) % {m})" if m is not None else text

    def _axes(self, expr: Expr) -> tuple[bool, bool, bool]:
        """(uses x, uses r, uses an indirect symbol)."""
        x = r = ind = False
        for s in expr.free_symbols():
            if s.name in self._indirect:
                ind = True
            elif s.name.startswith(self.inner_prefix):
                r = True
            else:
                x = True
        return x, r, ind

    def _mask_for(self, expr: Expr) -> str | None:
        x, r, ind = self._axes(expr)
        parts = []
        if (x or ind) and self.xmask:
            parts.append(self.xmask)
        if self.two_d and (r or ind) and self.rmask:
            parts.append(self.rmask)
        parts += [f"({m})" for m in self.masks]
        return " & ".join(parts) if parts else None

    def _store_index(self, expr: Expr) -> str:
        text = self.index(expr)
        if not self._axes(expr)[0]:
            text = f"{text} + 0 * xindex"  # broadcast a constant offset to the block
        return text

    def _store_mask(self, expr: Expr) -> str | None:
        parts = [self.xmask] if self.xmask else []
        if self.two_d and self._axes(expr)[1] and self.rmask:
            parts.append(self.rmask)
        return " & ".join(parts) if parts else None

    # -- memory ------------------------------------------------------------------------------

    def load(self, name: str, index: Expr) -> TV:
        if self.resolve_load is not None:
            value = self.resolve_load(name, index)
            if value is not None:
                return value
        ptr = self.loads.setdefault(name, f"in_ptr{len(self.loads)}")
        mask = self._mask_for(index)
        dtype = self.buffer_dtypes.get(name)
        extra = ""
        if self.eviction and self._axes(index)[1]:
            extra = f", eviction_policy='{self.eviction}'"
        if mask is None:
            text = f"tl.load({ptr} + ({self.index(index)}){extra})"
        else:
            other = "False" if dtype == torch.bool else "0"
            text = (f"tl.load({ptr} + ({self._load_index(index)}), {mask}, "
                    f"other={other}{extra})")
        if mask is None and not any(self._axes(index)):
            # A constant index (one element: x[1::3] of a 2-element x, a size-1 weight) loads a
            # scalar where the body works on blocks. Compiled Triton broadcasts a scalar operand,
            # the interpreter does not always (`|` of a block and a scalar comparison raised,
            # fuzz seed 5083): make it a block, `[1]` / `[1, 1]` as constants are.
            text = f"tl.broadcast_to({text}, {self._one})"
        return self._emit(text, dtype)

    def _load_index(self, expr: Expr) -> str:
        """A masked load's offset: compiled Triton refuses a block mask on a scalar pointer
        (the interpreter too), so an offset using no loop axis (a constant, or an indirect
        index loaded from a constant offset) is broadcast to the block."""
        text = self.index(expr)
        x, r, _ = self._axes(expr)
        return text if x or r else f"{text} + 0 * xindex"

    def store(self, name: str, index: Expr, value: TV) -> None:
        if self.on_store is not None and not self.on_store(name, index, value):
            return
        ptr = self.stores.setdefault(name, f"out_ptr{len(self.stores)}")
        mask = self._store_mask(index)
        tail = f", {mask}" if mask else ""
        self.lines.append(f"tl.store({ptr} + ({self._store_index(index)}), {value}{tail})")

    store_reduction = store

    def reduction(self, dtype: torch.dtype, src_dtype: torch.dtype, reduction_type: str,
                  value: TV) -> TV:
        if not self.is_reduction:
            raise CodegenError("reduction in a pointwise kernel")
        if reduction_type not in reductions.REDUCTIONS:
            raise CodegenError(f"reduction {reduction_type!r}")
        self.reductions.append(reduction_type)
        if self.loop_pre is None:
            return reductions.persistent(self, dtype, src_dtype, reduction_type, value)
        return reductions.looped(self, dtype, src_dtype, reduction_type, value)

    # -- leaves and control ------------------------------------------------------------------

    def constant(self, value: Any, dtype: torch.dtype) -> TV:
        tv = self._emit(f"tl.full({self._one}, {_literal(value)}, {triton_dtype(dtype)})", dtype)
        self._constants[tv.name] = value
        return tv

    def _pow(self, a: TV, b: TV, dtype: torch.dtype) -> TV:
        """x ** c for a small constant c as multiplies / sqrt (what torch's kernels do too);
        libdevice.pow is dozens of instructions per element and made RMSNorm ALU-bound."""
        c = self._constants.get(b.name)
        if c is not None and dtype.is_floating_point:
            if c == 2:
                return self._emit(f"{a} * {a}", dtype)
            if c == 3:
                return self._emit(f"{a} * {a} * {a}", dtype)
            if c == 1:
                return a
        return self._emit(f"libdevice.pow({a}, {b})", dtype)

    def _fast_erf(self, a: TV, dtype: torch.dtype) -> TV:
        """kiln's float32 erf (`fast_math._erf_f32`): libdevice's made erf-GELU + LayerNorm
        ALU-bound. 16-bit values are computed in float32 and rounded back."""
        if dtype == torch.float32:
            return self._emit(f"_erf_f32({a})", dtype)
        return self.to_dtype(self._emit(f"_erf_f32({a}.to(tl.float32))", torch.float32), dtype)

    def index_expr(self, expr: Expr, dtype: torch.dtype) -> TV:
        if expr.is_constant:
            return self.constant(expr.const, dtype)
        return self._emit(f"({self.index(expr)}).to({triton_dtype(dtype)})", dtype)

    def indirect_indexing(self, value: TV, size: int, check: bool = True) -> Expr:
        # wrap and check in the index's own dtype: a cast to int32 first would fold 2**32 + 1
        # into range
        v = self._emit(f"tl.where({value} < 0, {value} + {size}, {value})", None, cse=False)
        if check:
            self._check_index(v, size)
        cast = "tl.int32" if size < 2**31 else "tl.int64"
        wrapped = self._emit(f"{v}.to({cast})", None, cse=False)
        self._indirect.add(wrapped.name)
        return sym(wrapped.name, size)

    def _check_index(self, v: TV, size: int) -> None:
        """Eager raises on an index outside [-size, size); a kernel would read other memory.
        `_check_index` is a device assert (kernels with checks compile with debug=True) or,
        interpreted, an IndexError; lanes outside the masks loaded no index and are skipped."""
        ok = f"(0 <= {v}) & ({v} < {size})"
        parts = [self.xmask] if self.xmask else []
        if self.two_d and self.rmask:
            parts.append(self.rmask)
        parts += [f"({m})" for m in self.masks]
        if parts:
            ok = f"({ok}) | ~({' & '.join(parts)})"
        self.lines.append(f"_check_index({ok})")
        self.index_checks += 1

    def to_dtype(self, x: TV, dtype: torch.dtype) -> TV:
        if x.dtype == dtype:
            return x
        if dtype == torch.bool:
            return self._emit(f"{x} != 0", dtype)
        if dtype not in (torch.bfloat16, torch.float16):
            return self._emit(f"{x}.to({triton_dtype(dtype)})", dtype)
        src = x.name
        if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            # Integers and doubles reach half types through float32, as torch converts (c10's
            # Half and BFloat16 are built from a float; there is no direct int -> bf16 path).
            # Triton's interpreter also reinterprets the bits of a direct int -> bf16 cast.
            src = f"{x}.to(tl.float32)"
        if dtype == torch.bfloat16:
            # Rounds to nearest even (`_to_bf16` in the prelude: the interpreter truncates).
            # An explicit cast the program wrote rounds here even when the value goes back to
            # float32 (lower_to_copy emits the round trip; fuzz finding 7).
            return self._emit(f"_to_bf16({src})", dtype)
        return self._emit(f"{src}.to(tl.float16)", dtype)

    @staticmethod
    def _true_div(a: TV, b: TV) -> str:
        """Floating `a / b`: IEEE-rounded `div_rn` in float32 (see `_IEEE_F32`), where integer
        operands are converted first (true division of integers gives float32); `/` in the
        other float dtypes (float64 division is div.rn already; half types compute in float32)
        and for operands of unknown dtype (a float64 must not be cast down)."""
        dtype = _promote(a.dtype, b.dtype)
        if None in (a.dtype, b.dtype) or (dtype.is_floating_point and dtype != torch.float32):
            return f"{a} / {b}"
        x, y = (v.name if v.dtype == torch.float32 else f"{v}.to(tl.float32)" for v in (a, b))
        return f"tl.math.div_rn({x}, {y})"

    def where(self, cond: TV, a: TV, b: TV) -> TV:
        return self._emit(f"tl.where({cond}, {a}, {b})", _promote(a.dtype, b.dtype))

    def masked(self, mask: TV, body: Callable[[], Any], other: Any) -> TV:
        self.masks.append(mask.name)
        saved = dict(self._cse)  # values computed under a mask are not valid outside it
        try:
            value = body()
        finally:
            self.masks.pop()
            self._cse.clear()  # in place: the group emitter's scopes hold this dict
            self._cse.update(saved)
        dtype = value.dtype
        if dtype is not None:
            other_v = f"tl.full({self._one}, {_literal(other)}, {triton_dtype(dtype)})"
        else:
            other_v = _literal(other)
        return self._emit(f"tl.where({mask}, {value}, {other_v})", dtype)

    def math(self, name: str, *args: TV) -> TV:
        dtype = _promote(*(a.dtype for a in args))
        floating = dtype is not None and dtype.is_floating_point
        if name == "erf" and dtype in _FAST_ERF_DTYPES:
            return self._fast_erf(args[0], dtype)
        if dtype == torch.float32 and name in _IEEE_F32:
            one = self.constant(1.0, dtype) if name == "reciprocal" else None
            return self._emit(_IEEE_F32[name].format(args[0], one), dtype)
        if name in _UNARY:
            (a,) = args
            return self._emit(_UNARY[name].format(a), torch.bool if name in _BOOL_RESULT
                              else dtype)
        if name == "logical_not":
            return self._emit(f"{args[0]} == 0", torch.bool)
        if name == "sign":
            (a,) = args
            return self._emit(f"(({a} > 0).to({triton_dtype(dtype)}) - "
                              f"({a} < 0).to({triton_dtype(dtype)}))", dtype)
        a, b = args
        if name in _COMPARE:
            return self._emit(f"{a} {_COMPARE[name]} {b}", torch.bool)
        if dtype == torch.bool and name in _BOOL_ARITHMETIC:  # i1 arithmetic wraps (1 + 1 == 0)
            name = _BOOL_ARITHMETIC[name]
        simple = {"add": "+", "sub": "-", "mul": "*", "bitwise_and": "&", "bitwise_or": "|",
                  "bitwise_xor": "^"}
        if name in simple:
            return self._emit(f"{a} {simple[name]} {b}", dtype)
        if name == "truediv":
            return self._emit(self._true_div(a, b), dtype if floating else torch.float32)
        if name in ("logical_and", "logical_or", "logical_xor"):
            op = {"logical_and": "&", "logical_or": "|", "logical_xor": "^"}[name]
            return self._emit(f"({a} != 0) {op} ({b} != 0)", torch.bool)
        if name in ("maximum", "minimum"):
            if floating:  # torch propagates NaN
                cmp = ">" if name == "maximum" else "<"
                return self._emit(f"tl.where(({a} {cmp} {b}) | ({a} != {a}), {a}, {b})", dtype)
            return self._emit(f"tl.{name}({a}, {b})", dtype)
        if dtype is None:
            raise CodegenError(f"ops.{name} needs operand dtypes (pass the graph to emit_kernel)")
        if name == "pow":
            return self._pow(a, b, dtype)
        if name == "atan2":
            return self._emit(f"libdevice.atan2({a}, {b})", dtype)
        if name == "truncdiv":
            text = f"libdevice.trunc({self._true_div(a, b)})" if floating else f"{a} // {b}"
            return self._emit(text, dtype)
        if name == "fmod":
            return self._emit(f"libdevice.fmod({a}, {b})" if floating else f"{a} % {b}", dtype)
        if name == "floordiv":
            if floating:
                return self._emit(f"tl.floor({self._true_div(a, b)})", dtype)
            q = self._emit(f"{a} // {b}", dtype)
            fix = f"(({a} % {b} != 0) & (({a} < 0) != ({b} < 0))).to({triton_dtype(dtype)})"
            return self._emit(f"{q} - {fix}", dtype)
        if name == "remainder":
            r = self._emit(f"libdevice.fmod({a}, {b})" if floating else f"{a} % {b}", dtype)
            return self._emit(f"tl.where(({r} != 0) & (({r} < 0) != ({b} < 0)), {r} + {b}, {r})",
                              dtype)
        raise CodegenError(f"ops.{name}")

