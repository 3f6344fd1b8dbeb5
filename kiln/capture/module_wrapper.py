"""`kiln.compile(module)`: an nn.Module that behaves like the original and runs a compiled forward.

Everything but `forward` and `__call__` is the original module's: attributes, parameters,
`state_dict()` keys (no `_orig_mod.` prefix), `train()`/`eval()`, hooks. Hooks registered on the
original run around the compiled forward, exactly as `nn.Module.__call__` would run them.

The wrapper shares the original's instance `__dict__` (its own three fields are slots), so
whatever writes a module's state directly is seen by both: `_parameters`, `_modules`, the hook
tables, and what composable torch.distributed APIs store in `module.__dict__` (FSDP2's
`fully_shard` state). Only the class is the wrapper's own: `fully_shard(kiln.compile(m))` swaps
the wrapper's class for an FSDP subclass of `CompiledModule` (the original keeps its class), and
the wrapper is then the FSDP module: `named_modules()` yields it at the root, where FSDP2 looks
its state up by identity (docs/distributed.md).
"""
from __future__ import annotations

import copy
import types
from typing import Any, Callable

import torch

from kiln.capture import _compat, compile_hook
from kiln.capture.settings import CompileSettings
from kiln.capture.variables.nn_module import (call_module_with_hooks, module_has_hooks,
                                             only_own_forward_hooks)

__all__ = ["CompiledModule"]

_FORWARDED = (
    "parameters", "named_parameters", "buffers", "named_buffers", "children", "named_children",
    "state_dict", "load_state_dict", "train", "eval", "zero_grad",
    "register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
    "register_buffer", "register_parameter", "add_module", "get_submodule", "get_parameter",
    "requires_grad_", "apply", "extra_repr",
)


_SLOTS = ("_orig_mod", "_kiln_settings", "_kiln_forwards")


class CompiledModule(torch.nn.Module):
    __slots__ = _SLOTS

    def __init__(self, module: torch.nn.Module, settings: CompileSettings) -> None:
        # no nn.Module bookkeeping of our own: the original's state, shared (module docstring)
        object.__setattr__(self, "__dict__", module.__dict__)
        object.__setattr__(self, "_orig_mod", module)
        object.__setattr__(self, "_kiln_settings", settings)
        object.__setattr__(self, "_kiln_forwards", {})
        _compat.share_composable_state(module, self)  # a layer fully_shard'ed before compile

    @property
    def forward(self) -> Callable:  # type: ignore[override]
        module = self._orig_mod
        raw = module.__dict__.get("forward")
        if isinstance(raw, types.MethodType) and raw.__self__ is module:
            raw = None  # `module.forward = MethodType(fn, module)` (kernelize): bind fn again
            fn = module.__dict__["forward"].__func__
        else:
            fn = raw if raw is not None else type(module).forward
        cache = self._kiln_forwards
        compiled = cache.get(id(fn))
        if compiled is None:
            compiled = cache[id(fn)] = (fn, compile_hook.compile_function(fn, self._kiln_settings))
        bound = compiled[1]
        if raw is not None:
            return bound
        return bound.__get__(module)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module = self._orig_mod
        if not module_has_hooks(module):
            return self.forward(*args, **kwargs)
        if only_own_forward_hooks(module):
            return call_module_with_hooks(module, self.forward, args, kwargs)
        return _call_with_torch_hooks(module, self.forward, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        if name in _SLOTS:  # not set yet (an object being built by copy or pickle)
            raise AttributeError(name)
        return getattr(self._orig_mod, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "__class__":  # fully_shard's FSDP subclass: the wrapper's, not the original's
            object.__setattr__(self, name, value)
            return
        setattr(self._orig_mod, name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self._orig_mod, name)

    def __dir__(self) -> list[str]:
        return sorted(set(dir(self._orig_mod)) | {"_orig_mod"})

    def named_modules(self, memo: Any = None, prefix: str = "", remove_duplicate: bool = True
                      ) -> Any:
        """The original's, except that a wrapper whose class a composable API swapped
        (`fully_shard(kiln.compile(m))`) is itself the root: FSDP2 finds its state by module
        identity from there."""
        orig = self._orig_mod
        own = type(self) is not CompiledModule
        for name, module in orig.named_modules(memo, prefix, remove_duplicate):
            yield name, (self if own and module is orig else module)

    def __copy__(self) -> CompiledModule:
        return CompiledModule(self._orig_mod, self._kiln_settings)

    def __deepcopy__(self, memo: dict) -> CompiledModule:
        return CompiledModule(copy.deepcopy(self._orig_mod, memo), self._kiln_settings)

    def __reduce_ex__(self, protocol: Any) -> Any:
        return CompiledModule, (self._orig_mod, self._kiln_settings)

    def __repr__(self) -> str:
        return f"CompiledModule({self._orig_mod!r})"

    def __len__(self) -> int:
        return len(self._orig_mod)

    def __iter__(self) -> Any:
        return iter(self._orig_mod)

    def __getitem__(self, index: Any) -> Any:
        return self._orig_mod[index]

    def to(self, *args: Any, **kwargs: Any) -> CompiledModule:
        self._orig_mod.to(*args, **kwargs)
        return self

    def cuda(self, device: Any = None) -> CompiledModule:
        self._orig_mod.cuda(device)
        return self

    def cpu(self) -> CompiledModule:
        self._orig_mod.cpu()
        return self

    def float(self) -> CompiledModule:
        self._orig_mod.float()
        return self

    def half(self) -> CompiledModule:
        self._orig_mod.half()
        return self

    def bfloat16(self) -> CompiledModule:
        self._orig_mod.bfloat16()
        return self


def _call_with_torch_hooks(module: torch.nn.Module, forward: Callable, args: tuple,
                           kwargs: dict) -> Any:
    """nn.Module's own call of `module` (backward hooks, global hooks: torch's wrapping of
    inputs and outputs, hooks given the original module) around the compiled `forward`, which
    is the instance's `forward` for that call only."""
    instance = module.__dict__
    had, saved = "forward" in instance, instance.get("forward")
    instance["forward"] = forward
    try:
        return torch.nn.Module._call_impl(module, *args, **kwargs)
    finally:
        if had:
            instance["forward"] = saved
        else:
            del instance["forward"]


def _forwarder(name: str) -> Callable:
    def method(self: CompiledModule, *args: Any, **kwargs: Any) -> Any:
        result = getattr(self._orig_mod, name)(*args, **kwargs)
        return self if result is self._orig_mod else result
    method.__name__ = name
    method.__doc__ = f"`{name}` of the original module."
    return method


for _name in _FORWARDED:
    setattr(CompiledModule, _name, _forwarder(_name))
