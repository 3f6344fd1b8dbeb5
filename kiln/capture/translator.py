"""The symbolic bytecode interpreter: runs a function's canonical instructions on trackers.

One `Translator` per Python frame being interpreted: the root frame (the compiled function) and
one child per inlined call. Handlers, one per canonical opcode and named after it, live in
`handlers_*.py` and are collected into `HANDLERS`. An operation that cannot be modelled raises
`Unsupported`; each frame it passes adds its current user line to the error.
"""
from __future__ import annotations

import logging
import sys
import types
from typing import TYPE_CHECKING, Any

from kiln.capture import _compat
from kiln.capture.bytecode import decode
from kiln.capture.bytecode.emit import NULL_ABOVE_CALLABLE
from kiln.capture.sources import ConstSource, Global, Item, Source
from kiln.capture.unsupported import Unsupported, unsupported
from kiln.capture.variables.base import VT, CellBox, LazyVT, NullVT
from kiln.diagnostics import UserLocation

if TYPE_CHECKING:
    from kiln.capture.bytecode import Instr
    from kiln.capture.output_graph import OutputGraph

__all__ = ["Translator", "HANDLERS", "StopAtBreak"]

_log = logging.getLogger("kiln.capture")

MAX_STEPS = 500_000
MAX_INLINE_DEPTH = 64
HANDLERS: dict[str, Any] = {}


class StopAtBreak(Exception):
    """The root frame reached the instruction chosen as a graph break (state is left intact)."""


class Translator:
    def __init__(self, code: types.CodeType, local_vars: dict[str, VT], cells: dict[str, CellBox],
                 fn_globals: dict, output: OutputGraph, parent: Translator | None = None,
                 fn_source: Source | None = None) -> None:
        self.code = code
        self.instructions: list[Instr] = decode(code)
        self.stack: list[VT] = []
        self.locals = local_vars
        self.cells = cells
        self.globals = fn_globals
        self.output = output
        self.parent = parent
        self.fn_source = fn_source
        self.depth = 0 if parent is None else parent.depth + 1
        self.ip = 0
        self.inst: Instr | None = None
        self.done = False
        self.result: VT | None = None
        self.yields: list[VT] | None = None
        self.steps = 0
        self.break_at: int | None = None  # root only: stop before this instruction (a break)

    # -- running -------------------------------------------------------------------------------
    def run(self) -> VT:
        previous = self.output.current_tx
        self.output.current_tx = self
        try:
            while not self.done:
                self.step()
        except Unsupported as err:
            err.frames.append(self.location())
            if self.parent is None:
                err.root_index = self.inst.index
            raise
        except StopAtBreak:
            raise
        except _compat.UnbackedGuardError as err:  # Python decided on a `nonzero` count, ...
            self._data_dependent(err)
        except Exception as err:  # a kiln bug: never crash the user's program over it
            _log.debug("internal error while capturing", exc_info=True)
            wrapped = Unsupported("internal-error", f"kiln failed while capturing: "
                                  f"{type(err).__name__}: {err}",
                                  hints=("this is a kiln bug; please report it with "
                                         "KILN_LOGS=graph_breaks output",))
            wrapped.frames.append(self.location())
            if self.parent is None:
                wrapped.root_index = self.inst.index
            raise wrapped from err
        finally:
            self.output.current_tx = previous
        return self.result

    def _data_dependent(self, err: BaseException) -> None:
        """A decision on a data-dependent size is a graph break, located like any other."""
        from kiln.capture.output_graph import unbacked_guard_break
        try:
            unbacked_guard_break(err)
        except Unsupported as wrapped:
            wrapped.frames.append(self.location())
            if self.parent is None:
                wrapped.root_index = self.inst.index
            raise wrapped from err

    def step(self) -> None:
        if self.ip == self.break_at:
            raise StopAtBreak()
        inst = self.instructions[self.ip]
        self.ip += 1
        self.inst = inst
        self.steps += 1
        if self.steps > MAX_STEPS:
            unsupported("too-many-steps", f"capture ran more than {MAX_STEPS} instructions "
                        "(an unbounded Python loop?)")
        handler = HANDLERS.get(inst.opname)
        if handler is None:
            unsupported("unsupported-opcode", f"opcode {inst.opname} is not supported on Python "
                        f"{sys.version_info.major}.{sys.version_info.minor}")
        handler(self, inst)

    def jump(self, target: Instr) -> None:
        self.ip = target.index

    # -- stack -----------------------------------------------------------------------------------
    def push(self, vt: VT) -> None:
        self.stack.append(vt)

    def pop(self) -> VT:
        return self.stack.pop()

    def push_callable(self, fn: VT) -> None:
        """`fn` with the NULL slot of a call without `self`, in the version's order (decode.py
        rule 14: [NULL, fn] on 3.11/3.12, [fn, NULL] on 3.13)."""
        if NULL_ABOVE_CALLABLE:
            self.stack += [fn, NullVT()]
        else:
            self.stack += [NullVT(), fn]

    def popn(self, n: int) -> list[VT]:
        if n == 0:
            return []
        items = self.stack[-n:]
        del self.stack[-n:]
        return items

    # -- names -----------------------------------------------------------------------------------
    def load_local(self, name: str) -> VT:
        try:
            vt = self.locals[name]
        except KeyError:
            unsupported("unbound-local", f"local variable {name!r} is not set",
                        category="user-fixable")
        if isinstance(vt, LazyVT):
            vt = vt.realize(self)
            self.locals[name] = vt
        return vt

    def load_cell(self, name: str) -> VT:
        box = self.cells.get(name)
        if box is None or box.value is None:
            unsupported("unbound-cell", f"free variable {name!r} is not set",
                        category="user-fixable")
        if isinstance(box.value, LazyVT):
            box.value = box.value.realize(self)
        return box.value

    def load_global(self, name: str) -> VT:
        from kiln.capture.rules import is_library_module
        from kiln.capture.variables.builder import wrap, wrap_derived
        pending = self.output.pending_globals.get((id(self.globals), name))
        if pending is not None:
            return pending
        if name in self.globals:
            value = self.globals[name]
            if self.parent is None:
                return wrap(self, value, Global(name))
            if is_library_module(self.globals.get("__name__", "") or ""):
                return wrap_derived(self, value)
            return wrap(self, value, Item(self.globals_source(), name))
        builtins_ns = self.globals.get("__builtins__", __builtins__)
        if isinstance(builtins_ns, types.ModuleType):
            builtins_ns = builtins_ns.__dict__
        if name in builtins_ns:
            return wrap_derived(self, builtins_ns[name])
        unsupported("missing-global", f"name {name!r} is not defined", category="user-fixable")

    def globals_source(self) -> Source:
        index = self.output.consts.index(self.globals)
        return ConstSource(index, f"{self.globals.get('__name__', '?')}.globals()")

    def store_global(self, name: str, value: VT) -> None:
        key = (id(self.globals), name)
        if key not in self.output.pending_globals:
            self.output.side_effects.append(("global", (self.globals, name)))
        self.output.pending_globals[key] = value

    # -- calls -----------------------------------------------------------------------------------
    def inline(self, code: types.CodeType, bound: dict[str, VT], closure: list[CellBox],
               fn_globals: dict, fn_source: Source | None) -> VT:
        child = self._child(code, bound, closure, fn_globals, fn_source)
        return child.run()

    def inline_generator(self, code: types.CodeType, bound: dict[str, VT],
                         closure: list[CellBox], fn_globals: dict) -> list[VT]:
        child = self._child(code, bound, closure, fn_globals, None)
        child.yields = []
        child.run()
        return child.yields

    def _child(self, code: types.CodeType, bound: dict[str, VT], closure: list[CellBox],
               fn_globals: dict, fn_source: Source | None) -> Translator:
        if self.depth >= MAX_INLINE_DEPTH:
            unsupported("inline-depth", f"calls nested deeper than {MAX_INLINE_DEPTH} levels "
                        "(recursion?)")
        cells = dict(zip(code.co_freevars, closure))
        return Translator(code, dict(bound), cells, fn_globals, self.output, self, fn_source)

    def zero_arg_super(self) -> VT:
        """`super()` inside a method: the `__class__` cell and the first argument."""
        from kiln.capture.variables.functions import SuperVT
        box = self.cells.get("__class__")
        if box is None or self.code.co_argcount == 0:
            unsupported("super", "super() without arguments outside a method",
                        category="user-fixable")
        first = self.code.co_varnames[0]
        self_vt = self.cells[first].value if first in self.cells else self.load_local(first)
        return SuperVT(self.load_cell("__class__").as_constant(), self_vt)

    # -- provenance ------------------------------------------------------------------------------
    def location(self) -> UserLocation:
        lineno = self.inst.lineno if self.inst is not None else None
        return UserLocation.from_code(self.code, lineno)

    def location_stack(self) -> list[UserLocation]:
        """Outermost first."""
        frames = []
        tx: Translator | None = self
        while tx is not None:
            frames.append(tx.location())
            tx = tx.parent
        return frames[::-1]


def register_handlers(module: types.ModuleType) -> None:
    for name, fn in vars(module).items():
        if name.isupper() and callable(fn):
            HANDLERS[name] = fn


def _load_handlers() -> None:
    from kiln.capture import handlers_calls, handlers_control, handlers_data, handlers_match
    for module in (handlers_calls, handlers_control, handlers_data, handlers_match):
        register_handlers(module)


_load_handlers()
