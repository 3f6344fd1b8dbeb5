"""Callables during capture: user functions (inlined), nested functions made by the traced code,
bound methods, torch functions (recorded as graph nodes), and `super()` objects."""
from __future__ import annotations

import inspect
import types
from typing import TYPE_CHECKING, Any

from kiln.capture.sources import Attr, FnClosure, Item, Source
from kiln.capture.unsupported import unsupported
from kiln.capture.variables.base import VT, CellBox, ConstantVT, LazyVT
from kiln.capture.variables.containers import DictVT, TupleVT

if TYPE_CHECKING:
    from kiln.capture.translator import Translator

__all__ = ["UserFunctionVT", "NestedFunctionVT", "BoundMethodVT", "TorchFunctionVT", "SuperVT",
           "OpaqueCallableVT",
           "GeneratorVT", "bind_args"]

CO_VARARGS = inspect.CO_VARARGS
CO_VARKEYWORDS = inspect.CO_VARKEYWORDS
CO_GENERATOR = inspect.CO_GENERATOR
_UNINLINABLE_FLAGS = inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE


class _InlinableVT(VT):
    """Shared by real and nested Python functions: bind arguments, then interpret the body."""

    def code(self) -> types.CodeType:
        raise NotImplementedError

    def closure_cells(self, tx: Translator) -> list[CellBox]:
        raise NotImplementedError

    def defaults(self, tx: Translator) -> tuple[list[VT], dict[str, VT]]:
        raise NotImplementedError

    def fn_globals(self) -> dict:
        raise NotImplementedError

    def fn_name(self) -> str:
        return self.code().co_name

    def python_type(self) -> type:
        return types.FunctionType

    def call(self, tx: Translator, args: list[VT], kwargs: dict[str, VT]) -> VT:
        code = self.code()
        if code.co_flags & _UNINLINABLE_FLAGS:
            unsupported("async-call", f"calling async function {self.fn_name()} is not supported")
        defaults, kwdefaults = self.defaults(tx)
        bound = bind_args(code, self.fn_name(), args, kwargs, defaults, kwdefaults)
        if code.co_flags & CO_GENERATOR:
            return GeneratorVT(self, bound)
        return tx.inline(code, bound, self.closure_cells(tx), self.fn_globals(), self.source)


class UserFunctionVT(_InlinableVT):
    """A real Python function object (a global helper, a method's function, ...)."""

    def __init__(self, fn: types.FunctionType, source: Source | None = None) -> None:
        self.fn = fn
        self.source = source

    def code(self) -> types.CodeType:
        return self.fn.__code__

    def as_constant(self) -> Any:
        return self.fn

    def fn_name(self) -> str:
        return self.fn.__qualname__

    def fn_globals(self) -> dict:
        return self.fn.__globals__

    def closure_cells(self, tx: Translator) -> list[CellBox]:
        from kiln.capture.variables.builder import wrap, wrap_derived
        cells = []
        for i, (name, cell) in enumerate(zip(self.fn.__code__.co_freevars,
                                             self.fn.__closure__ or ())):
            source = FnClosure(self.source, i, name) if self.source is not None else None
            try:
                contents = cell.cell_contents
            except ValueError:  # an empty cell (variable assigned later)
                cells.append(CellBox(None, source, detached=source is None))
                continue
            value = wrap(tx, contents, source) if source is not None else \
                wrap_derived(tx, contents)
            cells.append(CellBox(value, source, detached=source is None))
        return cells

    def call(self, tx: Translator, args: list[VT], kwargs: dict[str, VT]) -> VT:
        if self.source is not None:
            # the function object is guarded, but `fn.__code__ = other` keeps its identity
            tx.output.guards.id_match(Attr(self.source, "__code__"), self.fn.__code__,
                                      location=tx.location())
        return super().call(tx, args, kwargs)

    def defaults(self, tx: Translator) -> tuple[list[VT], dict[str, VT]]:
        """Defaults read through the function when it has a source: the tuple's identity and
        each default's value are guarded when the call uses it (`LazyVT`: a default the body
        reads; `__defaults__` reassigned or a default list mutated is then a miss)."""
        from kiln.capture.variables.builder import wrap_derived
        fn = self.fn
        if self.source is None:
            defaults = [wrap_derived(tx, d) for d in (fn.__defaults__ or ())]
            kwdefaults = {k: wrap_derived(tx, v) for k, v in (fn.__kwdefaults__ or {}).items()}
            return defaults, kwdefaults
        table = Attr(self.source, "__defaults__")
        defaults = [_DefaultVT(d, Item(table, i), table, fn.__defaults__)
                    for i, d in enumerate(fn.__defaults__ or ())]
        table = Attr(self.source, "__kwdefaults__")
        kwdefaults = {k: _DefaultVT(v, Item(table, k), table, fn.__kwdefaults__)
                      for k, v in (fn.__kwdefaults__ or {}).items()}
        return defaults, kwdefaults

    def getattr(self, tx: Translator, name: str) -> VT:
        if name in ("__name__", "__qualname__", "__module__", "__doc__"):
            return ConstantVT(getattr(self.fn, name))
        if name in _FUNCTION_ATTRS and hasattr(self.fn, name):
            return function_attribute(tx, self.fn, name, self.source)
        return super().getattr(tx, name)


class _DefaultVT(LazyVT):
    """A default argument value, read through its function when the body first uses it. The
    table it sits in is guarded first (`__defaults__` by identity, `__kwdefaults__`, a dict,
    by its keys), so the index or key in the value's guard is still the same parameter's.
    A default the call does not use costs no guard."""

    def __init__(self, value: Any, source: Source, table_source: Source, table: Any) -> None:
        super().__init__(value, source)
        self.table_source, self.table = table_source, table

    def realize(self, tx: Translator) -> VT:
        guards, loc = tx.output.guards, tx.location()
        if isinstance(self.table, tuple):
            guards.id_match(self.table_source, self.table, location=loc)
        else:
            guards.dict_keys(self.table_source, self.table, location=loc)
        return super().realize(tx)


# Reflection attributes of function objects that library decorators read (transformers'
# `merge_with_config_defaults` reads `func.__code__.co_varnames`, `functools.wraps` chains
# `__wrapped__`); they become constants guarded through the function's own source.
_FUNCTION_ATTRS = ("__code__", "__defaults__", "__kwdefaults__", "__wrapped__", "__dict__",
                   "__closure__", "__globals__", "__annotations__", "__self__", "__func__")


def function_attribute(tx: Translator, fn: Any, name: str, source: Source | None) -> VT:
    """`fn.<name>` as a tracker: wrapped with guards when `fn` has a source, as a constant
    otherwise (a function capture computed itself or took from library constants)."""
    from kiln.capture.sources import Attr
    from kiln.capture.variables.builder import wrap, wrap_derived
    value = getattr(fn, name)
    if source is None:
        return ConstantVT(value) if isinstance(value, types.CodeType) else wrap_derived(tx, value)
    attr_source = Attr(source, name)
    if isinstance(value, (types.CodeType, dict)) and name != "__kwdefaults__":
        # code objects and namespaces: identity is what a reader of them relies on
        tx.output.guards.id_match(attr_source, value, location=tx.location())
        return ConstantVT(value, attr_source) if isinstance(value, types.CodeType) else \
            wrap_derived(tx, value)
    return wrap(tx, value, attr_source)


class NestedFunctionVT(_InlinableVT):
    """A function created by MAKE_FUNCTION inside the traced code (lambdas, inner defs, genexprs)."""

    def __init__(self, code: types.CodeType, qualname: str, defaults: list[VT],
                 kwdefaults: dict[str, VT], closure: list[CellBox], fn_globals: dict) -> None:
        self._code = code
        self.qualname = qualname
        self._defaults = defaults
        self._kwdefaults = kwdefaults
        self.closure = closure
        self._globals = fn_globals

    def code(self) -> types.CodeType:
        return self._code

    def fn_name(self) -> str:
        return self.qualname

    def fn_globals(self) -> dict:
        return self._globals

    def closure_cells(self, tx: Translator) -> list[CellBox]:
        return self.closure

    def defaults(self, tx: Translator) -> tuple[list[VT], dict[str, VT]]:
        return self._defaults, self._kwdefaults

    def getattr(self, tx: Translator, name: str) -> VT:
        if name == "__code__":
            return ConstantVT(self._code)
        if name in ("__name__", "__qualname__"):
            return ConstantVT(self.qualname.rsplit(".", 1)[-1] if name == "__name__"
                              else self.qualname)
        if name == "__module__":
            return ConstantVT(self._globals.get("__name__"))
        if name == "__defaults__":
            return TupleVT(list(self._defaults)) if self._defaults else ConstantVT(None)
        if name == "__kwdefaults__":
            return DictVT(dict(self._kwdefaults)) if self._kwdefaults else ConstantVT(None)
        return super().getattr(tx, name)


class BoundMethodVT(VT):
    """`obj.method` for a Python-level method: calls the function with `obj` first."""

    def __init__(self, fn: VT, self_vt: VT, source: Source | None = None) -> None:
        self.fn = fn
        self.self_vt = self_vt
        self.source = source

    def python_type(self) -> type:
        return types.MethodType

    def call(self, tx: Translator, args: list[VT], kwargs: dict[str, VT]) -> VT:
        return self.fn.call(tx, [self.self_vt, *args], kwargs)

    def getattr(self, tx: Translator, name: str) -> VT:
        if name == "__self__":
            return self.self_vt
        if name == "__func__":
            return self.fn
        return self.fn.getattr(tx, name)


class _KnownCallableVT(VT):
    """A callable object known at compile time (not interpreted): its identity is its value."""

    kind = "callable"

    def __init__(self, fn: Any, source: Source | None = None) -> None:
        self.fn = fn
        self.source = source

    def python_type(self) -> type:
        return type(self.fn)

    def as_constant(self) -> Any:
        return self.fn

    def getattr(self, tx: Translator, name: str) -> VT:
        from kiln.capture.variables.builder import wrap_derived
        if name in ("__name__", "__qualname__", "__module__", "__doc__"):
            return ConstantVT(getattr(self.fn, name, None))
        return wrap_derived(tx, getattr(self.fn, name))

    def describe(self) -> str:
        return f"{self.kind} {getattr(self.fn, '__qualname__', self.fn)!s}"


class TorchFunctionVT(_KnownCallableVT):
    """A torch function recorded as one `call_function` node, evaluated on fake tensors."""

    kind = "torch function"

    def call(self, tx: Translator, args: list[VT], kwargs: dict[str, VT]) -> VT:
        from kiln.capture import numpy_ops
        from kiln.capture.variables.scalars import tensor_of_numbers
        from kiln.capture.variables.tensor import graph_call
        if numpy_ops.has_array([args, kwargs]):  # torch.from_numpy(arr), torch.as_tensor(arr)
            return numpy_ops.torch_interop(tx, self.fn, args, kwargs)
        numbers = tensor_of_numbers(tx, self.fn, args, kwargs)
        return numbers if numbers is not None else graph_call(tx, "call_function", self.fn, args,
                                                              kwargs)


class OpaqueCallableVT(_KnownCallableVT):
    """A callable capture cannot look into (C extensions, I/O, kiln.disable'd functions): calling
    it stops capture at that call, where a graph break runs it natively."""

    def call(self, tx: Translator, args: list[VT], kwargs: dict[str, VT]) -> VT:
        from kiln.capture.rules import is_distributed_call, why_unsupported
        if is_distributed_call(self.fn):
            unsupported("distributed-call", why_unsupported(self.fn),
                        hint="kiln runs this call natively between graphs (docs/distributed.md)")
        unsupported("unsupported-callable", why_unsupported(self.fn),
                    hint="kiln runs this call natively between graphs; wrap it with "
                         "kiln.allow_in_graph if it only does torch ops")


class SuperVT(VT):
    """`super(cls, obj)`: attribute lookup starts after `cls` in type(obj).__mro__."""

    def __init__(self, cls: type, obj: VT) -> None:
        self.cls = cls
        self.obj = obj

    def getattr(self, tx: Translator, name: str) -> VT:
        from kiln.capture.variables.builder import wrap_derived
        mro = self.obj.python_type().__mro__
        for klass in mro[mro.index(self.cls) + 1:]:
            if name in klass.__dict__:
                attr = klass.__dict__[name]
                mapping_method = _super_mapping_read(self.obj, klass, name)
                if mapping_method is not None:  # super().get(...) in a registry class
                    return mapping_method
                if isinstance(attr, types.FunctionType):
                    from kiln.capture.variables.builder import class_function
                    return BoundMethodVT(class_function(tx, attr, klass, name), self.obj)
                if isinstance(attr, (staticmethod, classmethod)) or \
                        isinstance(attr, property) and attr.fget is not None:
                    from kiln.capture.variables.objects import ClassVT, class_descriptor
                    owner = self.obj if isinstance(attr, property) else \
                        ClassVT(self.obj.python_type())
                    return class_descriptor(tx, klass, name, attr, owner)
                if attr is object.__init__:
                    return _NoopVT()
                if isinstance(attr, (types.MethodDescriptorType, types.WrapperDescriptorType)):
                    # C methods of a builtin base (dict.__getitem__, object.__setattr__): bound
                    # to the object like any method; capture decides how to call them
                    return BoundMethodVT(wrap_derived(tx, attr), self.obj)
                if hasattr(attr, "__get__"):
                    unsupported("super-descriptor", f"super().{name} is a descriptor")
                return wrap_derived(tx, attr)
        unsupported("super-attribute", f"super().{name} not found", category="user-fixable")


def _super_mapping_read(obj: VT, klass: type, name: str) -> VT | None:
    from kiln.capture.variables.mappings import MappingMethodVT
    if klass.__module__ not in ("builtins", "collections.abc", "_collections_abc"):
        return None
    return MappingMethodVT.lookup(obj, name, owner=klass)


class _NoopVT(VT):
    def call(self, tx: Translator, args: list[VT], kwargs: dict[str, VT]) -> VT:
        return ConstantVT(None)


class GeneratorVT(VT):
    """A generator created by the traced code: run to completion when first iterated."""

    def __init__(self, fn: _InlinableVT, bound: dict[str, VT]) -> None:
        self.fn = fn
        self.bound = bound
        self.items: list[VT] | None = None

    def python_type(self) -> type:
        return types.GeneratorType

    def unpack(self, tx: Translator) -> list[VT]:
        if self.items is None:
            self.items = tx.inline_generator(self.fn.code(), self.bound,
                                             self.fn.closure_cells(tx), self.fn.fn_globals())
        items, self.items = self.items, []
        return items


def bind_args(code: types.CodeType, name: str, args: list[VT], kwargs: dict[str, VT],
              defaults: list[VT], kwdefaults: dict[str, VT]) -> dict[str, VT]:
    """CPython's argument binding, on trackers. Errors become user-fixable Unsupported (running
    the function eagerly then raises the real TypeError)."""
    nargs, nposonly, nkw = code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount
    names = code.co_varnames
    pos_names, kw_names = names[:nargs], names[nargs:nargs + nkw]
    extra_index = nargs + nkw
    varargs = names[extra_index] if code.co_flags & CO_VARARGS else None
    varkw = names[extra_index + (1 if varargs else 0)] if code.co_flags & CO_VARKEYWORDS else None
    bound: dict[str, VT] = dict(zip(pos_names, args))
    if len(args) > nargs and varargs is None:
        _bad_call(name, f"takes {nargs} positional arguments but {len(args)} were given")
    if varargs is not None:
        bound[varargs] = TupleVT(list(args[nargs:]))
    rest: dict[str, VT] = {}
    for key, value in kwargs.items():
        if key in pos_names[nposonly:] or key in kw_names:
            if key in bound:
                _bad_call(name, f"got multiple values for argument {key!r}")
            bound[key] = value
        elif varkw is not None:
            rest[key] = value
        else:
            _bad_call(name, f"got an unexpected keyword argument {key!r}")
    first_default = nargs - len(defaults)
    for index, param in enumerate(pos_names):
        if param not in bound:
            if index < first_default:
                _bad_call(name, f"missing required argument {param!r}")
            bound[param] = defaults[index - first_default]
    for param in kw_names:
        if param not in bound:
            if param not in kwdefaults:
                _bad_call(name, f"missing required keyword-only argument {param!r}")
            bound[param] = kwdefaults[param]
    if varkw is not None:
        bound[varkw] = DictVT(rest)
    return bound


def _bad_call(name: str, why: str) -> None:
    unsupported("bad-call", f"{name}() {why}", category="user-fixable")

