"""nn.Module instances during capture.

Attribute reads follow Python's lookup order for modules (data descriptors on the class, the
instance `__dict__`, class attributes, then `_parameters`, `_buffers`, `_modules`). Parameters and
buffers become graph inputs read through those dicts. Every value read here is guarded with a
*module* guard, re-checked only when the module version counter moved (see `module_version`).
Calling a module inlines its `forward` (and its hooks, through `call_module_with_hooks`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from kiln.capture.distributed import managed_module_reason
from kiln.capture.guards import Guard
from kiln.capture.sources import Buffer, DictAttr, Param, Source, SubModule
from kiln.capture.unsupported import unsupported
from kiln.capture.variables.base import VT, ConstantVT, DeletedVT
from kiln.capture.variables.containers import ListVT, TupleVT
from kiln.capture.variables.functions import UserFunctionVT
from kiln.capture.variables.objects import MISSING, ClassVT, _ObjectBase, lookup_class_attr

if TYPE_CHECKING:
    from kiln.capture.translator import Translator

__all__ = ["ModuleVT", "module_has_hooks", "call_module_with_hooks", "global_hooks_registered",
           "only_own_forward_hooks"]

_STATE_DICTS = ("_parameters", "_buffers", "_modules")
_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def module_has_hooks(module: torch.nn.Module) -> bool:
    # runs on every call of a compiled module: plain attribute reads, no generator
    try:
        if module._forward_hooks or module._forward_pre_hooks or module._backward_hooks or \
                module._backward_pre_hooks:
            return True
    except AttributeError:  # a module whose __init__ skipped nn.Module's
        if any(getattr(module, name, None) for name in _HOOK_DICTS):
            return True
    return global_hooks_registered()


def global_hooks_registered() -> bool:
    """Whether any of nn.Module's global hooks (register_module_forward_hook & co.) is set."""
    module_mod = torch.nn.modules.module  # not an import statement
    return bool(module_mod._global_forward_hooks or module_mod._global_forward_pre_hooks
                or module_mod._global_backward_hooks or module_mod._global_backward_pre_hooks)


def only_own_forward_hooks(module: torch.nn.Module) -> bool:
    """No backward hooks and no global hooks: what `call_module_with_hooks` runs is all."""
    return not (getattr(module, "_backward_hooks", None)
                or getattr(module, "_backward_pre_hooks", None) or global_hooks_registered())


def call_module_with_hooks(module, forward, args, kwargs):  # inlined by capture: keep it simple
    """nn.Module._call_impl for forward hooks, as plain Python that capture can inline."""
    for hook_id, hook in module._forward_pre_hooks.items():
        if hook_id in module._forward_pre_hooks_with_kwargs:
            result = hook(module, args, kwargs)
            if result is not None:
                args, kwargs = result
        else:
            result = hook(module, args)
            if result is not None:
                args = result if isinstance(result, tuple) else (result,)
    output = forward(*args, **kwargs)
    for hook_id, hook in module._forward_hooks.items():
        if hook_id in module._forward_hooks_with_kwargs:
            result = hook(module, args, kwargs, output)
        else:
            result = hook(module, args, output)
        if result is not None:
            output = result
    return output


class ModuleVT(_ObjectBase):
    def __init__(self, module: torch.nn.Module, source: Source | None) -> None:
        self.module = module
        self.cls = type(module)
        self.source = source
        self.pending: dict[str, VT] = {}

    def as_constant(self) -> Any:
        return self.module

    def truth(self, tx: Translator) -> bool:
        return bool(self.module)

    def getattr(self, tx: Translator, name: str) -> VT:
        from kiln.capture.variables.builder import wrap
        if name in self.pending:
            written = self.pending[name]
            if isinstance(written, DeletedVT):  # not a parameter, buffer or submodule (delattr)
                return self.deleted_attr(tx, name, (torch.nn.Module.__getattr__,))
            return written
        module, src = self.module, self.source
        if name == "__class__":
            return ClassVT(self.cls)
        attr = lookup_class_attr(self.cls, name)
        if attr is getattr(torch.nn.Module, name, None) and name in ("children", "named_children"):
            return _ChildrenMethodVT(self, name)
        if isinstance(attr, property) or hasattr(attr, "__set__"):
            return self.class_attr(tx, name)
        instance_dict = module.__dict__
        if name in instance_dict:
            return wrap(tx, instance_dict[name], DictAttr(src, name), module_guard=True)
        if attr is not MISSING:
            if src is not None:
                tx.output.guards.not_in_dict(src, name)
            return self.class_attr(tx, name)
        for slot, kind in (("_parameters", Param), ("_buffers", Buffer), ("_modules", SubModule)):
            table = instance_dict.get(slot, {})
            if name in table:
                return wrap(tx, table[name], kind(src, name), module_guard=True)
        if src is not None:  # `hasattr(self, name)` is False until the module changes
            tx.output.guards.add(Guard(f"hasattr({src.expr()}, {name!r})", "is", "False", False,
                                       f"hasattr({src.name()}, {name!r})", "no attribute",
                                       module=True))
        unsupported("missing-attribute", f"{type(module).__name__} has no attribute {name!r}",
                    category="user-fixable")

    def setattr(self, tx: Translator, name: str, value: VT) -> None:
        if self.source is None:
            unsupported("setattr", f"setting {name!r} on a module without a source")
        if isinstance(value, (ModuleVT,)) or name in self.module._parameters:
            unsupported("module-setattr", f"assigning a module or parameter to {name!r} inside "
                        "a compiled function is not supported",
                        hint="assign modules and parameters outside the compiled function")
        if not self.pending:
            tx.output.side_effects.append(("attrs", self))
        self.pending[name] = value

    def delattr(self, tx: Translator, name: str) -> None:
        if self.source is None:
            unsupported("delattr", f"deleting {name!r} of a module without a source")
        if any(name in self.module.__dict__.get(table, ()) for table in _STATE_DICTS):
            unsupported("module-delattr", f"deleting parameter, buffer or submodule {name!r} "
                        "inside a compiled function is not supported",
                        hint="delete parameters, buffers and submodules outside the compiled "
                             "function")
        self.check_deletable(name, torch.nn.Module.__dict__["__delattr__"])
        self.record_delete(tx, name, self.module.__dict__, module=True)

    def call(self, tx: Translator, args: list[VT], kwargs: dict[str, VT]) -> VT:
        managed = managed_module_reason(self.module)
        if managed is not None:
            unsupported("distributed-module", f"calling {managed}", hint="kiln calls it "
                        "natively between graphs; its own forward is compiled as a frame of "
                        "its own (docs/distributed.md)")
        forward = self.getattr(tx, "forward")
        if self.source is not None:
            for name in _HOOK_DICTS:  # a hook added later must not be missed
                tx.output.guards.add(Guard(
                    f"bool({self.source.expr()}.__dict__[{name!r}])", "is",
                    repr(bool(self.module.__dict__.get(name))),
                    bool(self.module.__dict__.get(name)), f"bool({self.source.name()}.{name})",
                    "hooks", module=True))
            # nn.Module's global hooks: registering or removing one moves the module version
            registered = global_hooks_registered()
            tx.output.guards.add(Guard(
                f"{tx.output.consts.ref(global_hooks_registered)}()", "is", repr(registered),
                registered, "nn.Module global hooks registered", "hooks", module=True))
        if not module_has_hooks(self.module):
            return forward.call(tx, args, kwargs)
        from kiln.capture.variables.containers import DictVT
        helper = UserFunctionVT(call_module_with_hooks)
        return helper.call(tx, [self, forward, TupleVT(list(args)), DictVT(dict(kwargs))], {})

    def call_method(self, tx: Translator, name: str, args: list[VT],
                    kwargs: dict[str, VT]) -> VT:
        container = _CONTAINER_METHODS.get(name)
        if container is not None and isinstance(self.module, (torch.nn.ModuleDict,
                                                              torch.nn.ParameterDict)):
            self.guard_children(tx)
            return container(self, tx)
        if name in ("children", "named_children") and not args and not kwargs:
            return self._children(tx, named=name == "named_children")
        if name in ("parameters", "named_parameters", "buffers", "children", "modules"):
            unsupported("module-iteration", f"module.{name}() inside a compiled function")
        return super().call_method(tx, name, args, kwargs)

    def guard_children(self, tx: Translator) -> None:
        """Iterating, indexing or `len` of a container module depends on its keys: guard them
        (ModuleList.append, ModuleDict assignment, `del` change them after a capture)."""
        if self.source is None:
            return
        slot = "_parameters" if isinstance(self.module, torch.nn.ParameterList) else "_modules"
        tx.output.guards.dict_keys(DictAttr(self.source, slot), self.module.__dict__[slot],
                                   module=True)

    def _children(self, tx: Translator, named: bool) -> VT:
        """`children()` / `named_children()` as a list: each submodule once (nn.Module keeps a
        `set` of the ones seen, which capture would have to model), skipping None slots."""
        from kiln.capture.variables.containers import ListVT, TupleVT
        from kiln.capture.variables.base import ConstantVT as Const
        seen: set[int] = set()
        items: list[VT] = []
        for key, child in self.module._modules.items():
            if child is None or id(child) in seen:
                continue
            seen.add(id(child))
            vt = self.getattr(tx, key)
            items.append(TupleVT([Const(key), vt]) if named else vt)
        return ListVT(items)

    def unpack(self, tx: Translator) -> list[VT]:
        module = self.module
        self.guard_children(tx)
        if isinstance(module, (torch.nn.Sequential, torch.nn.ModuleList)):
            return [self.getattr(tx, key) for key in module._modules]
        if isinstance(module, torch.nn.ModuleDict):
            return [ConstantVT(key) for key in module._modules]
        if isinstance(module, torch.nn.ParameterList):
            return [self.getattr(tx, key) for key in module._parameters]
        unsupported("module-iteration", f"iterating over {type(module).__name__}")

    def index(self, tx: Translator, key: Any) -> VT:
        module = self.module
        self.guard_children(tx)
        if isinstance(module, (torch.nn.Sequential, torch.nn.ModuleList)):
            keys = list(module._modules)
            if isinstance(key, slice) and isinstance(module, torch.nn.ModuleList):
                # `self.layers[:n]` to loop over: a list of the layers, each with its own source
                from kiln.capture.variables.containers import ListVT
                return ListVT([self.getattr(tx, k) for k in keys[key]])
            if isinstance(key, slice):
                unsupported("module-slice", "slicing a Sequential inside forward")
            return self.getattr(tx, keys[key])
        if isinstance(module, torch.nn.ModuleDict):
            return self.getattr(tx, key)
        unsupported("module-index", f"indexing {type(module).__name__}")

    def describe(self) -> str:
        where = f" {self.source.name()}" if self.source is not None else ""
        return f"module{where} ({type(self.module).__name__})"


def _dict_items(self: ModuleVT, tx: Translator) -> VT:
    return ListVT([TupleVT([ConstantVT(k), self.getattr(tx, k)]) for k in self.module._modules])


def _dict_values(self: ModuleVT, tx: Translator) -> VT:
    return ListVT([self.getattr(tx, k) for k in self.module._modules])


def _dict_keys(self: ModuleVT, tx: Translator) -> VT:
    return ListVT([ConstantVT(k) for k in self.module._modules])


_CONTAINER_METHODS = {"items": _dict_items, "values": _dict_values, "keys": _dict_keys}


class _ChildrenMethodVT(VT):
    """nn.Module's own `children` / `named_children`, bound to a module tracker."""

    def __init__(self, owner: ModuleVT, name: str) -> None:
        self.owner, self.name = owner, name

    def call(self, tx: Translator, args: list[VT], kwargs: dict[str, VT]) -> VT:
        if args or kwargs:
            unsupported("module-iteration", f"module.{self.name}() with arguments")
        return self.owner._children(tx, named=self.name == "named_children")
