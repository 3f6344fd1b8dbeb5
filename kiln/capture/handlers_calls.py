"""Opcode handlers for calls, function creation, `with` blocks and generators."""
from __future__ import annotations

from typing import TYPE_CHECKING

from kiln.capture.unsupported import unsupported
from kiln.capture.variables.base import VT, ConstantVT, NullVT
from kiln.capture.variables.containers import DictVT
from kiln.capture.variables.functions import NestedFunctionVT

if TYPE_CHECKING:
    from kiln.capture.bytecode import Instr
    from kiln.capture.translator import Translator

_MAKE_FUNCTION_DEFAULTS, _KWDEFAULTS, _ANNOTATIONS, _CLOSURE = 0x01, 0x02, 0x04, 0x08


def call_operands(first: VT, second: VT, args: list[VT]) -> tuple[VT, list[VT]]:
    """The callable and arguments of a call whose stack is [first, second, args]. One rule for
    every version: [NULL, fn] (3.11/3.12), [fn, NULL] (3.13) or [method, self] (both; also
    `__exit__` called with a None in the self slot)."""
    if isinstance(first, NullVT):
        return second, args
    if isinstance(second, NullVT):
        return first, args
    return first, [second, *args]


def CALL(tx: Translator, inst: Instr) -> None:
    nargs, kwnames = inst.argval
    args = tx.popn(nargs)
    second, first = tx.pop(), tx.pop()
    fn, args = call_operands(first, second, args)
    npos = len(args) - len(kwnames)
    kwargs = dict(zip(kwnames, args[npos:]))
    tx.push(fn.call(tx, args[:npos], kwargs))


def CALL_FUNCTION_EX(tx: Translator, inst: Instr) -> None:
    kwargs_vt = tx.pop() if inst.arg & 1 else DictVT({})
    args_vt = tx.pop()
    fn = tx.pop()
    if isinstance(fn, NullVT):  # 3.13: [fn, NULL, args]
        fn = tx.pop()
    elif tx.stack and isinstance(tx.stack[-1], NullVT):  # 3.11/3.12: [NULL, fn, args]
        tx.pop()
    if not isinstance(kwargs_vt, DictVT):
        unsupported("call-kwargs", f"**{kwargs_vt.describe()} in a call")
    from kiln.capture.variables.builtins import iterate
    args = iterate(tx, args_vt).unpack(tx)
    tx.push(fn.call(tx, args, dict(kwargs_vt.items)))


def MAKE_FUNCTION(tx: Translator, inst: Instr) -> None:
    code_vt = tx.pop()
    if not isinstance(code_vt, ConstantVT):
        unsupported("make-function", "MAKE_FUNCTION with a non-constant code object")
    code = code_vt.value
    flags = inst.argval if isinstance(inst.argval, int) else inst.arg
    closure = tx.pop().unpack(tx) if flags & _CLOSURE else []
    if flags & _ANNOTATIONS:
        tx.pop()
    kwdefaults = tx.pop() if flags & _KWDEFAULTS else DictVT({})
    defaults = tx.pop().unpack(tx) if flags & _MAKE_FUNCTION_DEFAULTS else []
    boxes = [cell.box for cell in closure]
    tx.push(NestedFunctionVT(code, code.co_qualname, defaults, dict(kwdefaults.items), boxes,
                             tx.globals))


class WithExitVT(VT):
    """The `__exit__` a `with` block calls on its normal path (with three Nones)."""

    def __init__(self, ctx: VT) -> None:
        self.ctx = ctx

    def call(self, tx: Translator, args: list[VT], kwargs: dict[str, VT]) -> VT:
        return self.ctx.exit(tx)


def BEFORE_WITH(tx: Translator, inst: Instr) -> None:
    ctx = tx.pop()
    if not hasattr(ctx, "enter"):
        from kiln.capture.variables.objects import UserContextVT
        ctx = UserContextVT.adapt(ctx) or ctx
    if not hasattr(ctx, "enter"):
        unsupported("context-manager", f"`with {ctx.describe()}` is not supported yet",
                    hint="torch.no_grad, enable_grad, set_grad_enabled, autocast and classes "
                         "with Python __enter__/__exit__ are")
    tx.push(WithExitVT(ctx))
    tx.push(ctx.enter(tx))


def RETURN_GENERATOR(tx: Translator, inst: Instr) -> None:
    if tx.yields is None:
        unsupported("generator", "a generator frame cannot be captured")
    tx.push(ConstantVT(None))


def YIELD_VALUE(tx: Translator, inst: Instr) -> None:
    if tx.yields is None:
        unsupported("yield", "yield outside an inlined generator")
    tx.yields.append(tx.pop())
    tx.push(ConstantVT(None))
