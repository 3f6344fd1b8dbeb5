"""Compile one Python function: capture on a miss, guard, cache, dispatch.

`CompiledFunction` owns the dispatcher of one function object; `capture_function` runs the
symbolic interpreter over the function's bytecode for one set of inputs and returns a cache entry
(or raises `Unsupported`, after which the code runs eagerly with the reason recorded).
"""
from __future__ import annotations

import logging
import functools
import threading
import time
import types
import weakref
from typing import Any, Callable

import torch

from kiln import records
from kiln.capture import compile_hook, rules
from kiln.capture.dispatch import (CacheEntry, CodeCache, build_dispatcher, cache_for, compiling,
                                compiling_scope)
from kiln.capture.breaks import check_resumable, route_only
from kiln.capture.entry import build_break_entry_code, build_entry_code
from kiln.capture.module_version import MODULE_VERSION
from kiln.capture.output_graph import OutputGraph
from kiln.capture.settings import CompileSettings
from kiln.capture.ddp_split import SplitGraph, compile_split
from kiln.capture.distributed import eager_wrapper_reason
from kiln.capture.dynamic_dims import DynamicPolicy
from kiln.capture.skip import SkipDecisions
from kiln.capture.sources import Closure, Local
from kiln.capture.translator import StopAtBreak, Translator
from kiln.capture.unsupported import Unsupported
from kiln.capture.variables.base import CellBox, LazyVT
from kiln.config import config
from kiln.dump import new_dump_folder, write_dump
from kiln.diagnostics import RecompileReason, UserLocation, user_terms
from kiln.diagnostics import Unsupported as UnsupportedRecord
from kiln.capture.bytecode import UnsupportedBytecode, decode, format_instrs
from kiln.errors import BackendCompilerFailed, InternalError, KilnError, UnsupportedError
from kiln.logs import artifact_enabled, artifact_logger, warn_once

_log = logging.getLogger("kiln.capture")

__all__ = ["CompiledFunction", "CompileSettings", "capture_function", "compile_function",
           "reset_compiled_functions"]


class CompiledFunction:
    """The cache-backed replacement of one function object."""

    def __init__(self, fn: types.FunctionType, settings: CompileSettings) -> None:
        self.fn = fn
        self.settings = settings
        self.reset()
        _live.add(self)

    def reset(self) -> None:
        """Start over from the (possibly new) shared cache for this code."""
        with _lock:  # two threads must not make two caches for one code
            self.cache: CodeCache = cache_for(self.fn.__code__, self.settings.key())
            self._route_only: Callable | None = None
            self.skips = SkipDecisions(self.fn.__code__)
            self.refresh()

    def refresh(self) -> None:
        with _lock:
            self.dispatcher = build_dispatcher(self.cache, self.fn, self.slow,
                                               self._fallback_fn(), self.probe, self.skips,
                                               self._point)
            self.version = self.cache.version
            self._point_at_first()

    def _fallback_fn(self) -> Callable:
        """What runs when capture gave up on this code: a route-only copy (its calls are still
        compiled), or the function itself when even that cannot be built."""
        if self.cache.skip is None:
            return self.fn
        # per function object, not per code: functions sharing one code object (decorator
        # wrappers) hold different closures and globals, and the copy runs with this one's
        if self._route_only is None:
            try:
                self._route_only = route_only(self.fn, self.settings)
            except Exception:  # noqa: BLE001 - the original function is always a safe fallback
                _log.warning("kiln: no route-only copy of %s; it runs as is",
                             user_terms(self.fn.__qualname__), exc_info=True)
                self._route_only = self.fn
        return self._route_only

    def _point(self, variant: Callable) -> None:
        self.dispatch = variant

    def _point_at_first(self) -> None:
        entries = self.cache.entries
        if entries:
            self.dispatch = self.dispatcher.variants[id(entries[0])]
        elif self.cache.skip is not None:
            # capture gave up for good: the original code once probes found nothing compiled
            # beneath this frame, else the route-only copy (`skip`), never the lock and `miss`
            self.dispatch = self.dispatcher.skipped
        else:
            self.dispatch = self.dispatcher.empty

    def probe(self, *values: Any) -> Any:
        """A call of a frame capture gave up on (positional arguments), when the dispatcher's
        skip check did not answer it: see `skip.SkipDecisions`."""
        if compiling():
            return self.dispatcher.eager(*values)
        return self.skips.run(values, self.dispatcher.fallback, self.dispatcher.eager)

    def slow(self, *values: Any) -> Any:
        """Every entry in most-recently-hit order, then a miss (positional arguments). The
        choice is made under the capture lock (entries and dispatchers are shared by every
        thread); the chosen code runs outside it."""
        with _lock:
            target = self._choose(values)
        return target(*values)

    def _choose(self, values: tuple) -> Callable:
        if self.cache.version != self.version:  # another function object with this code compiled
            self.refresh()
        for entry in self.cache.entries:
            if self.dispatcher.checks[id(entry)](*values):
                return self._hit(entry)
        if not compiling():  # module state changed, or another instance of the same class
            for entry in self.cache.entries:
                if self.dispatcher.rebinds[id(entry)](*values):
                    entry.version[0] = MODULE_VERSION[0]
                    return self._hit(entry)
        return self.miss(*values)

    def _hit(self, entry: CacheEntry) -> Callable:
        self.cache.promote(entry)
        self._point_at_first()
        return self.dispatcher.entries[id(entry)]

    def miss(self, *values: Any) -> Callable:
        cache = self.cache
        if compiling():
            return self.dispatcher.eager
        if cache.skip is not None:
            if self.dispatcher.namespace["__fallback_fn"] is self.fn:
                self.refresh()
            return self.probe
        namespace = {**self.dispatcher.namespace, **dict(zip(cache.params, values))}
        if cache.entries:
            automatic = self.settings.dynamic is not False
            became = cache.note_changed_dims(namespace, automatic)
            became += cache.note_changed_scalars(namespace, automatic)
            self._report_recompile(namespace, tuple(became))
        if self._over_limit(values):
            return self.dispatcher.eager
        return self._compile(dict(zip(cache.params, values)))

    def _report_recompile(self, namespace: dict[str, Any], became_dynamic: tuple[str, ...]) -> None:
        code = self.cache.code
        reason = RecompileReason(code.co_qualname, UserLocation.from_code(code),
                                 tuple(self.cache.failures(namespace)), len(self.cache.entries) + 1,
                                 became_dynamic)
        records.emit("recompiles", reason)
        if artifact_enabled("recompiles"):
            artifact_logger("recompiles").info(reason.render())

    def _over_limit(self, values: tuple) -> bool:
        cache = self.cache
        id_key = _id_key(values)
        same = sum(1 for e in cache.entries if e.id_key == id_key)
        if same < config.recompile_limit and len(cache.entries) < config.accumulated_recompile_limit:
            return False
        if not cache.warned_limit:
            cache.warned_limit = True
            limit = (f"recompile limit ({config.recompile_limit}, KILN_RECOMPILE_LIMIT)"
                     if same >= config.recompile_limit else
                     f"accumulated recompile limit ({config.accumulated_recompile_limit}, "
                     "KILN_ACCUMULATED_RECOMPILE_LIMIT)")
            warn_once(("recompile-limit", cache.code),
                      f"kiln: {user_terms(cache.code.co_qualname)} ({UserLocation.from_code(cache.code).short()}) "
                      f"hit the {limit}; new inputs run eagerly. Set KILN_LOGS=recompiles to "
                      "see why it recompiled.")
        return True

    def _compile(self, f_locals: dict[str, Any]) -> Callable:
        eager_reason = eager_wrapper_reason(self.fn)
        if eager_reason is not None:
            err = Unsupported("distributed-wrapper", eager_reason, hints=(
                "the module it wraps is still compiled (docs/distributed.md)",))
            err.frames.append(UserLocation.from_code(self.fn.__code__))
            return self._give_up(err)
        try:
            with compiling_scope():
                entry = capture_function(self.fn, f_locals, self.cache, self.settings)
        except (Unsupported, UnsupportedBytecode) as err:
            return self._give_up(err)
        except KilnError:
            raise  # already a clear, user-facing error (e.g. BackendCompilerFailed)
        except Exception as err:  # a kiln bug outside the interpreter: never crash the caller
            if not config.suppress_errors:
                raise InternalError(f"capture failed: {type(err).__name__}: {err}",
                                    location=UserLocation.from_code(self.fn.__code__)) from err
            _log.warning("kiln: capture of %s failed; running it eagerly", self.fn.__qualname__,
                         exc_info=True)
            return self._give_up(Unsupported("internal-error", f"kiln failed while capturing: "
                                             f"{type(err).__name__}: {err}"))
        self.cache.add(entry)
        self.refresh()
        return self.dispatcher.entries[id(entry)]

    def _give_up(self, err: Exception) -> Callable:
        """Record why capture stopped; the code runs eagerly (or fullgraph=True raises)."""
        if isinstance(err, UnsupportedBytecode):
            err = Unsupported("unsupported-python", str(err), hints=(
                "kiln captures Python 3.11 to 3.13 bytecode",))
            err.frames.append(UserLocation.from_code(self.fn.__code__))
        record = to_record(err, _frame_cost(self.fn.__code__))
        report_break(record)
        if self.settings.fullgraph:
            raise UnsupportedError(record) from None
        self.cache.skip = record
        self.refresh()
        return self.probe


_live: weakref.WeakSet[CompiledFunction] = weakref.WeakSet()
# Held while a dispatcher picks an entry on its slow path, captures or rebuilds; re-entrant
# because capture compiles resume functions. Guard hits in the generated variants never take it.
_lock = threading.RLock()


def reset_compiled_functions() -> None:
    """After the caches were cleared: every live compiled function drops its entries."""
    for compiled in list(_live):
        compiled.reset()


def to_record(err: Unsupported, cost: int = 1) -> UnsupportedRecord:
    frames = err.frames  # innermost first
    location = frames[0] if frames else None
    stack = tuple(reversed(frames[1:]))
    return UnsupportedRecord(err.code, err.category, err.message, location, stack, err.hints,
                             cost)


def _frame_cost(code: types.CodeType) -> int:
    """Instructions of a frame that run outside any graph when it has none of its own."""
    from kiln.capture.bytecode import decode
    try:
        return sum(1 for i in decode(code) if i.opname in ("CALL", "BINARY_OP", "BINARY_SUBSCR"))
    except Exception:  # noqa: BLE001 - only an estimate for ranking
        return 1


def _id_key(values: tuple) -> tuple:
    return tuple(id(v) for v in values if isinstance(v, torch.nn.Module))


def capture_function(fn: types.FunctionType, f_locals: dict[str, Any], cache: CodeCache,
                     settings: CompileSettings) -> CacheEntry:
    """Trace `fn` (see `_capture_with_break`). When that fails after NumPy code was traced
    (an array operator with no mapping is not an instruction a break can resume after), trace
    once more with `tensor.numpy()` breaking as an opaque call, as before NumPy tracing."""
    try:
        return _capture_with_break(fn, f_locals, cache, settings, trace_numpy=True)
    except Unsupported as err:
        if settings.fullgraph or not err.numpy_traced:
            raise
        note = f"NumPy code here is not traced as tensor ops because: {err.message}"
    return _capture_with_break(fn, f_locals, cache, settings, trace_numpy=False, note=note)


def _capture_with_break(fn: types.FunctionType, f_locals: dict[str, Any], cache: CodeCache,
                        settings: CompileSettings, trace_numpy: bool,
                        note: str | None = None) -> CacheEntry:
    """Trace `fn`; at an instruction capture cannot handle, trace again up to it and break there
    (graph, native instruction, compiled resume function) when resuming there is safe."""
    try:
        return _capture(fn, f_locals, cache, settings, None, trace_numpy)
    except Unsupported as err:
        if settings.fullgraph or err.root_index is None:
            raise
        try:
            check_resumable(fn.__code__, err.root_index, value_ops=not err.numpy_traced)
        except Unsupported as why:
            err.hints = (*err.hints, "the function runs without a graph of its own (the calls "
                         f"it makes are still compiled): {why.message}")
            raise err from None
        if note is not None and len(err.hints) < 2:
            err.hints = (*err.hints, note)
        entry = _capture(fn, f_locals, cache, settings, err, trace_numpy)
        report_break(to_record(err))
        return entry


# Breaks that are a choice about torch.distributed, not a gap in a user's code: warned once per
# site even with logs off, so a DDP/FSDP user sees which parts run eagerly (docs/distributed.md).
_WARNED_BREAKS = ("distributed-wrapper", "distributed-module", "distributed-call")


def report_break(record: UnsupportedRecord) -> None:
    records.emit("breaks", record)
    if record.code in _WARNED_BREAKS:
        where = record.location.short() if record.location is not None else "?"
        warn_once(("distributed-break", record.code, where),
                  f"kiln: {record.message} ({where}); this part runs eagerly")
    if artifact_enabled("graph_breaks"):
        artifact_logger("graph_breaks").info(record.render())


def _capture(fn: types.FunctionType, f_locals: dict[str, Any], cache: CodeCache,
             settings: CompileSettings, brk: Unsupported | None,
             trace_numpy: bool = True) -> CacheEntry:
    start = time.perf_counter()
    policy = DynamicPolicy(settings.dynamic,
                           {expr: frozenset(dims) for expr, dims in cache.dynamic_dims.items()},
                           {expr: frozenset(d) for expr, d in cache.dynamic_strides.items()})
    output = OutputGraph(cache.consts, frozenset(cache.dynamic), trace_numpy, policy)
    output.guards.ambient()
    code = fn.__code__
    local_vars = {name: LazyVT(value, Local(name)) for name, value in f_locals.items()}
    tx = Translator(code, local_vars, _root_cells(fn), fn.__globals__, output)
    tx.break_at = brk.root_index if brk is not None else None
    grad_mode = torch.is_grad_enabled()
    try:
        try:
            result = tx.run()
        except StopAtBreak:
            try:
                entry_code = build_break_entry_code(output, tx, fn, settings)
            except Unsupported as err:  # the break point is where this happened
                err.frames.append(tx.location())
                raise
        else:
            entry_code = build_entry_code(output, result)
    except Unsupported as err:
        err.numpy_traced = err.numpy_traced or output.numpy_traced
        raise
    finally:
        torch._C._set_grad_enabled(grad_mode)
        for mode in reversed(output.open_contexts):
            mode.__exit__(None, None, None)
    output.symbolic_guards()  # what the trace assumed about symbolic sizes, now all known
    captured = time.perf_counter()
    namespace: dict[str, Any] = {}
    split = None
    if entry_code.gm is not None:
        namespace["__graph"], split = _call_backend(settings, entry_code, code)
    done = time.perf_counter()
    guards = output.guards.guards
    times = {"capture": captured - start, "backend": done - captured}
    _log_entry(code, entry_code, guards)
    dump_capture(code, entry_code.gm, guards, entry_code.body, split)
    records.emit("graphs", records.GraphRecord(
        code.co_qualname, entry_code.gm,
        [n.target for n in entry_code.gm.graph.nodes if n.op.startswith("call")]
        if entry_code.gm is not None else [],
        [g.record() for g in guards], times, output.describe_dims(),
        split.record if split is not None else None))
    return CacheEntry(guards, entry_code.body, namespace, [MODULE_VERSION[0]],
                      _id_key(tuple(f_locals.values())), entry_code.gm)


def _root_cells(fn: types.FunctionType) -> dict[str, CellBox]:
    cells = {}
    for i, (name, cell) in enumerate(zip(fn.__code__.co_freevars, fn.__closure__ or ())):
        try:
            contents = cell.cell_contents
        except ValueError:
            cells[name] = CellBox(None, Closure(i, name))
            continue
        cells[name] = CellBox(LazyVT(contents, Closure(i, name)), Closure(i, name))
    return cells


def _call_backend(settings: CompileSettings, entry_code: Any, code: types.CodeType
                  ) -> tuple[Callable, SplitGraph | None]:
    """The compiled graph, and how it was split when it runs under DDP (`ddp_split`)."""
    try:
        split = compile_split(settings.backend, entry_code.gm, entry_code.example_inputs)
        if split is not None:
            return split.fn, split
        return settings.backend(entry_code.gm, entry_code.example_inputs), None
    except Exception as err:
        if config.suppress_errors and not settings.fullgraph:
            where = UserLocation.from_code(code).short()
            warn_once(("backend-failed", settings.backend_name, code),
                      f"kiln: backend {settings.backend_name!r} failed on a graph of "
                      f"{user_terms(code.co_qualname)} ({where}): {type(err).__name__}: {err}. "
                      "Falling back: that function runs eagerly (the functions it calls are "
                      "still compiled). Set KILN_SUPPRESS_ERRORS=0 to raise instead.", _log)
            raise Unsupported("backend-failed", f"backend {settings.backend_name!r} failed: "
                              f"{type(err).__name__}: {err}", category="not-supported-yet",
                              hints=("try backend='eager' to check capture alone",)) from err
        raise BackendCompilerFailed(settings.backend_name, err,
                                    location=UserLocation.from_code(code)) from err


def _log_entry(code: types.CodeType, entry_code: Any, guards: list) -> None:
    if artifact_enabled("graph_code") and entry_code.gm is not None:
        artifact_logger("graph_code").info(
            "graph for %s:\n%s", user_terms(code.co_qualname),
            entry_code.gm.print_readable(print_output=False))
    if artifact_enabled("guards"):
        artifact_logger("guards").info(
            "guards for %s:\n%s", user_terms(code.co_qualname),
            "\n".join("  " + g.record().render() for g in guards))


def compile_function(fn: types.FunctionType, settings: CompileSettings) -> Callable:
    if config.identity_transform:  # debug mode: decode -> normalize -> assemble, no capture
        from kiln.capture.bytecode import identity_transform
        return identity_transform(fn)
    if rules.runs_natively(fn):
        return fn
    compiled = CompiledFunction(fn, settings)

    @functools.wraps(fn)
    def kiln_compiled(*args: Any, **kwargs: Any) -> Any:
        dispatch = compiled.dispatch
        if dispatch.__defaults__ is not fn.__defaults__ or \
                dispatch.__kwdefaults__ is not fn.__kwdefaults__:
            compiled.refresh()  # the user changed the defaults: bind the new ones
        if compiled.cache.code is not fn.__code__:
            compiled.reset()  # `fn.__code__` was swapped: its entries belong to the old code
        return compiled.dispatch(*args, **kwargs)

    kiln_compiled._kiln_compiled = compiled  # type: ignore[attr-defined]
    return kiln_compiled


# Resume functions and routed calls are compiled by this function, from files below this one
# (`compile_hook` says why it is installed rather than imported).
compile_hook.install(compile_function)


def dump_capture(code: types.CodeType, gm: Any, guards: list, body: list[str],
                 split: SplitGraph | None = None) -> str | None:
    """Write the capture stage's artifacts for one graph under KILN_DEBUG_DIR (with `split`, a
    graph split at DDP buckets: its pieces too); returns the folder (None when dumping is off)."""
    folder = new_dump_folder(code.co_qualname)
    if folder is None:
        return None
    write_dump(folder, {
        "graph.py": gm.print_readable(print_output=False) if gm is not None else "# no graph\n",
        "guards.txt": "\n".join(g.record().render() for g in guards) + "\n",
        "entry.py": "def entry(...):\n" + "".join(f"    {line}\n" for line in body),
        "bytecode.txt": format_instrs(decode(code)) + "\n",
        **(split.dump_files() if split is not None else {}),
    })
    return folder
