"""kiln's public entry points: `compile` and the escape hatches (mirroring torch.compile)."""
from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import types
from typing import Any, Callable, Mapping

import torch

from kiln.backends import list_backends, lookup_backend
from kiln.backends.kiln_backend import kiln_backend
from kiln.capture import CompileSettings, clear_caches, compile_function
from kiln.capture.escapes import graph_break, is_compiling
from kiln.capture import module_version, rules
from kiln.capture.dynamic_dims import DYNAMIC_ATTR, STATIC_ATTR, WEAK_DYNAMIC_ATTR, mark_dims
from kiln.capture.module_wrapper import CompiledModule
from kiln.config import config
from kiln.errors import InvalidArgument
from kiln.logs import reset_warnings, warn_once
from kiln.options import resolve_options

__all__ = ["compile", "disable", "allow_in_graph", "graph_break", "is_compiling", "reset",
           "mark_dynamic", "maybe_mark_dynamic", "mark_static"]


def compile(fn_or_module: Any = None, *, backend: str | Callable | None = None,
            mode: str | None = None, fullgraph: bool = False, dynamic: bool | None = None,
            options: dict | None = None, disable: bool = False) -> Any:
    """Compile a function or an nn.Module; also usable as `@kiln.compile` or `@kiln.compile(...)`.

    Same meaning as torch.compile's arguments. `backend` is a registered name ("eager", ...) or a
    callable `(gm, example_inputs) -> callable`; the default comes from `kiln.config`. For the
    kiln backend, `mode` and `options` become one `kiln.options.CompileOptions` here (an unknown
    key is an error listing the known ones); other backends get them as torch.compile gives
    them. Every argument is checked here: a wrong type is an `InvalidArgument`."""
    _check_arguments(backend, mode, fullgraph, dynamic, options, disable)
    if fn_or_module is None:
        return lambda target: compile(target, backend=backend, mode=mode, fullgraph=fullgraph,
                                      dynamic=dynamic, options=options, disable=disable)
    backend_obj = backend if backend is not None else config.default_backend
    backend_fn, resolved = _bind_backend(lookup_backend(backend_obj), mode, options)
    if disable:
        return fn_or_module
    settings = CompileSettings(backend_fn, _backend_name(backend_obj), fullgraph, mode, resolved,
                               dynamic)
    module_version.install()
    if isinstance(fn_or_module, torch.nn.Module):
        return CompiledModule(fn_or_module, settings)
    return _compile_callable(fn_or_module, settings)


def _check_arguments(backend: Any, mode: Any, fullgraph: Any, dynamic: Any, options: Any,
                     disable: Any) -> None:
    """Types and names of kiln.compile's arguments (a string is not a bool: "no" is truthy)."""
    for name, value in (("fullgraph", fullgraph), ("disable", disable)):
        if not isinstance(value, bool):
            raise InvalidArgument(f"kiln.compile({name}={value!r}): expected True or False, "
                                  f"got {type(value).__name__}", hint=f"pass {name}=True")
    if dynamic is not None and not isinstance(dynamic, bool):
        raise InvalidArgument(f"kiln.compile(dynamic={dynamic!r}): expected None, True or "
                              f"False, got {type(dynamic).__name__}", hint="leave it None")
    if backend is not None and not isinstance(backend, str) and not callable(backend):
        raise InvalidArgument(f"kiln.compile(backend={backend!r}): expected a registered name "
                              "or a callable(gm, example_inputs)",
                              hint=f"registered backends: {', '.join(list_backends())}")
    resolve_options(mode)  # an unknown mode name raises
    if options is not None and not isinstance(options, Mapping):
        resolve_options(mode, options)  # a CompileOptions passes; anything else raises
    if isinstance(options, Mapping) and not all(isinstance(k, str) for k in options):
        raise InvalidArgument(f"kiln.compile(options={options!r}): keys must be strings",
                              hint="for example options={'autotune': True}")


def _bind_backend(backend: Callable, mode: str | None, options: Any) -> tuple[Callable, Any]:
    """The backend with its settings bound, and those settings in hashable form. kiln's own
    backend gets one validated `CompileOptions`; any other gets `mode=` / `options=` as
    torch.compile hands them to a backend (when it takes them)."""
    if backend is kiln_backend:
        resolved = resolve_options(mode, options)
        return _bind(backend, (("options", resolved),)), resolved
    raw = _RawOptions.of(options or {})
    return _bind_mode(backend, mode, raw), raw


@functools.lru_cache(maxsize=None)
def _bind(backend: Callable, kwargs: tuple) -> Callable:
    """Cached, so equal settings keep one backend object (capture's caches key on it)."""
    bound = functools.partial(backend, **dict(kwargs))
    functools.update_wrapper(bound, backend)
    return bound


@dataclasses.dataclass(frozen=True)
class _RawOptions:
    """Another backend's `options` dict, hashable (capture's caches key on the settings):
    equal when their canonical text is equal."""

    text: str
    value: dict = dataclasses.field(compare=False, hash=False)

    @classmethod
    def of(cls, options: Mapping) -> _RawOptions:
        from kiln.runtime.disk_cache import canonical

        value = dict(options)
        try:
            text = json.dumps(canonical(value))
        except TypeError:  # values without a stable text (functions): this dict only
            text = f"object at {id(value)}"
        return cls(text, value)


@functools.lru_cache(maxsize=None)
def _bind_mode(backend: Callable, mode: str | None, options: _RawOptions) -> Callable:
    """The backend with `mode=` / `options=` bound when it takes them (as torch.compile hands
    them to a backend). A backend without those parameters gets neither, with a warning."""
    if mode in (None, "default") and not options.value:
        return backend
    try:
        params = inspect.signature(backend).parameters
    except (TypeError, ValueError):
        params = {}
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs: dict[str, Any] = {}
    if mode not in (None, "default") and (takes_any or "mode" in params):
        kwargs["mode"] = mode
    if options.value and (takes_any or "options" in params):
        kwargs["options"] = options.value
    if not kwargs:
        warn_once(("backend-ignores-mode", _backend_name(backend)),
                  f"kiln: backend {_backend_name(backend)!r} takes no mode/options; "
                  f"mode={mode!r} options={options.value!r} are ignored")
        return backend
    bound = functools.partial(backend, **kwargs)  # cached by _bind_mode itself
    functools.update_wrapper(bound, backend)
    return bound


def _backend_name(backend: Any) -> str:
    return backend if isinstance(backend, str) else getattr(backend, "__name__",
                                                            type(backend).__name__)


def _compile_callable(fn: Any, settings: CompileSettings) -> Callable:
    if id(fn) in rules.DISABLED:
        return fn
    if isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType):
        return types.MethodType(compile_function(fn.__func__, settings), fn.__self__)
    if not isinstance(fn, types.FunctionType):
        if callable(fn) and isinstance(getattr(fn, "__call__", None), types.MethodType):
            return _compile_callable(fn.__call__, settings)
        raise InvalidArgument(f"kiln.compile() expects a function or an nn.Module, got "
                              f"{type(fn).__name__}", hint="pass the function itself")
    if fn.__code__.co_flags & (0x20 | 0x80 | 0x100 | 0x200):  # generator / coroutine kinds
        return fn  # generators and coroutines run natively (as under torch.compile)
    return compile_function(fn, settings)


def disable(fn: Callable | None = None, recursive: bool = True) -> Any:
    """Never compile `fn`; calling it from compiled code stops capture there."""
    if fn is None:
        return lambda f: disable(f, recursive)
    return rules.disable(fn)


def allow_in_graph(fn: Callable) -> Callable:
    """Record calls to `fn` as one graph node, evaluated on fake tensors at capture time."""
    return rules.allow_in_graph(fn)


def mark_dynamic(tensor: torch.Tensor, dim: int | list[int], **kwargs: Any) -> None:
    """Make `dim` of `tensor` symbolic in the next capture that reads it (the first call
    included): one graph for every size >= 2 of that dim. Sizes 0 and 1 still specialize.
    Ignored under `kiln.compile(dynamic=False)`. `min`/`max` (torch.compile's range hints) are
    accepted and not used yet."""
    _check_tensor("mark_dynamic", tensor)
    mark_dims(tensor, DYNAMIC_ATTR, dim)


def maybe_mark_dynamic(tensor: torch.Tensor, dim: int | list[int]) -> None:
    """Like `mark_dynamic`, as a hint: where the trace needs the dim's value it specializes
    (so does `mark_dynamic` in kiln, which never raises for it)."""
    _check_tensor("maybe_mark_dynamic", tensor)
    mark_dims(tensor, WEAK_DYNAMIC_ATTR, dim)


def mark_static(tensor: Any, dim: int | list[int] | None = None) -> None:
    """Keep `dim` (every dim when None) of `tensor` specialized, even under dynamic=True or
    after its size changed between calls. A module (torch.compile accepts one) is static
    already: its parameters and buffers never become dynamic."""
    if isinstance(tensor, torch.nn.Module) or isinstance(tensor, type):
        return
    _check_tensor("mark_static", tensor)
    mark_dims(tensor, STATIC_ATTR, range(tensor.dim()) if dim is None else dim)


def _check_tensor(name: str, tensor: Any) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgument(f"kiln.{name}() expects a tensor, got {type(tensor).__name__}",
                              hint=f"call kiln.{name}(x, 0) on the tensor argument")


def reset() -> None:
    """Forget every compiled entry, recorded warning and cached decode."""
    from kiln.capture.bytecode import clear_decode_cache
    from kiln.capture.breaks import clear_break_caches
    from kiln.capture.convert import reset_compiled_functions
    clear_caches()
    clear_break_caches()
    clear_decode_cache()
    reset_compiled_functions()
    reset_warnings()
    import kiln.lower
    kiln.lower.reset()
