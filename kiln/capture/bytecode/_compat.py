"""Every use of a private CPython API or a per-version constant in the bytecode layer lives here."""

from __future__ import annotations

import dis
import sys
import types
from typing import NamedTuple

__all__ = ["PY311", "PY312", "PY313", "RawExnEntry", "exception_table", "version_str"]

PY311 = sys.version_info[:2] == (3, 11)
PY312 = sys.version_info[:2] == (3, 12)
PY313 = sys.version_info[:2] >= (3, 13)


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
