"""Plain Python objects during capture: Python modules, classes, user objects (read from the
frame or created by the traced code), and the context managers capture understands."""
from __future__ import annotations

import abc
import dataclasses
import functools
import inspect
import types
from typing import TYPE_CHECKING, Any

import torch

from kiln.capture import _compat
from kiln.capture.sources import Attr, Source, TypeAttr
from kiln.capture.unsupported import unsupported
from kiln.capture.variables.base import VT, ConstantVT, DeletedVT
from kiln.capture.variables.containers import TupleVT, is_namedtuple_class
from kiln.capture.variables.functions import BoundMethodVT, UserFunctionVT

if TYPE_CHECKING:
    from kiln.capture.translator import Translator

__all__ = ["PythonModuleVT", "ClassVT", "UserObjectVT", "NewObjectVT", "GradModeVT",
           "AutocastVT", "UserContextVT", "PartialVT", "lookup_class_attr", "context_vt"]

MISSING = object()


class PythonModuleVT(VT):
    """A Python module (`torch`, `math`, a user module)."""

    def __init__(self, module: types.ModuleType, source: Source | None = None) -> None:
        self.module = module
        self.source = source

    def python_type(self) -> type:
        return types.ModuleType

    def as_constant(self) -> Any:
        return self.module

    def getattr(self, tx: Translator, name: str) -> VT:
        from kiln.capture.variables.builder import wrap, wrap_derived
        try:
            value = getattr(self.module, name)
        except AttributeError:
            unsupported("missing-attribute", f"module {self.module.__name__} has no attribute "
                        f"{name!r}", category="user-fixable")
        if self.source is not None and not _is_library(self.module):
            return wrap(tx, value, Attr(self.source, name))
        if self.source is not None and _is_torch(self.module):
            # torch's own modules are constant, except the flags they hold as plain values
            # (`torch.backends.cudnn.deterministic`, `...matmul.allow_tf32`): guarded when read
            if isinstance(value, types.ModuleType):
                return PythonModuleVT(value, Attr(self.source, name))
            if type(value) in (bool, int, float, str, type(None)):
                return wrap(tx, value, Attr(self.source, name))
            if type(value).__module__.startswith("torch.backends") and not callable(value):
                # flag holders that are plain objects (`torch.backends.cuda.matmul`)
                return UserObjectVT(value, Attr(self.source, name), tx.output)
        return wrap_derived(tx, value)


def _is_torch(module: types.ModuleType) -> bool:
    return module.__name__.split(".")[0] == "torch"


def _is_library(module: types.ModuleType) -> bool:
    """Library modules are taken as constant; user modules are guarded."""
    import sys
    name = module.__name__.split(".")[0]
    return name in ("torch", "kiln", "math", "operator", "builtins", "functools", "typing",
                    "collections", "dataclasses", "numbers", "enum", "warnings") or (
        name in sys.stdlib_module_names)


def _is_library_class(cls: type) -> bool:
    from kiln.capture.rules import is_library_module
    return is_library_module(getattr(cls, "__module__", "") or "")


def lookup_class_attr(cls: type, name: str) -> Any:
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name]
    return MISSING


@functools.lru_cache(maxsize=None)
def _function_apply(cls: type) -> Any:
    """`cls.apply` as a plain function named after the class: FX prints a bound classmethod of
    torch.autograd.Function as `torch.autograd.function.apply`, which does not exist."""
    def apply(*args: Any, **kwargs: Any) -> Any:
        return cls.apply(*args, **kwargs)
    apply.__name__ = apply.__qualname__ = f"{cls.__name__}_apply"
    return apply


class ClassVT(VT):
    """A class object; calling it builds namedtuples, dataclasses and plain user objects."""

    def __init__(self, cls: type, source: Source | None = None) -> None:
        self.cls = cls
        self.source = source

    def python_type(self) -> type:
        return type(self.cls)

    def is_constant(self) -> bool:
        return True

    def as_constant(self) -> Any:
        return self.cls

    def getattr(self, tx: Translator, name: str) -> VT:
        from kiln.capture.variables.builder import wrap_derived
        if name == "apply" and issubclass(self.cls, torch.autograd.Function):
            # a custom autograd.Function: one graph node (its forward runs on fake tensors;
            # the backends run `apply`, so its own backward is used)
            from kiln.capture.variables.functions import TorchFunctionVT
            return TorchFunctionVT(_function_apply(self.cls))
        attr = lookup_class_attr(self.cls, name)
        if isinstance(attr, (staticmethod, classmethod)):
            return class_descriptor(tx, self.cls, name, attr, self)
        if attr is MISSING:
            attr = getattr(self.cls, name, MISSING)
            if attr is MISSING:
                unsupported("missing-attribute", f"{self.cls.__qualname__} has no attribute "
                            f"{name!r}", category="user-fixable")
        if isinstance(attr, types.FunctionType):
            from kiln.capture.variables.builder import class_function
            return class_function(tx, attr, self.cls, name)
        if not hasattr(attr, "__get__") or isinstance(attr, type):
            # a user class's value (`Cls.factor`): read through the class, guarded per call
            from kiln.capture.variables.builder import class_attr_source, wrap
            source = class_attr_source(tx, self.cls, name, attr, identity=False) \
                if _class_value(attr) and not _is_dunder(name) else None
            if source is not None:
                return wrap(tx, attr, source)
        return wrap_derived(tx, attr)

    def call(self, tx: Translator, args: list[VT], kwargs: dict[str, VT]) -> VT:
        cls = self.cls
        from kiln.capture.variables.output_dict import OutputDictVT, is_output_dict_class
        if is_output_dict_class(cls):  # transformers' ModelOutput family
            return OutputDictVT.construct(tx, cls, args, kwargs)
        if is_namedtuple_class(cls):
            values = _bind_namedtuple(cls, args, kwargs)
            return TupleVT(values, cls)
        if issubclass(cls, torch.nn.Module):
            unsupported("module-construction", f"creating a {cls.__qualname__} module inside a "
                        "compiled function", hint="create modules in __init__, not in forward")
        if (cls.__new__ is object.__new__ and type(cls) in (type, abc.ABCMeta)
                and isinstance(lookup_class_attr(cls, "__init__"), types.FunctionType)):
            obj = NewObjectVT(cls)
            init = lookup_class_attr(cls, "__init__")
            UserFunctionVT(init).call(tx, [obj, *args], kwargs)
            return obj
        if all(a.is_constant() for a in args) and all(v.is_constant() for v in kwargs.values()):
            from kiln.capture.variables.builder import wrap_derived
            return wrap_derived(tx, cls(*[a.as_constant() for a in args],
                                        **{k: v.as_constant() for k, v in kwargs.items()}))
        unsupported("class-call", f"creating a {cls.__qualname__} object inside a compiled "
                    "function is not supported")

    def describe(self) -> str:
        return f"class {self.cls.__qualname__}"


def _bind_namedtuple(cls: type, args: list[VT], kwargs: dict[str, VT]) -> list[VT]:
    fields = cls._fields
    values: dict[str, VT] = dict(zip(fields, args))
    values.update(kwargs)
    defaults = getattr(cls, "_field_defaults", {})
    missing = [f for f in fields if f not in values and f not in defaults]
    if missing:
        unsupported("bad-call", f"{cls.__name__}() missing {missing}", category="user-fixable")
    return [values[f] if f in values else ConstantVT(defaults[f]) for f in fields]


class _ObjectBase(VT):
    """Attribute protocol shared by objects read from the frame and objects made while tracing."""

    cls: type

    def python_type(self) -> type:
        return self.cls

    def truth(self, tx: Translator) -> bool:
        if lookup_class_attr(self.cls, "__bool__") is MISSING and \
                lookup_class_attr(self.cls, "__len__") is MISSING:
            return True
        for name in ("__bool__", "__len__"):  # the class's own Python answer
            if isinstance(lookup_class_attr(self.cls, name), types.FunctionType):
                answer = self.getattr(tx, name).call(tx, [], {})
                if answer.is_constant():
                    return bool(answer.as_constant())
        return super().truth(tx)

    def python_len(self, tx: Translator) -> VT | None:
        """`len(obj)` through the class's Python `__len__`, if it has one."""
        if isinstance(lookup_class_attr(self.cls, "__len__"), types.FunctionType):
            return self.getattr(tx, "__len__").call(tx, [], {})
        return None

    def unpack(self, tx: Translator) -> list[VT]:
        # A collections.abc.Sequence iterates by indexing until IndexError (a try block capture
        # cannot interpret): index up to its Python __len__ instead.
        import collections.abc
        if issubclass(self.cls, collections.abc.Sequence) and \
                lookup_class_attr(self.cls, "__iter__") is collections.abc.Sequence.__iter__:
            length = self.getattr(tx, "__len__").call(tx, [], {}).as_constant()
            getitem = self.getattr(tx, "__getitem__")
            return [getitem.call(tx, [ConstantVT(i)], {}) for i in range(length)]
        return super().unpack(tx)

    def check_deletable(self, name: str, default_delattr: Any = object.__delattr__) -> None:
        """`del obj.name` is a plain removal from the instance `__dict__` unless the class says
        otherwise (its own `__delattr__`, a property or slot of that name): those stop capture."""
        if lookup_class_attr(self.cls, "__delattr__") is not default_delattr:
            unsupported("delattr", f"`del` of attribute {name!r}: {self.cls.__qualname__} "
                        "defines its own __delattr__, which capture does not run")
        attr = lookup_class_attr(self.cls, name)
        if hasattr(attr, "__set__") or hasattr(attr, "__delete__"):
            unsupported("delattr", f"`del` of attribute {name!r}: it is a descriptor (property "
                        f"or slot) of {self.cls.__qualname__}, which capture does not run")

    def record_delete(self, tx: Translator, name: str, present: dict, *, module: bool) -> None:
        """Record `del obj.name` in `pending` (replayed after the graph, like setattr). `present`
        is the real instance dict: a name neither written by the trace nor in it is an
        AttributeError, which eager raises."""
        written = self.pending.get(name)
        if isinstance(written, DeletedVT) or (written is None and name not in present):
            unsupported("missing-attribute", f"{self.describe()} has no attribute {name!r} to "
                        "delete", category="user-fixable")
        if written is None:
            tx.output.guards.in_dict(self.source, name, module=module)
        if not self.pending:
            tx.output.side_effects.append(("attrs", self))
        self.pending[name] = DeletedVT()

    def deleted_attr(self, tx: Translator, name: str, known_hooks: tuple = ()) -> VT:
        """A read of an attribute the trace deleted: the class's, or an AttributeError.
        `known_hooks`: `__getattr__`s known to have no answer for the name."""
        found = self.class_attr(tx, name)
        if found is not None:
            return found
        hooks = [lookup_class_attr(self.cls, n) for n in ("__getattribute__", "__getattr__")]
        if any(isinstance(h, types.FunctionType) and h not in known_hooks for h in hooks):
            unsupported("deleted-attribute", f"reading {name!r} of {self.describe()} after "
                        "`del`: its class's __getattr__ would answer, which capture cannot run "
                        "on the object's state after the deletion")
        unsupported("missing-attribute", f"{self.describe()} has no attribute {name!r} (deleted)",
                    category="user-fixable")

    def class_attr(self, tx: Translator, name: str) -> VT | None:
        from kiln.capture.variables.builder import wrap_derived
        attr = lookup_class_attr(self.cls, name)
        if attr is MISSING:
            return None
        if isinstance(self, UserObjectVT):  # a logger's emitting methods: replayed later
            from kiln.capture.variables.logging_calls import logger_method
            deferred = logger_method(self, name, attr)
            if deferred is not None:
                return deferred
        if _is_library_method(attr):  # dict's or collections.abc's own reads of a registry
            from kiln.capture.variables.mappings import MappingMethodVT
            method = MappingMethodVT.lookup(self, name)
            if method is not None:
                return method
        if isinstance(attr, types.FunctionType):
            from kiln.capture.variables.builder import class_function
            return BoundMethodVT(class_function(tx, attr, self.cls, name), self)
        if isinstance(attr, (types.MethodDescriptorType, types.WrapperDescriptorType,
                             types.BuiltinFunctionType)) and isinstance(self, UserObjectVT):
            return OpaqueMethodVT(self, name)  # a C method: runs natively at a graph break
        if isinstance(attr, (property, staticmethod, classmethod)):
            return class_descriptor(tx, self.cls, name, attr, self)
        if hasattr(attr, "__get__") and not isinstance(attr, (int, float, str, tuple, type)):
            unsupported("descriptor", f"descriptor {name!r} of {self.cls.__qualname__}")
        if self.source is not None and not _is_library_class(self.cls):
            from kiln.capture.variables.builder import wrap
            return wrap(tx, getattr(self.cls, name), TypeAttr(self.source, name))
        return wrap_derived(tx, attr)


def _class_value(attr: Any) -> bool:
    """Values read off a class that `wrap` guards by content rather than only by identity
    (containers and constants: `Cls.factor`, `Cls.table["relu"]`); other objects are taken as
    they are, as before."""
    from kiln.capture.variables.builder import _CONSTANT_TYPES
    return isinstance(attr, (*_CONSTANT_TYPES, list, dict, tuple, type, types.FunctionType))


def _is_dunder(name: str) -> bool:
    """Type metadata (`__name__`, `__module__`, `__mro__`) is taken as constant."""
    return name.startswith("__") and name.endswith("__")


def class_descriptor(tx: Translator, cls: type, name: str, attr: Any, owner: VT) -> VT:
    """A property, static method or class method of `cls`, read through `owner` (an instance or
    the class): its function is read through the class (`Cls.name`, guarded per call), so a
    replaced property or method is a cache miss, never the old body."""
    from kiln.capture.variables.builder import (_wrap_callable, class_attr_source,
                                                wrap_derived)
    if isinstance(attr, property):
        if attr.fget is None:
            unsupported("descriptor", f"property {name!r} of {cls.__qualname__} has no getter")
        source = class_attr_source(tx, cls, name, attr)
        getter = UserFunctionVT(attr.fget, Attr(source, "fget") if source else None)
        return BoundMethodVT(getter, owner).call(tx, [], {})
    if isinstance(attr, staticmethod):
        source = class_attr_source(tx, cls, name, attr.__func__)
        return _wrap_callable(tx, attr.__func__, source) if source else \
            wrap_derived(tx, attr.__func__)
    # a classmethod: `Cls.name` is a new bound method each time; its `__func__` is guarded
    source = class_attr_source(tx, cls, name, None)
    func_source = Attr(source, "__func__") if source else None
    if func_source is not None:
        tx.output.guards.id_match(func_source, attr.__func__, location=tx.location())
    cls_vt = owner if isinstance(owner, ClassVT) else ClassVT(cls)
    return BoundMethodVT(UserFunctionVT(attr.__func__, func_source), cls_vt)


def _is_library_method(attr: Any) -> bool:
    """C methods and methods of collections.abc (not the user class's own Python code)."""
    if isinstance(attr, (types.MethodDescriptorType, types.WrapperDescriptorType)):
        return True
    return isinstance(attr, types.FunctionType) and attr.__module__ in ("collections.abc",
                                                                          "_collections_abc")


class UserObjectVT(_ObjectBase):
    """An object read from the frame. Reads go to the real object (guarded); writes are recorded
    and replayed on the real object after the graph runs."""

    def __init__(self, value: Any, source: Source | None, output: Any = None) -> None:
        self.value = value
        self.cls = type(value)
        self.source = source
        self.output = output  # where to guard identity when the object is used as a constant
        self.pending: dict[str, VT] = {}

    def as_constant(self) -> Any:
        """The object itself, e.g. as an argument folded into a constant: only valid for this
        very object, so (when it came from the frame) its identity is guarded."""
        if self.source is not None and self.output is not None:
            self.output.guards.id_match(self.source, self.value)
        return self.value

    def getattr(self, tx: Translator, name: str) -> VT:
        from kiln.capture.variables.builder import wrap, wrap_derived
        if name in self.pending:
            written = self.pending[name]
            return self.deleted_attr(tx, name) if isinstance(written, DeletedVT) else written
        if name == "__class__":
            return ClassVT(self.cls)
        attr = lookup_class_attr(self.cls, name)
        is_data_descriptor = hasattr(attr, "__set__") or hasattr(attr, "__delete__")
        instance_dict = getattr(self.value, "__dict__", {})
        if not is_data_descriptor and name in instance_dict:
            value = instance_dict[name]
            if self.source is None:
                return wrap_derived(tx, value)
            # checked before the value's own guards, which would raise on an object without it
            # (`hasattr`, `getattr` with a default and class patterns read optional attributes)
            tx.output.guards.in_dict(self.source, name, module=False)
            return wrap(tx, value, Attr(self.source, name))
        if self.source is not None and hasattr(self.value, "__dict__"):
            tx.output.guards.not_in_dict(self.source, name, module=False)
        if isinstance(attr, (types.GetSetDescriptorType, types.MemberDescriptorType)):
            value = getattr(self.value, name)  # a C-level attribute (ndarray.shape, ...)
            return wrap(tx, value, Attr(self.source, name)) if self.source else \
                wrap_derived(tx, value)
        found = self.class_attr(tx, name)
        if found is not None:
            return found
        redirected = self._redirected_attr(tx, name)
        if redirected is not None:
            return redirected
        unsupported("missing-attribute", f"{self.describe()} has no attribute {name!r}",
                    category="user-fixable")

    def _redirected_attr(self, tx: Translator, name: str) -> VT | None:
        """An attribute a Python `__getattribute__`/`__getattr__` provides (transformers' configs
        map `num_hidden_layers` to `n_layer`): read for real, guarded through the same lookup."""
        from kiln.capture.variables.builder import wrap, wrap_derived
        hooks = [lookup_class_attr(self.cls, n) for n in ("__getattribute__", "__getattr__")]
        if not any(isinstance(h, types.FunctionType) for h in hooks):
            return None
        try:
            value = getattr(self.value, name)
        except AttributeError:
            return None
        return wrap(tx, value, Attr(self.source, name)) if self.source else \
            wrap_derived(tx, value)

    def setattr(self, tx: Translator, name: str, value: VT) -> None:
        if self.source is None:
            unsupported("setattr", f"setting {name!r} on {self.describe()}")
        if not self.pending:
            tx.output.side_effects.append(("attrs", self))
        self.pending[name] = value

    def delattr(self, tx: Translator, name: str) -> None:
        if self.source is None or not hasattr(self.value, "__dict__"):
            unsupported("delattr", f"deleting {name!r} of {self.describe()}")
        self.check_deletable(name)
        self.record_delete(tx, name, self.value.__dict__, module=False)


class OpaqueMethodVT(VT):
    """`obj.method` where the method is C code (ndarray.tobytes, ...): calling it stops capture;
    at the graph break it is looked up again on the object of that call."""

    def __init__(self, owner: VT, name: str) -> None:
        self.owner = owner
        self.name = name

    def call(self, tx: Translator, args: list[VT], kwargs: dict[str, VT]) -> VT:
        unsupported("unsupported-callable", f"{self.owner.describe()}.{self.name}() is C code "
                    "capture cannot look into", hint="kiln runs this call natively between graphs")

    def describe(self) -> str:
        return f"method {self.name} of {self.owner.describe()}"


class NewObjectVT(_ObjectBase):
    """An object created by the traced code (a dataclass or plain class instance)."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.attrs: dict[str, VT] = {}

    def getattr(self, tx: Translator, name: str) -> VT:
        if name in self.attrs:
            return self.attrs[name]
        if name == "__class__":
            return ClassVT(self.cls)
        found = self.class_attr(tx, name)
        if found is None:
            unsupported("missing-attribute", f"{self.describe()} has no attribute {name!r}",
                        category="user-fixable")
        return found

    def setattr(self, tx: Translator, name: str, value: VT) -> None:
        self.attrs[name] = value

    def delattr(self, tx: Translator, name: str) -> None:
        self.check_deletable(name)
        if name not in self.attrs:
            unsupported("missing-attribute", f"{self.describe()} has no attribute {name!r} to "
                        "delete", category="user-fixable")
        del self.attrs[name]

    def is_dataclass(self) -> bool:
        return dataclasses.is_dataclass(self.cls)


class GradModeVT(VT):
    """torch.no_grad() / enable_grad() / set_grad_enabled(b) as a context manager."""

    def __init__(self, enabled: bool, already_applied: bool = False) -> None:
        self.enabled = enabled
        self.prev = torch.is_grad_enabled()
        self.already_applied = already_applied

    def python_type(self) -> type:
        return torch.set_grad_enabled if self.already_applied else torch.no_grad

    def enter(self, tx: Translator) -> VT:
        if not self.already_applied:
            self.prev = torch.is_grad_enabled()
            set_grad(tx, self.enabled)
        return ConstantVT(None)

    def exit(self, tx: Translator) -> VT:
        set_grad(tx, self.prev)
        return ConstantVT(None)

    def call(self, tx: Translator, args: list[VT], kwargs: dict[str, VT]) -> VT:
        # Used as a decorator on a function: @torch.no_grad() def f(...)
        if len(args) == 1 and not kwargs:
            return _DecoratedVT(self, args[0])
        return super().call(tx, args, kwargs)


def set_grad(tx: Translator, enabled: bool) -> None:
    from kiln.capture.variables.tensor import graph_call
    if torch.is_grad_enabled() != enabled:
        graph_call(tx, "call_function", _compat.set_grad_enabled, [ConstantVT(enabled)], {},
                   keep=True)


class _DecoratedVT(VT):
    def __init__(self, ctx: VT, fn: VT) -> None:
        self.ctx, self.fn = ctx, fn

    def call(self, tx: Translator, args: list[VT], kwargs: dict[str, VT]) -> VT:
        self.ctx.enter(tx)
        result = self.fn.call(tx, args, kwargs)
        self.ctx.exit(tx)
        return result


def context_vt(value: Any) -> VT | None:
    """A tracker for a torch context-manager *object* (e.g. the one behind @torch.no_grad())."""
    if isinstance(value, torch.set_grad_enabled):
        return GradModeVT(bool(value.mode))
    if isinstance(value, torch.enable_grad):
        return GradModeVT(True)
    if isinstance(value, torch.no_grad):
        return GradModeVT(False)
    if isinstance(value, torch.autocast):
        return AutocastVT((value.device,), {"dtype": value.fast_dtype, "enabled": value._enabled,
                                            "cache_enabled": value._cache_enabled})
    return None


class UserContextVT(VT):
    """A user object with Python `__enter__`/`__exit__`, used in a `with` that does not break."""

    def __init__(self, obj: VT) -> None:
        self.obj = obj

    def enter(self, tx: Translator) -> VT:
        return self.obj.getattr(tx, "__enter__").call(tx, [], {})

    def exit(self, tx: Translator) -> VT:
        none = ConstantVT(None)
        return self.obj.getattr(tx, "__exit__").call(tx, [none, none, none], {})

    @staticmethod
    def adapt(obj: VT) -> VT | None:
        if not isinstance(obj, _ObjectBase):
            return None
        methods = [lookup_class_attr(obj.cls, n) for n in ("__enter__", "__exit__")]
        if all(isinstance(m, types.FunctionType) for m in methods):
            return UserContextVT(obj)
        return None


class PartialVT(VT):
    """functools.partial(fn, *args, **kwargs): calls `fn` with the bound arguments first."""

    def __init__(self, fn: VT, args: list[VT], kwargs: dict[str, VT],
                 source: Source | None = None) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.source = source

    def python_type(self) -> type:
        return functools.partial

    def call(self, tx: Translator, args: list[VT], kwargs: dict[str, VT]) -> VT:
        return self.fn.call(tx, [*self.args, *args], {**self.kwargs, **kwargs})


class AutocastVT(VT):
    """torch.autocast(device_type, dtype=..., enabled=...) as a context manager."""

    def __init__(self, args: tuple, kwargs: dict) -> None:
        bound = inspect.signature(torch.autocast.__init__).bind(None, *args, **kwargs)
        bound.apply_defaults()
        params = dict(bound.arguments)
        params.pop("self")
        self.device = params["device_type"]
        self.dtype = params.get("dtype") or torch.get_autocast_dtype(self.device)
        self.enabled = params.get("enabled", True)
        self.cache = params.get("cache_enabled")

    def python_type(self) -> type:
        return torch.autocast

    def enter(self, tx: Translator) -> VT:
        args = (self.device, self.dtype, self.enabled, self.cache)
        self.node, self.mode = tx.output.create_node(
            "call_function", _compat.enter_autocast, args, {},
            lambda: _compat.enter_autocast(*args))
        tx.output.open_contexts.append(self.mode)
        return ConstantVT(None)

    def exit(self, tx: Translator) -> VT:
        mode = self.mode
        tx.output.create_node("call_function", _compat.exit_autocast, (self.node,), {},
                              lambda: _compat.exit_autocast(mode))
        tx.output.open_contexts.remove(mode)
        return ConstantVT(None)
