"""The backend registry. A backend has torch.compile's contract:

    backend(gm: torch.fx.GraphModule, example_inputs: list) -> callable

Registered backends are looked up by name; any callable is a backend as it is.
"""

from __future__ import annotations

from typing import Any, Callable

from kiln.errors import InvalidArgument

__all__ = ["Backend", "list_backends", "lookup_backend", "register_backend"]

Backend = Callable[..., Callable[..., Any]]

_backends: dict[str, Backend] = {}


def register_backend(name: str | Backend | None = None) -> Any:
    """Register a backend: `@register_backend`, `@register_backend("name")` or
    `register_backend("name")(fn)`. The name defaults to the function's __name__."""
    if callable(name):
        return _register(name.__name__, name)

    def decorator(fn: Backend) -> Backend:
        return _register(name or fn.__name__, fn)

    return decorator


def _register(name: str, fn: Backend) -> Backend:
    if name in _backends and _backends[name] is not fn:
        raise InvalidArgument(f"backend {name!r} is already registered",
                              hint="pick another name, or pass the callable itself as backend=")
    _backends[name] = fn
    return fn


def lookup_backend(backend: str | Backend) -> Backend:
    """The backend callable for a registered name; a callable passes through unchanged."""
    if callable(backend):
        return backend
    if isinstance(backend, str) and backend in _backends:
        return _backends[backend]
    raise InvalidArgument(
        f"unknown backend {backend!r}; registered backends: {', '.join(list_backends())}",
        hint="use one of the registered names, register yours with "
             "@kiln.backends.register_backend, or pass a callable(gm, example_inputs)")


def list_backends() -> list[str]:
    """Registered backend names, sorted."""
    return sorted(_backends)
