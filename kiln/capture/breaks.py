"""Graph breaks: where capture may stop mid-function and resume in a new, compiled function.

At an instruction capture cannot handle, the entry (see `entry.py`) calls the graph built so far,
replays side effects, runs that one instruction natively (a call or a data-dependent branch) and
returns `resume(...)`. A resume function is a copy of the function's canonical instructions with a
prefix that rebuilds the operand stack (re-entering active `with` blocks) and jumps to the next
instruction; it takes the stack values and live locals as arguments and is itself compiled by
kiln, once per break point (cached here by its layout), through `compile_hook`: the frame compiler
(`convert.py`) sits above this file.

Where resuming is unsafe (inside a loop or a `try`, or with cells the resume cannot share), the
function has no graph of its own and runs a route-only copy (`route_only`): its calls of user
code go through a `Router`, so what it calls is still compiled; `skip.py` drops that copy for
the original code where nothing beneath the frame is compiled.
"""
from __future__ import annotations

import dataclasses
import inspect
import types
from typing import TYPE_CHECKING, Any, Callable

import torch

from kiln.capture import compile_hook
from kiln.capture.bytecode import Instr, assemble, decode, decode_fresh, emit
from kiln.capture.distributed import routes_through
from kiln.capture.module_wrapper import CompiledModule
from kiln.capture.rules import DISABLED, is_library_module
from kiln.capture.unsupported import unsupported

if TYPE_CHECKING:
    from kiln.capture.settings import CompileSettings

__all__ = ["STACK_PREFIX", "ResumeLayout", "Router", "check_resumable", "resume_function",
           "route", "route_only", "router_for", "CONTEXT_FACTORIES"]

STACK_PREFIX = "___stack"  # resume arguments holding stack values (dead once the prefix ran)
_BRANCHES = ("POP_JUMP_IF_TRUE", "POP_JUMP_IF_FALSE", "POP_JUMP_IF_NONE", "POP_JUMP_IF_NOT_NONE")
# Value instructions a break can run natively (entry.NATIVE_VALUE_OPS), then resume after.
_VALUE_OPS = ("BINARY_SUBSCR", "BINARY_OP", "CONTAINS_OP", "LOAD_ATTR")
_RESUMABLE = ("CALL", "CALL_FUNCTION_EX", *_BRANCHES, *_VALUE_OPS)


@dataclasses.dataclass(frozen=True)
class ResumeLayout:
    """What a resume function receives and rebuilds.

    `stack` describes each operand-stack slot bottom to top: "value" (an argument), "null" (a
    NULL slot) or ("with", factory_key, args) (a `with` block to re-enter: its `__exit__` slot).
    `live` are the local names passed after the stack values, in the original varnames order."""

    code: types.CodeType
    target: int
    stack: tuple
    live: tuple[str, ...]


def check_resumable(code: types.CodeType, index: int, value_ops: bool = True) -> None:
    """Raise Unsupported (with the reason) if capture cannot break and resume at `index`.
    `value_ops=False` refuses the value instructions too (after NumPy tracing the retrace with
    `.numpy()` breaking is better: arrays handed to a resume function are not traced)."""
    instrs = decode(code)
    inst = instrs[index]
    if inst.opname not in _RESUMABLE or inst.opname == "LOAD_ATTR" and inst.method or \
            not value_ops and inst.opname in _VALUE_OPS:
        unsupported("no-resume-here", f"capture cannot resume after {inst.opname} yet")
    if code.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR):
        unsupported("no-resume-generator", "graph breaks inside generators are not supported")
    for other in instrs:  # any backward jump (loop latch) around the break
        if other.target is not None and other.target.index <= index <= other.index and \
                other.target.index < other.index:
            unsupported("break-in-loop", "a graph break inside a loop would resume mid-loop",
                        hint="move the unsupported code out of the loop")
    if inst.exn is not None and not _is_with_region(instrs, inst):
        unsupported("break-in-try", "a graph break inside a try block is not supported",
                    hint="move the unsupported code out of the try block")


def _is_with_region(instrs: list[Instr], inst: Instr) -> bool:
    handler = inst.exn.target.index
    ops = [i.opname for i in instrs[handler:handler + 3]]
    return "WITH_EXCEPT_START" in ops


_resume_codes: dict[ResumeLayout, types.CodeType] = {}
_resume_fns: dict[tuple, Callable] = {}


def resume_function(fn: types.FunctionType, layout: ResumeLayout,
                    settings: CompileSettings) -> Callable:
    """The compiled resume function for `layout` (one per break point and layout)."""
    key = (layout, settings.key(), closure_key(fn), id(fn.__globals__))
    compiled = _resume_fns.get(key)
    if compiled is None:
        code = _resume_codes.get(layout)
        if code is None:
            code = _resume_codes[layout] = _build_resume_code(layout)
        resume = types.FunctionType(code, fn.__globals__, code.co_name, None, fn.__closure__)
        compiled = _resume_fns[key] = compile_hook.compile_function(resume, settings)
    return compiled


def closure_key(fn: types.FunctionType) -> tuple[int, ...]:
    """The identity of `fn`'s cells (cells are unhashable). Stable while cached: the resume
    function made for them holds the same cells, so their ids are not reused."""
    return tuple(id(cell) for cell in fn.__closure__ or ())


def clear_break_caches() -> None:
    _resume_codes.clear()
    _resume_fns.clear()
    _route_only_codes.clear()
    _routers.clear()


def _build_resume_code(layout: ResumeLayout) -> types.CodeType:
    code = layout.code
    body = decode_fresh(code)
    target = body[layout.target]
    stack_args = [f"{STACK_PREFIX}{i}" for i, slot in enumerate(layout.stack) if slot == "value"]
    prefix: list[Instr] = []
    if code.co_freevars:
        prefix.append(Instr("COPY_FREE_VARS", len(code.co_freevars), len(code.co_freevars)))
    # cellvars arrive as plain arguments (their current values) and are made cells again, as
    # CPython does for an argument captured by an inner function
    prefix.extend(Instr("MAKE_CELL", None, name) for name in code.co_cellvars)
    prefix.append(Instr("RESUME", 0, 0))
    names = iter(stack_args)
    for slot in layout.stack:
        if slot == "null":
            prefix.append(emit.push_null())
        elif slot == "value":
            prefix.append(emit.load_fast(next(names)))
        else:
            prefix.extend(_reenter(slot))
    prefix.append(emit.jump(target))
    emit.at(prefix, target)
    line = target.lineno or code.co_firstlineno
    name = f"__resume_at_{line}_in_{code.co_name}"
    args = list(layout.live) + stack_args
    flags = code.co_flags & ~(inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
    return assemble(prefix + body, code, co_argcount=len(args), co_posonlyargcount=0,
                    co_kwonlyargcount=0, co_varnames=tuple(args), co_flags=flags, co_name=name,
                    co_qualname=name)


def _reenter(slot: tuple) -> list[Instr]:
    """Build a fresh context manager and enter it; leaves its `__exit__` on the stack."""
    _, factory_key, args = slot
    factory = CONTEXT_FACTORIES[factory_key]
    instrs = emit.callable_with_null([emit.load_const(factory)])
    instrs.extend(emit.load_const(a) for a in args)
    instrs += [emit.call(len(args)), Instr("BEFORE_WITH"), emit.pop_top()]
    return instrs


CONTEXT_FACTORIES: dict[str, Any] = {
    "grad": torch.set_grad_enabled,
    "autocast": torch.autocast,
}


# -- routing: calls made natively at a break still go through kiln ------------------------------
# Callables route() always returns unchanged: C functions and methods (tensor methods, torch
# ops, builtins). Checked by exact type first: most calls a route-only frame makes are these.
_NEVER_ROUTED = (types.BuiltinFunctionType, types.MethodWrapperType,
                 types.WrapperDescriptorType, types.MethodDescriptorType, type)


class Router:
    """Where compiled code sends the callables it calls natively, for one compile settings:
    user functions, methods and modules to kiln-compiled stand-ins, everything else unchanged.

    Answers are cached per function object and per module instance, so a routed call costs a
    type test and a dictionary lookup (hashing the settings on every call cost more)."""

    def __init__(self, settings: CompileSettings) -> None:
        self.settings = settings
        self.functions: dict[types.FunctionType, Callable] = {}
        self.modules: dict[int, Any] = {}  # id -> CompiledModule (held until kiln.reset())

    def route(self, value: Any) -> Any:
        """A kiln-compiled stand-in for a user function, method or module called at a break."""
        kind = type(value)
        if kind in _NEVER_ROUTED:
            return value
        if kind is types.FunctionType:  # the answer for a function object never changes
            known = self.functions.get(value)
            if known is None:
                known = self.functions[value] = self._resolve(value)
            return known
        module = self.modules.get(id(value))
        if module is not None and module._orig_mod is value:
            return module
        return self._resolve(value)

    def _resolve(self, value: Any) -> Any:
        if id(value) in DISABLED:
            return value
        if isinstance(value, types.MethodType) and isinstance(value.__func__, types.FunctionType):
            return types.MethodType(self.route(value.__func__), value.__self__)
        if isinstance(value, CompiledModule):  # compiled already (a layer sharded after it)
            return value
        if isinstance(value, torch.nn.Module):
            module = self.modules[id(value)] = CompiledModule(value, self.settings)
            return module
        if isinstance(value, types.FunctionType) and (
                not is_library_module(value.__module__ or "") or routes_through(value)):
            return compile_hook.compile_function(value, self.settings)
        return value

    def call(self, fn: Any, args: tuple, kwnames: tuple) -> Any:
        """A call site of a route-only copy whose callable is not a C callable."""
        target = self.route(fn)
        if not kwnames:
            return target(*args)
        npos = len(args) - len(kwnames)
        return target(*args[:npos], **dict(zip(kwnames, args[npos:])))

    def call_ex(self, operands: tuple) -> Any:
        """`f(*args, **kwargs)` in a route-only copy: operands (f, args[, kwargs])."""
        fn, args, *kwargs = operands
        return self.route(fn)(*args, **(kwargs[0] if kwargs else {}))

    def call_ex_parts(self, fn: Any, rest: tuple) -> Any:
        """3.13's `f(*args, **kwargs)` in a route-only copy: rest = (args[, kwargs])."""
        return self.call_ex((fn, *rest))


_routers: dict[tuple, Router] = {}


def router_for(settings: CompileSettings) -> Router:
    router = _routers.get(settings.key())
    if router is None:
        router = _routers[settings.key()] = Router(settings)
    return router


def route(value: Any, settings: CompileSettings) -> Any:
    """A kiln-compiled stand-in for a user function, method or module called at a break."""
    return router_for(settings).route(value)


# -- route-only code: a frame kiln cannot capture still compiles what it calls -------------------
_route_only_codes: dict[tuple, types.CodeType] = {}


def route_only(fn: types.FunctionType, settings: CompileSettings) -> Callable:
    """`fn` with every call site sending its callable through `route` (no graph of its own).

    Method-form loads become plain loads plus a NULL, so every call has [NULL, callable, args];
    each `CALL n` then checks the callable's type inline: C callables (most calls: tensor
    methods, torch ops, builtins) are called natively, others are packed with their arguments
    into `Router.call(callable, args, kwnames)`."""
    key = (fn.__code__, settings.key())
    new_code = _route_only_codes.get(key)
    if new_code is None:
        new_code = _route_only_codes[key] = _build_route_only_code(fn.__code__,
                                                                   router_for(settings))
    routed = types.FunctionType(new_code, fn.__globals__, fn.__name__, fn.__defaults__,
                                fn.__closure__)
    routed.__kwdefaults__ = fn.__kwdefaults__
    return routed


def _build_route_only_code(code: types.CodeType, router: Router) -> types.CodeType:
    instrs = decode_fresh(code)
    out: list[Instr] = []
    for inst in instrs:
        out.append(inst)
        if inst.opname in ("LOAD_ATTR", "LOAD_SUPER_ATTR") and inst.method:
            inst.method = False  # [attr] then its NULL slot: no call gets a `self` slot
            out.extend(_like(inst, emit.null_for_loaded_callable()))
        elif inst.opname == "CALL_FUNCTION_EX":
            out.extend(_route_call_ex(inst, router))
        elif inst.opname == "CALL" and not _is_with_exit_call(out) and \
                not _is_comprehension_call(out) and not _is_zero_arg_super(out):
            out.extend(_route_call(inst, router))
    return assemble(out, code)


_NEVER_ROUTED_SET = frozenset(_NEVER_ROUTED)


def _route_call(inst: Instr, router: Router) -> list[Instr]:
    """[NULL, f, args] (3.13: [f, NULL, args]) CALL n: `type(f) in _NEVER_ROUTED_SET` decides,
    inline, between the native CALL and `router.call(f, (args), kwnames)`. `inst` (already
    emitted) keeps its identity (jump targets, exception entry): it becomes the first
    instruction of the check."""
    nargs, kwnames = inst.argval
    above = int(emit.NULL_ABOVE_CALLABLE)  # 3.13: the call's NULL lies between f and args
    native, packed, join = emit.call(nargs, kwnames), emit.build_tuple(nargs), emit.nop()
    check = [*emit.callable_with_null([emit.load_const(type)]), emit.copy(nargs + 3 + above),
             emit.call(1), emit.load_const(_NEVER_ROUTED_SET), Instr("CONTAINS_OP", 0, 0),
             emit.pop_jump_if(False, packed), native, emit.jump(join)]
    # [slot, slot, (args)] -> [router.call with its NULL, f, (args), kwnames]
    routed = [packed, emit.load_const(router.call), emit.swap(3 + above), emit.swap(2),
              emit.load_const(tuple(kwnames)), emit.call(3), join]
    first = check.pop(0)
    inst.opname, inst.arg, inst.argval = first.opname, first.arg, first.argval
    return _like(inst, check + routed)


def _route_call_ex(inst: Instr, router: Router) -> list[Instr]:
    """`f(*args, **kwargs)`: [NULL, f, args, (kwargs)] packed into one tuple and handed to
    `Router.call_ex`, which routes `f` (every version pushes the NULL here). 3.13's
    [f, NULL, args, (kwargs)]: only (args, (kwargs)) are packed, and `f` joins them in
    `Router.call_ex_parts`."""
    count = 3 if inst.arg & 1 else 2
    if not emit.NULL_ABOVE_CALLABLE:
        inst.opname, inst.arg, inst.argval = "BUILD_TUPLE", count, count
        return _like(inst, [emit.load_const(router.call_ex), emit.swap(2), emit.call(1)])
    inst.opname, inst.arg, inst.argval = "BUILD_TUPLE", count - 1, count - 1
    return _like(inst, [emit.load_const(router.call_ex_parts), emit.swap(4), emit.swap(2),
                        emit.call(2)])


def _is_with_exit_call(emitted: list[Instr]) -> bool:
    """`__exit__(None, None, None)` at the end of a with block: [exit, None, None, None] CALL 2
    has no NULL slot, so it must not be rewritten."""
    before = emitted[-4:-1]
    return len(before) == 3 and all(i.opname == "LOAD_CONST" and i.argval is None for i in before)


def _is_comprehension_call(emitted: list[Instr]) -> bool:
    """`[function, iterator] CALL 0` runs a comprehension or generator expression (3.11, and
    generator expressions on 3.12): the function sits where a method would, with no NULL slot,
    so the call must stay as it is. A call with no arguments right after GET_ITER is only ever
    this (a loop's GET_ITER is followed by FOR_ITER)."""
    nargs, kwnames = emitted[-1].argval
    return nargs == 0 and not kwnames and len(emitted) >= 2 and emitted[-2].opname == "GET_ITER"


def _is_zero_arg_super(emitted: list[Instr]) -> bool:
    """`super()` finds `__class__` and the first argument in the frame that calls it: called
    through `Router.call` it would look in the wrong frame, so it stays a native call."""
    nargs, _ = emitted[-1].argval
    return nargs == 0 and len(emitted) >= 2 and emitted[-2].opname == "LOAD_GLOBAL" and \
        emitted[-2].argval == "super"


def _like(model: Instr, instrs: list[Instr]) -> list[Instr]:
    emit.at(instrs, model)
    for instr in instrs:
        instr.exn = model.exn
    return instrs
