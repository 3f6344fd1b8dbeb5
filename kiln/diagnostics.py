"""Diagnostic records: the one set of facts that logs, `kiln.explain` and errors all render.

Records are plain frozen dataclasses with `render() -> str`; they hold strings and numbers only (no
torch objects), so they can be stored, compared, dumped and printed anywhere. Reports are built from
these records, never parsed back out of log text.
"""

from __future__ import annotations

import dataclasses
import linecache
import os
from types import CodeType
from typing import Literal

__all__ = [
    "CATEGORIES",
    "GuardFailure",
    "GuardRecord",
    "RecompileReason",
    "Unsupported",
    "UserLocation",
]

Category = Literal["user-fixable", "not-supported-yet", "fundamental"]
CATEGORIES: tuple[str, ...] = ("user-fixable", "not-supported-yet", "fundamental")


@dataclasses.dataclass(frozen=True)
class UserLocation:
    """A line of user source: `filename` (as in the code object), 1-based `lineno`, the enclosing
    `function` name and the stripped `source` text of that line ("" when unavailable)."""

    filename: str
    lineno: int
    function: str
    source: str = ""

    @classmethod
    def from_code(cls, code: CodeType, lineno: int | None = None) -> UserLocation:
        lineno = code.co_firstlineno if lineno is None else lineno
        source = linecache.getline(code.co_filename, lineno).strip()
        return cls(code.co_filename, lineno, code.co_name, source)

    def short(self) -> str:
        return f"{os.path.basename(self.filename)}:{self.lineno}"

    def render(self) -> str:
        head = f'  File "{self.filename}", line {self.lineno}, in {self.function}'
        return f"{head}\n    {self.source}" if self.source else head

    __str__ = render


def _indent(text: str, prefix: str = "  ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


@dataclasses.dataclass(frozen=True)
class Unsupported:
    """Why capture stopped (a graph break, or an error under fullgraph=True).

    `code` is a stable identifier chosen by the reporter (e.g. "unsupported-opcode"); `category` is
    one of CATEGORIES; `location` is the innermost user line; `stack` holds the inlined callers,
    outermost first; `hints` are concrete things the user can do; `cost` estimates the
    instructions that ran outside graphs because of it (1 when capture resumed right after)."""

    code: str
    category: Category
    message: str
    location: UserLocation | None = None
    stack: tuple[UserLocation, ...] = ()
    hints: tuple[str, ...] = ()
    cost: int = 0

    def __post_init__(self) -> None:
        if self.category not in CATEGORIES:
            raise ValueError(f"Unsupported.category must be one of {CATEGORIES}, "
                             f"got {self.category!r}")

    def render(self) -> str:
        cost = f" (~{self.cost} instructions outside graphs)" if self.cost > 1 else ""
        lines = [f"Graph break [{self.category}] {self.code}: {self.message}{cost}"]
        if self.location is not None:
            lines.append(self.location.render())
        if self.stack:
            lines.append("  (inlined from, outermost first:)")
            lines.extend(_indent(frame.render()) for frame in self.stack)
        lines.extend(f"  hint: {hint}" for hint in self.hints)
        return "\n".join(lines)

    __str__ = render


@dataclasses.dataclass(frozen=True)
class GuardFailure:
    """One guard that did not hold: `expr` as the user would write it, and both values as text."""

    expr: str
    expected: str
    actual: str

    def render(self) -> str:
        return f"{self.expr}: expected {self.expected}, got {self.actual}"

    __str__ = render


@dataclasses.dataclass(frozen=True)
class RecompileReason:
    """Why `function` was compiled again: the failed guards of the entries it missed."""

    function: str
    location: UserLocation | None
    failures: tuple[GuardFailure, ...]
    entry_count: int

    def render(self) -> str:
        where = f" ({self.location.short()})" if self.location is not None else ""
        why = "; ".join(f.render() for f in self.failures) or "no cache entry matched"
        return f"Recompiling {self.function}{where}, entry {self.entry_count}: {why}"

    __str__ = render


@dataclasses.dataclass(frozen=True)
class GuardRecord:
    """A guard as the user sees it: `expr` (e.g. "x.shape[0] == 8"), its `kind` (shape, dtype,
    constant, id, ...) and the user line whose value it protects."""

    expr: str
    kind: str
    location: UserLocation | None = None

    def render(self) -> str:
        where = f"  # {self.location.short()}" if self.location is not None else ""
        src = f": {self.location.source}" if self.location is not None and self.location.source else ""
        return f"[{self.kind}] {self.expr}{where}{src}"

    __str__ = render
