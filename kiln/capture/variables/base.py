"""Variable trackers: what the symbolic interpreter keeps on its stack and in its locals.

A `VT` stands for one Python value during capture. It knows the value's Python type, where it came
from (`source`, when it was read from the frame), and how to take part in Python operations
(attribute reads, calls, iteration, truth tests). Operations a tracker cannot model raise
`Unsupported`, which makes the frame run eagerly with the reason recorded.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kiln.capture.sources import Source
from kiln.capture.unsupported import unsupported

if TYPE_CHECKING:
    from kiln.capture.translator import Translator

__all__ = ["VT", "NotConstant", "ConstantVT", "NullVT", "DeletedVT", "CellBox", "LazyVT"]


class NotConstant(Exception):
    pass


class VT:
    """Base tracker. Subclasses override the operations they support."""

    source: Source | None = None

    def python_type(self) -> type:
        unsupported("unknown-type", f"the Python type of {self!r} is unknown")

    def is_constant(self) -> bool:
        return False

    def as_constant(self) -> Any:
        raise NotConstant(repr(self))

    def getattr(self, tx: Translator, name: str) -> VT:
        unsupported("unsupported-attribute",
                    f"reading attribute {name!r} of {self.describe()} is not supported")

    def setattr(self, tx: Translator, name: str, value: VT) -> None:
        unsupported("unsupported-setattr",
                    f"setting attribute {name!r} on {self.describe()} is not supported")

    def delattr(self, tx: Translator, name: str) -> None:
        unsupported("unsupported-delattr",
                    f"deleting attribute {name!r} of {self.describe()} is not supported")

    def call(self, tx: Translator, args: list[VT], kwargs: dict[str, VT]) -> VT:
        unsupported("unsupported-call", f"calling {self.describe()} is not supported")

    def call_method(self, tx: Translator, name: str, args: list[VT],
                    kwargs: dict[str, VT]) -> VT:
        return self.getattr(tx, name).call(tx, args, kwargs)

    def unpack(self, tx: Translator) -> list[VT]:
        """The items iteration would produce, all at once."""
        unsupported("unsupported-iteration", f"iterating over {self.describe()} is not supported")

    def truth(self, tx: Translator) -> bool:
        unsupported("unsupported-bool", f"the truth value of {self.describe()} is not known "
                    "at compile time")

    def describe(self) -> str:
        where = f" ({self.source.name()})" if self.source is not None else ""
        try:
            kind = self.python_type().__name__
        except Exception:
            kind = type(self).__name__
        return f"a {kind} value{where}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.describe()})"


class ConstantVT(VT):
    """A Python value known at compile time (numbers, strings, None, dtypes, devices, ...)."""

    def __init__(self, value: Any, source: Source | None = None) -> None:
        self.value = value
        self.source = source

    def python_type(self) -> type:
        return type(self.value)

    def is_constant(self) -> bool:
        return True

    def as_constant(self) -> Any:
        return self.value

    def getattr(self, tx: Translator, name: str) -> VT:
        from kiln.capture.variables.builder import wrap_derived
        try:
            attr = getattr(self.value, name)
        except AttributeError:
            unsupported("missing-attribute", f"{self.value!r} has no attribute {name!r}",
                        category="user-fixable")
        return wrap_derived(tx, attr)

    def truth(self, tx: Translator) -> bool:
        return bool(self.value)

    def unpack(self, tx: Translator) -> list[VT]:
        try:
            items = list(self.value)
        except TypeError:
            unsupported("not-iterable", f"{self.value!r} is not iterable", category="user-fixable")
        return [ConstantVT(item) for item in items]

    def describe(self) -> str:
        text = repr(self.value)
        return text if len(text) < 60 else f"a {type(self.value).__name__} constant"


class NullVT(VT):
    """The NULL slot CPython pushes before a callable (3.11+)."""

    def describe(self) -> str:
        return "NULL"


class DeletedVT(VT):
    """What a pending attribute write holds after `del obj.attr`: the entry replays a deletion,
    and reads of the name see the class attribute again (or none)."""

    def describe(self) -> str:
        return "a deleted attribute"


class CellBox:
    """A closure cell during capture: holds a tracker (or None while empty).

    `source` is set for cells of real functions (their contents live on after the call, so writes
    are replayed); cells created by the traced code itself have no source. `detached` marks a
    real function's cell capture has no source for (library code): a write to it could not be
    replayed, so it stops capture. `written`: a write is already recorded as a side effect."""

    def __init__(self, value: VT | None = None, source: Source | None = None, *,
                 detached: bool = False) -> None:
        self.value = value
        self.source = source
        self.detached = detached
        self.written = False


class LazyVT(VT):
    """A frame input not yet looked at: wrapped (and guarded) on first use."""

    def __init__(self, value: Any, source: Source) -> None:
        self.value = value
        self.source = source

    def realize(self, tx: Translator) -> VT:
        from kiln.capture.variables.builder import wrap
        return wrap(tx, self.value, self.source)
