"""op_table: the one table of loop-IR math ops (`ops.exp`, `ops.add`, ...).

Every math op a loop body may call is one `MathOp` row in `MATH_OPS`, and every stage that needs
to know the math ops reads its row instead of keeping a list of its own:

| reader | what it takes from a row |
|---|---|
| `ops.py` | `name`, `arity`: `UNARY_OPS`, `BINARY_OPS` and the `OpsHandler` methods |
| `evaluate.py` | `reference`: the torch function that defines the op's meaning |
| `rules/pointwise.py` | `aten`, `promotion`: the ATen op lowered 1:1 onto it; `result` |
| `codegen/triton_math.py` | `triton` (a format string), `triton_special`, `needs_dtype`, `result` |
| `codegen/_interp_libdevice.py` | `libdevice`: the numpy stand-in run by the Triton interpreter |

`tests/lower/test_op_table.py` checks every row against each reader, so a new op cannot get an
evaluator without a Triton form (which would silently make it an unfused fallback). Adding an
op: docs/lower.md, "Adding a math op".
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from kiln.lower._compat import PROMOTION

__all__ = [
    "BINARY_OPS",
    "BOOL",
    "BOOL_RESULT",
    "FLOAT",
    "LIBDEVICE",
    "MATH_OPS",
    "MathOp",
    "SAME",
    "UNARY_OPS",
]

# Result-dtype rules (`MathOp.result`).
SAME = "same"  # the operands' promoted dtype
BOOL = "bool"  # always torch.bool (comparisons, logical ops, isnan)
FLOAT = "float"  # the promoted dtype when floating, float32 for integer operands (true division)

DEFAULT = PROMOTION.DEFAULT
INT_TO_FLOAT = PROMOTION.INT_TO_FLOAT
ALWAYS_BOOL = PROMOTION.ALWAYS_BOOL
COMPLEX_TO_FLOAT = PROMOTION.COMPLEX_TO_FLOAT


@dataclasses.dataclass(frozen=True)
class MathOp:
    """One math op of the loop IR.

    name: the ops-handler method (`ops.<name>`). arity: 1 or 2 operands.
    reference: the torch function that computes it (the evaluator calls it; torch semantics are
        the op's meaning, and every Triton form must agree with it).
    triton: the Triton expression as a format string of the operands (`{0}`, `{1}`), or None
        when `triton_special` always applies.
    triton_special: the name of a function in `kiln.codegen.triton_math.SPECIAL_FORMS` that the
        Triton printer calls first, for forms that need code (a dtype-dependent form, a constant
        exponent); it returns None where `triton` applies.
    needs_dtype: the Triton printer refuses operands of unknown dtype (their form differs between
        integer and float operands, or the libdevice call needs one).
    result: the result-dtype rule, `SAME`, `BOOL` or `FLOAT`.
    libdevice: `(libdevice function, numpy function)` when a Triton form calls
        `libdevice.<function>`: what the interpreter's stand-in applies.
    aten: the ATen op (a name in `torch.ops.aten`) lowered 1:1 onto this op, with `promotion`,
        its torch type-promotion kind; None when a hand-written rule lowers to it (`alpha`,
        `rounding_mode`) or no ATen op maps onto it.
    """

    name: str
    arity: int
    reference: Callable[..., torch.Tensor]
    triton: str | None = None
    triton_special: str | None = None
    needs_dtype: bool = False
    result: str = SAME
    libdevice: tuple[str, str] | None = None
    aten: str | None = None
    promotion: Any = DEFAULT

    def __post_init__(self) -> None:
        if self.arity not in (1, 2) or self.result not in (SAME, BOOL, FLOAT):
            raise ValueError(f"math op {self.name}: arity {self.arity}, result {self.result!r}")
        if self.triton is None and self.triton_special is None:
            raise ValueError(f"math op {self.name}: no Triton form (triton or triton_special)")

    def result_dtype(self, dtype: torch.dtype | None) -> torch.dtype | None:
        """The result dtype for operands whose promoted dtype is `dtype` (None: unknown)."""
        if self.result == BOOL:
            return torch.bool
        if self.result == FLOAT and not (dtype is not None and dtype.is_floating_point):
            return torch.float32
        return dtype


def _floor_divide(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.div(a, b, rounding_mode="floor")


def _trunc_divide(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.div(a, b, rounding_mode="trunc")


_OWN_NAME = "<the op's own name>"  # default of `aten` in the row helpers below


def _row(name: str, arity: int, reference: Callable[..., torch.Tensor], triton: str | None,
         promotion: Any, aten: str | None, **kw: Any) -> MathOp:
    return MathOp(name, arity, reference, triton, aten=name if aten == _OWN_NAME else aten,
                  promotion=promotion, **kw)


def _unary(name: str, reference: Callable[..., torch.Tensor], triton: str | None,
           promotion: Any = DEFAULT, aten: str | None = _OWN_NAME, **kw: Any) -> MathOp:
    """A unary row, lowered from `aten.<name>` unless `aten` says otherwise."""
    return _row(name, 1, reference, triton, promotion, aten, **kw)


def _binary(name: str, reference: Callable[..., torch.Tensor], triton: str | None,
            promotion: Any = DEFAULT, aten: str | None = _OWN_NAME, **kw: Any) -> MathOp:
    """A binary row, lowered from `aten.<name>` unless `aten` says otherwise."""
    return _row(name, 2, reference, triton, promotion, aten, **kw)


_ROWS = [
    # -- unary -------------------------------------------------------------------------------
    _unary("abs", torch.abs, "tl.abs({0})", COMPLEX_TO_FLOAT),
    _unary("neg", torch.neg, "-{0}"),
    _unary("exp", torch.exp, "tl.exp({0})", INT_TO_FLOAT),
    _unary("exp2", torch.exp2, "tl.exp2({0})", INT_TO_FLOAT),
    _unary("expm1", torch.expm1, "libdevice.expm1({0})", INT_TO_FLOAT,
           libdevice=("expm1", "expm1")),
    _unary("log", torch.log, "tl.log({0})", INT_TO_FLOAT),
    _unary("log1p", torch.log1p, "libdevice.log1p({0})", INT_TO_FLOAT,
           libdevice=("log1p", "log1p")),
    _unary("log2", torch.log2, "tl.log2({0})", INT_TO_FLOAT),
    _unary("sqrt", torch.sqrt, "tl.sqrt({0})", INT_TO_FLOAT, triton_special="ieee_sqrt"),
    _unary("rsqrt", torch.rsqrt, "tl.rsqrt({0})", INT_TO_FLOAT),
    _unary("sin", torch.sin, "tl.sin({0})", INT_TO_FLOAT),
    _unary("cos", torch.cos, "tl.cos({0})", INT_TO_FLOAT),
    _unary("tan", torch.tan, "libdevice.tan({0})", INT_TO_FLOAT, libdevice=("tan", "tan")),
    _unary("tanh", torch.tanh, "libdevice.tanh({0})", INT_TO_FLOAT, libdevice=("tanh", "tanh")),
    _unary("sigmoid", torch.sigmoid, "tl.sigmoid({0})", INT_TO_FLOAT),
    _unary("erf", torch.erf, "tl.erf({0})", INT_TO_FLOAT, triton_special="fast_erf"),
    _unary("reciprocal", torch.reciprocal, "1.0 / {0}", INT_TO_FLOAT,
           triton_special="ieee_reciprocal"),
    _unary("floor", torch.floor, "tl.floor({0})", triton_special="integer_unchanged"),
    _unary("ceil", torch.ceil, "tl.ceil({0})", triton_special="integer_unchanged"),
    _unary("trunc", torch.trunc, "libdevice.trunc({0})", libdevice=("trunc", "trunc"),
           triton_special="integer_unchanged"),
    _unary("round", torch.round, "libdevice.nearbyint({0})", libdevice=("nearbyint", "rint"),
           triton_special="integer_unchanged"),
    _unary("sign", torch.sign, None, triton_special="sign"),
    _unary("logical_not", torch.logical_not, "{0} == 0", ALWAYS_BOOL, result=BOOL),
    _unary("bitwise_not", torch.bitwise_not, "~{0}"),
    _unary("isnan", torch.isnan, "{0} != {0}", ALWAYS_BOOL, result=BOOL),
    _unary("isinf", torch.isinf, 'tl.abs({0}) == float("inf")', ALWAYS_BOOL, result=BOOL),
    _unary("square", torch.square, "{0} * {0}", aten=None),  # aten.square decomposes to pow
    # -- binary ------------------------------------------------------------------------------
    # add/sub take `alpha`, floordiv/truncdiv a `rounding_mode`: rules/pointwise.py lowers them
    _binary("add", torch.add, "{0} + {1}", aten=None, triton_special="bool_or"),
    _binary("sub", torch.sub, "{0} - {1}", aten=None),
    _binary("mul", torch.mul, "{0} * {1}", triton_special="bool_and"),
    _binary("truediv", torch.true_divide, None, INT_TO_FLOAT, aten="div", result=FLOAT,
            triton_special="true_div"),
    _binary("floordiv", _floor_divide, None, aten=None, triton_special="floordiv",
            needs_dtype=True),
    _binary("truncdiv", _trunc_divide, None, aten=None, triton_special="truncdiv",
            needs_dtype=True),
    _binary("remainder", torch.remainder, None, triton_special="remainder", needs_dtype=True),
    _binary("fmod", torch.fmod, None, triton_special="fmod", needs_dtype=True,
            libdevice=("fmod", "fmod")),
    _binary("pow", torch.pow, None, triton_special="pow", needs_dtype=True,
            libdevice=("pow", "power")),
    _binary("maximum", torch.maximum, "tl.maximum({0}, {1})", triton_special="nan_maximum"),
    _binary("minimum", torch.minimum, "tl.minimum({0}, {1})", triton_special="nan_minimum"),
    _binary("eq", torch.eq, "{0} == {1}", ALWAYS_BOOL, result=BOOL),
    _binary("ne", torch.ne, "{0} != {1}", ALWAYS_BOOL, result=BOOL),
    _binary("lt", torch.lt, "{0} < {1}", ALWAYS_BOOL, result=BOOL),
    _binary("le", torch.le, "{0} <= {1}", ALWAYS_BOOL, result=BOOL),
    _binary("gt", torch.gt, "{0} > {1}", ALWAYS_BOOL, result=BOOL),
    _binary("ge", torch.ge, "{0} >= {1}", ALWAYS_BOOL, result=BOOL),
    _binary("logical_and", torch.logical_and, "({0} != 0) & ({1} != 0)", ALWAYS_BOOL,
            result=BOOL),
    _binary("logical_or", torch.logical_or, "({0} != 0) | ({1} != 0)", ALWAYS_BOOL,
            result=BOOL),
    _binary("logical_xor", torch.logical_xor, "({0} != 0) ^ ({1} != 0)", ALWAYS_BOOL,
            result=BOOL),
    _binary("bitwise_and", torch.bitwise_and, "{0} & {1}"),
    _binary("bitwise_or", torch.bitwise_or, "{0} | {1}"),
    _binary("bitwise_xor", torch.bitwise_xor, "{0} ^ {1}"),
    _binary("atan2", torch.atan2, "libdevice.atan2({0}, {1})", INT_TO_FLOAT, needs_dtype=True,
            libdevice=("atan2", "arctan2")),
]

MATH_OPS: dict[str, MathOp] = {op.name: op for op in _ROWS}
"""Every math op of the loop IR by name, unary ops first."""

UNARY_OPS: tuple[str, ...] = tuple(op.name for op in _ROWS if op.arity == 1)
BINARY_OPS: tuple[str, ...] = tuple(op.name for op in _ROWS if op.arity == 2)
BOOL_RESULT: frozenset[str] = frozenset(op.name for op in _ROWS if op.result == BOOL)
LIBDEVICE: dict[str, str] = {op.libdevice[0]: op.libdevice[1] for op in _ROWS if op.libdevice}
"""libdevice function → the numpy function the Triton interpreter's stand-in applies."""
