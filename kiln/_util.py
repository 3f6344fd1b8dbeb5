"""Small helpers every stage may use (the ground floor: imports nothing from kiln)."""
from __future__ import annotations

from typing import Any

__all__ = ["error_line", "is_hashable", "memory_from"]


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


def memory_from(t: Any) -> Any:
    """`t`'s storage from its first element to the storage's end, as a 1-D tensor of its dtype
    (shares memory): what a kernel handed `t.data_ptr()` can address. Kernels index inputs from
    their first element, so one compiled graph serves `xs[0]` and `xs[5]`."""
    import torch

    offset = t.storage_offset()
    n = t.untyped_storage().nbytes() // t.element_size() - offset
    return torch.as_strided(t, (max(n, 0),), (1,), offset)
