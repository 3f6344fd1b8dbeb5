"""emit: builders for canonical instructions, the only way passes should create new `Instr`s.

Each helper returns one canonical `Instr` (opname and argument form as in `decode.py`), so code
built here is version-neutral; `assemble` lowers it to the running interpreter's opcodes. Pass
`lineno=` (or use `at(instrs, like)`) so tracebacks through synthesized code point at user source.
"""

from __future__ import annotations

from typing import Any, Iterable

from kiln.capture.bytecode import _compat
from kiln.capture.bytecode.instructions import BytecodeError, Instr

__all__ = [
    "NULL_ABOVE_CALLABLE", "at", "binary_op", "callable_with_null", "null_for_loaded_callable", "binary_subscr", "build_list", "build_map", "build_slice", "build_tuple",
    "call", "call_function_ex", "compare_op", "copy", "for_iter", "get_iter", "jump",
    "load_attr", "load_const", "load_deref", "load_fast", "load_global", "nop", "pop_jump_if",
    "pop_jump_if_none", "pop_top", "push_null", "raise_varargs", "return_value", "store_attr",
    "store_deref", "store_fast", "store_subscr", "swap", "unpack_sequence",
]

COMPARE_OPS = ("<", "<=", "==", "!=", ">", ">=")

#: 3.13 puts a call's NULL slot above the callable ([f, NULL, args]); 3.11/3.12 below it
NULL_ABOVE_CALLABLE = _compat.NULL_ABOVE_CALLABLE


def _i(opname: str, arg: int | None = None, argval: Any = None, **kw: Any) -> Instr:
    return Instr(opname, arg, argval, **kw)


def at(instrs: Iterable[Instr], like: Instr | None = None, *, lineno: int | None = None) -> None:
    """Give synthesized `instrs` the source location of `like` (or just `lineno`)."""
    for instr in instrs:
        if like is not None:
            instr.lineno, instr.positions = like.lineno, like.positions
        else:
            instr.lineno = lineno


def call(nargs: int, kwnames: Iterable[str] = (), *, lineno: int | None = None) -> Instr:
    """Call with stack [A, B, arg1..argn] (names of the last len(kwnames) args in kwnames)."""
    return _i("CALL", nargs, (nargs, tuple(kwnames)), lineno=lineno)


def callable_with_null(load: list[Instr]) -> list[Instr]:
    """`load` (instructions pushing one callable) with the NULL slot a `CALL` without `self`
    needs, in the running version's order."""
    null = push_null()
    return [*load, null] if NULL_ABOVE_CALLABLE else [null, *load]


def null_for_loaded_callable() -> list[Instr]:
    """Turn a callable already on the stack into the [callable, NULL] pair of a call."""
    return [push_null()] if NULL_ABOVE_CALLABLE else [push_null(), swap(2)]


def call_function_ex(has_kwargs: bool, *, lineno: int | None = None) -> Instr:
    return _i("CALL_FUNCTION_EX", int(has_kwargs), int(has_kwargs), lineno=lineno)


def load_global(name: str, push_null: bool = False, *, lineno: int | None = None) -> Instr:
    return _i("LOAD_GLOBAL", None, name, lineno=lineno, push_null=push_null)


def load_attr(name: str, method: bool = False, *, lineno: int | None = None) -> Instr:
    return _i("LOAD_ATTR", None, name, lineno=lineno, method=method)


def store_attr(name: str, *, lineno: int | None = None) -> Instr:
    return _i("STORE_ATTR", None, name, lineno=lineno)


def load_const(value: Any, *, lineno: int | None = None) -> Instr:
    return _i("LOAD_CONST", None, value, lineno=lineno)


def load_fast(name: str, *, lineno: int | None = None) -> Instr:
    return _i("LOAD_FAST", None, name, lineno=lineno)


def store_fast(name: str, *, lineno: int | None = None) -> Instr:
    return _i("STORE_FAST", None, name, lineno=lineno)


def load_deref(name: str, *, lineno: int | None = None) -> Instr:
    return _i("LOAD_DEREF", None, name, lineno=lineno)


def store_deref(name: str, *, lineno: int | None = None) -> Instr:
    return _i("STORE_DEREF", None, name, lineno=lineno)


def jump(target: Instr, *, lineno: int | None = None) -> Instr:
    return _i("JUMP", target=target, lineno=lineno)


def pop_jump_if(cond: bool, target: Instr, *, lineno: int | None = None) -> Instr:
    """Pop TOS; jump to `target` if bool(TOS) is `cond`. On 3.13 TOS must be an exact bool
    (a comparison, `in`, `is`, or a value after a `TO_BOOL`)."""
    return _i("POP_JUMP_IF_TRUE" if cond else "POP_JUMP_IF_FALSE", target=target, lineno=lineno)


def pop_jump_if_none(is_none: bool, target: Instr, *, lineno: int | None = None) -> Instr:
    """Pop TOS; jump to `target` if (TOS is None) is `is_none`."""
    return _i("POP_JUMP_IF_NONE" if is_none else "POP_JUMP_IF_NOT_NONE", target=target,
              lineno=lineno)


def for_iter(target: Instr, *, lineno: int | None = None) -> Instr:
    """TOS is an iterator: push next(TOS), or pop it and go to `target` (after the loop)."""
    return _i("FOR_ITER", target=target, lineno=lineno)


def get_iter(*, lineno: int | None = None) -> Instr:
    return _i("GET_ITER", lineno=lineno)


def return_value(*, lineno: int | None = None) -> Instr:
    return _i("RETURN_VALUE", lineno=lineno)


def push_null(*, lineno: int | None = None) -> Instr:
    return _i("PUSH_NULL", lineno=lineno)


def pop_top(*, lineno: int | None = None) -> Instr:
    return _i("POP_TOP", lineno=lineno)


def nop(*, lineno: int | None = None) -> Instr:
    return _i("NOP", lineno=lineno)


def _counted(opname: str, n: int, lineno: int | None) -> Instr:
    if n < 0:
        raise BytecodeError(f"{opname} needs a count >= 0, got {n}")
    return _i(opname, n, n, lineno=lineno)


def build_tuple(n: int, *, lineno: int | None = None) -> Instr:
    return _counted("BUILD_TUPLE", n, lineno)


def build_list(n: int, *, lineno: int | None = None) -> Instr:
    return _counted("BUILD_LIST", n, lineno)


def build_map(n: int, *, lineno: int | None = None) -> Instr:
    return _counted("BUILD_MAP", n, lineno)


def build_slice(n: int = 2, *, lineno: int | None = None) -> Instr:
    return _counted("BUILD_SLICE", n, lineno)


def unpack_sequence(n: int, *, lineno: int | None = None) -> Instr:
    return _counted("UNPACK_SEQUENCE", n, lineno)


def copy(n: int, *, lineno: int | None = None) -> Instr:
    """Push a copy of the n-th item from the top (1 = TOS)."""
    return _counted("COPY", n, lineno)


def swap(n: int, *, lineno: int | None = None) -> Instr:
    return _counted("SWAP", n, lineno)


def raise_varargs(n: int, *, lineno: int | None = None) -> Instr:
    return _counted("RAISE_VARARGS", n, lineno)


def binary_subscr(*, lineno: int | None = None) -> Instr:
    return _i("BINARY_SUBSCR", lineno=lineno)


def store_subscr(*, lineno: int | None = None) -> Instr:
    return _i("STORE_SUBSCR", lineno=lineno)


def binary_op(op: str, *, lineno: int | None = None) -> Instr:
    """`op` is the operator symbol as dis prints it: '+', '+=', '@', '//=', ..."""
    if op not in _compat.BINARY_OP_INDEX:
        raise BytecodeError(f"unknown BINARY_OP operator {op!r}",
                            hint=f"use one of {sorted(_compat.BINARY_OP_INDEX)}")
    return _i("BINARY_OP", _compat.BINARY_OP_INDEX[op], op, lineno=lineno)


def compare_op(op: str, *, lineno: int | None = None) -> Instr:
    if op not in COMPARE_OPS:
        raise BytecodeError(f"unknown COMPARE_OP operator {op!r}", hint=f"use one of {COMPARE_OPS}")
    return _i("COMPARE_OP", None, op, lineno=lineno)
