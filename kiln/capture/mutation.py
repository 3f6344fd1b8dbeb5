"""A version counter for nn.Module state.

Guards on module attributes, parameters, submodules and hooks only need re-checking when some
module changed. `nn.Module.__setattr__`/`__delattr__`, the `register_*` methods, hook handle
removal and global hook registration bump one counter; a cache entry remembers the counter value
it last verified its module guards at (the fast path compares one integer)."""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch.nn.modules import module as module_mod
from torch.utils import hooks as hooks_mod

__all__ = ["MODULE_VERSION", "install"]

MODULE_VERSION = [0]
_installed = False

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


def _bumping(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        MODULE_VERSION[0] += 1
        return fn(*args, **kwargs)
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
            setattr(torch.nn.Module, name, _bumping(original))
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
            setattr(cls, name, _bumping(original))
    handle_remove = hooks_mod.RemovableHandle.remove
    if not getattr(handle_remove, "__kiln_bumps__", False):
        hooks_mod.RemovableHandle.remove = _bumping(handle_remove)
