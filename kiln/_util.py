"""Small helpers every stage may use (the ground floor: imports nothing from kiln)."""
from __future__ import annotations

from typing import Any

__all__ = ["error_line", "is_hashable"]


def is_hashable(value: Any) -> bool:
    """Whether `value` can key a dict (rule tables are looked up with arbitrary user objects)."""
    try:
        hash(value)
    except TypeError:
        return False
    return True


def error_line(err: BaseException) -> str:
    """`Type: first line of the message` (just `Type` for an empty message), for one-line logs
    and records of an exception."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
