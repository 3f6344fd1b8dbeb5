"""Per-code caches and their generated dispatchers.

For each (code object, compile settings) a `CodeCache` holds entries, most recent first. Its
dispatcher is Python source generated with the user function's own signature: CPython binds the
arguments, each entry's guards are one inlined `if`, and a miss calls back into capture. Module
guards sit behind a version check (see `mutation`), so a hit costs a few comparisons.
"""
from __future__ import annotations

import dataclasses
import inspect
import threading
import types
import weakref
from typing import Any, Callable

from kiln.capture.guards import AMBIENT_NAMESPACE, Constants, Guard
from kiln.capture.mutation import MODULE_VERSION
from kiln.diagnostics import GuardFailure, Unsupported

__all__ = ["CacheEntry", "CodeCache", "cache_for", "clear_caches", "signature_source",
           "compiling"]

_local = threading.local()


def compiling() -> bool:
    return getattr(_local, "depth", 0) > 0


class compiling_scope:  # noqa: N801 - used as `with compiling_scope():`
    """Marks capture in progress on this thread (compiled code reached meanwhile runs eagerly)."""

    def __enter__(self) -> None:
        _local.depth = getattr(_local, "depth", 0) + 1

    def __exit__(self, *exc: object) -> None:
        _local.depth -= 1


@dataclasses.dataclass
class CacheEntry:
    guards: list[Guard]
    body: list[str]
    namespace: dict[str, Any]
    version: list[int]
    id_key: tuple
    graph: Any = None


class CodeCache:
    def __init__(self, code: types.CodeType) -> None:
        self.code = code
        self.entries: list[CacheEntry] = []
        self.consts = Constants()
        self.skip: Unsupported | None = None
        self.version = 0
        self.warned_limit = False
        self.params = _param_names(code)

    def add(self, entry: CacheEntry) -> None:
        self.entries.insert(0, entry)
        self.version += 1

    def failures(self, namespace: dict[str, Any]) -> list[GuardFailure]:
        """Why the most recent entry did not match (its first failing guards)."""
        if not self.entries:
            return []
        entry = self.entries[0]
        found = []
        for guard in entry.guards:
            failure = guard.failure(namespace)
            if failure is not None:
                found.append(failure)
                if len(found) == 3:
                    break
        return found

    def revalidate(self, namespace: dict[str, Any]) -> CacheEntry | None:
        """An entry whose guards all hold although the module version moved; refresh it."""
        for entry in self.entries:
            if all(g.failure(namespace) is None for g in entry.guards):
                entry.version[0] = MODULE_VERSION[0]
                return entry
        return None


# Keyed by code object *identity*: equal code objects (two identical nested functions) must not
# share entries, since their globals and closures differ.
_caches: dict[int, tuple[weakref.ref, dict[Any, CodeCache]]] = {}


def cache_for(code: types.CodeType, key: Any) -> CodeCache:
    slot = _caches.get(id(code))
    if slot is None or slot[0]() is not code:
        code_id = id(code)
        slot = _caches[code_id] = (weakref.ref(code, lambda _: _caches.pop(code_id, None)), {})
    per_code = slot[1]
    if key not in per_code:
        per_code[key] = CodeCache(code)
    return per_code[key]


def clear_caches() -> None:
    _caches.clear()


def _param_names(code: types.CodeType) -> list[str]:
    count = code.co_argcount + code.co_kwonlyargcount
    count += bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    return list(code.co_varnames[:count])


def signature_source(code: types.CodeType) -> str:
    """The parameter list of `code` as source (without defaults: they are set on the function)."""
    names = code.co_varnames
    nargs, nposonly, nkw = code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount
    parts = list(names[:nargs])
    if nposonly:
        parts.insert(nposonly, "/")
    index = nargs + nkw
    if code.co_flags & inspect.CO_VARARGS:
        parts.append("*" + names[index])
        index += 1
    elif nkw:
        parts.append("*")
    parts.extend(names[nargs:nargs + nkw])
    if code.co_flags & inspect.CO_VARKEYWORDS:
        parts.append("**" + names[index])
    return ", ".join(parts)


def call_source(code: types.CodeType) -> str:
    """How to call the original function from inside a dispatcher (same argument binding)."""
    names = code.co_varnames
    nargs, nkw = code.co_argcount, code.co_kwonlyargcount
    parts = list(names[:nargs])
    index = nargs + nkw
    if code.co_flags & inspect.CO_VARARGS:
        parts.append("*" + names[index])
        index += 1
    parts.extend(f"{n}={n}" for n in names[nargs:nargs + nkw])
    if code.co_flags & inspect.CO_VARKEYWORDS:
        parts.append("**" + names[index])
    return ", ".join(parts)


def build_dispatcher(cache: CodeCache, fn: types.FunctionType,
                     miss: Callable[..., Callable]) -> types.FunctionType:
    """Generate and exec the dispatcher for `fn` over the cache's current entries."""
    params = ", ".join(cache.params)
    lines = []
    namespace: dict[str, Any] = {
        **AMBIENT_NAMESPACE, **cache.consts.namespace(), "__G": fn.__globals__,
        "__cells": fn.__closure__, "__modver": MODULE_VERSION, "__miss": miss,
        "__orig": fn,
    }
    for i, entry in enumerate(cache.entries):
        namespace[f"__ev{i}"] = entry.version
        for name, value in entry.namespace.items():
            namespace[f"{name}_{i}"] = value
        body = [line.replace("__graph(", f"__graph_{i}(") for line in entry.body]
        lines.append(f"def __entry{i}({params}):")
        lines.extend(f"    {line}" for line in body)
    lines.append(f"def __eager({params}):")
    lines.append(f"    return __orig({call_source(cache.code)})")
    lines.append(f"def __redispatch({params}):")
    lines.append(f"    return {_safe_name(fn.__name__)}({call_source(cache.code)})")
    lines.append(f"def {_safe_name(fn.__name__)}({signature_source(cache.code)}):")
    for i, entry in enumerate(cache.entries):
        fast = [g.source() for g in entry.guards if not g.module]
        fast.append(f"__modver[0] == __ev{i}[0]")
        lines.append(f"    if {' and '.join(fast)}:")
        lines.append(f"        return __entry{i}({params})")
    lines.append(f"    return __miss({params})({params})")
    source = "\n".join(lines) + "\n"
    exec(compile(source, f"<kiln dispatcher for {fn.__qualname__}>", "exec"), namespace)  # noqa: S102
    dispatcher = namespace[_safe_name(fn.__name__)]
    dispatcher.__defaults__ = fn.__defaults__
    dispatcher.__kwdefaults__ = fn.__kwdefaults__
    dispatcher.__kiln_source__ = source
    dispatcher.__kiln_eager__ = namespace["__eager"]
    dispatcher.__kiln_redispatch__ = namespace["__redispatch"]
    dispatcher.__kiln_entries__ = [namespace[f"__entry{i}"] for i in range(len(cache.entries))]
    dispatcher.__kiln_namespace__ = namespace
    return dispatcher


def _safe_name(name: str) -> str:
    return name if name.isidentifier() else "compiled_fn"

