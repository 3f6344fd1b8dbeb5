"""decode: a code object -> the canonical `list[Instr]` (3.11, 3.12 and 3.13).

The symbolic interpreter sees ONLY the forms in this table; version differences beyond it are
noted as such. `dis` argval/argrepr are reused where they already are the canonical value.

Rule  real bytecode (3.11 / 3.12)                     -> canonical Instr
  1   3.11 `[KW_NAMES k] PRECALL n; CALL n`,          -> one `CALL`, arg=n, argval=(n, kwnames).
      3.12 `[KW_NAMES k] CALL n`                         Stack [A, B, arg1..argn]: A is NULL ->
                                                         callable=B, no self; else callable=A,
                                                         self=B. `CALL_FUNCTION_EX` unchanged.
  2   3.11 `LOAD_METHOD name`, 3.12 `LOAD_ATTR` bit 0 -> `LOAD_ATTR` argval=name, method=True:
                                                         pushes [meth, self] or [NULL, attr];
                                                         plain loads have method=False
  3   `LOAD_GLOBAL` (low bit: push NULL)              -> argval=name, push_null=bit (the NULL
                                                         goes BELOW the global)
  4   3.12 `LOAD_SUPER_ATTR`                          -> argval=name, method=bit 0, arg=raw
                                                         (bit 1 = two-arg form); 3.11 zero-arg
                                                         super() stays a plain call
  5   JUMP_FORWARD, JUMP_BACKWARD[_NO_INTERRUPT]      -> `JUMP` (target set, no direction)
      POP_JUMP_{FORWARD,BACKWARD}_IF_X (3.11),        -> `POP_JUMP_IF_X`, X in TRUE FALSE NONE
      POP_JUMP_IF_X (3.12)                               NOT_NONE
      JUMP_IF_{TRUE,FALSE}_OR_POP (3.11 only)         -> same names, target set
      FOR_ITER (3.12: END_FOR at the target)          -> `FOR_ITER`: when exhausted pops the
                                                         iterator and goes to target = the first
                                                         instr AFTER the loop; END_FOR removed
      SEND                                            -> `SEND`, target as dis gives it (3.11:
                                                         the instr after the loop, 3.12: END_SEND)
  6   3.12 `RETURN_CONST c`                           -> `LOAD_CONST c` + `RETURN_VALUE`
  7   3.12 `BINARY_SLICE` / `STORE_SLICE`             -> `BUILD_SLICE 2` + `BINARY_SUBSCR` /
                                                         `STORE_SUBSCR`
  8   `COMPARE_OP` (3.12: cmp_op[arg >> 4])           -> argval '<' '<=' '==' '!=' '>' '>='
  9   `BINARY_OP i`                                   -> argval = dis argrepr ('+', '+=', '@',
                                                         '//='), arg = i
 10   3.12 `CALL_INTRINSIC_1/2 i`; 3.11               -> `CALL_INTRINSIC_1` argval='INTRINSIC_..'
      `LIST_TO_TUPLE`, `UNARY_POSITIVE`                  (dis argrepr; likewise _2 on 3.12)
 11   `FORMAT_VALUE flags`                            -> argval = (None|'str'|'repr'|'ascii',
                                                         has_spec)
 12   CACHE, EXTENDED_ARG, PRECALL, KW_NAMES, END_FOR -> removed
      everything else (NOP, RESUME, MAKE_CELL,        -> unchanged with dis argval (names for
      COPY_FREE_VARS, LOAD_FAST*, *_DEREF, ...)          LOAD_FAST*, STORE_FAST*, *_DEREF,
                                                         LOAD_CLOSURE)
 13   jump/handler target on a removed instruction    -> the next kept instruction
      exception table                                 -> `ExnEntry` objects; each Instr's `.exn`
                                                         = the covering entry (the table is
                                                         flat, so also the innermost)
      line numbers                                    -> every Instr has `lineno` (positions
                                                         .lineno, else the previous Instr's);
                                                         `positions` kept as is

3.13 rules (the canonical form keeps the running version's NULL-slot order: see rule 14)
 14   3.13 calls: [callable, NULL|self, args]         -> `CALL` as rule 1, argval=(n, kwnames);
      `LOAD_CONST kwnames; CALL_KW n`                    the stack order is the real one (the
                                                         NULL is ABOVE the callable; a method
                                                         load still pushes [meth, self]):
                                                         `_compat.NULL_ABOVE_CALLABLE`
 15   LOAD_FAST_LOAD_FAST, STORE_FAST_LOAD_FAST,      -> two instructions (LOAD_FAST/STORE_FAST)
      STORE_FAST_STORE_FAST
 16   `MAKE_FUNCTION; SET_FUNCTION_ATTRIBUTE f...`    -> one `MAKE_FUNCTION`, arg=argval=the OR
                                                         of the flags (3.11/3.12's oparg)
 17   `END_FOR; POP_TOP` at a loop exit               -> removed (as END_FOR in rule 12)
 18   `COMPARE_OP` (cmp_op[arg >> 5], bit 4: bool)    -> argval as rule 8, arg raw (the bool
                                                         bit only matters to assembly: a jump
                                                         consumes the result anyway)
 19   LOAD_FAST of a cell or free variable            -> `LOAD_CLOSURE` (as on 3.11/3.12)
 20   TO_BOOL, CONVERT_VALUE (argval 'str' 'repr'     -> unchanged (3.13-only canonical ops;
      'ascii'), FORMAT_SIMPLE, FORMAT_WITH_SPEC          POP_JUMP_IF_TRUE/FALSE and UNARY_NOT
                                                         need an exact bool on 3.13, so TO_BOOL
                                                         is kept where the compiler put it)

Split instructions (rules 6, 7 and 15): the first half keeps the original `offset`, the second
half has offset None; both carry the original positions and exception entry. Fused ones (rules
14 and 16) keep the first instruction's offset.

Python 3.14+ is not supported: decode raises `UnsupportedBytecode`.
"""

from __future__ import annotations

import bisect
import dis
import types
import weakref

from kiln.capture.bytecode import _compat
from kiln.capture.bytecode.instructions import ExnEntry, Instr, UnsupportedBytecode, renumber

__all__ = ["clear_decode_cache", "decode", "decode_fresh"]

JUMP_NAMES: dict[str, str] = {
    "JUMP_FORWARD": "JUMP", "JUMP_BACKWARD": "JUMP", "JUMP_BACKWARD_NO_INTERRUPT": "JUMP",
    "JUMP_ABSOLUTE": "JUMP", "JUMP": "JUMP", "JUMP_NO_INTERRUPT": "JUMP",
    "JUMP_IF_TRUE_OR_POP": "JUMP_IF_TRUE_OR_POP", "JUMP_IF_FALSE_OR_POP": "JUMP_IF_FALSE_OR_POP",
    "FOR_ITER": "FOR_ITER", "SEND": "SEND",
}
for _cond in ("TRUE", "FALSE", "NONE", "NOT_NONE"):
    for _pre in ("POP_JUMP_IF_", "POP_JUMP_FORWARD_IF_", "POP_JUMP_BACKWARD_IF_"):
        JUMP_NAMES[_pre + _cond] = "POP_JUMP_IF_" + _cond

#: canonical jump opnames (instructions whose `target` is set)
JUMP_OPNAMES: frozenset[str] = frozenset(JUMP_NAMES.values())
REMOVED: frozenset[str] = frozenset({"CACHE", "EXTENDED_ARG", "PRECALL", "KW_NAMES", "END_FOR"})
INTRINSICS_311: dict[str, tuple[str, int]] = {
    "UNARY_POSITIVE": ("INTRINSIC_UNARY_POSITIVE", 5),
    "LIST_TO_TUPLE": ("INTRINSIC_LIST_TO_TUPLE", 6),
}
_JUMP_OPCODES = frozenset(dis.hasjrel) | frozenset(dis.hasjabs)

_cache: weakref.WeakKeyDictionary[types.CodeType, tuple[int, list[Instr]]] = (
    weakref.WeakKeyDictionary())


def decode(code: types.CodeType) -> list[Instr]:
    """The canonical instructions of `code`, cached per code object. Do not mutate the result
    (use `decode_fresh` for transforms)."""
    hit = _cache.get(code)
    # code objects compare by value (not co_filename/qualname): check identity too.
    if hit is not None and hit[0] == id(code):
        return hit[1]
    instrs = decode_fresh(code)
    _cache[code] = (id(code), instrs)
    return instrs


def clear_decode_cache() -> None:
    _cache.clear()


def decode_fresh(code: types.CodeType) -> list[Instr]:
    """Decode `code` into a new list of canonical instructions (safe to mutate)."""
    if not _compat.SUPPORTED:
        raise UnsupportedBytecode(
            f"cannot decode {code.co_qualname!r}: Python {_compat.version_str()} bytecode is not "
            "supported by the bytecode layer (3.11, 3.12 and 3.13 are)",
            hint="run on Python 3.11 to 3.13; on this version frames run eagerly")
    return _Decoder(code).run()


class _Decoder:
    def __init__(self, code: types.CodeType) -> None:
        self.code = code
        self.out: list[Instr] = []
        self.src: list[int] = []  # per output instr: offset of the raw instruction it came from
        self.at_offset: dict[int, Instr] = {}  # raw offset -> first kept instr at/after it
        self.pending: list[int] = []  # offsets of removed instrs awaiting the next kept one
        self.kwnames: tuple[str, ...] = ()
        self.line: int | None = code.co_firstlineno
        self.end_for: set[int] = set()
        self.cells = frozenset(code.co_cellvars + code.co_freevars)
        self.previous_op: str | None = None  # the raw opname before the current one

    def run(self) -> list[Instr]:
        raw = list(dis.get_instructions(self.code))
        for ins in raw:
            self.step(ins)
            self.previous_op = ins.opname
        renumber(self.out)
        self.link_jumps(raw)
        self.link_exceptions()
        return self.out

    def emit(self, ins: dis.Instruction, opname: str, arg: int | None = None,
             argval: object = None, *, first: bool = True, **flags: object) -> Instr:
        # positions, not starts_line: co_lines() merges ranges differently after a round trip
        lineno = ins.positions.lineno if ins.positions is not None else None
        self.line = lineno if lineno is not None else self.line
        instr = Instr(opname, arg, argval, lineno=self.line,
                      positions=ins.positions, offset=ins.offset if first else None, **flags)
        if first:
            for off in self.pending:
                self.at_offset[off] = instr
            self.pending.clear()
            self.at_offset[ins.offset] = instr
        self.out.append(instr)
        self.src.append(ins.offset)
        return instr

    def step(self, ins: dis.Instruction) -> None:  # noqa: C901 (one flat rule table)
        op, arg = ins.opname, ins.arg
        if op in REMOVED or self.is_loop_exit_pop(ins):
            if op == "KW_NAMES":
                self.kwnames = tuple(self.code.co_consts[arg])
            elif op == "END_FOR":
                self.end_for.add(ins.offset)
            self.pending.append(ins.offset)
        elif op == "CALL":
            self.emit(ins, "CALL", arg, (arg, self.kwnames))
            self.kwnames = ()
        elif op == "LOAD_FAST" and _compat.PY313 and ins.argval in self.cells:
            self.emit(ins, "LOAD_CLOSURE", arg, ins.argval)  # 3.13 loads a cell object this way
        elif op == "CALL_KW":
            self.emit_call_kw(ins)
        elif op in _compat.SUPERINSTRUCTIONS:
            first, second = _compat.SUPERINSTRUCTIONS[op]
            self.emit(ins, first, None, ins.argval[0], origin=op)
            self.emit(ins, second, None, ins.argval[1], first=False)
        elif op == "MAKE_FUNCTION" and arg is None:  # 3.13: attributes follow as their own ops
            self.emit(ins, op, 0, 0)
        elif op == "SET_FUNCTION_ATTRIBUTE":
            self.merge_function_attribute(ins)
        elif op == "LOAD_METHOD":
            self.emit(ins, "LOAD_ATTR", arg, ins.argval, method=True)
        elif op == "LOAD_ATTR":
            self.emit(ins, "LOAD_ATTR", arg, ins.argval, method=bool(_compat.SINCE_312 and arg & 1))
        elif op == "LOAD_GLOBAL":
            self.emit(ins, "LOAD_GLOBAL", arg, ins.argval, push_null=bool(arg & 1))
        elif op == "LOAD_SUPER_ATTR":
            self.emit(ins, "LOAD_SUPER_ATTR", arg, ins.argval, method=bool(arg & 1))
        elif ins.opcode in _JUMP_OPCODES:
            if op not in JUMP_NAMES:
                raise UnsupportedBytecode(f"unknown jump opcode {op} on Python "
                                          f"{_compat.version_str()} in {self.code.co_qualname!r}")
            self.emit(ins, JUMP_NAMES[op], arg, ins.argval,
                      origin=op if op == "JUMP_BACKWARD_NO_INTERRUPT" else None)
        elif op == "RETURN_CONST":
            self.emit(ins, "LOAD_CONST", arg, ins.argval)
            self.emit(ins, "RETURN_VALUE", first=False)
        elif op in ("BINARY_SLICE", "STORE_SLICE"):
            self.emit(ins, "BUILD_SLICE", 2, 2)
            self.emit(ins, "BINARY_SUBSCR" if op == "BINARY_SLICE" else "STORE_SUBSCR",
                      first=False)
        elif op in ("BINARY_OP", "CALL_INTRINSIC_1", "CALL_INTRINSIC_2"):
            self.emit(ins, op, arg, ins.argrepr)
        elif op in INTRINSICS_311:
            name, number = INTRINSICS_311[op]
            self.emit(ins, "CALL_INTRINSIC_1", number, name)
        elif op == "CONVERT_VALUE":
            self.emit(ins, op, arg, ins.argrepr)
        elif op == "FORMAT_VALUE":
            conv = _compat.FORMAT_CONVERSIONS[arg & 3]
            self.emit(ins, op, arg, (conv, bool(arg & _compat.FORMAT_SPEC_BIT)))
        else:
            self.emit(ins, op, arg, ins.argval)

    def is_loop_exit_pop(self, ins: dis.Instruction) -> bool:
        """The POP_TOP of 3.13's `END_FOR; POP_TOP` loop exit (FOR_ITER skips both)."""
        return ins.opname == "POP_TOP" and self.previous_op == "END_FOR" and \
            _compat.LOOP_EXIT == ("END_FOR", "POP_TOP")

    def emit_call_kw(self, ins: dis.Instruction) -> None:
        """3.13 `LOAD_CONST kwnames; CALL_KW n` -> one CALL: the compiler always loads the names
        tuple right before CALL_KW, so the LOAD_CONST just emitted is taken back."""
        names = self.out[-1] if self.out else None
        if names is None or names.opname != "LOAD_CONST" or type(names.argval) is not tuple:
            raise UnsupportedBytecode(f"CALL_KW at offset {ins.offset} in "
                                      f"{self.code.co_qualname!r} does not follow the LOAD_CONST "
                                      "of its keyword names")
        self.out.pop()
        self.src.pop()
        call = self.emit(ins, "CALL", ins.arg, (ins.arg, names.argval))
        call.offset = names.offset
        for off, instr in self.at_offset.items():  # jumps to the names now land on the call
            if instr is names:
                self.at_offset[off] = call

    def merge_function_attribute(self, ins: dis.Instruction) -> None:
        """3.13 `SET_FUNCTION_ATTRIBUTE flag` right after MAKE_FUNCTION -> its flag bit."""
        make = self.out[-1] if self.out else None
        if make is None or make.opname != "MAKE_FUNCTION":
            raise UnsupportedBytecode(f"SET_FUNCTION_ATTRIBUTE at offset {ins.offset} in "
                                      f"{self.code.co_qualname!r} does not follow MAKE_FUNCTION")
        make.arg |= ins.arg
        make.argval = make.arg
        self.pending.append(ins.offset)

    def link_jumps(self, raw: list[dis.Instruction]) -> None:
        for ins in raw:
            if ins.opcode in _JUMP_OPCODES and ins.argval in self.end_for \
                    and ins.opname != "FOR_ITER":
                raise UnsupportedBytecode(
                    f"{ins.opname} at offset {ins.offset} in {self.code.co_qualname!r} jumps to "
                    "END_FOR (only FOR_ITER may)")
        for instr in self.out:
            if instr.opname in JUMP_OPNAMES:
                instr.target = self.resolve(instr.argval, instr)

    def resolve(self, offset: int, who: object) -> Instr:
        target = self.at_offset.get(offset)
        if target is None:
            raise UnsupportedBytecode(f"{who!r} in {self.code.co_qualname!r}: no instruction at "
                                      f"target offset {offset}")
        return target

    def link_exceptions(self) -> None:
        raw = sorted(_compat.exception_table(self.code))
        if not raw:
            return
        starts = [e.start for e in raw]
        entries: dict[int, ExnEntry] = {}
        for instr, src in zip(self.out, self.src):
            k = bisect.bisect_right(starts, src) - 1
            if k < 0 or src >= raw[k].end:
                continue
            entry = entries.get(k)
            if entry is None:
                e = raw[k]
                entry = ExnEntry(instr, instr, self.resolve(e.target, e), e.depth, e.lasti)
                entries[k] = entry
            entry.end = instr
            instr.exn = entry
