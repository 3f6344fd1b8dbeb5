"""dispatch: per-code guard caches and their generated dispatchers.

For each (code object, compile settings) a `CodeCache` holds entries, most recent first. Its
dispatcher is Python source generated with the user function's own signature: CPython binds the
arguments, each entry's guards are one inlined `if`, and a miss calls back into capture. Module
guards sit behind a version check (see `module_version`), so a hit costs a few comparisons.
"""
from __future__ import annotations

import dataclasses
import inspect
import threading
import types
import weakref
from typing import Any, Callable

import torch

from kiln.capture.dynamic_dims import changed_dims, changed_strides
from kiln.capture.guard_cse import share_reads
from kiln.capture.guards import AMBIENT_NAMESPACE, Constants, Guard
from kiln.capture.module_version import MODULE_VERSION
from kiln.diagnostics import GuardFailure, Unsupported

__all__ = ["CacheEntry", "CodeCache", "Dispatcher", "GRAPH_RUNS", "build_dispatcher", "cache_for",
           "clear_caches", "signature_source", "compiling"]

_local = threading.local()

# Calls of compiled graphs, counted by every entry that has one. A frame with no graph of its own
# reads it around a run of its route-only copy to learn whether anything it calls is compiled
# (other threads can only make that look true: the frame then keeps routing, never wrongly skips).
GRAPH_RUNS = [0]


def compiling() -> bool:
    return getattr(_local, "depth", 0) > 0


class compiling_scope:  # noqa: N801 - used as `with compiling_scope():`
    """Marks capture in progress on this thread (compiled code reached meanwhile runs eagerly)."""

    def __enter__(self) -> None:
        _local.depth = getattr(_local, "depth", 0) + 1

    def __exit__(self, *exc: object) -> None:
        _local.depth -= 1


@dataclasses.dataclass(eq=False)  # identity: entries are reordered and looked up by object
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
        self.dynamic: set[str] = set()  # scalars whose value changed: kept symbolic from now on
        # tensor dims whose size changed, per source expression: symbolic from now on
        self.dynamic_dims: dict[str, set[int]] = {}
        self.dynamic_strides: dict[str, set[int]] = {}  # the same for strides
        self.fallback: Callable | None = None  # the route-only copy run when `skip` is set
        self.version = 0
        self.warned_limit = False
        self.params = _param_names(code)

    def add(self, entry: CacheEntry) -> None:
        self.entries.insert(0, entry)
        self.version += 1

    def promote(self, entry: CacheEntry) -> None:
        """Most recently hit first (the order is shared by every function with this code)."""
        if self.entries[0] is not entry:
            self.entries.remove(entry)
            self.entries.insert(0, entry)

    def failures(self, namespace: dict[str, Any]) -> list[GuardFailure]:
        """Why the most recent entry did not match (its first failing guards). Module identity
        is left out: another instance of the class reuses the entry when every other guard holds
        (`_rebind_source`), so it is never the cause, and listing it for each submodule of a
        layer would crowd out the guard that did fail (`x.requires_grad`)."""
        if not self.entries:
            return []
        entry = self.entries[0]
        found = []
        for guard in entry.guards:
            if guard.kind == "instance":
                continue
            failure = guard.failure(namespace)
            if failure is not None:
                found.append(failure)
                if len(found) == 3:
                    break
        return found

    def note_changed_scalars(self, namespace: dict[str, Any], enabled: bool) -> list[str]:
        """Automatic dynamic: an int/float guard of the newest entry that failed marks that value
        symbolic in the next capture (TorchDynamo's automatic_dynamic for scalars). Returns
        what became dynamic, in words. A number read through module state (`self.layer_idx`,
        a module guard) stays specialized, as TorchDynamo never makes an int attribute of an
        nn.Module dynamic: layers of one class differ in such ints, and each gets its entry.
        `enabled` False (dynamic=False) records nothing: every value is specialized."""
        if not enabled:
            return []
        newly = []
        for guard in self.entries[0].guards if self.entries else ():
            if guard.kind == "constant" and type(guard.expected) in (int, float) and \
                    not guard.module and \
                    guard.value not in self.dynamic and guard.failure(namespace) is not None:
                self.dynamic.add(guard.value)
                newly.append(f"{guard.user} changed from {guard.expected!r}")
        return newly

    def note_changed_dims(self, namespace: dict[str, Any], enabled: bool) -> list[str]:
        """Automatic dynamic for tensor sizes: each dim whose size guard of the newest entry
        failed is symbolic in the next capture (sizes 0 and 1 still specialize there); the
        same for each stride whose guard failed (a slice of a growing buffer). Returns
        what became dynamic, in words; `enabled` False (dynamic=False) records nothing."""
        if not enabled or not self.entries:
            return []
        newly = []
        guards = self.entries[0].guards
        sizes = changed_dims(guards, namespace)
        resized = {change.expr for change in sizes}
        # a tensor whose sizes changed has new strides too: the symbolic sizes account for
        # them (contiguous strides are products of sizes); only a stride that changed while
        # every size held is a symbol of its own
        strides = [c for c in changed_strides(guards, namespace) if c.expr not in resized]
        for table, changes in ((self.dynamic_dims, sizes), (self.dynamic_strides, strides)):
            for change in changes:
                dims = table.setdefault(change.expr, set())
                if change.dim not in dims:
                    dims.add(change.dim)
                    newly.append(change.render())
        return newly


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


@dataclasses.dataclass
class Dispatcher:
    """Generated code over a cache's entries for one function object.

    `variants[e]` has the user's signature and checks entry `e` inline first: pointing the
    compiled function at the variant of the most recently hit entry keeps MRU order without
    regenerating code. `checks[e]` / `entries[e]` are positional (one argument per parameter);
    `slow` is the positional path that tries every entry in MRU order, then misses.
    `skipped` (user's signature) serves a frame capture gave up on: the original function when
    the frame's probes found no graph beneath it for this first argument (module instance) at
    this module version, the route-only copy when they found one, else `probe`, which runs the
    route-only copy and decides (`skip.SkipDecisions`)."""

    variants: dict[int, Callable]
    empty: Callable
    checks: dict[int, Callable]
    rebinds: dict[int, Callable]
    entries: dict[int, Callable]
    eager: Callable
    fallback: Callable
    skipped: Callable
    namespace: dict[str, Any]
    source: str


_OTHERS_CHECKED = 7  # entries a variant tries after its own before the slow path


def build_dispatcher(cache: CodeCache, fn: types.FunctionType, slow: Callable[..., Any],
                     fallback: Callable, probe: Callable[..., Any], skips: Any,
                     point: Callable[[Callable], None]) -> Dispatcher:
    """Generate and exec the dispatch code for `fn` over the cache's current entries (`skips`:
    the function's `skip.SkipDecisions`, read by the code of a frame capture gave up on;
    `point(variant)`: make `variant` what the compiled function calls next)."""
    params = ", ".join(cache.params)
    signature = signature_source(cache.code)
    lines = []
    namespace: dict[str, Any] = {
        **AMBIENT_NAMESPACE, **cache.consts.namespace(), "__G": fn.__globals__,
        "__cells": fn.__closure__, "__modver": MODULE_VERSION, "__slow": slow, "__orig": fn,
        "__fallback_fn": fallback, "__probe": probe, "__dead": skips.dead,
        "__settled": skips.settled, "__live": skips.live, "__Module": torch.nn.Module,
        "__id": id, "__isinstance": isinstance, "__graph_runs": GRAPH_RUNS, "__point": point,
    }
    fast = [_fast_check(i, entry) for i, entry in enumerate(cache.entries)]
    for i, entry in enumerate(cache.entries):
        namespace[f"__ev{i}"] = entry.version
        for name, value in entry.namespace.items():
            namespace[f"{name}_{i}"] = value
        lines.append(f"def __entry{i}({params}):")
        if entry.graph is not None:
            lines.append("    __graph_runs[0] += 1")
        lines.extend(f"    {line.replace('__graph(', f'__graph_{i}(')}" for line in entry.body)
        lines.append(f"def __check{i}({params}):")
        lines.extend(_guarded(f"return {fast[i]}", "return False", "    "))
        lines.extend(_rebind_source(i, entry, params))
    for i in range(len(cache.entries)):
        lines.append(f"def __variant{i}({signature}):")
        lines.extend(_guarded(f"__hit = {fast[i]}", "__hit = False", "    "))
        lines.append("    if __hit:")
        lines.append(f"        return __entry{i}({params})")
        # the other entries next, without the lock: layers of one class whose inputs differ
        # (the first layer's input needs no grad, the others' do) alternate between two entries
        # (no reordering, which takes the lock: the function is pointed at entry j's variant)
        for j in [j for j in range(len(cache.entries)) if j != i][:_OTHERS_CHECKED]:
            lines.append(f"    if __check{j}({params}):")
            lines.append(f"        __point(__variant{j})")
            lines.append(f"        return __entry{j}({params})")
        lines.append(f"    return __slow({params})")
    lines.append(f"def __empty({signature}):")
    lines.append(f"    return __slow({params})")
    lines.append(f"def __eager({params}):")
    lines.append(f"    return __orig({call_source(cache.code)})")
    lines.append(f"def __fallback({params}):")
    lines.append(f"    return __fallback_fn({call_source(cache.code)})")
    lines.append(f"def __skipped({signature}):")
    lines.append(f"    __kiln_key = {dead_key_source(cache.code)}")
    lines.append("    if __dead.get(__kiln_key) == __modver[0] or __kiln_key in __settled:")
    lines.append(f"        return __orig({call_source(cache.code)})")
    lines.append("    if __kiln_key in __live:")
    lines.append(f"        return __fallback_fn({call_source(cache.code)})")
    lines.append(f"    return __probe({params})")
    source = "\n".join(lines) + "\n"
    exec(compile(source, f"<kiln dispatcher for {fn.__qualname__}>", "exec"), namespace)  # noqa: S102
    named = {}
    for kind in ("variant", "check", "rebind", "entry"):
        named[kind] = {id(e): namespace[f"__{kind}{i}"] for i, e in enumerate(cache.entries)}
    for variant in (*named["variant"].values(), namespace["__empty"], namespace["__skipped"]):
        variant.__defaults__ = fn.__defaults__
        variant.__kwdefaults__ = fn.__kwdefaults__
        variant.__name__ = variant.__qualname__ = fn.__name__
    return Dispatcher(named["variant"], namespace["__empty"], named["check"], named["rebind"],
                      named["entry"], namespace["__eager"], namespace["__fallback"],
                      namespace["__skipped"], namespace, source)


def dead_key(code: types.CodeType, values: tuple) -> int:
    """Which skip decision a call falls under: its first argument's id when that is a module
    (layers of one class can call different code), else 0. Same as `dead_key_source`."""
    if code.co_argcount and isinstance(values[0], torch.nn.Module):
        return id(values[0])
    return 0


def dead_key_source(code: types.CodeType) -> str:
    if not code.co_argcount:
        return "0"
    first = code.co_varnames[0]
    return f"__id({first}) if __isinstance({first}, __Module) else 0"


def _guarded(line: str, otherwise: str, indent: str) -> list[str]:
    """`line` (which evaluates guards) in a try block: a guard whose value is gone (a deleted
    global, a key removed from a dict) is a miss, so capture and eager run and raise the user's
    own error (`NameError`), not the dispatcher's `KeyError`. Free on 3.11+ (zero-cost try)."""
    return [f"{indent}try:", f"{indent}    {line}", f"{indent}except Exception:",
            f"{indent}    {otherwise}"]


def _fast_check(i: int, entry: CacheEntry) -> str:
    """Entry `i`'s guards checked on every call, and its module guards' version."""
    fast = [g.source() for g in entry.guards if not g.module]
    fast.append(f"__modver[0] == __ev{i}[0]")
    return share_reads(" and ".join(fast))


def _rebind_source(i: int, entry: CacheEntry, params: str) -> list[str]:
    """`__rebind{i}(params)`: if every guard but module identity holds for these arguments (say
    another instance of the same layer class), add them to the identity slots (keeping the
    instances verified before when the module version has not moved since); True on success."""
    others = [g.source() for g in entry.guards if g.kind != "instance"]
    slots = [g for g in entry.guards if g.kind == "instance"]
    lines = [f"def __rebind{i}({params}):", "    try:",
             f"        if not ({share_reads(' and '.join(others) or 'True')}):",
             "            return False",
             "    except Exception:  # a guard on state that is gone (a deleted attribute, ...)",
             "        return False",
             f"    __keep = __ev{i}[0] == __modver[0]"]
    lines += [f"    {g.expected_src}.set({g.value}, __keep)" for g in slots]
    lines.append("    return True")
    return lines


def _safe_name(name: str) -> str:
    return name if name.isidentifier() else "compiled_fn"

