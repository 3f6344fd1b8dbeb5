"""The exception that stops capture, and helpers that raise it with a stable code and a hint.

Raised deep inside the interpreter without a location; each translator frame it passes through
adds its current user line, so the root sees the full inline stack (innermost first) and turns it
into a `kiln.diagnostics.Unsupported` record.
"""
from __future__ import annotations

from typing import NoReturn

from kiln.diagnostics import Category, UserLocation

__all__ = ["Unsupported", "unsupported"]


class Unsupported(Exception):
    def __init__(self, code: str, message: str, *, category: Category = "not-supported-yet",
                 hints: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.category = category
        self.hints = hints
        self.frames: list[UserLocation] = []  # innermost first, filled while unwinding
        self.root_index: int | None = None  # the compiled frame's instruction it stopped at
        self.numpy_traced = False  # set when the failed trace had traced NumPy code as tensors


def unsupported(code: str, message: str, *, category: Category = "not-supported-yet",
                hint: str | None = None) -> NoReturn:
    raise Unsupported(code, message, category=category, hints=(hint,) if hint else ())
