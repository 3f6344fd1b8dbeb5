"""Turn real Python values into trackers, installing the guards that make reuse safe.

`wrap(tx, value, source)` is for values read from the frame (arguments, globals, closures, module
state): it guards what capture relies on. `wrap_derived(tx, value)` is for values that capture
computed itself or that come from library code taken as constant; it installs no guard.
"""
from __future__ import annotations

import enum
import functools
import inspect
import types
from typing import TYPE_CHECKING, Any

import torch

from kiln.capture import _compat, rules
from kiln.capture.sources import (Attr, ConstSource, FnClosure, Item, Local, RefItem, Source,
                                  is_literal_key)
from kiln.capture.unsupported import unsupported
from kiln.capture.variables.base import VT, ConstantVT
from kiln.capture.variables.containers import DictVT, ListVT, SliceVT, TupleVT
from kiln.capture.variables.functions import (BoundMethodVT, OpaqueCallableVT, TorchFunctionVT,
                                              UserFunctionVT)
from kiln.capture.variables.ndarray import NumpyFunctionVT
from kiln.capture.variables.nn_module import ModuleVT
from kiln.capture.variables.number_tensors import number_dtype
from kiln.capture.variables.objects import (ClassVT, PartialVT, PythonModuleVT, UserObjectVT,
                                            context_vt)

if TYPE_CHECKING:
    from kiln.capture.translator import Translator

__all__ = ["wrap", "wrap_derived"]

_CONSTANT_TYPES = (type(None), bool, int, float, complex, str, torch.dtype, torch.device,
                   torch.layout, torch.memory_format, range, type(Ellipsis), type(NotImplemented),
                   enum.Enum, frozenset, torch.finfo, torch.iinfo)


def item_source(tx: Translator, base: Source, key: Any) -> Source:
    """`base[key]`: the key is pasted into generated code only when its repr is a literal;
    any other key (an object, an enum, a str subclass) is a constant bound by the cache."""
    if is_literal_key(key):
        return Item(base, key)
    return RefItem(base, tx.output.consts.ref(key), repr(key)[:40])


def wrap(tx: Translator, value: Any, source: Source, *, module_guard: bool = False) -> VT:
    """A tracker for `value`, read from `source`, with guards. One tracker per source, so a
    mutation made through one read (`LOG.append`) is seen by the next (`len(LOG)`)."""
    memo = tx.output.wrapped
    known = memo.get(source)
    if known is not None:
        return known
    vt = _wrap(tx, value, source, module_guard)
    memo[source] = vt
    return vt


def _dynamic_number(tx: Translator, value: Any, source: Source, module_guard: bool) -> str | None:
    """Why a Python number becomes a graph input instead of a guarded constant, or None: its
    value changed between calls (automatic dynamic), or it is an int argument of the compiled
    function under `dynamic=True` (as torch.compile's unspecialized ints; an int read through
    module state or an object stays specialized: layer sizes, head counts). 0 and 1 stay
    constants, as sizes 0 and 1 do (`OutputGraph.scalar_input` says what the others become)."""
    if type(value) not in (int, float) or (type(value) is int and value in (0, 1)) or \
            number_dtype(value) is None:  # an int past int64 has no tensor to travel in
        return None
    if source.expr() in tx.output.dynamic_scalars:
        return "its value changed between calls"
    if type(value) is int and tx.output.dynamic.mode is True and isinstance(source, Local) \
            and not module_guard:
        return "dynamic=True"
    return None


def _wrap(tx: Translator, value: Any, source: Source, module_guard: bool) -> VT:
    guards = tx.output.guards
    loc = tx.location()
    if isinstance(value, torch.Tensor):
        vt = tx.output.input_for(value, source, type(value), module_state=module_guard)
        guards.tensor_match(source, value, module=module_guard, location=loc,
                            symbolic_dims=symbolic_dims(vt.fake),
                            symbolic_strides=any(map(_compat.is_symbolic, vt.fake.stride())))
        if vt.source is not source and vt.source != source:  # the same tensor seen twice
            guards.same_object(source, vt.source, location=loc)
        return vt
    why = _dynamic_number(tx, value, source, module_guard)
    if why is not None:
        guards.type_match(source, value, module=module_guard, location=loc)
        return tx.output.scalar_input(value, source, why)
    if isinstance(value, _CONSTANT_TYPES):
        if isinstance(value, (torch.dtype, torch.layout, enum.Enum)):  # singletons
            guards.id_match(source, value, module=module_guard, location=loc)
        else:
            guards.equals(source, value, module=module_guard, location=loc)
        return ConstantVT(value, source)
    context = context_vt(value)
    if context is not None:
        guards.id_match(source, value, module=module_guard, location=loc)
        return context
    if isinstance(value, functools.partial):
        guards.id_match(source, value, module=module_guard, location=loc)
        # `func` and `args` are read-only, but `keywords` is a dict changed in place
        # (`p.keywords["alpha"] = 2`): its keys and values are guarded like any dict's
        keywords = wrap(tx, value.keywords, Attr(source, "keywords"))
        return PartialVT(wrap(tx, value.func, Attr(source, "func")),
                         [wrap(tx, a, Item(Attr(source, "args"), i))
                          for i, a in enumerate(value.args)], dict(keywords.items), source)
    if isinstance(value, torch.nn.Module):
        guards.module_instance(source, value, module=module_guard, location=loc)
        return ModuleVT(value, source)
    if type(value) in (list, dict):
        # a list or dict held by a module changes in place (`m.scales[0] = 5`) without moving
        # the module version: its guards, and its items', are checked on every call
        module_guard = False
    if type(value) in (tuple, list) or isinstance(value, tuple):
        guards.length(source, value, module=module_guard, location=loc)
        items = [wrap(tx, item, Item(source, i), module_guard=module_guard)
                 for i, item in enumerate(value)]
        if isinstance(value, list):
            return ListVT(items, source)
        return TupleVT(items, type(value), source)
    if type(value) is dict:
        guards.dict_keys(source, value, module=module_guard, location=loc)
        items = {k: wrap(tx, v, item_source(tx, source, k), module_guard=module_guard)
                 for k, v in value.items()}
        return DictVT(items, source)
    if _is_numpy_function(value):  # NumPy functions kiln maps to torch ops on traced arrays
        guards.id_match(source, value, module=module_guard, location=loc)
        return NumpyFunctionVT(value, source)
    original = _scripted_original(value)
    if original is not None:  # @torch.jit.script: trace the Python function it was made from
        guards.id_match(source, value, module=module_guard, location=loc)
        return wrap(tx, original, Attr(source, "_torchdynamo_inline"), module_guard=module_guard)
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, types.ModuleType, type,
                          types.MethodType, types.MethodDescriptorType,
                          types.WrapperDescriptorType, functools._lru_cache_wrapper)) or \
            callable(value) and not hasattr(
                              value, "__dict__"):
        guards.id_match(source, value, module=module_guard, location=loc)
        return _wrap_callable(tx, value, source)
    # any other object (a dataclass, a NumPy array, ...): its type is guarded, its attributes
    # are read (and guarded) as the code uses them. One object reached by several paths (a
    # transformers config held by every layer) is one tracker: the later paths are guarded to
    # hold the same object, and its attributes are read and guarded once, through the first
    # (a config's Python `__getattribute__` is the costliest read of a call's guards).
    seen = tx.output.objects.get(id(value))
    if seen is not None and seen[0] is value:
        guards.same_object(source, seen[1].source, location=loc)
        return seen[1]
    guards.type_match(source, value, module=module_guard, location=loc)
    vt = UserObjectVT(value, source, tx.output)
    tx.output.objects[id(value)] = (value, vt)
    return vt


def symbolic_dims(fake: torch.Tensor) -> set[int]:
    return {d for d, size in enumerate(fake.shape) if _compat.is_symbolic(size)}


def wrap_derived(tx: Translator, value: Any) -> VT:
    """A tracker for a value with no source (computed, or a library constant): no guards."""
    if isinstance(value, torch.Tensor):
        unsupported("tensor-constant", "a tensor reached capture without a source (a tensor "
                    "held by library code or created outside the graph)",
                    hint="pass the tensor as an argument or store it on the module")
    if isinstance(value, (*_CONSTANT_TYPES, bytes)):  # bytes from the frame are objects, here values
        return ConstantVT(value)
    context = context_vt(value)
    if context is not None:
        return context
    if isinstance(value, functools.partial):
        return PartialVT(wrap_derived(tx, value.func), [wrap_derived(tx, a) for a in value.args],
                         {k: wrap_derived(tx, v) for k, v in value.keywords.items()})
    if isinstance(value, torch.Size):
        return TupleVT([ConstantVT(d) for d in value], torch.Size)
    if isinstance(value, tuple):
        return TupleVT([wrap_derived(tx, v) for v in value], type(value))
    if isinstance(value, list):
        return ListVT([wrap_derived(tx, v) for v in value])
    if type(value) is dict or isinstance(value, types.MappingProxyType):
        return DictVT({k: wrap_derived(tx, v) for k, v in value.items()})
    if isinstance(value, (inspect.Signature, inspect.Parameter)):  # immutable reflection values
        return ConstantVT(value)
    if isinstance(value, slice):
        return SliceVT(*(ConstantVT(p) for p in (value.start, value.stop, value.step)))
    if isinstance(value, torch.nn.Module):
        unsupported("module-without-source", "a module reached capture without a source")
    if _is_numpy_function(value):
        return NumpyFunctionVT(value, None)
    if callable(value) or isinstance(value, types.ModuleType):
        return _wrap_callable(tx, value, None)
    return UserObjectVT(value, None)


def class_function(tx: Translator, fn: types.FunctionType, cls: type, name: str) -> VT:
    """A Python function found on a class (`type(obj).forward`, a method, a property getter).
    It is read through the class (`class_attr_source`): `Cls.name = other` after compiling
    (a monkeypatched method) fails its identity guard, and what its cells hold (a decorator's
    wrapped function and arguments, a module: `functools.wraps(orig)(new_forward)`) is
    wrapped with sources and guards like any frame value, so a module or tensor held there can
    be traced and a cell rebound later is seen. These guards run on every call: assigning to
    a class attribute or a cell moves no counter (the module version only covers instances)."""
    source = class_attr_source(tx, cls, name, fn)
    if source is None:
        if not fn.__closure__:
            return wrap_derived(tx, fn)
        source = ConstSource(tx.output.consts.index(fn), f"{cls.__qualname__}.{name}")
    return _wrap_callable(tx, fn, source)


def class_attr_source(tx: Translator, cls: type, name: str, value: Any, *,
                      identity: bool = True) -> Source | None:
    """`cls.name` as a source, for an attribute of a user class that `getattr(cls, name)`
    returns as is (functions, properties, static methods' functions, plain values); with
    `identity`, guarded `is value` on every call (without: the caller's `wrap` guards the
    value). None for classes of torch and the standard library and for enums (taken as
    constant, like their modules' functions), and when the class hands out another object.
    `value` None: the source alone (a class method, whose `__func__` the caller guards)."""
    from kiln.capture.rules import is_library_module
    if is_library_module(getattr(cls, "__module__", "") or "") or issubclass(cls, enum.Enum):
        return None
    source = Attr(ConstSource(tx.output.consts.index(cls), cls.__qualname__), name)
    if value is None:
        return source
    try:
        if getattr(cls, name) is not value:
            return None
    except Exception:  # noqa: BLE001 - a metaclass that computes the attribute: no source
        return None
    if identity:
        tx.output.guards.id_match(source, value, location=tx.location())
    return source


def _scripted_original(value: Any) -> types.FunctionType | None:
    """The Python function behind a `torch.jit.script` function (TorchScript keeps it as
    `_torchdynamo_inline` for TorchDynamo, which inlines it too: transformers scripts helpers
    such as deberta's `scaled_size_sqrt`), else None."""
    if not isinstance(value, torch.jit.ScriptFunction):
        return None
    original = getattr(value, "_torchdynamo_inline", None)
    return original if isinstance(original, types.FunctionType) else None


def _is_numpy_function(value: Any) -> bool:
    from kiln.capture.numpy_ops import is_traced_function
    return callable(value) and not isinstance(value, type) and is_traced_function(value)


def _wrap_callable(tx: Translator, value: Any, source: Source | None) -> VT:
    from kiln.capture.variables.builtins import BuiltinVT, SpecialVT
    if isinstance(value, functools._lru_cache_wrapper) and \
            isinstance(getattr(value, "__wrapped__", None), types.FunctionType):
        # `@functools.lru_cache` helpers (transformers' is_*_available)
        from kiln.capture.variables.reflection import LruCachedVT
        return LruCachedVT(value, source)
    from kiln.capture.variables.logging_calls import log_function
    deferred = log_function(value, source)  # logging.info & co., warnings.warn
    if deferred is not None:
        return deferred
    kind = rules.classify(value)
    if kind == "module":
        return PythonModuleVT(value, source)
    if kind == "class":
        special = SpecialVT.for_value(value)
        return special if special is not None else ClassVT(value, source)
    if kind == "builtin":
        return BuiltinVT(value)
    if kind in ("special", "context"):
        return SpecialVT(value)
    if kind == "graph":
        return TorchFunctionVT(value, source)
    if kind == "method":
        self_obj = value.__self__
        self_vt = wrap_derived(tx, self_obj) if source is None else wrap(
            tx, self_obj, Attr(source, "__self__"))
        # the method object is guarded (one stored as `module.forward`): so is its function
        func_source = Attr(source, "__func__") if source is not None else None
        return BoundMethodVT(_wrap_callable(tx, value.__func__, func_source), self_vt, source)
    if kind == "inline":
        decorated = _context_decorated(tx, value, source)
        return decorated if decorated is not None else UserFunctionVT(value, source)
    if kind == "constant":
        return ConstantVT(value, source)
    return OpaqueCallableVT(value, source)


# The code object of torch's context-decorator wrapper (functools.wraps hides its name).
_DECORATE_CONTEXT_CODE = torch.no_grad()(lambda: None).__code__


def _context_decorated(tx: Translator, fn: Any, source: Source | None) -> VT | None:
    """A function wrapped by `@torch.no_grad()` and friends: the context around the wrapped call
    (read from the wrapper's closure instead of interpreting torch's decorator machinery)."""
    from kiln.capture.variables.objects import _DecoratedVT
    if getattr(fn, "__code__", None) is not _DECORATE_CONTEXT_CODE:
        return None
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
    factory, func = cells["ctx_factory"].cell_contents, cells["func"].cell_contents
    context = context_vt(getattr(factory, "__self__", None))
    if context is None or not isinstance(func, types.FunctionType):
        return None
    index = fn.__code__.co_freevars.index("func")
    func_source = FnClosure(source, index, "func") if source is not None else None
    return _DecoratedVT(context, UserFunctionVT(func, func_source))



