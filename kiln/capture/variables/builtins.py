"""Python builtins and the special functions capture models (one handler per builtin).

A builtin whose arguments are all compile-time constants is simply called. Otherwise its handler
in `_HANDLERS` decides: `len` of a list, `isinstance` of a tensor, `all` over a generator, ... or
stops capture with the reason.
"""
from __future__ import annotations

import functools
import math
import operator
from typing import TYPE_CHECKING, Any, Callable

import torch

from kiln._util import is_hashable
from kiln.capture.unsupported import unsupported
from kiln.capture.variables.base import VT, ConstantVT, NotConstant
from kiln.capture.variables.containers import DictVT, IteratorVT, ListVT, SliceVT, TupleVT
from kiln.capture.variables.ndarray import NdarrayVT
from kiln.capture.variables.objects import AutocastVT, GradModeVT
from kiln.capture.variables.number_tensors import TensorNumberVT
from kiln.capture.variables.scalars import SymScalarVT, scalar_op, specialize_all
from kiln.capture.variables.tensor import TensorVT, dim_vt, graph_call

if TYPE_CHECKING:
    from kiln.capture.translator import Translator

__all__ = ["BuiltinVT", "SpecialVT", "SPECIAL_FUNCTIONS", "binary_op"]

Args = list[VT]
Kwargs = dict[str, VT]


class BuiltinVT(VT):
    def __init__(self, fn: Callable) -> None:
        self.fn = fn

    def python_type(self) -> type:
        return type(self.fn)

    def is_constant(self) -> bool:
        return True

    def as_constant(self) -> Any:
        return self.fn

    def call(self, tx: Translator, args: Args, kwargs: Kwargs) -> VT:
        handler = _HANDLERS.get(self.fn)
        if handler is not None:
            result = handler(tx, args, kwargs)
            if result is not None:
                return result
        if self.fn is operator.getitem and len(args) == 2:
            from kiln.capture.handlers_data import subscript
            return subscript(tx, args[0], args[1])
        if self.fn in _TENSOR_OPS and len(args) == 2 and not kwargs and self.fn not in (
                operator.setitem,):
            return binary_op(tx, self.fn, args[0], args[1])
        if self.fn in _TENSOR_OPS and any(isinstance(a, TensorVT) for a in args):
            return graph_call(tx, "call_function", self.fn, args, kwargs)
        constants = _all_constant(args, kwargs)
        if constants is not None:
            try:
                return _wrap_value(self.fn(*constants[0], **constants[1]))
            except Exception as err:
                unsupported("builtin-failed", f"{_name(self.fn)}() raised {type(err).__name__}: "
                            f"{err}", category="user-fixable")
        tensors = any(isinstance(a, (TensorVT, NdarrayVT)) for a in args)
        described = ", ".join(a.describe() for a in args)
        # on a tensor the call needs its value in Python, which no graph can give (fundamental);
        # on other values it is capture that lacks a rule (not supported yet)
        unsupported("builtin-arguments", f"{_name(self.fn)}() of {described} needs the "
                    "tensor's value in Python, which a graph does not have" if tensors else
                    f"{_name(self.fn)}() with arguments {described} is not supported yet",
                    category="fundamental" if tensors else "not-supported-yet",
                    hint="this needs a tensor's value in Python: keep the computation in tensor "
                         "ops, or do it outside the compiled function" if tensors else
                    "compute this outside the compiled function, or pass the result in")

    def describe(self) -> str:
        return f"builtin {_name(self.fn)}"


def _name(fn: Any) -> str:
    return getattr(fn, "__name__", repr(fn))


def _wrap_value(value: Any) -> VT:
    if isinstance(value, torch.Size):
        return TupleVT([ConstantVT(d) for d in value], torch.Size)
    if isinstance(value, tuple):
        return TupleVT([_wrap_value(v) for v in value], type(value))
    if isinstance(value, list):
        return ListVT([_wrap_value(v) for v in value])
    if isinstance(value, dict):
        return DictVT({k: _wrap_value(v) for k, v in value.items()})
    return ConstantVT(value)


def _foldable(vt: VT) -> bool:
    """Values a builtin may be evaluated on at compile time. Opaque objects (a NumPy scalar, a
    frame object) are not: folding them would bake one call's value into the graph."""
    if isinstance(vt, (ListVT, TupleVT)):  # a tuple: `math.prod(x.shape)` of symbolic sizes
        return all(_foldable(i) for i in vt.items)
    return vt.is_constant() or isinstance(vt, SymScalarVT)


def _all_constant(args: Args, kwargs: Kwargs) -> tuple[list, dict] | None:
    if not all(_foldable(v) for v in (*args, *kwargs.values())):
        return None
    try:
        return ([a.as_constant() for a in args],
                {k: v.as_constant() for k, v in kwargs.items()})
    except NotConstant:
        return None
    except Exception:
        return None


# -- operators ---------------------------------------------------------------------------------
_TENSOR_OPS = {
    operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv, operator.mod,
    operator.pow, operator.matmul, operator.neg, operator.pos, operator.invert, operator.and_,
    operator.or_, operator.xor, operator.lshift, operator.rshift, operator.lt, operator.le,
    operator.gt, operator.ge, operator.eq, operator.ne, operator.getitem, operator.setitem,
    operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
    operator.imod, operator.ipow, operator.imatmul, operator.iand, operator.ior, operator.ixor,
    operator.abs, abs,
}
_INPLACE_TO_PLAIN = {operator.iadd: operator.add, operator.isub: operator.sub,
                     operator.imul: operator.mul, operator.itruediv: operator.truediv,
                     operator.ifloordiv: operator.floordiv, operator.imod: operator.mod,
                     operator.ipow: operator.pow, operator.imatmul: operator.matmul,
                     operator.iand: operator.and_, operator.ior: operator.or_,
                     operator.ixor: operator.xor, operator.ilshift: operator.lshift,
                     operator.irshift: operator.rshift}


def binary_op(tx: Translator, op: Callable, a: VT, b: VT) -> VT:
    """`a <op> b` for any trackers: tensors become nodes, constants fold, sequences concat."""
    if isinstance(a, NdarrayVT) or isinstance(b, NdarrayVT):
        from kiln.capture import numpy_ops
        return numpy_ops.binary(tx, op, a, b)
    if isinstance(a, TensorVT) or isinstance(b, TensorVT):
        if op in _INPLACE_TO_PLAIN and not isinstance(a, TensorVT):
            op = _INPLACE_TO_PLAIN[op]
        return graph_call(tx, "call_function", op, [a, b], {})
    plain = _INPLACE_TO_PLAIN.get(op, op)
    if isinstance(a, SymScalarVT) or isinstance(b, SymScalarVT):
        if all(isinstance(v, SymScalarVT) or (v.is_constant() and type(v.as_constant()) in
                                               (int, float, bool)) for v in (a, b)):
            return scalar_op(tx, plain, [a, b])
        a, b = specialize_all(a), specialize_all(b)
    if plain in (operator.eq, operator.ne) and isinstance(a, (TupleVT, ListVT)) and \
            isinstance(b, (TupleVT, ListVT)) and \
            any(isinstance(i, SymScalarVT) for i in (*a.items, *b.items)):
        return _compare_sizes(tx, plain, a, b)
    if isinstance(a, ListVT) and op is operator.iadd:
        a.call_method(tx, "extend", [b], {})
        return a
    if isinstance(a, (TupleVT, ListVT)) and isinstance(b, (TupleVT, ListVT)) and \
            plain is operator.add:
        items = a.items + b.items
        if isinstance(a, ListVT):
            return ListVT(items)
        return TupleVT(items, torch.Size if torch.Size in (a.cls, getattr(b, "cls", None))
                       else tuple)
    if isinstance(a, (TupleVT, ListVT)) and plain is operator.mul and b.is_constant():
        items = a.items * b.as_constant()
        return ListVT(items) if isinstance(a, ListVT) else TupleVT(items)
    if isinstance(a, (TupleVT, ListVT)) and isinstance(b, (TupleVT, ListVT)):
        a, b = specialize_all(a, sizes=True), specialize_all(b, sizes=True)  # `<` on shapes
    if a.is_constant() and b.is_constant():
        try:
            return _wrap_value(plain(a.as_constant(), b.as_constant()))
        except Exception as err:
            unsupported("operator-failed", f"{_name(op)} raised {type(err).__name__}: {err}",
                        category="user-fixable")
    if plain in (operator.eq, operator.ne) and (a.is_constant() or b.is_constant()) and \
            _identity_equality(b if a.is_constant() else a):
        # Different kinds of object (e.g. a module and None) are never equal here.
        return ConstantVT(plain is operator.ne)
    unsupported("operator", f"{_name(op)} on {a.describe()} and {b.describe()}")


def _compare_sizes(tx: Translator, op: Callable, a: VT, b: VT) -> VT:
    """`a == b` / `a != b` on sequences holding symbolic sizes (`x.shape == y.shape`): item by
    item, as Python does, so each symbolic pair asks the ShapeEnv (a guard) instead of
    specializing both sizes. (`+` and `*` build new sequences that keep the symbols; other
    operators specialize the sizes and fold, in `binary_op`.)"""
    equal = len(a.items) == len(b.items) and all(
        binary_op(tx, operator.eq, x, y).truth(tx) for x, y in zip(a.items, b.items))
    return ConstantVT(equal == (op is operator.eq))


def _identity_equality(vt: VT) -> bool:
    """Objects whose `==` is identity (object.__eq__): never equal to a constant of another kind.
    Objects with their own `__eq__` (a NumPy array read from the frame) are not folded."""
    try:
        cls = vt.python_type()
    except Exception:  # noqa: BLE001 - unknown type: do not fold
        return False
    return getattr(cls, "__eq__", None) is object.__eq__


# -- builtin handlers: return None to fall back to calling the builtin on constants ------------
def _len(tx: Translator, args: Args, kwargs: Kwargs) -> VT | None:
    (obj,) = args
    if isinstance(obj, TensorVT):
        if obj.fake.dim() == 0:
            unsupported("len-0d", "len() of a 0-d tensor", category="user-fixable")
        return dim_vt(tx, obj, 0)
    if isinstance(obj, (TupleVT, ListVT)):
        return ConstantVT(len(obj.items))
    if isinstance(obj, DictVT):
        return ConstantVT(len(obj.items))
    if isinstance(obj, NdarrayVT) and obj.shape and not obj.scalar:
        return ConstantVT(obj.shape[0])
    from kiln.capture.variables.nn_module import ModuleVT
    if isinstance(obj, ModuleVT):
        obj.guard_children(tx)
        return ConstantVT(len(obj.module))
    from kiln.capture.variables.mappings import is_user_mapping, mapping_read
    if is_user_mapping(obj):
        return mapping_read(tx, obj, "len")
    from kiln.capture.variables.output_dict import OutputDictVT
    if isinstance(obj, OutputDictVT):
        return ConstantVT(len(obj.keys))
    if hasattr(obj, "python_len"):
        return obj.python_len(tx)
    return None


def _isinstance(tx: Translator, args: Args, kwargs: Kwargs) -> VT | None:
    obj, classes = args
    cls = classes.as_constant()
    if isinstance(obj, ConstantVT):
        return ConstantVT(isinstance(obj.value, cls))
    return ConstantVT(issubclass(obj.python_type(), cls))


def _type(tx: Translator, args: Args, kwargs: Kwargs) -> VT | None:
    from kiln.capture.variables.objects import ClassVT
    if len(args) == 1:
        return ClassVT(args[0].python_type())
    return None


def _iter(tx: Translator, args: Args, kwargs: Kwargs) -> VT | None:
    if len(args) == 1:
        return iterate(tx, args[0])
    return None


def _next(tx: Translator, args: Args, kwargs: Kwargs) -> VT | None:
    it = args[0]
    if isinstance(it, IteratorVT):
        item = it.next_item()
        if item is None:
            if len(args) > 1:
                return args[1]
            unsupported("stop-iteration", "next() on an exhausted iterator")
        return item
    return None


def iterate(tx: Translator, obj: VT) -> IteratorVT:
    if isinstance(obj, IteratorVT):
        return obj
    if isinstance(obj, DictVT):
        return IteratorVT([ConstantVT(k) for k in obj.items])
    return IteratorVT(obj.unpack(tx))


def _sequence_builder(kind: type) -> Callable[[Translator, Args, Kwargs], VT | None]:
    def build(tx: Translator, args: Args, kwargs: Kwargs) -> VT | None:
        if kwargs:
            return None
        if not args:
            return {list: lambda: ListVT([]), tuple: lambda: TupleVT([]),
                    dict: lambda: DictVT({})}.get(kind, lambda: None)()
        if kind is dict:
            return _dict_from(tx, args[0])
        items = iterate(tx, args[0]).unpack(tx)
        if kind is list:
            return ListVT(items)
        if kind is tuple:
            return TupleVT(items)
        if kind in (set, frozenset):
            return ConstantVT(kind(i.as_constant() for i in items))
        return None
    return build


def _dict_from(tx: Translator, source: VT) -> VT:
    if isinstance(source, DictVT):
        return DictVT(source.items)
    pairs = [p.unpack(tx) for p in iterate(tx, source).unpack(tx)]
    return DictVT({k.as_constant(): v for k, v in pairs})


def _dict(tx: Translator, args: Args, kwargs: Kwargs) -> VT | None:
    base = _sequence_builder(dict)(tx, args, {}) if args else DictVT({})
    base.items.update(kwargs)
    return base


def _enumerate(tx: Translator, args: Args, kwargs: Kwargs) -> VT | None:
    items = iterate(tx, args[0]).unpack(tx)
    start = (args[1] if len(args) > 1 else kwargs.get("start", ConstantVT(0))).as_constant()
    return IteratorVT([TupleVT([ConstantVT(start + i), item]) for i, item in enumerate(items)])


def _zip(tx: Translator, args: Args, kwargs: Kwargs) -> VT | None:
    columns = [iterate(tx, a).unpack(tx) for a in args]
    return IteratorVT([TupleVT(list(row)) for row in zip(*columns)])


def _reversed(tx: Translator, args: Args, kwargs: Kwargs) -> VT | None:
    return IteratorVT(list(reversed(iterate(tx, args[0]).unpack(tx))))


def _all_any(want: bool) -> Callable[[Translator, Args, Kwargs], VT | None]:
    def check(tx: Translator, args: Args, kwargs: Kwargs) -> VT | None:
        for item in iterate(tx, args[0]).unpack(tx):
            if item.truth(tx) is want:
                return ConstantVT(want)
        return ConstantVT(not want)
    return check


def _sum(tx: Translator, args: Args, kwargs: Kwargs) -> VT | None:
    items = iterate(tx, args[0]).unpack(tx)
    total = args[1] if len(args) > 1 else kwargs.get("start", ConstantVT(0))
    for item in items:
        total = binary_op(tx, operator.add, total, item)
    return total


def _min_max(fn: Callable) -> Callable[[Translator, Args, Kwargs], VT | None]:
    def pick(tx: Translator, args: Args, kwargs: Kwargs) -> VT | None:
        items = iterate(tx, args[0]).unpack(tx) if len(args) == 1 else list(args)
        if any(isinstance(i, TensorVT) for i in items):
            unsupported("tensor-min-max", f"builtin {fn.__name__}() on tensors needs their values",
                        hint=f"use torch.{fn.__name__}imum or torch.{fn.__name__}")
        consts = _all_constant(items, kwargs)
        return None if consts is None else ConstantVT(fn(consts[0], **consts[1]))
    return pick


def _abs(tx: Translator, args: Args, kwargs: Kwargs) -> VT | None:
    if isinstance(args[0], TensorVT):
        return graph_call(tx, "call_function", torch.abs, args, {})
    if isinstance(args[0], TensorNumberVT):  # a value-only number stays one
        return scalar_op(tx, operator.abs, args)
    if isinstance(args[0], NdarrayVT):
        from kiln.capture import numpy_ops
        return numpy_ops.unary(tx, abs, args[0])
    return None


def _sqrt(tx: Translator, args: Args, kwargs: Kwargs) -> VT | None:
    """`math.sqrt` of a symbolic size (`scores / math.sqrt(q.size(-1))`): `torch._sym_sqrt`, a
    symbolic float as torch.compile makes it, instead of a guard specializing the size."""
    if len(args) == 1 and not kwargs and isinstance(args[0], SymScalarVT):
        return scalar_op(tx, torch._sym_sqrt, args)
    return None


def _getattr(tx: Translator, args: Args, kwargs: Kwargs) -> VT | None:
    obj, name = args[0], args[1].as_constant()
    if len(args) == 3:
        try:
            return obj.getattr(tx, name)
        except Exception as err:
            if getattr(err, "code", None) != "missing-attribute":
                raise
            return args[2]
    return obj.getattr(tx, name)


def _hasattr(tx: Translator, args: Args, kwargs: Kwargs) -> VT | None:
    try:
        args[0].getattr(tx, args[1].as_constant())
    except Exception as err:
        if getattr(err, "code", None) != "missing-attribute":
            raise
        return ConstantVT(False)
    return ConstantVT(True)


def _setattr(tx: Translator, args: Args, kwargs: Kwargs) -> VT | None:
    args[0].setattr(tx, args[1].as_constant(), args[2])
    return ConstantVT(None)


def _delattr(tx: Translator, args: Args, kwargs: Kwargs) -> VT | None:
    args[0].delattr(tx, args[1].as_constant())
    return ConstantVT(None)


def _slice(tx: Translator, args: Args, kwargs: Kwargs) -> VT | None:
    parts = list(args) + [ConstantVT(None)] * (3 - len(args))
    if len(args) == 1:
        parts = [ConstantVT(None), args[0], ConstantVT(None)]
    return SliceVT(*parts)


def _print(tx: Translator, args: Args, kwargs: Kwargs) -> VT | None:
    unsupported("print", "print() inside a compiled function writes to the console, which a "
                "captured graph cannot do", category="user-fixable",
                hint="the graph breaks there and the print runs in place; remove it or move it "
                     "outside the compiled function to keep one graph")


def _callable(tx: Translator, args: Args, kwargs: Kwargs) -> VT | None:
    from kiln.capture.variables.functions import _InlinableVT, BoundMethodVT, TorchFunctionVT
    from kiln.capture.variables.nn_module import ModuleVT
    kinds = (_InlinableVT, BoundMethodVT, TorchFunctionVT, ModuleVT, BuiltinVT)
    return ConstantVT(True) if isinstance(args[0], kinds) else None


def _super(tx: Translator, args: Args, kwargs: Kwargs) -> VT | None:
    from kiln.capture.variables.functions import SuperVT
    if args:
        return SuperVT(args[0].as_constant(), args[1])
    return tx.zero_arg_super()


def _sorted(tx: Translator, args: Args, kwargs: Kwargs) -> VT | None:
    items = iterate(tx, args[0]).unpack(tx)
    consts = _all_constant(items, kwargs)
    if consts is None:
        return None
    return _wrap_value(sorted(consts[0], **consts[1]))


def _bool(tx: Translator, args: Args, kwargs: Kwargs) -> VT | None:
    return ConstantVT(args[0].truth(tx)) if args else ConstantVT(False)


def _id(tx: Translator, args: Args, kwargs: Kwargs) -> VT | None:
    """`id(obj)` of an object read from the frame (a global, a closure cell, an attribute
    chain, a module): the object's identity is guarded (`source is <obj>`), which makes its
    id a constant, as TorchDynamo folds it. A value capture made or traced (a tensor, a list
    built by the code) has no id that holds across calls: that breaks."""
    if len(args) == 1 and not kwargs:
        real = _sourced_object(args[0])
        if real is not None:
            source, value = real
            tx.output.guards.id_match(source, value, location=tx.location())
            return ConstantVT(id(value))
    unsupported("id", "id() of a traced value is not stable across calls",
                hint="compare objects with `is` instead of id()")


def _sourced_object(vt: VT) -> tuple[Any, Any] | None:
    """(source, the real object) for a tracker that stands for an object of the frame as is."""
    from kiln.capture.variables.functions import UserFunctionVT
    from kiln.capture.variables.nn_module import ModuleVT
    from kiln.capture.variables.objects import ClassVT, PythonModuleVT, UserObjectVT
    source = getattr(vt, "source", None)
    if source is None:
        return None
    if isinstance(vt, ModuleVT):
        return source, vt.module
    if isinstance(vt, UserObjectVT):
        return source, vt.value
    if isinstance(vt, UserFunctionVT):
        return source, vt.fn
    if isinstance(vt, ClassVT):
        return source, vt.cls
    if isinstance(vt, PythonModuleVT):
        return source, vt.module
    if type(vt) is ConstantVT:
        return source, vt.value
    return None


_HANDLERS: dict[Any, Callable[[Translator, Args, Kwargs], VT | None]] = {
    len: _len, isinstance: _isinstance, type: _type, iter: _iter, next: _next,
    list: _sequence_builder(list), tuple: _sequence_builder(tuple), dict: _dict,
    set: _sequence_builder(set), frozenset: _sequence_builder(frozenset),
    enumerate: _enumerate, zip: _zip, reversed: _reversed, all: _all_any(False),
    any: _all_any(True), sum: _sum, min: _min_max(min), max: _min_max(max), abs: _abs,
    getattr: _getattr, hasattr: _hasattr, setattr: _setattr, delattr: _delattr, slice: _slice,
    print: _print, callable: _callable, super: _super, bool: _bool, id: _id, sorted: _sorted,
    math.sqrt: _sqrt,
}


# -- special functions and classes ---------------------------------------------------------------
class SpecialVT(VT):
    """kiln's escape hatches, torch's context managers and torch functions capture answers itself."""

    def __init__(self, value: Any) -> None:
        self.value = value

    @staticmethod
    def for_value(value: Any) -> SpecialVT | None:
        return SpecialVT(value) if is_hashable(value) and value in SPECIAL_FUNCTIONS else None

    def python_type(self) -> type:
        return type(self.value)

    def is_constant(self) -> bool:
        return True

    def as_constant(self) -> Any:
        return self.value

    def call(self, tx: Translator, args: Args, kwargs: Kwargs) -> VT:
        return SPECIAL_FUNCTIONS[self.value](tx, args, kwargs)

    def getattr(self, tx: Translator, name: str) -> VT:
        from kiln.capture.variables.builder import wrap_derived
        return wrap_derived(tx, getattr(self.value, name))


def _no_grad(tx: Translator, args: Args, kwargs: Kwargs) -> VT:
    return GradModeVT(False)


def _enable_grad(tx: Translator, args: Args, kwargs: Kwargs) -> VT:
    return GradModeVT(True)


def _set_grad_enabled(tx: Translator, args: Args, kwargs: Kwargs) -> VT:
    from kiln.capture.variables.objects import set_grad
    mode = (args[0] if args else kwargs["mode"]).as_constant()
    ctx = GradModeVT(bool(mode), already_applied=True)
    set_grad(tx, bool(mode))
    return ctx


def _autocast(tx: Translator, args: Args, kwargs: Kwargs) -> VT:
    return AutocastVT(tuple(a.as_constant() for a in args),
                      {k: v.as_constant() for k, v in kwargs.items()})


def _constant(value: Any) -> Callable[[Translator, Args, Kwargs], VT]:
    return lambda tx, args, kwargs: ConstantVT(value)


def _graph_break(tx: Translator, args: Args, kwargs: Kwargs) -> VT:
    unsupported("graph-break-call", "kiln.graph_break() was called", category="user-fixable",
                hint="remove the kiln.graph_break() call to capture this code")


def _grad_enabled(tx: Translator, args: Args, kwargs: Kwargs) -> VT:
    return ConstantVT(torch.is_grad_enabled())


def _autocast_enabled(tx: Translator, args: Args, kwargs: Kwargs) -> VT:
    device = args[0].as_constant() if args else "cuda"
    return ConstantVT(torch.is_autocast_enabled(device))


def _guarded_query(fn: Callable[[], Any]) -> Callable[[Translator, Args, Kwargs], VT]:
    """A query of process-wide torch state (`torch.are_deterministic_algorithms_enabled()`):
    folded to its value, and that value guarded on every call, only in graphs that read it."""
    from kiln.capture.guards import Guard

    def handler(tx: Translator, args: Args, kwargs: Kwargs) -> VT:
        if args or kwargs:
            unsupported("state-query", f"{fn.__qualname__} with arguments")
        value = fn()
        tx.output.guards.add(Guard(f"{tx.output.consts.ref(fn)}()", "==", repr(value), value,
                                   f"torch.{fn.__name__}()", "ambient", False, tx.location()))
        return ConstantVT(value)
    return handler


def _partial(tx: Translator, args: Args, kwargs: Kwargs) -> VT:
    from kiln.capture.variables.objects import PartialVT
    return PartialVT(args[0], list(args[1:]), dict(kwargs))


def _has_torch_function(tx: Translator, args: Args, kwargs: Kwargs) -> VT:
    """Plain tensors never override __torch_function__ (subclasses are refused at input)."""
    return ConstantVT(False)


SPECIAL_FUNCTIONS: dict[Any, Callable[[Translator, Args, Kwargs], VT]] = {
    functools.partial: _partial,
    torch.no_grad: _no_grad,
    torch.enable_grad: _enable_grad,
    torch.set_grad_enabled: _set_grad_enabled,
    torch.autocast: _autocast,
    torch.amp.autocast: _autocast,
    torch.is_grad_enabled: _grad_enabled,
    torch.is_autocast_enabled: _autocast_enabled,
    torch.overrides.has_torch_function: _has_torch_function,
    torch.overrides.has_torch_function_unary: _has_torch_function,
    torch.overrides.has_torch_function_variadic: _has_torch_function,
    torch._C._get_tracing_state: _constant(None),
    torch.jit.is_scripting: _constant(False),
    torch.jit.is_tracing: _constant(False),
    torch.compiler.is_compiling: _constant(True),
    torch.compiler.is_dynamo_compiling: _constant(False),
}
for _query in (torch.are_deterministic_algorithms_enabled,
               torch.is_deterministic_algorithms_warn_only_enabled,
               torch.is_inference_mode_enabled, torch.get_float32_matmul_precision):
    SPECIAL_FUNCTIONS[_query] = _guarded_query(_query)


def register_special(fn: Any, handler: Callable[[Translator, Args, Kwargs], VT]) -> None:
    SPECIAL_FUNCTIONS[fn] = handler


def kiln_specials() -> None:
    """kiln's own escape hatches (kiln/capture/escapes.py)."""
    from kiln.capture.escapes import graph_break, is_compiling
    register_special(graph_break, _graph_break)
    register_special(is_compiling, _constant(True))

