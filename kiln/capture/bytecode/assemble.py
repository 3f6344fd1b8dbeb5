"""assemble: canonical `list[Instr]` -> a code object for the running interpreter (3.11-3.13).

Lowering (the inverse of the table in `decode.py`), one rule per canonical opname in `LOWERINGS`:
  CALL (n, kw)         3.11 `[KW_NAMES kw] PRECALL n; CALL n`; 3.12 `[KW_NAMES kw] CALL n`;
                       3.13 `CALL n`, or `LOAD_CONST kw; CALL_KW n`
  LOAD_ATTR method     3.11 `LOAD_METHOD`; 3.12+ `LOAD_ATTR` with the low bit
  MAKE_FUNCTION flags  3.13: `MAKE_FUNCTION; SET_FUNCTION_ATTRIBUTE f` per flag bit
  COMPARE_OP           3.13: keeps the decoded bool bit
  fused pairs          3.12+: RETURN_CONST, BINARY_SLICE, STORE_SLICE; 3.13: LOAD_FAST_LOAD_FAST,
                       STORE_FAST_LOAD_FAST, STORE_FAST_STORE_FAST (only pairs decode split,
                       `Instr.origin`, and only when the locals' indices fit in 4 bits)
  JUMP / POP_JUMP_IF_X forward or backward form from the list order; a forward-only jump
                       (3.12 POP_JUMP_IF_X, FOR_ITER, SEND, JUMP_IF_X_OR_POP) whose target lies
                       behind it goes through a trampoline `JUMP_BACKWARD` appended at the end
  FOR_ITER             3.12+: `FOR_ITER` -> `_compat.LOOP_EXIT` placed just before the loop exit
  JUMP_IF_X_OR_POP     3.12+: `COPY 1; POP_JUMP_IF_X; POP_TOP`
  CALL_INTRINSIC_1     3.11: back to `UNARY_POSITIVE` / `LIST_TO_TUPLE`
Everything else is emitted with its argval. The `bytecode` package (0.19.x) only encodes: labels,
caches, EXTENDED_ARG, line table and exception table. Exception regions are rebuilt from each
instruction's `.exn` with the DECODED depth kept (never recomputed: research §4.1, a prefix that
jumps into a try/with region would otherwise get a bogus depth and crash CPython 3.11). The stack
size is computed here by walking the lowered code from the entry and from every handler.
"""

from __future__ import annotations

import dis
import types
from typing import Any, Callable

import bytecode as _bc

from kiln.capture.bytecode import _compat
from kiln.capture.bytecode.decode import JUMP_OPNAMES
from kiln.capture.bytecode.instructions import BytecodeError, ExnEntry, Instr, UnsupportedBytecode

__all__ = ["assemble"]

#: canonical opnames after which control never falls through
NO_FALLTHROUGH = frozenset({"JUMP", "RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE"})
_REPLACEABLE = {
    "co_argcount": "argcount", "co_posonlyargcount": "posonlyargcount",
    "co_kwonlyargcount": "kwonlyargcount", "co_flags": "flags", "co_name": "name",
    "co_qualname": "qualname", "co_filename": "filename", "co_firstlineno": "first_lineno",
    "co_varnames": "argnames", "co_cellvars": "cellvars", "co_freevars": "freevars",
}
_COMPARE = {"<": _bc.Compare.LT, "<=": _bc.Compare.LE, "==": _bc.Compare.EQ,
            "!=": _bc.Compare.NE, ">": _bc.Compare.GT, ">=": _bc.Compare.GE}
_INTRINSICS_311 = {"INTRINSIC_UNARY_POSITIVE": "UNARY_POSITIVE",
                   "INTRINSIC_LIST_TO_TUPLE": "LIST_TO_TUPLE"}
_FORMAT_CODES = {v: k for k, v in _compat.FORMAT_CONVERSIONS.items()}
_FUSIONS = {("LOAD_CONST", "RETURN_VALUE"): "RETURN_CONST",
            ("BUILD_SLICE", "BINARY_SUBSCR"): "BINARY_SLICE",
            ("BUILD_SLICE", "STORE_SUBSCR"): "STORE_SLICE"} if _compat.SINCE_312 else {}
_FUSIONS.update({halves: fused for fused, halves in _compat.SUPERINSTRUCTIONS.items()})
_SUPERINSTRUCTIONS = frozenset(_compat.SUPERINSTRUCTIONS)
_GEN_FLAGS = 0x20 | 0x80 | 0x200  # CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR

def assemble(instrs: list[Instr], like: types.CodeType, **replace: Any) -> types.CodeType:
    """Build a code object running `instrs`, with the metadata of `like` (names, flags, file,
    first line, varnames, cell/free vars) except for the `co_*` fields given in `replace`."""
    if not _compat.SUPPORTED:
        raise UnsupportedBytecode(
            f"cannot assemble {like.co_qualname!r} on Python {_compat.version_str()}",
            hint="the bytecode layer supports Python 3.11 to 3.13")
    unknown = set(replace) - set(_REPLACEABLE)
    if unknown:
        raise BytecodeError(f"assemble() cannot replace {sorted(unknown)}",
                            hint=f"replaceable fields: {sorted(_REPLACEABLE)}")
    return _Assembler(instrs, like, replace).run()


def _location(instr: Instr) -> _bc.instr.InstrLocation:
    p = instr.positions
    if p is not None:
        return _bc.instr.InstrLocation(p.lineno, p.end_lineno, p.col_offset, p.end_col_offset)
    return _bc.instr.InstrLocation(instr.lineno, None, None, None)


class _Assembler:
    def __init__(self, instrs: list[Instr], like: types.CodeType, replace: dict) -> None:
        self.instrs = instrs
        self.like = like
        self.pos: dict[Instr, int] = {instr: k for k, instr in enumerate(instrs)}
        if len(self.pos) != len(instrs):
            raise BytecodeError("the same Instr object appears twice in the list",
                                hint="copy instructions with Instr.copy() before reusing them")
        self.cellvars = tuple(replace.get("co_cellvars", like.co_cellvars))
        self.freevars = tuple(replace.get("co_freevars", like.co_freevars))
        self.replace = replace
        self.labels: dict[Instr, _bc.Label] = {}
        self.end_for: dict[Instr, tuple[_bc.Label, _bc.instr.InstrLocation, ExnEntry | None]] = {}
        self.items: list[tuple[Any, ExnEntry | None]] = []
        self.stubs: list[tuple[Any, ExnEntry | None]] = []

    # -- driver ------------------------------------------------------------------------------
    def run(self) -> types.CodeType:
        prev: Instr | None = None
        fused = self.fusions()
        for k, instr in enumerate(self.instrs):
            if instr in fused and fused[instr] is None:
                prev = instr  # second half of a re-fused pair, lowered with the first
                continue
            if instr in self.end_for:
                self.place_end_for(instr, prev)
            self.items.append((self.label(instr), None))
            if fused.get(instr) in _SUPERINSTRUCTIONS:
                lowered = [_bc.Instr(fused[instr], (instr.argval, self.instrs[k + 1].argval),
                                     location=_location(instr))]
            elif instr in fused:
                lowered = self.generic(instr, _location(instr), fused[instr])
            else:
                lowered = LOWERINGS.get(instr.opname, _Assembler.generic)(
                    self, instr, _location(instr))
            self.items.extend((low, instr.exn) for low in lowered)
            prev = instr
        self.items.extend(self.stubs)
        return self.build()

    def fusions(self) -> dict[Instr, str | None]:
        """Pairs that decode split (3.12+: RETURN_CONST, BINARY_SLICE, STORE_SLICE; 3.13: the
        LOAD_FAST/STORE_FAST superinstructions) are fused back when the second half is no
        jump/handler target, so identity round trips are exact. Maps the first half to the
        fused opname and the second half to None."""
        targeted = {i.target for i in self.instrs if i.target is not None}
        targeted |= {i.exn.target for i in self.instrs if i.exn is not None}
        out: dict[Instr, str | None] = {}
        for a, b in zip(self.instrs, self.instrs[1:]):
            name = _FUSIONS.get((a.opname, b.opname))
            if (name is None or a in out or b in targeted or a.exn is not b.exn
                    or a.positions != b.positions or a.lineno != b.lineno
                    or (a.opname == "BUILD_SLICE" and a.argval != 2)
                    or (name in _SUPERINSTRUCTIONS and not self.fits_superinstruction(a, b))):
                continue
            out[a], out[b] = name, None
        return out

    def fits_superinstruction(self, a: Instr, b: Instr) -> bool:
        """Only pairs decode split (CPython leaves some adjacent pairs unfused); it packs both
        local indices into one oparg, 4 bits each."""
        if a.origin != _FUSIONS[(a.opname, b.opname)]:
            return False
        names = list(self.replace.get("co_varnames", self.like.co_varnames))
        limit = _compat.SUPERINSTRUCTION_MAX_INDEX
        return all(v in names[:limit + 1] and names.index(v) <= limit
                   for v in (a.argval, b.argval))

    def build(self) -> types.CodeType:
        like, code = self.like, _bc.Bytecode()
        code.argcount, code.posonlyargcount = like.co_argcount, like.co_posonlyargcount
        code.kwonlyargcount, code.flags = like.co_kwonlyargcount, like.co_flags
        code.name, code.qualname, code.filename = like.co_name, like.co_qualname, like.co_filename
        code.first_lineno, code.argnames = like.co_firstlineno, list(like.co_varnames)
        code.cellvars, code.freevars = list(like.co_cellvars), list(like.co_freevars)
        # keep co_consts[0] in place: it is the docstring slot of functions made from this code
        if like.co_consts and (like.co_consts[0] is None or isinstance(like.co_consts[0], str)):
            code.docstring = like.co_consts[0]
        for key, value in self.replace.items():
            setattr(code, _REPLACEABLE[key], list(value) if isinstance(value, tuple) else value)
        code.extend(self.with_try_blocks())
        stacksize = _stacksize(self.items, code.flags, like.co_qualname,
                               lambda exn: self.labels[exn.target])
        try:
            return code.to_code(stacksize=stacksize, compute_exception_stack_depths=False)
        except Exception as e:  # the package's errors carry no location: add ours
            raise BytecodeError(f"assembling {like.co_qualname!r} failed: "
                                f"{type(e).__name__}: {e}") from e

    def with_try_blocks(self) -> list[Any]:
        """Wrap each maximal run of real instructions with equal `.exn` (same handler, depth and
        lasti: the table is flat, so equal entries can merge) in TryBegin/TryEnd."""
        out: list[Any] = []
        current: tuple | None = None
        begin: _bc.TryBegin | None = None
        for item, exn in self.items:
            if isinstance(item, _bc.Label):
                out.append(item)
                continue
            key = None if exn is None else (exn.target, exn.depth, exn.lasti)
            if key != current:
                if begin is not None:
                    out.append(_bc.TryEnd(begin))
                    begin = None
                if exn is not None:
                    begin = _bc.TryBegin(self.label(self.member(exn.target, "handler")),
                                         exn.lasti, exn.depth)
                    out.append(begin)
                current = key
            out.append(item)
        if begin is not None:
            out.append(_bc.TryEnd(begin))
        return out

    # -- helpers -----------------------------------------------------------------------------
    def member(self, instr: Instr | None, what: str) -> Instr:
        if instr is None or instr not in self.pos:
            raise BytecodeError(f"{what} {instr!r} is not in the instruction list being "
                                f"assembled for {self.like.co_qualname!r}",
                                hint="retarget jumps and exception entries when removing "
                                     "instructions")
        return instr

    def label(self, instr: Instr) -> _bc.Label:
        lab = self.labels.get(instr)
        if lab is None:
            lab = self.labels[instr] = _bc.Label()
        return lab

    def forward(self, instr: Instr) -> tuple[Instr, bool]:
        target = self.member(instr.target, f"jump target of {instr!r}:")
        return target, self.pos[target] > self.pos[instr]

    def stub(self, instr: Instr, loc: Any, target: Instr, end_for: bool = False) -> _bc.Label:
        """A trampoline at the end of the code for a forward-only jump going backwards."""
        lab = _bc.Label()
        self.stubs.append((lab, None))
        if end_for:
            self.stubs.extend((_bc.Instr(op, location=loc), instr.exn) for op in _compat.LOOP_EXIT)
        back = "JUMP_BACKWARD_NO_INTERRUPT" if target.opname == "SEND" else "JUMP_BACKWARD"
        self.stubs.append((_bc.Instr(back, self.label(target), location=loc), instr.exn))
        return lab

    def place_end_for(self, target: Instr, prev: Instr | None) -> None:
        lab, loc, exn = self.end_for[target]
        if prev is not None and prev.opname not in NO_FALLTHROUGH:
            self.items.append((_bc.Instr("JUMP_FORWARD", self.label(target), location=loc), exn))
        self.items.append((lab, None))
        self.items.extend((_bc.Instr(op, location=loc), exn) for op in _compat.LOOP_EXIT)

    def var(self, name: str) -> _bc.CellVar | _bc.FreeVar:
        if name in self.cellvars:
            return _bc.CellVar(name)
        if name in self.freevars:
            return _bc.FreeVar(name)
        raise BytecodeError(f"{name!r} is neither a cell nor a free variable of "
                            f"{self.like.co_qualname!r}",
                            hint="pass co_cellvars=/co_freevars= to assemble()")

    # -- lowering rules ----------------------------------------------------------------------
    def generic(self, instr: Instr, loc: Any, opname: str | None = None) -> list[_bc.Instr]:
        name = opname or instr.opname
        op = dis.opmap.get(name)
        if op is None:
            raise UnsupportedBytecode(f"opcode {name} does not exist on Python "
                                      f"{_compat.version_str()} ({self.like.co_qualname!r})")
        if not _compat.has_argument(op):
            return [_bc.Instr(name, location=loc)]
        if op in dis.hasconst:
            arg: Any = instr.argval
        elif op in dis.hasfree:
            arg = self.var(instr.argval)
        elif op in dis.haslocal or op in dis.hasname:
            arg = instr.argval
        elif op in dis.hascompare:
            arg = _COMPARE[instr.argval]
        else:
            arg = instr.arg if instr.arg is not None else instr.argval
        return [_bc.Instr(name, arg, location=loc)]

    def lower_call(self, instr: Instr, loc: Any) -> list[_bc.Instr]:
        nargs, kwnames = instr.argval
        if _compat.PY313:
            if not kwnames:
                return [_bc.Instr("CALL", nargs, location=loc)]
            return [_bc.Instr("LOAD_CONST", tuple(kwnames), location=loc),
                    _bc.Instr("CALL_KW", nargs, location=loc)]
        out = [_bc.Instr("KW_NAMES", tuple(kwnames), location=loc)] if kwnames else []
        if _compat.PY311:
            out.append(_bc.Instr("PRECALL", nargs, location=loc))
        out.append(_bc.Instr("CALL", nargs, location=loc))
        return out

    def lower_load_attr(self, instr: Instr, loc: Any) -> list[_bc.Instr]:
        if _compat.PY311:
            return [_bc.Instr("LOAD_METHOD" if instr.method else "LOAD_ATTR", instr.argval,
                              location=loc)]
        return [_bc.Instr("LOAD_ATTR", (instr.method, instr.argval), location=loc)]

    def lower_load_global(self, instr: Instr, loc: Any) -> list[_bc.Instr]:
        return [_bc.Instr("LOAD_GLOBAL", (instr.push_null, instr.argval), location=loc)]

    def lower_load_super_attr(self, instr: Instr, loc: Any) -> list[_bc.Instr]:
        two_arg = bool((instr.arg or 0) & 2)
        return [_bc.Instr("LOAD_SUPER_ATTR", (instr.method, two_arg, instr.argval), location=loc)]

    def lower_load_closure(self, instr: Instr, loc: Any) -> list[_bc.Instr]:
        """3.13 has no LOAD_CLOSURE: a cell is loaded with LOAD_FAST from its slot (an argument
        that is a cell keeps its varnames slot)."""
        if not _compat.PY313:
            return [_bc.Instr("LOAD_CLOSURE", self.var(instr.argval), location=loc)]
        names = self.replace.get("co_varnames", self.like.co_varnames)
        arg = instr.argval if instr.argval in names else self.var(instr.argval)
        return [_bc.Instr("LOAD_FAST", arg, location=loc)]

    def lower_make_function(self, instr: Instr, loc: Any) -> list[_bc.Instr]:
        flags = instr.arg or 0
        if not _compat.PY313:
            return [_bc.Instr("MAKE_FUNCTION", flags, location=loc)]
        return [_bc.Instr("MAKE_FUNCTION", location=loc)] + [
            _bc.Instr("SET_FUNCTION_ATTRIBUTE", bit, location=loc)
            for bit in _compat.FUNCTION_ATTRIBUTE_ORDER if flags & bit]

    def lower_compare_op(self, instr: Instr, loc: Any) -> list[_bc.Instr]:
        op = _COMPARE[instr.argval]
        if _compat.compare_casts_to_bool(instr.arg):
            op = _bc.Compare[op.name + "_CAST"]
        return [_bc.Instr("COMPARE_OP", op, location=loc)]

    def lower_convert_value(self, instr: Instr, loc: Any) -> list[_bc.Instr]:
        return [_bc.Instr("CONVERT_VALUE", _bc.instr.FormatValue[instr.argval.upper()],
                          location=loc)]

    def lower_binary_op(self, instr: Instr, loc: Any) -> list[_bc.Instr]:
        index = _compat.BINARY_OP_INDEX.get(instr.argval, instr.arg)
        return [_bc.Instr("BINARY_OP", _bc.BinaryOp(index), location=loc)]

    def lower_intrinsic_1(self, instr: Instr, loc: Any) -> list[_bc.Instr]:
        if _compat.PY311:
            if instr.argval not in _INTRINSICS_311:
                raise UnsupportedBytecode(f"CALL_INTRINSIC_1 {instr.argval} has no Python 3.11 "
                                          "equivalent")
            return [_bc.Instr(_INTRINSICS_311[instr.argval], location=loc)]
        return [_bc.Instr("CALL_INTRINSIC_1", _bc.Intrinsic1Op[instr.argval], location=loc)]

    def lower_intrinsic_2(self, instr: Instr, loc: Any) -> list[_bc.Instr]:
        return [_bc.Instr("CALL_INTRINSIC_2", _bc.Intrinsic2Op[instr.argval], location=loc)]

    def lower_format_value(self, instr: Instr, loc: Any) -> list[_bc.Instr]:
        conv, has_spec = instr.argval
        flags = _FORMAT_CODES[conv] | (_compat.FORMAT_SPEC_BIT if has_spec else 0)
        return [_bc.Instr("FORMAT_VALUE", flags, location=loc)]

    def lower_jump(self, instr: Instr, loc: Any) -> list[_bc.Instr]:
        target, fwd = self.forward(instr)
        name, dest = instr.opname, self.label(target)
        if name == "JUMP":
            if fwd:
                return [_bc.Instr("JUMP_FORWARD", dest, location=loc)]
            no_interrupt = instr.origin == "JUMP_BACKWARD_NO_INTERRUPT" or target.opname == "SEND"
            back = "JUMP_BACKWARD_NO_INTERRUPT" if no_interrupt else "JUMP_BACKWARD"
            return [_bc.Instr(back, dest, location=loc)]
        if name.startswith("POP_JUMP_IF_"):
            cond = name[len("POP_JUMP_IF_"):]
            if _compat.PY311:
                real = f"POP_JUMP_{'FORWARD' if fwd else 'BACKWARD'}_IF_{cond}"
                return [_bc.Instr(real, dest, location=loc)]
            return [_bc.Instr(name, dest if fwd else self.stub(instr, loc, target), location=loc)]
        if name == "FOR_ITER" and _compat.SINCE_312:
            if fwd:
                if target not in self.end_for:
                    self.end_for[target] = (_bc.Label(), loc, instr.exn)
                dest = self.end_for[target][0]
            else:
                dest = self.stub(instr, loc, target, end_for=True)
            return [_bc.Instr("FOR_ITER", dest, location=loc)]
        if not fwd:
            dest = self.stub(instr, loc, target)
        if name.endswith("_OR_POP") and _compat.SINCE_312:
            cond = "TRUE" if name == "JUMP_IF_TRUE_OR_POP" else "FALSE"
            return [_bc.Instr("COPY", 1, location=loc),
                    _bc.Instr(f"POP_JUMP_IF_{cond}", dest, location=loc),
                    _bc.Instr("POP_TOP", location=loc)]
        return [_bc.Instr(name, dest, location=loc)]


LOWERINGS: dict[str, Callable[[_Assembler, Instr, Any], list[_bc.Instr]]] = {
    "CALL": _Assembler.lower_call,
    "LOAD_ATTR": _Assembler.lower_load_attr,
    "LOAD_GLOBAL": _Assembler.lower_load_global,
    "LOAD_SUPER_ATTR": _Assembler.lower_load_super_attr,
    "BINARY_OP": _Assembler.lower_binary_op,
    "CALL_INTRINSIC_1": _Assembler.lower_intrinsic_1,
    "CALL_INTRINSIC_2": _Assembler.lower_intrinsic_2,
    "FORMAT_VALUE": _Assembler.lower_format_value,
    "MAKE_FUNCTION": _Assembler.lower_make_function,
    "LOAD_CLOSURE": _Assembler.lower_load_closure,
    "COMPARE_OP": _Assembler.lower_compare_op,
    "CONVERT_VALUE": _Assembler.lower_convert_value,
    **{name: _Assembler.lower_jump for name in JUMP_OPNAMES},
}


def _stacksize(items: list[tuple[Any, ExnEntry | None]], flags: int, where: str,
               handler: Callable[[ExnEntry], _bc.Label]) -> int:
    """Max operand-stack depth over the code reachable from the entry and from the handlers of
    reached instructions (handler depth = entry depth + lasti + exception)."""
    at: dict[_bc.Label, int] = {}
    for k, (item, _exn) in enumerate(items):
        if isinstance(item, _bc.Label):
            at[item] = k
    seen_depth: dict[int, int] = {}
    seen_exn: set[int] = set()
    initial = _compat.GENERATOR_ENTRY_DEPTH if flags & _GEN_FLAGS else 0
    work, best = [(0, initial)], initial
    while work:
        k, depth = work.pop()
        while k < len(items):
            item, exn = items[k]
            if isinstance(item, _bc.Label):
                k += 1
                continue
            if seen_depth.get(k, -1) >= depth:
                break
            seen_depth[k] = depth
            best = max(best, depth)
            if exn is not None and id(exn) not in seen_exn:
                seen_exn.add(id(exn))
                work.append((at[handler(exn)], exn.depth + 1 + int(exn.lasti)))
            if item.has_jump():
                work.append((at[item.arg], depth + item.stack_effect(jump=True)))
            if item.is_final() or item.is_uncond_jump():
                break
            depth += item.stack_effect(jump=False)
            if depth < 0:
                raise BytecodeError(f"operand stack underflow at {item.name} (lowered index {k}) "
                                    f"in {where!r}", hint="check the stack effect of "
                                    "synthesized instructions")
            k += 1
    return best

