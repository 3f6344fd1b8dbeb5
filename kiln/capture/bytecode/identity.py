"""identity_transform: decode -> assemble every code object of a function, changing nothing.

The debug mode that proves the bytecode layer loses nothing: the result must behave exactly like
the original (results, exceptions, tracebacks, generators)."""

from __future__ import annotations

import types

from kiln.capture.bytecode.assemble import assemble
from kiln.capture.bytecode.decode import decode_fresh

__all__ = ["identity_code", "identity_transform"]

_FUNCTION_ATTRS = ("__kwdefaults__", "__qualname__", "__doc__", "__module__", "__annotations__")


def identity_code(code: types.CodeType) -> types.CodeType:
    """Round-trip `code` and, recursively, the code objects among its constants."""
    instrs = decode_fresh(code)
    for instr in instrs:
        if instr.opname == "LOAD_CONST" and isinstance(instr.argval, types.CodeType):
            instr.argval = identity_code(instr.argval)
    return assemble(instrs, code)


def identity_transform(fn: types.FunctionType) -> types.FunctionType:
    """A new function whose code is `fn`'s round-tripped through decode -> assemble."""
    new = types.FunctionType(identity_code(fn.__code__), fn.__globals__, fn.__name__,
                             fn.__defaults__, fn.__closure__)
    for attr in _FUNCTION_ATTRS:
        setattr(new, attr, getattr(fn, attr))
    new.__dict__.update(fn.__dict__)
    return new
