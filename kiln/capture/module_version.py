"""module_version: a version counter for nn.Module state.

Guards on module attributes, parameters, submodules and hooks only need re-checking when some
module changed. `nn.Module.__setattr__`/`__delattr__`, the `register_*` methods, hook handle
removal and global hook registration bump one counter; a cache entry remembers the counter value
it last verified its module guards at (the fast path compares one integer).

Only a change to a *watched* module moves the counter: one that guards were written for
(`watch`, called for every module generated code refers to). A module no guard has seen cannot
make an entry stale, and counting its changes cost every entry its fast path: transformers'
`self.layers[:n]` builds a new ModuleList per forward, whose `add_module` calls moved the counter
twice a call, and every layer then re-checked all its guards (24 slow-path dispatches per Llama
forward). A module assigned into a watched one moves the counter through the parent's
`__setattr__`/`add_module`, and guards that read it watch it from then on."""
from __future__ import annotations

import functools
import weakref
from typing import Any, Callable

import torch
from torch.nn.modules import module as module_mod
from torch.utils import hooks as hooks_mod

__all__ = ["MODULE_VERSION", "install", "watch"]

MODULE_VERSION = [0]
_installed = False
# id -> weak reference of every watched module; an entry leaves when its module dies (before
# CPython can reuse the id), so an id found here is the module that has it
_WATCHED: dict[int, weakref.ref] = {}

_MODULE_METHODS = (
    "__setattr__", "__delattr__", "register_buffer", "register_parameter", "add_module",
    "register_module", "register_forward_hook", "register_forward_pre_hook",
    "register_full_backward_hook", "register_full_backward_pre_hook", "register_backward_hook",
    "_apply",
)
# container methods that change `_modules` directly, without a bumping method above
_CONTAINER_METHODS = ((torch.nn.ModuleDict, "__delitem__"), (torch.nn.ModuleDict, "clear"),
                      (torch.nn.ModuleList, "insert"), (torch.nn.Sequential, "insert"))
_GLOBAL_HOOK_FUNCTIONS = (
    "register_module_forward_hook", "register_module_forward_pre_hook",
    "register_module_full_backward_hook", "register_module_full_backward_pre_hook",
    "register_module_backward_hook",
)


def watch(module: torch.nn.Module) -> None:
    """From now on, a change to `module` moves the version counter (guards were written for it)."""
    key = id(module)
    if key not in _WATCHED:
        _WATCHED[key] = weakref.ref(module, lambda _, key=key: _WATCHED.pop(key, None))


def _bumping(fn: Callable) -> Callable:
    """For global functions (hook registration, a hook handle's removal): always bump."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        MODULE_VERSION[0] += 1
        return fn(*args, **kwargs)
    wrapper.__kiln_bumps__ = True
    return wrapper


def _bumping_if_watched(fn: Callable) -> Callable:
    """For module methods: bump when the module (`self`) is watched."""
    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if id(self) in _WATCHED:
            MODULE_VERSION[0] += 1
        return fn(self, *args, **kwargs)
    wrapper.__kiln_bumps__ = True
    return wrapper


def install() -> None:
    """Patch torch once per process (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    for name in _MODULE_METHODS:
        original = getattr(torch.nn.Module, name)
        if not getattr(original, "__kiln_bumps__", False):
            setattr(torch.nn.Module, name, _bumping_if_watched(original))
    for name in _GLOBAL_HOOK_FUNCTIONS:
        original = getattr(module_mod, name, None)
        if original is not None and not getattr(original, "__kiln_bumps__", False):
            patched = _bumping(original)
            setattr(module_mod, name, patched)
            if hasattr(torch.nn.modules, name):
                setattr(torch.nn.modules, name, patched)
    for cls, name in _CONTAINER_METHODS:
        original = cls.__dict__[name]
        if not getattr(original, "__kiln_bumps__", False):
            setattr(cls, name, _bumping_if_watched(original))
    handle_remove = hooks_mod.RemovableHandle.remove
    if not getattr(handle_remove, "__kiln_bumps__", False):
        hooks_mod.RemovableHandle.remove = _bumping(handle_remove)
