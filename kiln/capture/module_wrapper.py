"""`kiln.compile(module)`: an nn.Module that behaves like the original and runs a compiled forward.

Everything but `forward` and `__call__` is the original module's: attributes, parameters,
`state_dict()` keys (no `_orig_mod.` prefix), `train()`/`eval()`, hooks. Hooks registered on the
original run around the compiled forward, exactly as `nn.Module.__call__` would run them.
"""
from __future__ import annotations

import types
from typing import Any, Callable

import torch

from kiln.capture import compile_hook
from kiln.capture.settings import CompileSettings
from kiln.capture.variables.nn_module import call_module_with_hooks, module_has_hooks

__all__ = ["CompiledModule"]

_FORWARDED = (
    "parameters", "named_parameters", "buffers", "named_buffers", "children", "named_children",
    "modules", "named_modules", "state_dict", "load_state_dict", "train", "eval", "zero_grad",
    "register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
    "register_buffer", "register_parameter", "add_module", "get_submodule", "get_parameter",
    "requires_grad_", "apply", "extra_repr",
)


class CompiledModule(torch.nn.Module):
    def __init__(self, module: torch.nn.Module, settings: CompileSettings) -> None:
        object.__setattr__(self, "__dict__", {})  # no nn.Module bookkeeping of our own
        self.__dict__["_orig_mod"] = module
        self.__dict__["_kiln_settings"] = settings
        self.__dict__["_kiln_forwards"] = {}

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
        if module._backward_hooks or module._backward_pre_hooks:
            return module(*args, **kwargs)  # backward hooks need nn.Module's own wrapping
        return call_module_with_hooks(module, self.forward, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_orig_mod"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._orig_mod, name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self._orig_mod, name)

    def __dir__(self) -> list[str]:
        return sorted(set(dir(self._orig_mod)) | {"_orig_mod"})

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


def _forwarder(name: str) -> Callable:
    def method(self: CompiledModule, *args: Any, **kwargs: Any) -> Any:
        result = getattr(self._orig_mod, name)(*args, **kwargs)
        return self if result is self._orig_mod else result
    method.__name__ = name
    method.__doc__ = f"`{name}` of the original module."
    return method


for _name in _FORWARDED:
    setattr(CompiledModule, _name, _forwarder(_name))
