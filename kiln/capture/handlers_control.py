"""Opcode handlers for control flow: jumps, loops, returns and raises."""
from __future__ import annotations

from typing import TYPE_CHECKING

from kiln.capture.unsupported import unsupported
from kiln.capture.variables.base import ConstantVT, VT
from kiln.capture.variables.builtins import iterate
from kiln.capture.variables.containers import IteratorVT

if TYPE_CHECKING:
    from kiln.capture.bytecode import Instr
    from kiln.capture.translator import Translator


def JUMP(tx: Translator, inst: Instr) -> None:
    tx.jump(inst.target)


def _is_none(vt: VT) -> bool:
    return vt.is_constant() and vt.as_constant() is None


def POP_JUMP_IF_TRUE(tx: Translator, inst: Instr) -> None:
    if tx.pop().truth(tx):
        tx.jump(inst.target)


def POP_JUMP_IF_FALSE(tx: Translator, inst: Instr) -> None:
    if not tx.pop().truth(tx):
        tx.jump(inst.target)


def POP_JUMP_IF_NONE(tx: Translator, inst: Instr) -> None:
    if _is_none(tx.pop()):
        tx.jump(inst.target)


def POP_JUMP_IF_NOT_NONE(tx: Translator, inst: Instr) -> None:
    if not _is_none(tx.pop()):
        tx.jump(inst.target)


def JUMP_IF_TRUE_OR_POP(tx: Translator, inst: Instr) -> None:
    if tx.stack[-1].truth(tx):
        tx.jump(inst.target)
    else:
        tx.pop()


def JUMP_IF_FALSE_OR_POP(tx: Translator, inst: Instr) -> None:
    if not tx.stack[-1].truth(tx):
        tx.jump(inst.target)
    else:
        tx.pop()


def GET_ITER(tx: Translator, inst: Instr) -> None:
    tx.push(iterate(tx, tx.pop()))


def FOR_ITER(tx: Translator, inst: Instr) -> None:
    it = tx.stack[-1]
    if not isinstance(it, IteratorVT):
        unsupported("for-iter", f"iterating over {it.describe()}")
    item = it.next_item()
    if item is None:
        tx.pop()
        tx.jump(inst.target)
    else:
        tx.push(item)


def RETURN_VALUE(tx: Translator, inst: Instr) -> None:
    tx.result = tx.pop()
    tx.done = True


def RAISE_VARARGS(tx: Translator, inst: Instr) -> None:
    exc = tx.stack[-1] if tx.stack else None
    what = exc.describe() if exc is not None else "the current exception"
    unsupported("raise", f"the function raises {what} while being captured",
                category="user-fixable",
                hint="kiln runs the function eagerly so the exception reaches you unchanged")


def LOAD_ASSERTION_ERROR(tx: Translator, inst: Instr) -> None:
    tx.push(ConstantVT(AssertionError))
