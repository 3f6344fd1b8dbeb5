"""Opcode handlers for `match` statements: GET_LEN, MATCH_SEQUENCE, MATCH_MAPPING, MATCH_KEYS and
MATCH_CLASS (3.11 and 3.12 compile patterns to the same instructions).

Each handler answers as CPython's would from what capture knows exactly: the subject's Python
type (its `tp_flags`, read from the real type object), a dict's constant keys, a class's
`__match_args__`. Literal and value sub-patterns are ordinary COMPARE_OP/IS_OP instructions, so
a pattern that compares a tensor's value breaks at that branch like any `if`. What cannot be
answered exactly stops capture with the reason: a class whose metaclass defines
`__instancecheck__` (typing.Protocol, torch.nn.Parameter), an object that fakes `__class__`,
keys of a mapping that is not a plain dict.
"""
from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, NoReturn

from kiln.capture.unsupported import Unsupported, unsupported
from kiln.capture.variables.base import VT, ConstantVT
from kiln.capture.variables.builtins import BuiltinVT
from kiln.capture.variables.containers import DictVT, TupleVT
from kiln.capture.variables.objects import lookup_class_attr

if TYPE_CHECKING:
    from kiln.capture.bytecode import Instr
    from kiln.capture.translator import Translator

# CPython's type flags (Include/object.h): what MATCH_SEQUENCE / MATCH_MAPPING test, and the
# builtins whose one positional sub-pattern is the subject itself (`case int(n)`)
_TPFLAGS_SEQUENCE = 1 << 5
_TPFLAGS_MAPPING = 1 << 6
_TPFLAGS_MATCH_SELF = 1 << 22

# isinstance() answers these metaclasses give depend only on the instance's type
_PLAIN_INSTANCECHECKS = (type.__dict__["__instancecheck__"],
                         abc.ABCMeta.__dict__["__instancecheck__"])
_PLAIN_SUBCLASSCHECKS = (type.__dict__["__subclasscheck__"],
                         abc.ABCMeta.__dict__["__subclasscheck__"])
_OBJECT_CLASS = object.__dict__["__class__"]


def GET_LEN(tx: Translator, inst: Instr) -> None:
    tx.push(BuiltinVT(len).call(tx, [tx.stack[-1]], {}))


def MATCH_SEQUENCE(tx: Translator, inst: Instr) -> None:
    tx.push(ConstantVT(bool(_subject_type(tx.stack[-1]).__flags__ & _TPFLAGS_SEQUENCE)))


def MATCH_MAPPING(tx: Translator, inst: Instr) -> None:
    tx.push(ConstantVT(bool(_subject_type(tx.stack[-1]).__flags__ & _TPFLAGS_MAPPING)))


def _subject_type(subject: VT) -> type:
    if isinstance(subject, ConstantVT):
        return type(subject.value)
    return subject.python_type()  # guarded wherever the subject was read from the frame


def MATCH_KEYS(tx: Translator, inst: Instr) -> None:
    """[subject, keys] -> [subject, keys, values tuple or None], looked up as `subject.get`."""
    keys_vt, subject = tx.stack[-1], tx.stack[-2]
    keys = _constant(keys_vt, "the keys of a mapping pattern")
    if not isinstance(subject, DictVT) or lookup_class_attr(subject.cls, "get") is not \
            dict.__dict__["get"]:
        unsupported("match-keys", f"mapping pattern on {subject.describe()}: capture reads "
                    "keys of plain dicts only", hint="match on a dict, or convert with dict()")
    seen: set[Any] = set()
    values = []
    for key in keys:
        if key in seen:
            unsupported("match-keys", f"mapping pattern checks duplicate key ({key!r})",
                        category="user-fixable")
        seen.add(key)
        if key not in subject.items:
            tx.push(ConstantVT(None))
            return
        values.append(subject.items[key])
    tx.push(TupleVT(values))


def MATCH_CLASS(tx: Translator, inst: Instr) -> None:
    """[subject, cls, names] -> [attributes tuple or None]; `inst.arg` positional sub-patterns
    (through `__match_args__`), then the keyword `names`."""
    names_vt, cls_vt, subject = tx.pop(), tx.pop(), tx.pop()
    names = _constant(names_vt, "the keywords of a class pattern")
    cls = _constant(cls_vt, "the class of a class pattern")
    if not isinstance(cls, type):
        unsupported("match-class", "called match pattern must be a class (TypeError)",
                    category="user-fixable")
    if not _is_instance(subject, cls):
        tx.push(ConstantVT(None))
        return
    match_self, positional = _positional_names(cls, inst.arg)
    attrs: list[VT] = [subject] if match_self else []
    seen: set[str] = set()
    for name in (*positional, *names):
        if name in seen:
            _bad_pattern(f"{cls.__name__}() got multiple sub-patterns for attribute {name!r}")
        seen.add(name)
        value = _match_attr(tx, subject, name)
        if value is None:
            tx.push(ConstantVT(None))
            return
        attrs.append(value)
    tx.push(TupleVT(attrs))


def _constant(vt: VT, what: str) -> Any:
    if not vt.is_constant():
        unsupported("match-pattern", f"{what} is {vt.describe()}, not a compile-time constant")
    return vt.as_constant()


def _bad_pattern(message: str) -> NoReturn:
    unsupported("match-class", f"{message} (TypeError)", category="user-fixable")


def _is_instance(subject: VT, cls: type) -> bool:
    """isinstance(subject, cls) where its answer depends on the subject's type alone."""
    meta = type(cls)
    if lookup_class_attr(meta, "__instancecheck__") not in _PLAIN_INSTANCECHECKS or \
            lookup_class_attr(meta, "__subclasscheck__") not in _PLAIN_SUBCLASSCHECKS:
        unsupported("match-class", f"class pattern {cls.__qualname__}(): its metaclass "
                    f"{meta.__qualname__} defines its own isinstance check, whose answer "
                    "capture cannot know", hint="match on a plain class, or test with "
                    "isinstance() outside the compiled function")
    if isinstance(subject, ConstantVT):
        return isinstance(subject.value, cls)
    kind = subject.python_type()
    if lookup_class_attr(kind, "__class__") is not _OBJECT_CLASS:
        unsupported("match-class", f"class pattern on {subject.describe()}: its class "
                    "overrides __class__, so isinstance() is not decided by its type")
    return issubclass(kind, cls)


def _positional_names(cls: type, count: int) -> tuple[bool, tuple[str, ...]]:
    """(whether the one positional sub-pattern is the subject itself, the attribute names of
    the positional sub-patterns), with CPython's checks in its order."""
    if not count:
        return False, ()
    try:
        match_args = getattr(cls, "__match_args__")
    except AttributeError:  # only then do the builtins' flag count (a subclass may redefine it)
        match_args, match_self = (), bool(cls.__flags__ & _TPFLAGS_MATCH_SELF)
    except Exception as err:  # the class's own lookup failed: eager raises it
        unsupported("match-class", f"{cls.__qualname__}.__match_args__ raised {err!r}",
                    category="user-fixable")
    else:
        match_self = False
        if type(match_args) is not tuple:
            _bad_pattern(f"{cls.__name__}.__match_args__ must be a tuple "
                         f"(got {type(match_args).__name__})")
    allowed = 1 if match_self else len(match_args)
    if allowed < count:
        _bad_pattern(f"{cls.__name__}() accepts {allowed} positional sub-pattern"
                     f"{'' if allowed == 1 else 's'} ({count} given)")
    if match_self:
        return True, ()
    names = match_args[:count]
    for name in names:
        if type(name) is not str:
            _bad_pattern(f"__match_args__ elements must be strings (got {type(name).__name__})")
    return False, names


def _match_attr(tx: Translator, subject: VT, name: str) -> VT | None:
    """`getattr(subject, name)`; None where it raises AttributeError (no match). Only a missing
    attribute capture saw directly counts: one raised inside an inlined property breaks."""
    try:
        return subject.getattr(tx, name)
    except Unsupported as err:
        if err.code == "missing-attribute" and not err.frames:
            return None
        raise
