"""instructions: the canonical instruction IR of the bytecode layer.

A function body is a plain `list[Instr]` in execution-layout order. Control flow is by object
reference (`Instr.target`, `ExnEntry.target`), never by byte offset, so passes can insert, delete
and retarget instructions freely; `renumber()` refreshes `.index` afterwards.

The opnames and argument forms an `Instr` may carry are specified by the rule table at the top of
`decode.py`; `assemble.py` lowers them back to the running interpreter's real opcodes.
"""

from __future__ import annotations

import dataclasses
import dis
from typing import Any, Iterable, Sequence

from kiln.errors import KilnError

__all__ = [
    "BytecodeError",
    "ExnEntry",
    "Instr",
    "UnsupportedBytecode",
    "format_instrs",
    "renumber",
]


class BytecodeError(KilnError):
    """Malformed canonical instructions, or a code object the layer cannot read or build."""

    stage = "capture"


class UnsupportedBytecode(BytecodeError, NotImplementedError):
    """An opcode or Python version the bytecode layer does not handle (the frame runs eagerly)."""


@dataclasses.dataclass(eq=False)
class Instr:
    """One canonical instruction. Identity semantics: two `Instr` are equal only if they are the
    same object, so they can be dict keys and jump targets.

    Fields:
      opname    canonical opcode name (see the table in `decode.py`).
      arg       raw oparg where meaningful (kept for emission), else None.
      argval    decoded value: a name, a constant, an operator string, `(nargs, kwnames)` for
                `CALL`, `(conversion, has_spec)` for `FORMAT_VALUE`, ...; for jumps dis's target
                offset (informative only: `target` is what counts).
      target    the jump target instruction (jumps, `FOR_ITER`, `SEND` only).
      lineno    source line; every decoded instruction has one (carried forward).
      positions `dis.Positions` of the original instruction (None when synthesized); assembly
                writes these back so tracebacks point at user source.
      exn       the exception-table entry covering this instruction (the table is flat, so this is
                also the innermost). Authoritative for assembly: regions are rebuilt from it.
      offset    original byte offset; None for synthesized instructions and for the second half
                of a split one (`RETURN_CONST` -> `LOAD_CONST` + `RETURN_VALUE`).
      index     position in the list (set by decode / `renumber`).
      push_null `LOAD_GLOBAL`: a NULL is pushed before the global.
      method    `LOAD_ATTR`: method-form load (pushes [meth, self] or [NULL, attr]);
                `LOAD_SUPER_ATTR`: bit 0 of the oparg.
      origin    the real opname decode folded or split into this instruction, where assembly
                needs it to rebuild the original exactly (no semantic difference):
                JUMP_BACKWARD_NO_INTERRUPT (3.13 also uses it outside `yield from` loops) and,
                on the first half, a 3.13 superinstruction (CPython leaves some adjacent pairs
                unfused, e.g. the loads building a closure tuple).
    """

    opname: str
    arg: int | None = None
    argval: Any = None
    target: Instr | None = None
    lineno: int | None = None
    positions: dis.Positions | None = None
    exn: ExnEntry | None = None
    offset: int | None = None
    index: int = -1
    push_null: bool = False
    method: bool = False
    origin: str | None = None

    def __repr__(self) -> str:
        return f"<Instr {format_instr(self)}>"

    def copy(self) -> Instr:
        """A shallow copy (same target/exn objects); callers remap references themselves."""
        return dataclasses.replace(self)


@dataclasses.dataclass(eq=False)
class ExnEntry:
    """One exception-table entry: instructions `start`..`end` (inclusive, in list order) unwind to
    `target` with the operand stack cut to `depth` items, then push the last instruction offset
    if `lasti`, then the exception.

    `start`/`end` describe the decoded layout; after a pass moves instructions only each
    instruction's `.exn` is trusted (assembly rebuilds regions from it)."""

    start: Instr
    end: Instr
    target: Instr
    depth: int
    lasti: bool

    def __repr__(self) -> str:
        return (f"<ExnEntry {self.start.index}..{self.end.index} -> {self.target.index} "
                f"depth={self.depth}{' lasti' if self.lasti else ''}>")


def renumber(instrs: Sequence[Instr]) -> None:
    """Set `.index` of every instruction to its position in `instrs`."""
    for i, instr in enumerate(instrs):
        instr.index = i


def _argval_repr(instr: Instr) -> str:
    if instr.opname == "CALL":
        nargs, kwnames = instr.argval
        return f"{nargs}" + (f" kw={kwnames!r}" if kwnames else "")
    if instr.argval is None and instr.arg is None:
        return ""
    text = repr(instr.argval)
    return text if len(text) <= 60 else text[:57] + "..."


def format_instr(instr: Instr) -> str:
    flags = ("NULL+" if instr.push_null else "") + ("method " if instr.method else "")
    parts = [f"{instr.index:>4}", f"L{instr.lineno if instr.lineno is not None else '-':<4}",
             f"{instr.opname:<24}", flags + _argval_repr(instr)]
    if instr.target is not None:
        parts.append(f"-> {instr.target.index}")
    if instr.exn is not None:
        parts.append(f"[exn -> {instr.exn.target.index} depth={instr.exn.depth}"
                     f"{' lasti' if instr.exn.lasti else ''}]")
    return " ".join(p for p in parts if p).rstrip()


def format_instrs(instrs: Iterable[Instr]) -> str:
    """One line per instruction: index, line, opname, argval, `-> target.index`, exception entry."""
    return "\n".join(format_instr(i) for i in instrs)
