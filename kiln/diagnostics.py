"""Diagnostic records: the one set of facts that logs, `kiln.explain` and errors all render.

Records are plain frozen dataclasses with `render() -> str`; they hold strings and numbers only (no
torch objects), so they can be stored, compared, dumped and printed anywhere. Reports are built from
these records, never parsed back out of log text.
"""

from __future__ import annotations

import dataclasses
import linecache
import os
import re
from types import CodeType
from typing import Literal

__all__ = [
    "CATEGORIES",
    "GuardFailure",
    "GuardRecord",
    "RecompileReason",
    "Unsupported",
    "UserLocation",
    "user_terms",
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
        head = f'  File "{self.filename}", line {self.lineno}, in {user_function(self.function)}'
        return f"{head}\n    {self.source}" if self.source else head

    __str__ = render


# Names that only generated code has (kiln.capture.breaks): a resume function continues a
# function after a graph break, and its `___stack<i>` arguments carry the values that were on
# the operand stack there. Records keep them (they are what the guards test); rendering turns
# them into what the user wrote.
# a resume function of a resume function nests the prefix: the outermost one is the latest break
_RESUME = re.compile(r"__resume_at_(\d+)_in_(?:__resume_at_\d+_in_)*(\w+)")
_STACK = re.compile(r"___stack\d+")
# `x = e`, `x += e`, `return e`, `if e:`, `while e:` → e: the expression whose value was live
_EXPRESSION = re.compile(r"^(?:[\w.\[\], ]+\s*[-+*/@%&|^]?=(?!=)\s*|return\s+|(?:el)?if\s+|"
                         r"while\s+)?(?P<expr>.+?):?$")


def user_terms(text: str, location: UserLocation | None = None) -> str:
    """`text` with generated-code names in user terms: `__resume_at_46_in_g` → "the code after
    line 46 of g"; `___stack3` → "the value of `float(y.sum())` at line 46", the expression of
    the line `location` points at (the one that broke the graph). Where several stack values
    appear, each is only "a value computed in" that expression: the source does not say which."""
    text = _RESUME.sub(lambda m: f"the code after line {m.group(1)} of {m.group(2)}", text)
    slots = set(_STACK.findall(text))
    if not slots:
        return text
    if location is None or not location.source:
        return _STACK.sub("a value live at the graph break", text)
    expr = _EXPRESSION.match(location.source).group("expr")
    what = "the value of" if len(slots) == 1 else "a value computed in"
    return _STACK.sub(f"{what} `{expr}` at line {location.lineno}", text)


def user_function(name: str) -> str:
    """A function name as the user wrote it: a resume function is the function it continues."""
    match = _RESUME.fullmatch(name)
    return f"{match.group(2)} (after line {match.group(1)})" if match else name


def _break_location(function: str, location: UserLocation | None) -> UserLocation | None:
    """The line a resume function continues after (its name says which), in the same file."""
    match = _RESUME.fullmatch(function.rsplit(".", 1)[-1])
    if match is None or location is None:
        return None
    lineno = int(match.group(1))
    source = linecache.getline(location.filename, lineno).strip()
    return UserLocation(location.filename, lineno, match.group(2), source)


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
        message = user_terms(self.message, self.location)
        lines = [f"Graph break [{self.category}] {self.code}: {message}{cost}"]
        if self.location is not None:
            lines.append(self.location.render())
        if self.stack:
            lines.append("  (inlined from, outermost first:)")
            lines.extend(_indent(frame.render()) for frame in self.stack)
        lines.extend(f"  hint: {user_terms(hint, self.location)}" for hint in self.hints)
        return "\n".join(lines)

    __str__ = render


@dataclasses.dataclass(frozen=True)
class GuardFailure:
    """One guard that did not hold: `expr` as the user would write it, and both values as text."""

    expr: str
    expected: str
    actual: str

    def render(self, location: UserLocation | None = None) -> str:
        """`location`: the line that broke the graph, when the guard is on a resume function."""
        expr, expected, actual = (user_terms(t, location)
                                  for t in (self.expr, self.expected, self.actual))
        return f"{expr}: expected {expected}, got {actual}"

    __str__ = render


@dataclasses.dataclass(frozen=True)
class RecompileReason:
    """Why `function` was compiled again: the failed guards of the entries it missed."""

    function: str
    location: UserLocation | None
    failures: tuple[GuardFailure, ...]
    entry_count: int
    # what this recompile makes dynamic, in words ("x.shape[0] changed from 1 to 2")
    became_dynamic: tuple[str, ...] = ()

    def render(self) -> str:
        where = f" ({self.location.short()})" if self.location is not None else ""
        at_break = _break_location(self.function, self.location)
        why = "; ".join(f.render(at_break) for f in self.failures) or "no cache entry matched"
        dynamic = ""
        if self.became_dynamic:
            dynamic = (f"; now dynamic (automatic dynamic: the value changed between calls): "
                       f"{', '.join(user_terms(d) for d in self.became_dynamic)}")
        return (f"Recompiling {user_terms(self.function)}{where}, entry {self.entry_count}: "
                f"{why}{dynamic}")

    __str__ = render


@dataclasses.dataclass(frozen=True)
class GuardRecord:
    """A guard as the user sees it: `expr` (e.g. "x.shape[0] == 8"), its `kind` (shape, dtype,
    constant, id, ...) and the user line whose value it protects."""

    expr: str
    kind: str
    location: UserLocation | None = None

    def render(self) -> str:
        expr = user_terms(self.expr, self.location)
        where = f"  # {self.location.short()}" if self.location is not None else ""
        src = f": {self.location.source}" if self.location is not None and self.location.source else ""
        return f"[{self.kind}] {expr}{where}{src}"

    __str__ = render
