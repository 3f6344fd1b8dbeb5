"""Sources: where a value seen during capture came from.

A source is a small frozen tree (`Local("x")`, `Attr(Local("self"), "scale")`, `Param(...)`) with
two renderings:

- `expr()`: a Python expression that reloads the value inside a generated dispatcher or entry
  function. Module attributes are read through `__dict__`, `_modules`, `_parameters` and `_buffers`
  directly, never through `nn.Module.__getattr__` (37 µs for 16 parameters against 1.4 µs).
- `name()`: what the user would write (`self.attn.in_proj_weight`), used in guards shown to the
  user, recompile reasons and placeholder names.

Generated code sees these names: the frame's own argument names, `__G` (the function's globals),
`__cells` (its closure cells) and `__k<N>` (objects the code refers to, bound by the cache).
"""
from __future__ import annotations

import keyword
import math
import re
from dataclasses import dataclass

__all__ = [
    "Source", "Local", "Global", "Closure", "Attr", "DictAttr", "Param", "Buffer", "SubModule",
    "Item", "ConstSource", "FnClosure", "TypeAttr", "RefItem", "NumberTensor", "attr_expr",
    "is_literal_key",
]


def attr_expr(base: str, attr: str) -> str:
    """`base.attr` as source; `getattr(base, 'attr')` when the name is not an identifier
    (`getattr(obj, "weight-2")` must never read as `obj.weight - 2`)."""
    if type(attr) is str and attr.isidentifier() and not keyword.iskeyword(attr):
        return f"{base}.{attr}"
    return f"getattr({base}, {str(attr)!r})"


def is_literal_key(key: object) -> bool:
    """Whether `repr(key)` is Python source for an equal value (exact builtin types only: a
    subclass, an enum or any other object may print as anything)."""
    if type(key) in (str, int, bool, bytes, type(None)):
        return True
    if type(key) is float:
        return math.isfinite(key)
    return type(key) is tuple and all(is_literal_key(k) for k in key)


class Source:
    """Base class; subclasses are frozen dataclasses."""

    def expr(self) -> str:
        raise NotImplementedError

    def name(self) -> str:
        raise NotImplementedError

    def ident(self) -> str:
        """A Python identifier derived from `name()`, for placeholder names."""
        text = re.sub(r"[^0-9a-zA-Z_]+", "_", self.name()).strip("_")
        return text if text and not text[0].isdigit() else f"v_{text}"


@dataclass(frozen=True)
class Local(Source):
    local: str

    def expr(self) -> str:
        return self.local

    def name(self) -> str:
        return self.local


@dataclass(frozen=True)
class Global(Source):
    global_name: str

    def expr(self) -> str:
        return f"__G[{self.global_name!r}]"

    def name(self) -> str:
        return self.global_name


@dataclass(frozen=True)
class Closure(Source):
    """A free variable of the compiled (root) function: `fn.__closure__[index]`."""
    index: int
    var: str

    def expr(self) -> str:
        return f"__cells[{self.index}].cell_contents"

    def name(self) -> str:
        return self.var


@dataclass(frozen=True)
class FnClosure(Source):
    """A free variable of a function reached through another source (an inlined callee)."""
    fn: Source
    index: int
    var: str

    def expr(self) -> str:
        return f"{self.fn.expr()}.__closure__[{self.index}].cell_contents"

    def name(self) -> str:
        return f"{self.fn.name()}.<closure {self.var}>"


@dataclass(frozen=True)
class _Derived(Source):
    """A value read through another source (`base`)."""
    base: Source


@dataclass(frozen=True)
class Attr(_Derived):
    """`getattr(base, attr)` on a plain object."""
    attr: str

    def expr(self) -> str:
        return attr_expr(self.base.expr(), self.attr)

    def name(self) -> str:
        return f"{self.base.name()}.{self.attr}"


@dataclass(frozen=True)
class TypeAttr(_Derived):
    """A class attribute read through an instance: `type(base).attr`."""
    attr: str

    def expr(self) -> str:
        return attr_expr(f"type({self.base.expr()})", self.attr)

    def name(self) -> str:
        return f"type({self.base.name()}).{self.attr}"


@dataclass(frozen=True)
class _ModuleSlot(_Derived):
    attr: str
    slot = "__dict__"

    def expr(self) -> str:
        return f"{self.base.expr()}.{self.slot}[{self.attr!r}]"

    def name(self) -> str:
        return f"{self.base.name()}.{self.attr}"


@dataclass(frozen=True)
class DictAttr(_ModuleSlot):
    """An instance attribute read from `obj.__dict__` (module attributes, shadowing checks)."""
    slot = "__dict__"


@dataclass(frozen=True)
class Param(_ModuleSlot):
    slot = "_parameters"


@dataclass(frozen=True)
class Buffer(_ModuleSlot):
    slot = "_buffers"


@dataclass(frozen=True)
class SubModule(_ModuleSlot):
    slot = "_modules"


@dataclass(frozen=True)
class Item(_Derived):
    """`base[key]` for a constant key (list index, dict key, tuple index)."""
    key: object

    def expr(self) -> str:
        if not is_literal_key(self.key):  # a kiln bug: such keys are RefItem sources
            raise TypeError(f"key {type(self.key).__name__} cannot be rendered as source")
        return f"{self.base.expr()}[{self.key!r}]"

    def name(self) -> str:
        return f"{self.base.name()}[{self.key!r}]"


@dataclass(frozen=True)
class RefItem(_Derived):
    """`base[key]` for a key whose repr is not source: the key is a constant bound by the cache
    (`key_expr`, from `Constants.ref`); `label` is its repr for the user."""
    key_expr: str
    label: str

    def expr(self) -> str:
        return f"{self.base.expr()}[{self.key_expr}]"

    def name(self) -> str:
        return f"{self.base.name()}[{self.label}]"


@dataclass(frozen=True)
class NumberTensor(_Derived):
    """The number read from `base` as the 0-dim tensor a graph takes it as: `wrap` is the bound
    name of the function that makes it (`variables/number_tensors.py`). The user's name for it
    is the number's."""
    wrap: str

    def expr(self) -> str:
        return f"{self.wrap}({self.base.expr()})"

    def name(self) -> str:
        return self.base.name()


@dataclass(frozen=True)
class ConstSource(Source):
    """An object kiln holds itself (a default argument value), bound as `__k<index>`."""
    index: int
    label: str

    def expr(self) -> str:
        return f"__k{self.index}"

    def name(self) -> str:
        return self.label
