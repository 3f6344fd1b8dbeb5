"""Reads of user mapping objects read from the frame: registries such as transformers'
`AttentionInterface` (a `collections.abc.MutableMapping` with Python `__getitem__`) and
`_CanRecordRegistry` (a `dict` subclass reached through `super().get`).

`key in obj`, `obj[key]`, `obj.get(key)`, `len(obj)` with a constant key are answered at compile
time on the real object. The answer is then wrapped with a source that repeats the same read
(`MappingRead`), so the dispatcher's guard re-runs the object's own lookup on every call and a
registry changed later recompiles. Lookups are assumed free of side effects (what registries do);
one that raises breaks the graph at that instruction instead.
"""
from __future__ import annotations

import collections.abc
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kiln.capture.sources import Source
from kiln.capture.unsupported import unsupported
from kiln.capture.variables.base import VT

if TYPE_CHECKING:
    from kiln.capture.translator import Translator

__all__ = ["MappingRead", "is_user_mapping", "mapping_read", "MappingMethodVT"]

# Operators, spelled in guard source with {obj} the object's expression and {key} the key's.
_OPERATORS = {
    "contains": "({key} in {obj})",
    "getitem": "{obj}[{key}]",
    "len": "len({obj})",
}
_LITERAL_KEYS = (str, int, bool, type(None))


@dataclass(frozen=True)
class MappingRead(Source):
    """One read of a mapping object (`base`): an operator of `_OPERATORS`, or a call of the read
    method `op` with `key`, looked up on the object (`owner` None) or on the class
    `type(base).__mro__[owner]` (a `super().get(...)`)."""
    base: Source
    op: str
    key: object = None
    owner: int | None = None

    def _spell(self, obj: str) -> str:
        if self.op in _OPERATORS:
            return _OPERATORS[self.op].format(obj=obj, key=repr(self.key))
        args = "" if self.op == "__len__" else repr(self.key)
        if self.owner is None:
            return f"{obj}.{self.op}({args})"
        return f"type({obj}).__mro__[{self.owner}].{self.op}({obj}{', ' if args else ''}{args})"

    def expr(self) -> str:
        return self._spell(self.base.expr())

    def name(self) -> str:
        return self._spell(self.base.name())


def is_user_mapping(vt: VT) -> bool:
    """A user object (read from the frame, or a library constant such as a registry held in a
    decorator's closure) whose class is a mapping (not a plain dict)."""
    from kiln.capture.variables.objects import UserObjectVT
    return (isinstance(vt, UserObjectVT)
            and isinstance(vt.value, (collections.abc.Mapping, dict)) and type(vt.value) is not dict)


def mapping_read(tx: Translator, obj: VT, op: str, key: VT | None = None,
                 owner: int | None = None) -> VT:
    """The answer to one read of `obj` (see `MappingRead`), guarded by repeating the read."""
    from kiln.capture.variables.builder import wrap, wrap_derived
    real_key = None
    if key is not None:
        if not key.is_constant() or not isinstance(key.as_constant(), _LITERAL_KEYS):
            unsupported("mapping-key", f"a non-constant key into {obj.describe()}")
        real_key = key.as_constant()
    read = MappingRead(obj.source, op, real_key, owner)
    try:
        value = eval(read._spell("obj"), {"obj": obj.value})  # noqa: S307 - our own spelling
    except Exception as err:  # noqa: BLE001 - eager raises (or handles) it natively
        unsupported("mapping-read", f"{read._spell(obj.describe())} raised {type(err).__name__}")
    # a library constant (no source) is read like other library constants: without a guard
    return wrap(tx, value, read) if obj.source is not None else wrap_derived(tx, value)


class MappingMethodVT(VT):
    """A library read method of a user mapping (`obj.get`, `obj.keys`, or `super().get` in a
    registry class): a call with at most one constant argument (plus a `get` default) becomes a
    `mapping_read`."""

    _READS = ("get", "__getitem__", "__contains__", "__len__")

    def __init__(self, obj: VT, name: str, owner: int | None = None) -> None:
        self.obj, self.name, self.owner = obj, name, owner

    @classmethod
    def lookup(cls, obj: VT, name: str, owner: type | None = None) -> MappingMethodVT | None:
        if name not in cls._READS or not is_user_mapping(obj):
            return None
        return cls(obj, name, None if owner is None else type(obj.value).__mro__.index(owner))

    def call(self, tx: Translator, args: list[VT], kwargs: dict[str, VT]) -> VT:
        most = {"__len__": 0, "get": 2}.get(self.name, 1)
        if kwargs or len(args) > most or (self.name != "__len__" and not args):
            unsupported("mapping-call", f"{self.name}() with these arguments on "
                        f"{self.obj.describe()}")
        found = mapping_read(tx, self.obj, self.name, args[0] if args else None, self.owner)
        if self.name == "get" and len(args) == 2 and found.is_constant() and \
                found.as_constant() is None:
            return args[1]  # the default (a stored None reads the same as a missing key)
        return found

    def describe(self) -> str:
        return f"method {self.name} of {self.obj.describe()}"
