"""Reflection that library code runs on every forward, folded to constants at compile time.

`inspect.signature(fn)` of a function capture knows (its identity is guarded where it came from the
frame) is computed once and becomes a constant; reads of the resulting `Signature` and `Parameter`
objects, and of `mappingproxy` views such as `sig.parameters`, are constant reads too.
"""
from __future__ import annotations

import inspect
import types
from typing import TYPE_CHECKING, Any

from kiln.capture.unsupported import unsupported
from kiln.capture.variables.base import VT, ConstantVT

if TYPE_CHECKING:
    from kiln.capture.translator import Translator

__all__ = ["register_reflection", "LruCachedVT"]


class LruCachedVT(VT):
    """A `functools.lru_cache` function. Called with constant arguments it is called for real at
    compile time (its answer is cached for those arguments anyway: what eager gets on every call
    but the first); otherwise its wrapped function is interpreted."""

    def __init__(self, fn: Any, source: Any = None) -> None:
        self.fn, self.source = fn, source

    def as_constant(self) -> Any:
        return self.fn

    def call(self, tx: Translator, args: list[VT], kwargs: dict[str, VT]) -> VT:
        from kiln.capture.sources import Attr
        from kiln.capture.variables.builder import wrap_derived
        from kiln.capture.variables.functions import UserFunctionVT
        values = [*args, *kwargs.values()]
        if all(v.is_constant() for v in values):
            try:
                result = self.fn(*[a.as_constant() for a in args],
                                 **{k: v.as_constant() for k, v in kwargs.items()})
            except Exception as err:  # noqa: BLE001 - eager raises it natively
                unsupported("lru-cache-call", f"{self.fn.__qualname__} raised "
                            f"{type(err).__name__}")
            return wrap_derived(tx, result)
        wrapped = UserFunctionVT(self.fn.__wrapped__,
                                 Attr(self.source, "__wrapped__") if self.source else None)
        return wrapped.call(tx, args, kwargs)


def _callable_value(vt: VT) -> Any:
    """The real callable behind a tracker, or None when capture does not know it."""
    from kiln.capture.variables.functions import BoundMethodVT, NestedFunctionVT
    if isinstance(vt, BoundMethodVT):
        func = _callable_value(vt.fn)
        owner = getattr(vt.self_vt, "value", None) or getattr(vt.self_vt, "module", None)
        if func is None or owner is None:
            return None
        return types.MethodType(func, owner)
    if isinstance(vt, NestedFunctionVT):
        return None
    try:
        return vt.as_constant()
    except Exception:  # noqa: BLE001 - not a known value
        return getattr(vt, "fn", None)


def _signature(tx: Translator, args: list[VT], kwargs: dict[str, VT]) -> VT:
    if len(args) != 1 or kwargs:
        unsupported("signature-call", "inspect.signature with options")
    fn = _callable_value(args[0])
    if fn is None:
        unsupported("signature-call", f"inspect.signature of {args[0].describe()}")
    try:
        return ConstantVT(inspect.signature(fn))
    except (TypeError, ValueError) as err:
        unsupported("signature-call", f"inspect.signature raised {type(err).__name__}")


def register_reflection() -> None:
    from kiln.capture.variables.builtins import register_special
    register_special(inspect.signature, _signature)
    from kiln.capture.variables.private import register_private
    register_private()
