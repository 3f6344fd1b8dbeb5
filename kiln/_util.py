"""Small helpers every stage may use (the ground floor: imports nothing from kiln)."""
from __future__ import annotations

from typing import Any

__all__ = ["is_hashable"]


def is_hashable(value: Any) -> bool:
    """Whether `value` can key a dict (rule tables are looked up with arbitrary user objects)."""
    try:
        hash(value)
    except TypeError:
        return False
    return True
