"""Containers during capture: tuples (incl. torch.Size and namedtuples), lists, dicts, slices and
iterators. Their items are trackers. Lists and dicts read from the frame remember their source;
when the traced code mutates them, the final contents are written back after the graph runs."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from kiln.capture.sources import Source
from kiln.capture.unsupported import unsupported
from kiln.capture.variables.base import VT, ConstantVT, NotConstant
from kiln.capture.variables.scalars import SymScalarVT

if TYPE_CHECKING:
    from kiln.capture.translator import Translator

__all__ = ["TupleVT", "ListVT", "DictVT", "SliceVT", "IteratorVT", "is_namedtuple_class",
           "tuple_fields"]


def is_namedtuple_class(cls: type) -> bool:
    return isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields")


def tuple_fields(cls: type) -> tuple[str, ...]:
    if is_namedtuple_class(cls):
        return tuple(cls._fields)
    return tuple(getattr(cls, "__match_args__", ()))  # torch.return_types structseqs


class _Sequence(VT):
    items: list[VT]

    def unpack(self, tx: Translator) -> list[VT]:
        return list(self.items)

    def truth(self, tx: Translator) -> bool:
        return bool(self.items)

    def is_constant(self) -> bool:
        return all(item.is_constant() for item in self.items)

    def _index(self, tx: Translator, key: VT) -> VT:
        if isinstance(key, SliceVT):
            return self._rebuild(self.items[key.as_constant()])
        if isinstance(key, SymScalarVT) and key.python_type() is int:
            # a Python list holds no graph values to choose from: the index is specialized
            # (its sources get their equality guards back), as TorchDynamo does
            key = ConstantVT(key.as_constant())
        if not key.is_constant():
            unsupported("dynamic-index", f"indexing {self.describe()} with {key.describe()}")
        index = key.as_constant()
        try:
            return self.items[index]
        except (IndexError, TypeError) as err:
            unsupported("bad-index", f"{self.describe()}[{index!r}]: {err}", category="user-fixable")

    def _rebuild(self, items: list[VT]) -> VT:
        raise NotImplementedError

    def _common(self, tx: Translator, name: str, args: list[VT]) -> VT | None:
        if name == "__getitem__":
            return self._index(tx, args[0])
        if name == "__len__":
            return ConstantVT(len(self.items))
        if name in ("index", "count", "__contains__"):
            values = [_constant_or_fail(i) for i in self.items]
            return ConstantVT(getattr(values, name)(*(a.as_constant() for a in args)))
        return None


class TupleVT(_Sequence):
    """A tuple; `cls` is tuple, torch.Size, a namedtuple class or a torch.return_types type."""

    def __init__(self, items: list[VT], cls: type = tuple, source: Source | None = None) -> None:
        self.items = list(items)
        self.cls = cls
        self.source = source

    def python_type(self) -> type:
        return self.cls

    def as_constant(self) -> Any:
        values = tuple(_constant_or_fail(i) for i in self.items)
        if self.cls is tuple:
            return values
        if is_namedtuple_class(self.cls):
            return self.cls(*values)
        return self.cls(values)

    def _rebuild(self, items: list[VT]) -> VT:
        return TupleVT(items, torch.Size if self.cls is torch.Size else tuple)

    def getattr(self, tx: Translator, name: str) -> VT:
        fields = tuple_fields(self.cls)
        if name in fields:
            return self.items[fields.index(name)]
        if name in ("count", "index", "__getitem__", "__len__", "__contains__", "numel"):
            return BoundBuiltinMethod(self, name)
        if name in ("_asdict", "_replace") and fields:
            return BoundBuiltinMethod(self, name)
        return super().getattr(tx, name)

    def call_method(self, tx: Translator, name: str, args: list[VT],
                    kwargs: dict[str, VT]) -> VT:
        result = self._common(tx, name, args)
        if result is not None:
            return result
        if name == "numel" and self.cls is torch.Size:
            return ConstantVT(self.as_constant().numel())
        if name == "_asdict":
            return DictVT(dict(zip(tuple_fields(self.cls), self.items)))
        if name == "_replace":
            fields = tuple_fields(self.cls)
            items = list(self.items)
            for key, value in kwargs.items():
                items[fields.index(key)] = value
            return TupleVT(items, self.cls)
        return super().call_method(tx, name, args, kwargs)


class ListVT(_Sequence):
    def __init__(self, items: list[VT], source: Source | None = None) -> None:
        self.items = list(items)
        self.source = source
        self.mutated = False

    def python_type(self) -> type:
        return list

    def as_constant(self) -> Any:
        return [_constant_or_fail(i) for i in self.items]

    def is_constant(self) -> bool:
        return False  # mutable: never folded into a constant

    def _rebuild(self, items: list[VT]) -> VT:
        return ListVT(items)

    def getattr(self, tx: Translator, name: str) -> VT:
        if hasattr(list, name):
            return BoundBuiltinMethod(self, name)
        return super().getattr(tx, name)

    def call_method(self, tx: Translator, name: str, args: list[VT],
                    kwargs: dict[str, VT]) -> VT:
        result = self._common(tx, name, args)
        if result is not None:
            return result
        return self._mutate(tx, name, args)

    def _mutate(self, tx: Translator, name: str, args: list[VT]) -> VT:
        items = self.items
        if name == "append":
            items.append(args[0])
        elif name == "extend":
            items.extend(args[0].unpack(tx))
        elif name == "insert":
            items.insert(args[0].as_constant(), args[1])
        elif name == "pop":
            value = items.pop(*(a.as_constant() for a in args))
            self._mark(tx)
            return value
        elif name == "__setitem__":
            key = args[0]
            if isinstance(key, SliceVT):
                items[key.as_constant()] = args[1].unpack(tx)
            else:
                items[key.as_constant()] = args[1]
        elif name == "__delitem__":
            del items[args[0].as_constant()]
        elif name == "clear":
            items.clear()
        elif name == "reverse":
            items.reverse()
        elif name == "copy":
            return ListVT(list(items))
        else:
            unsupported("list-method", f"list.{name}() is not supported in captured code")
        self._mark(tx)
        return ConstantVT(None)

    def _mark(self, tx: Translator) -> None:
        if not self.mutated:
            self.mutated = True
            if self.source is not None:
                tx.output.side_effects.append(("container", self))


class DictVT(VT):
    """A dict with constant keys (insertion order kept)."""

    def __init__(self, items: dict[Any, VT], source: Source | None = None,
                 cls: type = dict) -> None:
        self.items = dict(items)
        self.source = source
        self.cls = cls
        self.mutated = False

    def python_type(self) -> type:
        return self.cls

    def unpack(self, tx: Translator) -> list[VT]:
        return [ConstantVT(k) for k in self.items]

    def truth(self, tx: Translator) -> bool:
        return bool(self.items)

    def getattr(self, tx: Translator, name: str) -> VT:
        if hasattr(dict, name):
            return BoundBuiltinMethod(self, name)
        return super().getattr(tx, name)

    def call_method(self, tx: Translator, name: str, args: list[VT],
                    kwargs: dict[str, VT]) -> VT:
        items = self.items
        keys = [_constant_or_fail(a) for a in args[:1]] if name not in ("update",) else []
        if name == "__getitem__":
            if keys[0] not in items:
                unsupported("missing-key", f"key {keys[0]!r} not in dict", category="user-fixable")
            return items[keys[0]]
        if name in ("__contains__",):
            return ConstantVT(keys[0] in items)
        if name == "__len__":
            return ConstantVT(len(items))
        if name == "get":
            return items.get(keys[0], args[1] if len(args) > 1 else ConstantVT(None))
        if name == "keys":
            return ListVT([ConstantVT(k) for k in items])
        if name == "values":
            return ListVT(list(items.values()))
        if name == "items":
            return ListVT([TupleVT([ConstantVT(k), v]) for k, v in items.items()])
        if name == "copy":
            return DictVT(items)
        return self._mutate(tx, name, keys, args, kwargs)

    def _mutate(self, tx: Translator, name: str, keys: list, args: list[VT],
                kwargs: dict[str, VT]) -> VT:
        items = self.items
        result: VT = ConstantVT(None)
        if name == "__setitem__":
            items[keys[0]] = args[1]
        elif name == "__delitem__":
            del items[keys[0]]
        elif name == "pop":
            result = items.pop(keys[0], *args[1:])
        elif name == "setdefault":
            result = items.setdefault(keys[0], args[1] if len(args) > 1 else ConstantVT(None))
        elif name == "update":
            if args:
                other = args[0]
                if not isinstance(other, DictVT):
                    unsupported("dict-update", "dict.update() with a non-dict argument")
                items.update(other.items)
            items.update(kwargs)
        elif name == "clear":
            items.clear()
        else:
            unsupported("dict-method", f"dict.{name}() is not supported in captured code")
        if not self.mutated:
            self.mutated = True
            if self.source is not None:
                tx.output.side_effects.append(("container", self))
        return result


class SliceVT(VT):
    def __init__(self, start: VT, stop: VT, step: VT) -> None:
        self.start, self.stop, self.step = start, stop, step

    def python_type(self) -> type:
        return slice

    def is_constant(self) -> bool:
        return all(p.is_constant() for p in (self.start, self.stop, self.step))

    def as_constant(self) -> slice:
        return slice(*(_constant_or_fail(p) for p in (self.start, self.stop, self.step)))


class IteratorVT(VT):
    """An iterator over trackers already known (lists, ranges, zip, enumerate, generators)."""

    def __init__(self, items: list[VT]) -> None:
        self.items = list(items)
        self.pos = 0

    def python_type(self) -> type:
        return type(iter([]))

    def next_item(self) -> VT | None:
        if self.pos >= len(self.items):
            return None
        self.pos += 1
        return self.items[self.pos - 1]

    def unpack(self, tx: Translator) -> list[VT]:
        rest = self.items[self.pos:]
        self.pos = len(self.items)
        return rest


class BoundBuiltinMethod(VT):
    """`container.method` before the call."""

    def __init__(self, owner: VT, name: str) -> None:
        self.owner = owner
        self.name = name

    def call(self, tx: Translator, args: list[VT], kwargs: dict[str, VT]) -> VT:
        return self.owner.call_method(tx, self.name, args, kwargs)


def _constant_or_fail(vt: VT) -> Any:
    try:
        return vt.as_constant()
    except NotConstant:
        unsupported("not-constant", f"{vt.describe()} is used where a compile-time constant "
                    "is needed")
