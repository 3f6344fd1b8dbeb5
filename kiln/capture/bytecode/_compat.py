"""Every use of a private CPython API or a per-version constant in the bytecode layer lives here."""

from __future__ import annotations

import dis
import sys
import types
from typing import NamedTuple

__all__ = ["PY311", "PY312", "PY313", "SUPPORTED", "SINCE_312", "NULL_ABOVE_CALLABLE",
           "LOOP_EXIT", "SUPERINSTRUCTIONS", "FUNCTION_ATTRIBUTE_ORDER", "RawExnEntry",
           "compare_casts_to_bool", "exception_table", "version_str"]

PY311 = sys.version_info[:2] == (3, 11)
PY312 = sys.version_info[:2] == (3, 12)
PY313 = sys.version_info[:2] == (3, 13)
#: the versions whose bytecode the layer reads and writes
SUPPORTED = (3, 11) <= sys.version_info[:2] <= (3, 13)
#: 3.12 and later: LOAD_ATTR's method bit, direction-less POP_JUMP_IF_X, END_FOR, RETURN_CONST,
#: BINARY_SLICE/STORE_SLICE
SINCE_312 = sys.version_info[:2] >= (3, 12)

#: Where a call's NULL slot sits. 3.11/3.12: [NULL, callable, args] (a method load: [meth,
#: self]); 3.13: [callable, NULL, args] (a method load: still [meth, self]).
NULL_ABOVE_CALLABLE = PY313

#: What ends a `for` loop at FOR_ITER's target, skipped by FOR_ITER when the iterator is done:
#: 3.12 `END_FOR` (pops 2), 3.13 `END_FOR; POP_TOP` (one pop each); 3.11 has nothing there.
LOOP_EXIT: tuple[str, ...] = ("END_FOR", "POP_TOP") if PY313 else ("END_FOR",) if PY312 else ()

#: The operand depth CPython's stack-size pass starts a generator frame at (3.11/3.12 count the
#: value `send()` brings in; 3.13 does not).
GENERATOR_ENTRY_DEPTH = 0 if PY313 else 1

#: 3.13 fused pairs of local loads/stores -> their halves (oparg: 4 bits per local index)
SUPERINSTRUCTIONS: dict[str, tuple[str, str]] = {
    "LOAD_FAST_LOAD_FAST": ("LOAD_FAST", "LOAD_FAST"),
    "STORE_FAST_LOAD_FAST": ("STORE_FAST", "LOAD_FAST"),
    "STORE_FAST_STORE_FAST": ("STORE_FAST", "STORE_FAST"),
} if PY313 else {}
SUPERINSTRUCTION_MAX_INDEX = 15

#: 3.13 `MAKE_FUNCTION; SET_FUNCTION_ATTRIBUTE flag...`: the flags in the order the compiler
#: sets them (the attribute just below the function first: closure, annotations, kwdefaults,
#: defaults), the same bits as 3.11/3.12's MAKE_FUNCTION oparg.
FUNCTION_ATTRIBUTE_ORDER = (0x08, 0x04, 0x02, 0x01)

# 3.13 COMPARE_OP oparg: bit 4 asks for the result converted to bool (set when a jump consumes it)
_COMPARE_BOOL_BIT = 0x10


def has_argument(opcode: int) -> bool:
    """Whether `opcode` takes an oparg. `dis.HAVE_ARGUMENT` is no longer a clean threshold on 3.13
    (WITH_EXCEPT_START sits at it without an argument); `dis.hasarg` exists since 3.12."""
    hasarg = getattr(dis, "hasarg", None)
    return opcode in hasarg if hasarg is not None else opcode >= dis.HAVE_ARGUMENT


def compare_casts_to_bool(arg: int | None) -> bool:
    return PY313 and arg is not None and bool(arg & _COMPARE_BOOL_BIT)


def version_str() -> str:
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


class RawExnEntry(NamedTuple):
    start: int  # byte offset of the first covered instruction
    end: int  # byte offset one past the last covered code unit (exclusive)
    target: int
    depth: int
    lasti: bool


def exception_table(code: types.CodeType) -> list[RawExnEntry]:
    """The decoded `co_exceptiontable` (dis's parser is private but stable on 3.11-3.13)."""
    return [RawExnEntry(e.start, e.end, e.target, e.depth, bool(e.lasti))
            for e in dis._parse_exception_table(code)]  # type: ignore[attr-defined]


# FORMAT_VALUE flag bits (Include/ceval.h FVC_*), the same on 3.11 and 3.12.
FORMAT_CONVERSIONS: dict[int, str | None] = {0: None, 1: "str", 2: "repr", 3: "ascii"}
FORMAT_SPEC_BIT = 0x04

#: BINARY_OP operator symbol ('+', '+=', '@', ...) -> oparg (dis's table is private).
BINARY_OP_INDEX: dict[str, int] = {
    sym: i for i, (_name, sym) in enumerate(dis._nb_ops)}  # type: ignore[attr-defined]
