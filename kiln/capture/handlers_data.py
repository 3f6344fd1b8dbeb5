"""Opcode handlers for loads, stores, operators and building containers.

Each function is named after the canonical opcode it handles (see `bytecode/decode.py`).
"""
from __future__ import annotations

import operator
import types
from typing import TYPE_CHECKING

from kiln.capture import numpy_ops
from kiln.capture.unsupported import unsupported
from kiln.capture.variables.base import VT, CellBox, ConstantVT, NullVT
from kiln.capture.variables.builtins import binary_op, iterate
from kiln.capture.variables.containers import DictVT, ListVT, SliceVT, TupleVT
from kiln.capture.variables.functions import UserFunctionVT
from kiln.capture.variables.ndarray import NdarrayVT
from kiln.capture.variables.nn_module import ModuleVT
from kiln.capture.variables.scalars import SymScalarVT, scalar_op
from kiln.capture.variables.tensor import TensorVT, graph_call
from kiln.capture.variables.mappings import is_user_mapping, mapping_read
from kiln.capture.variables.output_dict import OutputDictVT

if TYPE_CHECKING:
    from kiln.capture.bytecode import Instr
    from kiln.capture.translator import Translator

_BINARY = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
    "//": operator.floordiv, "%": operator.mod, "**": operator.pow, "@": operator.matmul,
    "&": operator.and_, "|": operator.or_, "^": operator.xor, "<<": operator.lshift,
    ">>": operator.rshift,
    "+=": operator.iadd, "-=": operator.isub, "*=": operator.imul, "/=": operator.itruediv,
    "//=": operator.ifloordiv, "%=": operator.imod, "**=": operator.ipow, "@=": operator.imatmul,
    "&=": operator.iand, "|=": operator.ior, "^=": operator.ixor, "<<=": operator.ilshift,
    ">>=": operator.irshift,
}
_COMPARE = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
            ">": operator.gt, ">=": operator.ge}


class CellVT(VT):
    """A closure cell on the stack (LOAD_CLOSURE), on its way into MAKE_FUNCTION."""

    def __init__(self, box: CellBox) -> None:
        self.box = box


# -- stack -------------------------------------------------------------------------------------
def NOP(tx: Translator, inst: Instr) -> None:
    pass


RESUME = COPY_FREE_VARS = NOP


def POP_TOP(tx: Translator, inst: Instr) -> None:
    tx.pop()


def PUSH_NULL(tx: Translator, inst: Instr) -> None:
    tx.push(NullVT())


def COPY(tx: Translator, inst: Instr) -> None:
    tx.push(tx.stack[-inst.arg])


def SWAP(tx: Translator, inst: Instr) -> None:
    stack, i = tx.stack, inst.arg
    stack[-1], stack[-i] = stack[-i], stack[-1]


# -- names -------------------------------------------------------------------------------------
def LOAD_CONST(tx: Translator, inst: Instr) -> None:
    from kiln.capture.variables.builder import wrap_derived
    value = inst.argval
    simple = isinstance(value, (types.CodeType, str, int, float, bool, type(None), bytes))
    tx.push(ConstantVT(value) if simple else wrap_derived(tx, value))


def LOAD_FAST(tx: Translator, inst: Instr) -> None:
    tx.push(tx.load_local(inst.argval))


LOAD_FAST_CHECK = LOAD_FAST


def LOAD_FAST_AND_CLEAR(tx: Translator, inst: Instr) -> None:
    name = inst.argval
    tx.push(tx.load_local(name) if name in tx.locals else NullVT())
    tx.locals.pop(name, None)


def STORE_FAST(tx: Translator, inst: Instr) -> None:
    value = tx.pop()
    if isinstance(value, NullVT):
        tx.locals.pop(inst.argval, None)
    else:
        tx.locals[inst.argval] = value


def DELETE_FAST(tx: Translator, inst: Instr) -> None:
    tx.locals.pop(inst.argval, None)


def LOAD_GLOBAL(tx: Translator, inst: Instr) -> None:
    value = tx.load_global(inst.argval)
    if inst.push_null:
        tx.push_callable(value)
    else:
        tx.push(value)


def STORE_GLOBAL(tx: Translator, inst: Instr) -> None:
    tx.store_global(inst.argval, tx.pop())


def MAKE_CELL(tx: Translator, inst: Instr) -> None:
    name = inst.argval
    tx.cells[name] = CellBox(tx.locals.pop(name, None))


def LOAD_DEREF(tx: Translator, inst: Instr) -> None:
    tx.push(tx.load_cell(inst.argval))


def STORE_DEREF(tx: Translator, inst: Instr) -> None:
    box = tx.cells.get(inst.argval)
    if box is None:
        box = tx.cells[inst.argval] = CellBox()
    _record_cell_write(tx, box, inst.argval)
    box.value = tx.pop()


def DELETE_DEREF(tx: Translator, inst: Instr) -> None:
    tx.load_cell(inst.argval)  # an empty cell raises NameError in eager; a full one is guarded
    box = tx.cells[inst.argval]
    _record_cell_write(tx, box, inst.argval)
    box.value = None


def _record_cell_write(tx: Translator, box: CellBox, name: str) -> None:
    """A cell of a real function outlives the call: its final contents are replayed."""
    if box.detached:
        unsupported("cell-write", f"writing free variable {name!r} of a function capture has "
                    "no source for (library code): the write could not be replayed")
    if box.source is not None and not box.written:
        box.written = True
        tx.output.side_effects.append(("cell", box))


def LOAD_CLOSURE(tx: Translator, inst: Instr) -> None:
    name = inst.argval
    if name not in tx.cells:
        tx.cells[name] = CellBox(tx.locals.pop(name, None))
    tx.push(CellVT(tx.cells[name]))


def LOAD_ATTR(tx: Translator, inst: Instr) -> None:
    obj = tx.pop()
    attr = obj.getattr(tx, inst.argval)
    if inst.method:  # always the [NULL, attr] form: the bound method is one tracker
        tx.push_callable(attr)
    else:
        tx.push(attr)


def LOAD_SUPER_ATTR(tx: Translator, inst: Instr) -> None:
    from kiln.capture.variables.functions import SuperVT
    self_vt = tx.pop()
    cls = tx.pop()
    tx.pop()  # the global `super`
    attr = SuperVT(cls.as_constant(), self_vt).getattr(tx, inst.argval)
    if inst.method:
        tx.push_callable(attr)
    else:
        tx.push(attr)


def STORE_ATTR(tx: Translator, inst: Instr) -> None:
    obj = tx.pop()
    value = tx.pop()
    obj.setattr(tx, inst.argval, value)


def DELETE_ATTR(tx: Translator, inst: Instr) -> None:
    tx.pop().delattr(tx, inst.argval)


def IMPORT_NAME(tx: Translator, inst: Instr) -> None:
    from kiln.capture.variables.builder import wrap_derived
    fromlist = tx.pop().as_constant()
    level = tx.pop().as_constant()
    module = __import__(inst.argval, tx.globals, None, fromlist, level)
    tx.push(wrap_derived(tx, module))


def IMPORT_FROM(tx: Translator, inst: Instr) -> None:
    tx.push(tx.stack[-1].getattr(tx, inst.argval))


# -- operators ---------------------------------------------------------------------------------
def BINARY_OP(tx: Translator, inst: Instr) -> None:
    b, a = tx.pop(), tx.pop()
    op = _BINARY.get(inst.argval)
    if op is None:
        unsupported("binary-op", f"operator {inst.argval!r}")
    tx.push(binary_op(tx, op, a, b))


def COMPARE_OP(tx: Translator, inst: Instr) -> None:
    b, a = tx.pop(), tx.pop()
    tx.push(binary_op(tx, _COMPARE[inst.argval], a, b))


def IS_OP(tx: Translator, inst: Instr) -> None:
    b, a = tx.pop(), tx.pop()
    same = is_same(a, b)
    tx.push(ConstantVT(same != bool(inst.arg)))


def is_same(a: VT, b: VT) -> bool:
    if a is b:
        return True
    if isinstance(a, TensorVT) and isinstance(b, TensorVT):
        return a.fake is b.fake
    if a.is_constant() and b.is_constant():
        return a.as_constant() is b.as_constant()
    if isinstance(a, ModuleVT) and isinstance(b, ModuleVT):
        return a.module is b.module
    if isinstance(a, UserFunctionVT) and isinstance(b, UserFunctionVT):
        # one function read two ways (`kernel.forward.__func__ is type(self).forward`)
        return a.fn is b.fn
    real_a, real_b = getattr(a, "value", a), getattr(b, "value", b)
    return real_a is real_b


def CONTAINS_OP(tx: Translator, inst: Instr) -> None:
    container, item = tx.pop(), tx.pop()
    if isinstance(container, DictVT):
        found = item.as_constant() in container.items
    elif isinstance(container, (ListVT, TupleVT)) and not isinstance(item, TensorVT):
        found = any(_equal(item, other) for other in container.items)
    elif container.is_constant() and item.is_constant():
        found = item.as_constant() in container.as_constant()
    elif is_user_mapping(container):
        found = mapping_read(tx, container, "contains", item).as_constant()
    elif isinstance(container, OutputDictVT):
        found = container.contains(item)
    else:
        unsupported("contains", f"`in` on {container.describe()}")
    tx.push(ConstantVT(found != bool(inst.arg)))


def _equal(a: VT, b: VT) -> bool:
    if a.is_constant() and b.is_constant():
        return a.as_constant() == b.as_constant()
    return is_same(a, b)


def _unary(op: object) -> object:
    def handler(tx: Translator, inst: Instr) -> None:
        value = tx.pop()
        if isinstance(value, TensorVT):
            tx.push(graph_call(tx, "call_function", op, [value], {}))
        elif isinstance(value, NdarrayVT):
            tx.push(numpy_ops.unary(tx, op, value))
        elif isinstance(value, SymScalarVT):
            tx.push(scalar_op(tx, op, [value]))
        elif value.is_constant():
            tx.push(ConstantVT(op(value.as_constant())))
        else:
            unsupported("unary-op", f"{op.__name__} on {value.describe()}")
    return handler


UNARY_NEGATIVE = _unary(operator.neg)
UNARY_INVERT = _unary(operator.invert)


def UNARY_NOT(tx: Translator, inst: Instr) -> None:
    tx.push(ConstantVT(not tx.pop().truth(tx)))


def CALL_INTRINSIC_1(tx: Translator, inst: Instr) -> None:
    name = inst.argval
    value = tx.pop()
    if name == "INTRINSIC_LIST_TO_TUPLE":
        tx.push(TupleVT(value.unpack(tx)))
    elif name == "INTRINSIC_UNARY_POSITIVE" and isinstance(value, NdarrayVT):
        tx.push(numpy_ops.unary(tx, operator.pos, value))
    elif name == "INTRINSIC_UNARY_POSITIVE":
        tx.push(graph_call(tx, "call_function", operator.pos, [value], {})
                if isinstance(value, TensorVT) else ConstantVT(+value.as_constant()))
    else:
        unsupported("unsupported-intrinsic", f"intrinsic {name}")


# -- subscripts --------------------------------------------------------------------------------
def BINARY_SUBSCR(tx: Translator, inst: Instr) -> None:
    key, container = tx.pop(), tx.pop()
    tx.push(subscript(tx, container, key))


def subscript(tx: Translator, container: VT, key: VT) -> VT:
    if isinstance(container, TensorVT):
        return graph_call(tx, "call_function", operator.getitem, [container, key], {})
    if isinstance(container, NdarrayVT):
        return numpy_ops.getitem(tx, container, key)
    if isinstance(container, ModuleVT):
        return container.index(tx, key.as_constant())
    if isinstance(container, (ListVT, TupleVT, DictVT)):
        return container.call_method(tx, "__getitem__", [key], {})
    if is_user_mapping(container):
        return mapping_read(tx, container, "getitem", key)
    if isinstance(container, OutputDictVT):
        return container.getitem(tx, key)
    if container.is_constant() and key.is_constant():
        from kiln.capture.variables.builder import wrap_derived
        return wrap_derived(tx, container.as_constant()[key.as_constant()])
    unsupported("subscript", f"indexing {container.describe()}")


def STORE_SUBSCR(tx: Translator, inst: Instr) -> None:
    key, container, value = tx.pop(), tx.pop(), tx.pop()
    if isinstance(container, TensorVT):
        graph_call(tx, "call_function", operator.setitem, [container, key, value], {}, keep=True)
    elif isinstance(container, NdarrayVT):
        numpy_ops.setitem(tx, container, key, value)
    elif isinstance(container, (ListVT, DictVT)):
        container.call_method(tx, "__setitem__", [key, value], {})
    elif isinstance(container, OutputDictVT) and key.is_constant():
        container.setattr(tx, key.as_constant(), value)
    else:
        unsupported("store-subscript", f"item assignment on {container.describe()}")


def DELETE_SUBSCR(tx: Translator, inst: Instr) -> None:
    key, container = tx.pop(), tx.pop()
    if not isinstance(container, (ListVT, DictVT)):
        unsupported("delete-subscript", f"del on {container.describe()}")
    container.call_method(tx, "__delitem__", [key], {})


def BUILD_SLICE(tx: Translator, inst: Instr) -> None:
    parts = tx.popn(inst.argval)
    if len(parts) == 2:
        parts.append(ConstantVT(None))
    tx.push(SliceVT(*parts))


# -- containers --------------------------------------------------------------------------------
def BUILD_TUPLE(tx: Translator, inst: Instr) -> None:
    tx.push(TupleVT(tx.popn(inst.arg)))


def BUILD_LIST(tx: Translator, inst: Instr) -> None:
    tx.push(ListVT(tx.popn(inst.arg)))


def BUILD_SET(tx: Translator, inst: Instr) -> None:
    items = tx.popn(inst.arg)
    tx.push(ConstantVT({set_item(i) for i in items}))


def set_item(vt: VT) -> object:
    """A set is a constant during capture: its items must be hashable constants (a set of
    tensors hashes them by identity, which a graph cannot keep)."""
    if isinstance(vt, SymScalarVT):
        return vt.as_constant()  # specialized: a set member's value is needed
    if not vt.is_constant():
        unsupported("set-item", f"a set holding {vt.describe()}: capture keeps sets as "
                    "constants, so their items must be known at compile time",
                    hint="build sets from ints, strings and other constants; keep tensors in a "
                         "list or tuple")
    value = vt.as_constant()
    try:
        hash(value)
    except TypeError:
        unsupported("set-item", f"unhashable {type(value).__name__} in a set",
                    category="user-fixable")
    return value


def BUILD_MAP(tx: Translator, inst: Instr) -> None:
    flat = tx.popn(2 * inst.arg)
    tx.push(DictVT({flat[i].as_constant(): flat[i + 1] for i in range(0, len(flat), 2)}))


def BUILD_CONST_KEY_MAP(tx: Translator, inst: Instr) -> None:
    keys = tx.pop().as_constant()
    values = tx.popn(inst.arg)
    tx.push(DictVT(dict(zip(keys, values))))


def BUILD_STRING(tx: Translator, inst: Instr) -> None:
    parts = tx.popn(inst.arg)
    tx.push(ConstantVT("".join(p.as_constant() for p in parts)))


def FORMAT_VALUE(tx: Translator, inst: Instr) -> None:
    conversion, has_spec = inst.argval
    spec = tx.pop().as_constant() if has_spec else ""
    raw = _formattable(tx.pop())
    raw = {"str": str, "repr": repr, "ascii": ascii}.get(conversion, lambda v: v)(raw)
    tx.push(ConstantVT(format(raw, spec)))


def CONVERT_VALUE(tx: Translator, inst: Instr) -> None:
    """3.13: the `!s`/`!r`/`!a` of an f-string field (FORMAT_VALUE's conversion before)."""
    value = _formattable(tx.pop())
    tx.push(ConstantVT({"str": str, "repr": repr, "ascii": ascii}[inst.argval](value)))


def FORMAT_SIMPLE(tx: Translator, inst: Instr) -> None:
    tx.push(ConstantVT(format(_formattable(tx.pop()), "")))


def FORMAT_WITH_SPEC(tx: Translator, inst: Instr) -> None:
    spec = tx.pop().as_constant()
    tx.push(ConstantVT(format(_formattable(tx.pop()), spec)))


def _formattable(value: VT) -> object:
    if not value.is_constant():
        unsupported("format-value", f"formatting {value.describe()} into a string needs its "
                    "value", category="user-fixable", hint="format only Python constants in "
                    "compiled code")
    return value.as_constant()


def TO_BOOL(tx: Translator, inst: Instr) -> None:
    """3.13 converts a condition to bool before POP_JUMP_IF_X / UNARY_NOT. Those handlers take
    the truth of any value themselves, so the value stays as it is: a tensor condition then
    breaks at the jump, where a break can resume, as on 3.11/3.12."""


def LIST_APPEND(tx: Translator, inst: Instr) -> None:
    value = tx.pop()
    tx.stack[-inst.arg].call_method(tx, "append", [value], {})


def LIST_EXTEND(tx: Translator, inst: Instr) -> None:
    value = tx.pop()
    tx.stack[-inst.arg].call_method(tx, "extend", [value], {})


def SET_ADD(tx: Translator, inst: Instr) -> None:
    value = tx.pop()
    tx.stack[-inst.arg].as_constant().add(set_item(value))


def SET_UPDATE(tx: Translator, inst: Instr) -> None:
    """`{*a, *b}`: BUILD_SET 0, then one SET_UPDATE per starred operand."""
    items = iterate(tx, tx.pop()).unpack(tx)
    tx.stack[-inst.arg].as_constant().update(set_item(i) for i in items)


def MAP_ADD(tx: Translator, inst: Instr) -> None:
    value, key = tx.pop(), tx.pop()
    tx.stack[-inst.arg].call_method(tx, "__setitem__", [key, value], {})


def DICT_UPDATE(tx: Translator, inst: Instr) -> None:
    other = tx.pop()
    tx.stack[-inst.arg].call_method(tx, "update", [other], {})


DICT_MERGE = DICT_UPDATE


def UNPACK_SEQUENCE(tx: Translator, inst: Instr) -> None:
    items = iterate(tx, tx.pop()).unpack(tx)
    if len(items) != inst.arg:
        unsupported("unpack", f"cannot unpack {len(items)} values into {inst.arg}",
                    category="user-fixable")
    for item in reversed(items):
        tx.push(item)


def UNPACK_EX(tx: Translator, inst: Instr) -> None:
    before, after = inst.arg & 0xFF, inst.arg >> 8
    items = iterate(tx, tx.pop()).unpack(tx)
    if len(items) < before + after:
        unsupported("unpack", "not enough values to unpack", category="user-fixable")
    middle = ListVT(items[before:len(items) - after])
    for item in reversed(items[:before] + [middle] + items[len(items) - after:]):
        tx.push(item)

