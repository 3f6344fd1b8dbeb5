"""Logging calls replayed after the graph (`kiln.config.reorder_logging`).

`logger.info(...)` and friends, `logging.warning(...)` and `warnings.warn(...)` return None and
only emit, so instead of breaking the graph the call is recorded as a side effect (the entry
replays it after the graph, in program order with the other side effects) with its arguments
as they were at the call: immutable constants, and tensors/numbers the graph outputs. What a
replay could not reproduce breaks at the call, which then runs natively (`_refusal`)."""
from __future__ import annotations

import enum
import functools
import logging
import types
import warnings
from typing import TYPE_CHECKING, Any

import torch

from kiln.capture.guards import Guard
from kiln.capture.unsupported import unsupported
from kiln.capture.variables.base import VT, ConstantVT, LazyVT
from kiln.capture.variables.containers import DictVT, ListVT, TupleVT
from kiln.capture.variables.functions import OpaqueCallableVT
from kiln.capture.variables.objects import OpaqueMethodVT
from kiln.capture.variables.scalars import SymScalarVT
from kiln.capture.variables.tensor import TensorVT
from kiln.config import config

if TYPE_CHECKING:
    from kiln.capture.output_graph import OutputGraph
    from kiln.capture.translator import Translator

__all__ = ["LogMethodVT", "LogFunctionVT", "LogQueryVT", "logger_method", "log_function",
           "check_logged_tensors"]

_LEVELS = ("debug", "info", "warning", "warn", "error", "critical", "fatal", "log")
_LOGGER_TYPES = (logging.Logger, logging.LoggerAdapter)
_QUERIES = ("isEnabledFor", "getEffectiveLevel")  # reads: folded to guarded constants
# Module-level functions replayed like logger methods.
_FUNCTIONS = {getattr(logging, n) for n in _LEVELS if hasattr(logging, n)} | {warnings.warn}
_EXC_INFO = "it logs the exception being handled (sys.exc_info()), which is over when the " \
            "graph has run"
_IMMUTABLE = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device,
              torch.layout, torch.memory_format, range, slice, type(Ellipsis), enum.Enum, type)


def logger_method(obj: VT, name: str, attr: Any) -> VT | None:
    """The tracker for `obj.name` when `obj` is a Logger/LoggerAdapter and the method only
    emits: logging's own level methods, or a level-named helper a library set on the class
    (transformers' `warning_once`, an lru_cache wrapper). None: the usual attribute path."""
    if not config.reorder_logging or not isinstance(obj.value, _LOGGER_TYPES):
        return None
    fn = attr.__wrapped__ if isinstance(attr, functools._lru_cache_wrapper) else attr
    if not isinstance(fn, types.FunctionType):
        return None
    if fn.__module__ == "logging":  # the stdlib's own (a subclass override is user code)
        if name == "exception":
            return LogMethodVT(obj, name, refused=f"logger.exception: {_EXC_INFO}")
        if name in _QUERIES:
            return LogQueryVT(obj, name, fn)
        return LogMethodVT(obj, name) if name in _LEVELS else None
    # a library's helper set on Logger itself; a subclass's own method is user code, which
    # may do more than emit (it is traced as before)
    on_base = any(klass.__dict__.get(name) is attr for klass in _LOGGER_TYPES)
    return LogMethodVT(obj, name) if on_base and name.split("_")[0] in _LEVELS else None


def log_function(value: Any, source: Any) -> VT | None:
    """The tracker for `logging.info` & co. and `warnings.warn`, else None."""
    if not config.reorder_logging or not callable(value):
        return None
    if value is getattr(logging, "exception", None):
        return LogFunctionVT(value, source, refused=f"logging.exception: {_EXC_INFO}")
    try:
        return LogFunctionVT(value, source) if value in _FUNCTIONS else None
    except TypeError:  # unhashable callable
        return None


class _Deferred:
    refused: str | None

    def defer(self, tx: Translator, what: str, args: list[VT], kwargs: dict[str, VT]) -> VT:
        reason = self.refused or _refusal(what, args, kwargs)
        if reason is not None:
            unsupported("logging-call", f"{what}() is not replayed after the graph: {reason}",
                        hint="kiln runs this call natively between graphs")
        args = [_snapshot(tx, a) for a in args]
        kwargs = {k: _snapshot(tx, v) for k, v in kwargs.items()}
        tx.output.side_effects.append(("log", (self, args, kwargs, tx.location(), tx.globals)))
        return ConstantVT(None)


class LogMethodVT(_Deferred, OpaqueMethodVT):
    """`logger.warning` (& co.) of a logger read from the frame; replayed as
    `<logger>.warning(...)`, so an lru_cache helper (`warning_once`) still warns once."""

    def __init__(self, owner: VT, name: str, refused: str | None = None) -> None:
        super().__init__(owner, name)
        self.refused = refused

    def call(self, tx: Translator, args: list[VT], kwargs: dict[str, VT]) -> VT:
        return self.defer(tx, f"logger.{self.name}", args, kwargs)


class LogFunctionVT(_Deferred, OpaqueCallableVT):
    """`logging.info` & co., `warnings.warn`."""

    def __init__(self, fn: Any, source: Any = None, refused: str | None = None) -> None:
        super().__init__(fn, source)
        self.refused = refused

    def call(self, tx: Translator, args: list[VT], kwargs: dict[str, VT]) -> VT:
        what = f"{self.fn.__module__}.{self.fn.__name__}".replace("_warnings", "warnings")
        return self.defer(tx, what, args, kwargs)


# keyword -> the values that do what leaving it out does (None: any value is replayed as is)
_LOG_KEYWORDS = {"extra": None, "exc_info": (None, False), "stack_info": (False,),
                 "stacklevel": (1,)}
_WARN_KEYWORDS = {"message": None, "category": None, "stacklevel": (1,), "source": (None,)}
_WHY = {"exc_info": f"exc_info: {_EXC_INFO}",
        "stack_info": "stack_info prints the caller's stack, which is kiln's entry by then",
        "stacklevel": "stacklevel names a caller frame, and the replay's callers are kiln's",
        "source": "source= is a live object, whose state may differ after the graph"}


class LogQueryVT(OpaqueMethodVT):
    """`logger.isEnabledFor(level)` / `logger.getEffectiveLevel()` with constant arguments:
    answered at compile time and guarded by the same call (a `setLevel`, `logging.disable` or
    a new parent level recompiles), so `if logger.isEnabledFor(DEBUG):` does not break."""

    def __init__(self, owner: VT, name: str, fn: types.FunctionType) -> None:
        super().__init__(owner, name)
        self.fn = fn

    def call(self, tx: Translator, args: list[VT], kwargs: dict[str, VT]) -> VT:
        owner = self.owner
        if kwargs or owner.source is None or not all(
                a.is_constant() and type(a.as_constant()) is int for a in args):
            return OpaqueCallableVT(self.fn).call(tx, [owner, *args], kwargs)  # as before
        values = [a.as_constant() for a in args]
        result = getattr(owner.value, self.name)(*values)
        call = f"{self.name}({', '.join(map(repr, values))})"
        tx.output.guards.add(Guard(
            f"{owner.source.expr()}.{call}", "is" if isinstance(result, bool) else "==",
            repr(result), result, f"{owner.source.name()}.{call}", "constant",
            location=tx.location()))
        return ConstantVT(result)


def _refusal(what: str, args: list[VT], kwargs: dict[str, VT]) -> str | None:
    """Why replaying the call later would not do what the call does now (None: it would)."""
    if what == "warnings.warn":
        named, allowed = dict(zip(_WARN_KEYWORDS, args)) | kwargs, _WARN_KEYWORDS
    else:
        named, allowed = kwargs, _LOG_KEYWORDS
    for key, vt in named.items():
        if key not in allowed:
            return f"keyword {key!r} is not one kiln replays"
        plain = allowed[key]
        if plain is not None and not (vt.is_constant() and type(vt.as_constant()) in
                                      (int, bool, type(None)) and vt.as_constant() in plain):
            return _WHY[key]
    return None


def _snapshot(tx: Translator, vt: VT) -> VT:
    """`vt` as it is now, for a replay after the graph: containers copied, tensors and
    symbolic numbers kept (graph outputs; `check_logged_tensors` watches in-place updates)."""
    if isinstance(vt, LazyVT):
        vt = vt.realize(tx)
    if isinstance(vt, TensorVT):
        tx.output.logged_tensors.append((vt.fake, vt.fake._version, tx.location()))
        return vt
    if isinstance(vt, SymScalarVT):
        return vt
    if isinstance(vt, ConstantVT) and type(vt.value) is set:
        if all(_immutable(v) for v in vt.value):
            return ConstantVT(set(vt.value))  # a copy: the trace may add to the set later
    elif vt.is_constant() and not isinstance(vt, (TupleVT, ListVT, DictVT)) and \
            _immutable(vt.as_constant()):  # numbers, strings, classes (a warning category)
        return vt
    if isinstance(vt, TupleVT):
        return TupleVT([_snapshot(tx, i) for i in vt.items], vt.cls)
    if isinstance(vt, ListVT):
        return ListVT([_snapshot(tx, i) for i in vt.items])
    if isinstance(vt, DictVT) and vt.cls is dict:
        return DictVT({k: _snapshot(tx, v) for k, v in vt.items.items()})
    unsupported("logging-call", f"a logging call's argument {vt.describe()} is not replayed "
                "after the graph: only constants, tensors and numbers the graph computes, and "
                "lists/tuples/dicts of them (an object's state may differ by then)",
                hint="kiln runs this call natively between graphs; format the object into "
                     "the message first (an f-string) if its text is a constant")


def _immutable(value: Any) -> bool:
    if isinstance(value, (tuple, frozenset)):
        return all(_immutable(v) for v in value)
    return isinstance(value, _IMMUTABLE)


def check_logged_tensors(output: OutputGraph) -> None:
    """Called after each op: an in-place update of a tensor a recorded logging call reads
    (directly or through a view: they share a version counter) would show the new value in the
    replay, so capture stops at this op; the break replays the call before running it."""
    for fake, version, where in output.logged_tensors:
        if fake._version != version:
            line = f" (line {where.lineno})" if getattr(where, "lineno", None) else ""
            unsupported("logging-call", "an in-place update of a tensor that an earlier "
                        f"logging call{line} reads: the call is replayed after the graph, "
                        "where it would see the new value",
                        hint="kiln ends the graph here and emits the record before the update")
