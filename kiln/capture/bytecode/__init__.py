"""capture/bytecode: CPython code objects <-> the canonical instruction IR.

Input -> output:
  decode(code)              code object -> list[Instr] in canonical form (cached per code object;
                            `decode_fresh` returns a private copy for transforms)
  assemble(instrs, like)    list[Instr] -> code object for the running interpreter, with `like`'s
                            metadata (names, flags, file, lines, cell/free vars)
  identity_transform(fn)    decode -> assemble of every code object of `fn` (debug mode)
  emit.*                    builders for canonical instructions used by transforms

Invariants:
  - the canonical form is version-neutral for the rules tabled in `decode.py` (one CALL with
    kwnames, LOAD_ATTR(method=), LOAD_GLOBAL(push_null=), direction-less jumps with Instr targets,
    FOR_ITER exiting past the loop, no CACHE/EXTENDED_ARG/PRECALL/KW_NAMES/END_FOR);
  - version differences are emitted only by `emit` and `assemble`;
  - `assemble` keeps every exception-table depth as decoded or set by the caller, never
    recomputing it (research §4.1), and preserves positions so tracebacks point at user source;
  - decode(assemble(decode(c), c)) == decode(c) structurally.

  - the canonical form keeps the running version's NULL-slot order ([NULL, f] on 3.11/3.12,
    [f, NULL] on 3.13): `emit.NULL_ABOVE_CALLABLE`, `emit.callable_with_null`.

Never: executes user code, imports torch, rewrites semantics (no constant folding, no explicit
super(), no dead-code removal), or supports 3.14+ (decode/assemble raise UnsupportedBytecode).
"""

from __future__ import annotations

from kiln.capture.bytecode import emit
from kiln.capture.bytecode.assemble import assemble
from kiln.capture.bytecode.decode import clear_decode_cache, decode, decode_fresh
from kiln.capture.bytecode.identity import identity_code, identity_transform
from kiln.capture.bytecode.instructions import (BytecodeError, ExnEntry, Instr, UnsupportedBytecode,
                                      format_instrs, renumber)

__all__ = [
    "BytecodeError",
    "ExnEntry",
    "Instr",
    "UnsupportedBytecode",
    "assemble",
    "clear_decode_cache",
    "decode",
    "decode_fresh",
    "emit",
    "format_instrs",
    "identity_code",
    "identity_transform",
    "renumber",
]
