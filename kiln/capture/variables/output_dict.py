"""Ordered-dict dataclasses made by the traced code: transformers' `ModelOutput` family.

Such a class is a `@dataclass` that subclasses `OrderedDict`: its fields are attributes, and the
fields that are not None are also its items, in the order they were set (`out[0]`,
`out["logits"]`, `out.to_tuple()`, `len(out)`). `OutputDictVT` models that protocol directly
instead of interpreting `ModelOutput.__post_init__` (which needs `dataclasses.fields`, `try` blocks
and dict C methods). Leaving a graph, `build_output_dict` makes the object again through the
class's own `__init__` and `__setitem__`.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import TYPE_CHECKING, Any

from kiln.capture.unsupported import unsupported
from kiln.capture.variables.base import VT, ConstantVT, LazyVT
from kiln.capture.variables.containers import TupleVT

if TYPE_CHECKING:
    from kiln.capture.translator import Translator

__all__ = ["OutputDictVT", "is_output_dict_class", "build_output_dict"]

# transformers renamed `past_key_values`/`cache_params` to `cache`; its outputs map the old names.
_RENAMED = {"past_key_values": "cache", "cache_params": "cache"}


def is_output_dict_class(cls: type) -> bool:
    return isinstance(cls, type) and issubclass(cls, collections.OrderedDict) and \
        dataclasses.is_dataclass(cls)


def build_output_dict(cls: type, items: dict[str, Any]) -> Any:
    """The real object, at run time: empty, then each item set in order (`__setitem__` of a
    ModelOutput sets the attribute too)."""
    obj = cls()
    for key, value in items.items():
        obj[key] = value
    return obj


def _is_none(vt: VT) -> bool:
    return isinstance(vt, ConstantVT) and vt.value is None


class OutputDictVT(VT):
    """An instance of an ordered-dict dataclass: `values` holds every field's tracker, `keys`
    the fields that are items (not None when set)."""

    def __init__(self, cls: type, values: dict[str, VT], keys: list[str]) -> None:
        self.cls, self.values, self.keys = cls, values, keys

    @classmethod
    def construct(cls, tx: Translator, klass: type, args: list[VT],
                  kwargs: dict[str, VT]) -> OutputDictVT:
        fields = [f for f in dataclasses.fields(klass) if f.init]
        if len(args) > len(fields) or any(k not in {f.name for f in fields} for k in kwargs):
            unsupported("bad-call", f"{klass.__name__}() arguments do not match its fields",
                        category="user-fixable")
        values: dict[str, VT] = {}
        for index, field in enumerate(fields):
            if index < len(args):
                values[field.name] = args[index]
            elif field.name in kwargs:
                values[field.name] = kwargs[field.name]
            elif field.default is not dataclasses.MISSING:
                values[field.name] = _constant(tx, field.default)
            else:
                unsupported("bad-call", f"{klass.__name__}() missing {field.name!r}",
                            category="user-fixable")
        values = {k: v.realize(tx) if isinstance(v, LazyVT) else v for k, v in values.items()}
        first, rest = fields[0].name, [f.name for f in fields[1:]]
        if all(_is_none(values[n]) for n in rest) and not _is_none(values[first]):
            from kiln.capture.variables.tensor import TensorVT
            if not isinstance(values[first], TensorVT):  # the "iterator of pairs" form
                unsupported("output-dict", f"{klass.__name__}(...) with only a non-tensor "
                            "first field")
        return cls(klass, values, [n for n in values if not _is_none(values[n])])

    def python_type(self) -> type:
        return self.cls

    def truth(self, tx: Translator) -> bool:
        return bool(self.keys)

    def _key(self, name: str) -> str:
        return _RENAMED.get(name, name) if name not in self.values else name

    def getattr(self, tx: Translator, name: str) -> VT:
        name = self._key(name)
        if name in self.values:
            return self.values[name]
        if name == "__class__":
            from kiln.capture.variables.objects import ClassVT
            return ClassVT(self.cls)
        if name in _METHODS:
            return _OutputDictMethodVT(self, name)
        unsupported("output-dict-attribute", f"{self.cls.__name__}.{name} is not supported")

    def setattr(self, tx: Translator, name: str, value: VT) -> None:
        name = self._key(name)
        if name not in self.values:
            unsupported("output-dict-attribute", f"setting {self.cls.__name__}.{name}, not a field")
        self.values[name] = value
        if not _is_none(value) and name not in self.keys:
            self.keys.append(name)  # an OrderedDict appends a new key

    def items_tuple(self) -> TupleVT:
        return TupleVT([self.values[k] for k in self.keys])

    def getitem(self, tx: Translator, key: VT) -> VT:
        if not key.is_constant():
            unsupported("output-dict-key", f"a non-constant key into {self.cls.__name__}")
        k = key.as_constant()
        if isinstance(k, str):
            k = self._key(k)
            if k not in self.keys:
                unsupported("output-dict-key", f"{self.cls.__name__}[{k!r}] is not set",
                            category="user-fixable")
            return self.values[k]
        return self.items_tuple().call_method(tx, "__getitem__", [key], {})

    def contains(self, key: VT) -> bool:
        return key.is_constant() and self._key(key.as_constant()) in self.keys

    def unpack(self, tx: Translator) -> list[VT]:
        return [ConstantVT(k) for k in self.keys]

    def describe(self) -> str:
        return f"a {self.cls.__name__} output"


def _constant(tx: Translator, value: Any) -> VT:
    from kiln.capture.variables.builder import wrap_derived
    return wrap_derived(tx, value)


class _OutputDictMethodVT(VT):
    """`out.to_tuple`, `out.keys`, `out.values`, `out.items`, `out.get`, `out.__getitem__`."""

    def __init__(self, owner: OutputDictVT, name: str) -> None:
        self.owner, self.name = owner, name

    def call(self, tx: Translator, args: list[VT], kwargs: dict[str, VT]) -> VT:
        return _METHODS[self.name](tx, self.owner, *args, **kwargs)

    def describe(self) -> str:
        return f"method {self.name} of {self.owner.describe()}"


def _get(tx: Translator, out: OutputDictVT, key: VT, default: VT | None = None) -> VT:
    if out.contains(key):
        return out.getitem(tx, key)
    return default if default is not None else ConstantVT(None)


_METHODS = {
    "to_tuple": lambda tx, out: out.items_tuple(),
    "keys": lambda tx, out: TupleVT([ConstantVT(k) for k in out.keys]),
    "values": lambda tx, out: out.items_tuple(),
    "items": lambda tx, out: TupleVT([TupleVT([ConstantVT(k), out.values[k]])
                                      for k in out.keys]),
    "get": _get,
    "__getitem__": lambda tx, out, key: out.getitem(tx, key),
    "__contains__": lambda tx, out, key: ConstantVT(out.contains(key)),
    "__len__": lambda tx, out: ConstantVT(len(out.keys)),
}
