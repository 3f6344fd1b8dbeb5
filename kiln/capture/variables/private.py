"""Objects that exist only inside one compilation: `copy.deepcopy` of a tensor-free object.

Library code copies small configuration objects on the forward path (transformers'
`get_text_config` deep-copies a flat encoder-decoder config and renames its fields). Such a copy
is private: nothing outside the traced code can see it until it is returned. kiln makes the copy
for real at compile time (`PrivateObjectVT`) and folds what the code does to it: attribute reads,
writes and deletes act on the real copy, and its methods run for real when called with constant
arguments. The original's identity is guarded; its contents are taken as they were when traced
(a config deep-copied during forward and later mutated in place is not detected).
"""
from __future__ import annotations

import copy
import types
from typing import TYPE_CHECKING, Any

import torch

from kiln.capture.unsupported import unsupported
from kiln.capture.variables.base import VT, NotConstant

if TYPE_CHECKING:
    from kiln.capture.translator import Translator

__all__ = ["PrivateObjectVT", "register_private"]


class PrivateObjectVT(VT):
    """A compile-time copy (see module docstring); `value` is the real copy."""

    def __init__(self, value: Any) -> None:
        self.value = value

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
            unsupported("missing-attribute", f"{self.describe()} has no attribute {name!r}",
                        category="user-fixable")
        if isinstance(attr, types.MethodType) and attr.__self__ is self.value:
            return _FoldedMethodVT(self, attr)
        if attr is self.value:
            return self
        return wrap_derived(tx, attr)

    def setattr(self, tx: Translator, name: str, value: VT) -> None:
        setattr(self.value, name, _constant(value, f"setting {name!r} on {self.describe()}"))

    def delattr(self, tx: Translator, name: str) -> None:
        try:
            delattr(self.value, name)
        except Exception as err:  # noqa: BLE001 - eager raises it
            unsupported("delattr", f"deleting {name!r} of {self.describe()} raised {err!r}",
                        category="user-fixable")

    def describe(self) -> str:
        return f"a private copy of a {type(self.value).__name__}"


class _FoldedMethodVT(VT):
    """A method of a private copy: run for real on constant arguments."""

    def __init__(self, owner: PrivateObjectVT, method: types.MethodType) -> None:
        self.owner, self.method = owner, method

    def call(self, tx: Translator, args: list[VT], kwargs: dict[str, VT]) -> VT:
        from kiln.capture.variables.builder import wrap_derived
        why = f"calling {self.method.__name__} of {self.owner.describe()}"
        real_args = [_constant(a, why) for a in args]
        real_kwargs = {k: _constant(v, why) for k, v in kwargs.items()}
        result = self.method(*real_args, **real_kwargs)
        return self.owner if result is self.owner.value else wrap_derived(tx, result)


def _constant(vt: VT, why: str) -> Any:
    try:
        return vt.as_constant()
    except NotConstant:
        unsupported("private-object", f"{why} with a value only known at run time")


def _holds_tensor(value: Any, depth: int = 3) -> bool:
    """Whether a tensor sits in the object's attributes or containers (a few levels down)."""
    if isinstance(value, torch.Tensor):
        return True
    if depth == 0:
        return False
    if isinstance(value, dict):
        return any(_holds_tensor(v, depth - 1) for v in value.values())
    if isinstance(value, (list, tuple, set)):
        return any(_holds_tensor(v, depth - 1) for v in value)
    inner = getattr(value, "__dict__", None)
    return isinstance(inner, dict) and _holds_tensor(inner, depth - 1)


def _deepcopy(tx: Translator, args: list[VT], kwargs: dict[str, VT]) -> VT:
    from kiln.capture.variables.objects import UserObjectVT
    if len(args) != 1 or kwargs:
        unsupported("deepcopy", "copy.deepcopy with a memo")
    (obj,) = args
    if isinstance(obj, PrivateObjectVT) or isinstance(obj, UserObjectVT) and \
            not _holds_tensor(obj.value):
        original = obj.as_constant()  # guards the identity of an object read from the frame
        return PrivateObjectVT(copy.deepcopy(original))
    if obj.is_constant():
        from kiln.capture.variables.builder import wrap_derived
        return wrap_derived(tx, copy.deepcopy(obj.as_constant()))
    unsupported("deepcopy", f"copy.deepcopy of {obj.describe()}")


def register_private() -> None:
    from kiln.capture.variables.builtins import register_special
    register_special(copy.deepcopy, _deepcopy)
