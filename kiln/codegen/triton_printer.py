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
reduction identities) print the right form. Math ops print as `triton_math.print_math` says,
from their rows in `kiln.lower.op_table`. Index expressions (`index.Expr`) print with Triton's
truncating `//` and `%` only where the dividend's `bounds()` are non-negative; elsewhere (inside
`masked` bodies, e.g. padding) they print a floor-correct form. Loads are masked by the masks of
the loop axes their index uses plus every enclosing `masked` condition.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from kiln.codegen import reductions
from kiln.codegen.triton_math import print_math, promote
from kiln.codegen.triton_types import TV, triton_dtype
from kiln.errors import CodegenError
from kiln.lower.index import DerivedSize, Div, Expr, Mono, Size, Sym, sym
from kiln.lower.ops import OpsHandler
from kiln.lower.printer import format_value

__all__ = ["CodegenError", "TV", "TritonPrinter", "triton_dtype"]


def _literal(value: Any) -> str:
    """Python source for a constant: bools and floats (nan, ±inf too) as the lower stage's
    printer writes them, anything else as an int."""
    if isinstance(value, (bool, float)):
        return format_value(value)
    return repr(int(value))


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
        # printing an x-only member of a reduction group (one value per row, `group.is_x_only`):
        # its loads and index checks span x alone, masked by xmask only (between the r loops of
        # a looped kernel rmask does not exist; inside a tile, an rmask would widen the value to
        # [XBLOCK, RBLOCK] where its store writes [XBLOCK, 1])
        self.x_only = False
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
            text = self._atom(atom)
            if coef == 1:
                parts.append(text)
            else:
                parts.append(f"({coef})*{text}" if coef < 0 else f"{coef}*{text}")
        if expr.const or not parts:
            parts.append(f"({expr.const})" if expr.const < 0 else str(expr.const))
        return " + ".join(parts)

    def _atom(self, atom: Any) -> str:
        if isinstance(atom, DerivedSize):  # computed from the size arguments it is made of
            return f"({self.index(atom.definition)})"
        if isinstance(atom, (Sym, Size)):
            return atom.name  # a size is a kernel argument of that name
        if isinstance(atom, Mono):
            return "*".join(self._atom(f) for f in atom.factors)
        return self._div(atom)

    def _div(self, atom: Div) -> str:
        arg = self.index(atom.arg)
        d, m = _size_text(atom.div), _size_text(atom.mod)
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
        if self.two_d and not self.x_only and (r or ind) and self.rmask:
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

    def index_expr(self, expr: Expr, dtype: torch.dtype) -> TV:
        if expr.is_constant:
            return self.constant(expr.const, dtype)
        return self._emit(f"({self.index(expr)}).to({triton_dtype(dtype)})", dtype)

    def indirect_indexing(self, value: TV, size: int, check: bool = True,
                          wrap: bool = True) -> Expr:
        # wrap and check in the index's own dtype: a cast to int32 first would fold 2**32 + 1
        # into range. Without `wrap` (gather, index_select, embedding) a negative index is out
        # of range, as eager has it.
        if wrap:
            v = self._emit(f"tl.where({value} < 0, {value} + {size}, {value})", None, cse=False)
        else:
            v = value
        if check:
            self._check_index(v, size)
        cast = "tl.int32" if size < 2**31 else "tl.int64"
        wrapped = self._emit(f"{v}.to({cast})", None, cse=False)
        self._indirect.add(wrapped.name)
        return sym(wrapped.name, size)

    def _check_index(self, v: TV, size: int) -> None:
        """Eager raises on an index outside [-size, size) (outside [0, size) for ops that do not
        wrap); a kernel would read other memory.
        `_check_index` is a device assert (kernels with checks compile with debug=True) or,
        interpreted, an IndexError; lanes outside the masks loaded no index and are skipped."""
        ok = f"(0 <= {v}) & ({v} < {size})"
        parts = [self.xmask] if self.xmask else []
        if self.two_d and not self.x_only and self.rmask:
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

    def where(self, cond: TV, a: TV, b: TV) -> TV:
        return self._emit(f"tl.where({cond}, {a}, {b})", promote(a.dtype, b.dtype))

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
        return print_math(self, name, args)


def _size_text(value: Any) -> Any:
    """A divisor or modulus as source: a symbolic one is parenthesized."""
    return f"({value})" if isinstance(value, Expr) else value
