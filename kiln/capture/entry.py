"""Turn a finished trace into a cache entry: the graph's outputs, the Python source of the entry
function (read inputs, call the compiled graph, replay side effects, rebuild the result with the
caller's exact Python structure), and the FX GraphModule handed to the backend."""
from __future__ import annotations

import inspect
import types
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.fx

from kiln.capture.breaks import (CONTEXT_FACTORIES, STACK_PREFIX, ResumeLayout, resume_function,
                                 route, router_for)
from kiln.capture.guard_cse import share_reads
from kiln.capture.guards import Guard
from kiln.capture.handlers_calls import WithExitVT, call_operands
from kiln.capture.sources import Local, NumberTensor, Source, attr_expr
from kiln.capture.unsupported import unsupported
from kiln.capture.variables.base import (VT, ConstantVT, DeletedVT, LazyVT, NotConstant,
                                         NullVT)
from kiln.capture.variables.builtins import BuiltinVT, SpecialVT
from kiln.capture.variables.containers import BoundBuiltinMethod, DictVT, ListVT, SliceVT, TupleVT
from kiln.capture.variables.output_dict import OutputDictVT, build_output_dict
from kiln.capture.variables.functions import (BoundMethodVT, GeneratorVT, OpaqueCallableVT,
                                              TorchFunctionVT, UserFunctionVT)
from kiln.capture.variables.ndarray import NdarrayVT
from kiln.capture.variables.nn_module import ModuleVT
from kiln.capture.variables.objects import (AutocastVT, ClassVT, GradModeVT, NewObjectVT,
                                            OpaqueMethodVT, PythonModuleVT, UserObjectVT)
from kiln.capture.variables.number_tensors import TensorNumberVT, host_expression
from kiln.capture.variables.scalars import SymScalarVT
from kiln.capture.variables.tensor import TensorMethodVT, TensorVT

if TYPE_CHECKING:
    from kiln.capture.settings import CompileSettings
    from kiln.capture.output_graph import OutputGraph
    from kiln.capture.translator import Translator

__all__ = ["EntryCode", "build_entry_code", "build_break_entry_code", "new_object"]


def new_object(cls: type, attrs: dict[str, Any]) -> Any:
    """Rebuild an object created inside the graph region (dataclass or plain class)."""
    obj = cls.__new__(cls)
    for name, value in attrs.items():
        object.__setattr__(obj, name, value)
    return obj


def replace_dict(target: dict, contents: dict) -> None:
    target.clear()
    target.update(contents)


_CALLERS: dict[tuple, Callable[..., Any]] = {}


def called_from(filename: str, lineno: int, function: str, fn_globals: dict) -> Callable[..., Any]:
    """`caller(fn, *args, **kwargs)` calls `fn` from a frame at `filename:lineno`, in a function
    named `function` over `fn_globals`: a replayed logging call or warning finds the user's line
    as its caller (logging's `findCaller`, the warnings registry), as it does in eager, not
    kiln's entry. Made once per call site."""
    key = (filename, lineno, function, id(fn_globals))
    caller = _CALLERS.get(key)
    if caller is None:
        # the call on line `lineno` of a code object named after the user's file and function
        source = "\n" * (lineno - 1) + "def _at(__fn, *a, **k): return __fn(*a, **k)\n"
        outer = compile(source, filename, "exec")
        code = next(c for c in outer.co_consts if isinstance(c, types.CodeType))
        code = code.replace(co_name=function, co_qualname=function)
        caller = _CALLERS[key] = types.FunctionType(code, fn_globals, function)
    return caller


class EntryCode:
    """Lines of an entry function body, plus the graph module and whether it must be called."""

    def __init__(self, body: list[str], gm: torch.fx.GraphModule | None,
                 example_inputs: list[torch.Tensor]) -> None:
        self.body = body
        self.gm = gm
        self.example_inputs = example_inputs


class _Rebuilder:
    def __init__(self, output: OutputGraph) -> None:
        self.output = output
        self.consts = output.consts
        self.input_source = {inp.node: inp.source for inp in output.inputs}
        self.outputs: list[torch.fx.Node] = []
        self._made: dict[int, str] = {}  # objects created again at a break, by tracker id
        self.prelude: list[str] = []  # statements creating them, run right after the graph
        self._out_index: dict[torch.fx.Node, int] = {}
        self._reads: dict[Source, str] = {}  # sources read into locals before the side effects

    def _read(self, source: Source) -> str:
        """`source`'s value as the traced code read it. Side effects replay after the graph call
        and may rebind where a value came from (`t = self.buf; self.buf = x * 2; return t`
        returns the old buffer; `self.a, self.b = self.b, self.a` swaps): such a source is read
        into a local right after the call, before the effects. Frame arguments cannot be
        rebound by them, and without side effects nothing can."""
        if not self.output.side_effects or isinstance(source, Local):
            return source.expr()
        name = self._reads.get(source)
        if name is None:
            name = self._reads[source] = f"__read{len(self._reads)}"
            self.prelude.insert(len(self._reads) - 1, f"{name} = {source.expr()}")
        return name

    def _number_input(self, node: torch.fx.Node) -> str | None:
        """The Python number a number input's placeholder was made from, None for another."""
        source = self.input_source.get(node)
        return self._read(source.base) if isinstance(source, NumberTensor) else None

    def expr(self, vt: VT) -> str:
        if isinstance(vt, LazyVT):
            return self._read(vt.source)
        if isinstance(vt, TensorNumberVT):  # a Python number again
            host = host_expression(vt.node, self._number_input, self.consts.literal_or_ref)
            return host if host is not None else f"{self._node(vt.node)}.item()"
        if isinstance(vt, (TensorVT, SymScalarVT)):
            return self._node(vt.node)
        if isinstance(vt, NdarrayVT):
            return self._ndarray(vt)
        if isinstance(vt, ConstantVT) and type(vt.value) is set:
            return self._set(vt)
        if isinstance(vt, ConstantVT):
            return self.consts.literal_or_ref(vt.value)
        if isinstance(vt, TupleVT):
            return self._tuple(vt)
        if isinstance(vt, ListVT):
            if vt.source is not None:
                return self._read(vt.source)
            return "[" + ", ".join(self.expr(i) for i in vt.items) + "]"
        if isinstance(vt, DictVT):
            if vt.source is not None:
                return self._read(vt.source)
            return self._dict_literal(vt)
        if isinstance(vt, BoundMethodVT):
            return f"{self.expr(vt.fn)}.__get__({self.expr(vt.self_vt)})"
        if isinstance(vt, TensorMethodVT):
            return attr_expr(self.expr(vt.tensor), vt.name)
        if isinstance(vt, (BoundBuiltinMethod, OpaqueMethodVT)):
            return attr_expr(self.expr(vt.owner), vt.name)
        if isinstance(vt, GeneratorVT):
            return self._generator(vt)
        if isinstance(vt, SliceVT):
            return f"slice({self.expr(vt.start)}, {self.expr(vt.stop)}, {self.expr(vt.step)})"
        if isinstance(vt, OutputDictVT):  # the class's own __init__ rebuilds its items
            items = self._dict_literal(DictVT({k: vt.values[k] for k in vt.keys}))
            return f"{self.consts.ref(build_output_dict)}({self.consts.ref(vt.cls)}, {items})"
        if isinstance(vt, NewObjectVT):
            attrs = self._dict_literal(DictVT(vt.attrs))
            return f"{self.consts.ref(new_object)}({self.consts.ref(vt.cls)}, {attrs})"
        if isinstance(vt, (ModuleVT, UserObjectVT, PythonModuleVT, ClassVT, UserFunctionVT,
                           TorchFunctionVT, BuiltinVT, SpecialVT, OpaqueCallableVT)) or \
                vt.is_constant():
            if vt.source is not None:
                return self._read(vt.source)
            return self.consts.ref(vt.as_constant())
        unsupported("output-value", f"returning or storing {vt.describe()} out of a compiled "
                    "region is not supported yet",
                    hint="keep such values (generators, functions made inside, iterators) "
                         "inside the compiled code, or create them outside it")

    def _set(self, vt: ConstantVT) -> str:
        """A set the traced code built (sets are constants during capture): a fresh copy per
        call, made once per entry, so the caller never shares the compile-time object."""
        key = id(vt.value)  # trackers of one set share its copy
        name = self._made.get(key)
        if name is None:
            name = self._made[key] = f"__made{len(self._made)}"
            self.prelude.append(f"{name} = {self.consts.ref(vt.value)}.copy()")
        return name

    def _generator(self, vt: GeneratorVT) -> str:
        """A generator the traced code created but did not start: create it again (once)."""
        if vt.items is not None or not isinstance(vt.fn, UserFunctionVT):
            unsupported("output-value", "a generator that capture already started cannot be "
                        "handed to Python code", hint="consume generators with for/list/tuple "
                        "inside the compiled code, or create them outside it")
        name = self._made.get(id(vt))
        if name is not None:
            return name
        name = self._made[id(vt)] = f"__made{len(self._made)}"
        code = vt.fn.code()
        flags = code.co_flags
        names = code.co_varnames
        npos, nkw = code.co_argcount, code.co_kwonlyargcount
        parts = [self.expr(vt.bound[n]) for n in names[:npos]]
        index = npos + nkw
        if flags & inspect.CO_VARARGS:
            parts.append(f"*{self.expr(vt.bound[names[index]])}")
            index += 1
        parts += [f"{n}={self.expr(vt.bound[n])}" for n in names[npos:npos + nkw]]
        if flags & inspect.CO_VARKEYWORDS:
            parts.append(f"**{self.expr(vt.bound[names[index]])}")
        self.prelude.append(f"{name} = {self.consts.ref(vt.fn.fn)}({', '.join(parts)})")
        return name

    def _ndarray(self, vt: NdarrayVT) -> str:
        """A traced NumPy array as a real one: `tensor.numpy()` of its graph value (sharing its
        memory, as in eager), made once per entry so every use sees the same object."""
        name = self._made.get(id(vt))
        if name is None:
            name = self._made[id(vt)] = f"__made{len(self._made)}"
            scalar = "[()]" if vt.scalar else ""
            self.prelude.append(f"{name} = {self._node(vt.tensor.node)}.numpy(){scalar}")
        return name

    def _node(self, node: torch.fx.Node) -> str:
        if node in self.input_source:  # an input returned as is keeps its identity
            return self._read(self.input_source[node])
        if node not in self._out_index:
            self._out_index[node] = len(self.outputs)
            self.outputs.append(node)
        return f"__o[{self._out_index[node]}]"

    def _tuple(self, vt: TupleVT) -> str:
        inner = "".join(f"{self.expr(i)}, " for i in vt.items)
        if vt.cls is tuple:
            return f"({inner})"
        if hasattr(vt.cls, "_fields"):
            return f"{self.consts.ref(vt.cls)}({inner})"
        return f"{self.consts.ref(vt.cls)}(({inner}))"

    def _dict_literal(self, vt: DictVT) -> str:
        pairs = ", ".join(f"{self.consts.literal_or_ref(k)}: {self.expr(v)}"
                          for k, v in vt.items.items())
        return "{" + pairs + "}"

    def side_effect_lines(self) -> list[str]:
        lines = []
        for kind, payload in self.output.side_effects:
            lines.extend(getattr(self, f"_replay_{kind}")(payload))
        return lines

    def _replay_attrs(self, obj: VT) -> list[str]:
        target = obj.source.expr()
        # a deletion (the class's plain __delattr__: see check_deletable) leaves the name out of
        # the instance dict; it was absent already if the trace had set it first
        return [f"if {name!r} in {target}.__dict__: delattr({target}, {name!r})"
                if isinstance(value, DeletedVT) else
                f"setattr({target}, {name!r}, {self.expr(value)})"
                for name, value in obj.pending.items()]

    def _replay_container(self, vt: VT) -> list[str]:
        target = vt.source.expr()
        if isinstance(vt, ListVT):
            return [f"{target}[:] = [{', '.join(self.expr(i) for i in vt.items)}]"]
        return [f"{self.consts.ref(replace_dict)}({target}, {self._dict_literal(vt)})"]

    def _replay_global(self, payload: tuple[dict, str]) -> list[str]:
        fn_globals, name = payload
        value = self.output.pending_globals[(id(fn_globals), name)]
        return [f"{self.consts.ref(fn_globals)}[{name!r}] = {self.expr(value)}"]

    def _replay_log(self, payload: tuple[VT, list[VT], dict[str, VT], Any, dict]) -> list[str]:
        # called natively (lru_cache helpers keep their cache), from the user's line
        callee, args, kwargs, where, fn_globals = payload
        caller = called_from(where.filename, where.lineno, where.function, fn_globals)
        parts = [self.expr(callee)] + [self.expr(a) for a in args] + \
            [f"{k}={self.expr(v)}" for k, v in kwargs.items()]
        return [f"{self.consts.ref(caller)}({', '.join(parts)})"]

    def _replay_cell(self, box: Any) -> list[str]:
        target = box.source.expr()
        if box.value is None:  # `del` (DELETE_DEREF): the cell may have been empty already
            return [f"{target} = None", f"del {target}"]
        return [f"{target} = {self.expr(box.value)}"]


def build_entry_code(output: OutputGraph, result: VT) -> EntryCode:
    rebuild = _Rebuilder(output)
    effects = rebuild.side_effect_lines()
    result_expr = rebuild.expr(result)
    return _finish(output, rebuild, [*effects, f"return {result_expr}"])


def _finish(output: OutputGraph, rebuild: _Rebuilder, tail: list[str]) -> EntryCode:
    """Close the graph over the values `tail` reads and put the graph call in front of it."""
    tail = [*rebuild.prelude, *tail]
    output.drop_dead_sizes(rebuild.outputs)
    if output.call_count() == 0:
        return EntryCode(tail, None, [])
    output.graph.output(tuple(rebuild.outputs))
    gm = torch.fx.GraphModule(torch.nn.Module(), output.graph, class_name="CapturedGraph")
    args = ", ".join(inp.source.expr() for inp in output.inputs)
    # the inputs' paths share prefixes (`self._modules['h']._modules['0']...` for each of a
    # layer's parameters): each prefix read once per call, left to right as arguments evaluate
    return EntryCode([f"__o = {share_reads(f'__graph({args})')}", *tail], gm,
                     [inp.example for inp in output.inputs])


def build_break_entry_code(output: OutputGraph, tx: Translator, fn: types.FunctionType,
                           settings: CompileSettings) -> EntryCode:
    """The entry for a graph break before instruction `tx.break_at` of the compiled frame: run
    the graph, replay side effects, run that instruction natively inside the active `with`
    blocks, and continue in the compiled resume function(s)."""
    inst = tx.instructions[tx.break_at]
    _guard_frame_identity(output, fn)
    withs = [v.ctx for v in tx.stack if isinstance(v, WithExitVT)]
    for ctx in reversed(withs):  # the graph leaves every `with` block it is inside
        ctx.exit(tx)
    rebuild = _Rebuilder(output)
    lines = rebuild.side_effect_lines()
    is_call = inst.opname in ("CALL", "CALL_FUNCTION_EX", *NATIVE_VALUE_OPS)
    used = _names_read_after(tx.instructions, tx.break_at + 1 if is_call else
                             min(tx.break_at + 1, inst.target.index))
    if "__class__" in tx.code.co_freevars and tx.code.co_argcount:
        # a zero-arg super() later reads the first argument without a LOAD_FAST (3.11), and
        # expects it first in the resume function's locals too (live keeps varnames order)
        used.add(tx.code.co_varnames[0])
    live_locals = [n for n in tx.code.co_varnames if n in tx.locals and n in used and n not in
                   tx.code.co_cellvars and not isinstance(tx.locals[n], NullVT)
                   and not n.startswith(STACK_PREFIX)]
    live_cells = [n for n in tx.code.co_cellvars if n in tx.cells and n in used
                  and tx.cells[n].value is not None]
    live = tuple(live_locals + live_cells)
    live_exprs = [rebuild.expr(tx.locals[n]) for n in live_locals]
    live_exprs += [rebuild.expr(tx.cells[n].value) for n in live_cells]

    def resume_call(target: int, stack: list[VT], extra: list[str]) -> str:
        slots = tuple(_slot(v) for v in stack) + ("value",) * len(extra)
        layout = ResumeLayout(tx.code, target, slots, live)
        resume = resume_function(fn, layout, settings)
        values = [rebuild.expr(v) for v, slot in zip(stack, slots) if slot == "value"]
        args = ", ".join([*live_exprs, *values, *extra])
        return f"{rebuild.consts.ref(resume)}({args})"

    if inst.opname == "CALL":
        nargs, kwnames = inst.argval
        below = tx.stack[:len(tx.stack) - nargs - 2]
        call = _native_call(rebuild, tx.stack[len(below):], kwnames, settings)
        lines.extend(_inside_withs(rebuild, withs, f"__r = {call}"))
        lines.append(f"return {resume_call(tx.break_at + 1, below, ['__r'])}")
    elif inst.opname in NATIVE_VALUE_OPS:
        count, render = NATIVE_VALUE_OPS[inst.opname]
        below, operands = tx.stack[:-count], [rebuild.expr(v) for v in tx.stack[-count:]]
        value = render(rebuild, inst, *operands)
        lines.extend(_inside_withs(rebuild, withs, f"__r = {value}"))
        lines.append(f"return {resume_call(tx.break_at + 1, below, ['__r'])}")
    elif inst.opname == "CALL_FUNCTION_EX":
        below, call = _native_call_ex(rebuild, tx.stack, inst.arg & 1, settings)
        lines.extend(_inside_withs(rebuild, withs, f"__r = {call}"))
        lines.append(f"return {resume_call(tx.break_at + 1, below, ['__r'])}")
    else:
        cond, below = tx.stack[-1], tx.stack[:-1]
        test = _BRANCH_TESTS[inst.opname].format(rebuild.expr(cond))
        lines.append(f"if {test}:")
        lines.append(f"    return {resume_call(inst.target.index, below, [])}")
        lines.append(f"return {resume_call(tx.break_at + 1, below, [])}")
    return _finish(output, rebuild, lines)


def _guard_frame_identity(output: OutputGraph, fn: types.FunctionType) -> None:
    """A break entry calls a resume function made with `fn`'s closure and globals. Functions
    sharing one code object (every function a decorator wrapped) share the cache, so the entry
    may only run for a function holding these very cells and globals."""
    consts = output.consts
    if fn.__closure__:
        output.guards.add(Guard("__cells", "is", consts.ref(fn.__closure__), fn.__closure__,
                                f"{fn.__qualname__}.__closure__", "closure",
                                display=f"{fn.__qualname__}.__closure__ is the one seen at "
                                        "compile time"))
    output.guards.add(Guard("__G", "is", consts.ref(fn.__globals__), fn.__globals__,
                            f"{fn.__qualname__}.__globals__", "globals",
                            display=f"{fn.__qualname__}.__globals__ is the module seen at "
                                    "compile time"))


_READS = ("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_AND_CLEAR", "DELETE_FAST", "LOAD_DEREF",
          "LOAD_CLOSURE", "STORE_DEREF", "DELETE_DEREF")


def _names_read_after(instrs: list, start: int) -> set[str]:
    """Variables the code may still use from instruction `start` on. Breaks never resume inside
    a loop, so everything reachable from `start` lies after it: a conservative liveness."""
    return {i.argval for i in instrs[start:] if i.opname in _READS}


_BRANCH_TESTS = {"POP_JUMP_IF_TRUE": "{}", "POP_JUMP_IF_FALSE": "not {}",
                 "POP_JUMP_IF_NONE": "{} is None", "POP_JUMP_IF_NOT_NONE": "{} is not None"}


def _slot(vt: VT) -> Any:
    if isinstance(vt, NullVT):
        return "null"
    if isinstance(vt, WithExitVT):
        return ("with", *_context_factory(vt.ctx))
    return "value"


def _context_factory(ctx: VT) -> tuple[str, tuple]:
    if isinstance(ctx, GradModeVT):
        return "grad", (ctx.enabled,)
    if isinstance(ctx, AutocastVT):
        return "autocast", (ctx.device, ctx.dtype, ctx.enabled, ctx.cache)
    unsupported("break-in-context", f"a graph break inside `with {ctx.describe()}` cannot "
                "re-enter that context", hint="move the unsupported code out of the with block")


def _inside_withs(rebuild: _Rebuilder, withs: list[VT], line: str) -> list[str]:
    lines = []
    for depth, ctx in enumerate(withs):
        key, args = _context_factory(ctx)
        factory = rebuild.consts.ref(CONTEXT_FACTORIES[key])
        lines.append("    " * depth + f"with {factory}(*{rebuild.consts.ref(args)}):")
    lines.append("    " * len(withs) + line)
    return lines


def _native_call(rebuild: _Rebuilder, operands: list[VT], kwnames: tuple[str, ...],
                 settings: CompileSettings) -> str:
    first, second, *args = operands
    callee, args = call_operands(first, second, args)
    npos = len(args) - len(kwnames)
    parts = [rebuild.expr(a) for a in args[:npos]]
    parts += [f"{k}={rebuild.expr(v)}" for k, v in zip(kwnames, args[npos:])]
    return f"{_callee_expr(rebuild, callee, settings)}({', '.join(parts)})"


def _binary_op(rebuild: _Rebuilder, inst: Any, a: str, b: str) -> str:
    from kiln.capture.handlers_data import _BINARY
    return f"{rebuild.consts.ref(_BINARY[inst.argval])}({a}, {b})"


# Instructions other than calls and branches that a break runs natively before resuming:
# opname -> (stack operands, how to spell the operation on their expressions).
NATIVE_VALUE_OPS: dict[str, tuple[int, Callable[..., str]]] = {
    "BINARY_SUBSCR": (2, lambda rebuild, inst, obj, key: f"{obj}[{key}]"),
    "BINARY_OP": (2, _binary_op),
    "CONTAINS_OP": (2, lambda rebuild, inst, item, obj:
                    f"({item} {'not in' if inst.arg else 'in'} {obj})"),
    "LOAD_ATTR": (1, lambda rebuild, inst, obj: f"getattr({obj}, {inst.argval!r})"),
}


def _native_call_ex(rebuild: _Rebuilder, stack: list[VT], has_kwargs: int,
                    settings: CompileSettings) -> tuple[list[VT], str]:
    """`f(*args, **kwargs)` at a break: the stack below [NULL, f, args, (kwargs)] (3.13:
    [f, NULL, args, (kwargs)]) and the call."""
    count = 3 if has_kwargs else 2
    callee, args, *kwargs = stack[-count:]
    below = stack[:-count]
    if isinstance(callee, NullVT):
        callee, below = below[-1], below[:-1]
    elif below and isinstance(below[-1], NullVT):
        below = below[:-1]
    star = f"**{rebuild.expr(kwargs[0])}" if kwargs else ""
    return below, f"{_callee_expr(rebuild, callee, settings)}(*{rebuild.expr(args)}, {star})"


def _callee_expr(rebuild: _Rebuilder, callee: VT, settings: CompileSettings) -> str:
    """The callable at a break, routed through kiln when it is user code (it gets its own
    graphs, and its own breaks)."""
    if isinstance(callee, BoundMethodVT):
        fn = _callee_expr(rebuild, callee.fn, settings)
        return f"{fn}.__get__({rebuild.expr(callee.self_vt)})"
    if isinstance(callee, (TensorMethodVT, BoundBuiltinMethod, OpaqueMethodVT)):
        return rebuild.expr(callee)
    try:
        value = callee.as_constant()
    except NotConstant:
        return rebuild.expr(callee)
    if callee.source is not None:
        # routed at run time from where it is read: an entry shared by instances of one class
        # (guards.InstanceSlot) must call this instance's submodule, not the first one's
        router = rebuild.consts.ref(router_for(settings).route)
        return f"{router}({callee.source.expr()})"
    return rebuild.consts.ref(route(value, settings))
