"""printer: an IR graph as runnable Python.

`print_graph(graph)` writes a module whose `call(*inputs)` runs the graph: each `ComputedBuffer`
becomes a body function (the `inner_fn` replayed through the `Printer` ops handler, one `ops.*`
call per line) plus a `pointwise(...)`/`reduction(...)` line; externs and fallbacks become
`extern(...)`/`fallback(...)` lines reading `tensor(name, size, stride, offset)` views.
`exec` the text and call `call(*inputs, constants=graph.constants)`: it runs with the reference
evaluator (`evaluate.PrintedRun`), so the printed text is a repro of the stage's output.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

from kiln.lower import _compat
from kiln.lower.index import Expr, sym
from kiln.lower.nodes import (
    ComputedBuffer,
    ExternKernel,
    ExternOutput,
    Fallback,
    Reduction,
    TensorArg,
)
from kiln.lower.ops import OpsHandler, use_handler

__all__ = ["Printer", "format_value", "print_body", "print_graph"]

HEADER = """\
# kiln.lower IR graph. exec() it, then call(*inputs, constants=graph.constants) runs it on the
# CPU with the reference evaluator (kiln.lower.evaluate.PrintedRun); ops.* is the ops handler.
import torch
from kiln.lower.evaluate import PrintedRun
from kiln.lower.ops import ops
aten = torch.ops.aten
"""


class _Val:
    """A printed value: the name of the local variable that holds it."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return self.name


class Printer(OpsHandler):
    """Writes each op as one line `tN = ops.<op>(...)` into `lines`."""

    def __init__(self, indent: int = 2) -> None:
        self.lines: list[str] = []
        self.indent = indent
        self.count = 0
        self.indirect = 0
        self.nested = 0

    def _line(self, text: str) -> None:
        self.lines.append("    " * self.indent + text)

    def _emit(self, text: str) -> _Val:
        name = f"t{self.count}"
        self.count += 1
        self._line(f"{name} = {text}")
        return _Val(name)

    def load(self, name: str, index: Expr) -> _Val:
        return self._emit(f"ops.load({name!r}, {index})")

    def store(self, name: str, index: Expr, value: Any) -> None:
        self._line(f"ops.store({name!r}, {index}, {value})")

    def store_reduction(self, name: str, index: Expr, value: Any) -> None:
        self._line(f"ops.store_reduction({name!r}, {index}, {value})")

    def reduction(self, dtype: torch.dtype, src_dtype: torch.dtype, reduction_type: str,
                  value: Any) -> _Val:
        return self._emit(f"ops.reduction({dtype}, {src_dtype}, {reduction_type!r}, {value})")

    def constant(self, value: Any, dtype: torch.dtype) -> _Val:
        return self._emit(f"ops.constant({format_value(value)}, {dtype})")

    def index_expr(self, expr: Expr, dtype: torch.dtype) -> _Val:
        return self._emit(f"ops.index_expr({expr}, {dtype})")

    def indirect_indexing(self, value: Any, size: int, check: bool = True,
                          wrap: bool = True) -> Expr:
        name = f"i{self.indirect}"
        self.indirect += 1
        extra = ("" if check else ", check=False") + ("" if wrap else ", wrap=False")
        self._line(f"{name} = ops.indirect_indexing({value}, {size}{extra})")
        return sym(name, size)

    def to_dtype(self, x: Any, dtype: torch.dtype) -> _Val:
        return self._emit(f"ops.to_dtype({x}, {dtype})")

    def where(self, cond: Any, a: Any, b: Any) -> _Val:
        return self._emit(f"ops.where({cond}, {a}, {b})")

    def masked(self, mask: Any, body: Callable[[], Any], other: Any) -> _Val:
        name = f"masked_body{self.nested}"
        self.nested += 1
        self._line(f"def {name}():")
        self.indent += 1
        result = body()
        self._line(f"return {result}")
        self.indent -= 1
        return self._emit(f"ops.masked({mask}, {name}, {format_value(other)})")

    def math(self, name: str, *args: Any) -> _Val:
        return self._emit(f"ops.{name}({', '.join(format_value(a) for a in args)})")


def format_value(value: Any) -> str:
    """Python source for an argument value (tensor args, dtypes, ops, nested lists)."""
    if isinstance(value, _Val):
        return value.name
    if isinstance(value, TensorArg):
        return f"rt.{value.render()}"
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "float('nan')"
        if math.isinf(value):
            return "float('inf')" if value > 0 else "float('-inf')"
        return repr(value)
    if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
        return str(value)
    if isinstance(value, torch.device):
        return f"torch.device({str(value)!r})"
    if isinstance(value, _compat.OpOverload):
        return f"aten.{value.__name__}" if value.namespace == "aten" else \
            f"torch.ops.{value.namespace}.{value.__name__}"
    if isinstance(value, list):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    if isinstance(value, tuple):
        inner = ", ".join(format_value(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {format_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


def print_body(node: ComputedBuffer, indent: int = 2) -> list[str]:
    """The node's store body as the lines of a Python function `<name>_body(x0, ..., r0, ...)`."""
    index, rindex = node.loop_vars()
    printer = Printer(indent=indent)
    with use_handler(printer):
        node.body(index, rindex)
    params = ", ".join([f"x{i}" for i in range(len(index))] +
                       [f"r{i}" for i in range(len(rindex))])
    return ["    " * (indent - 1) + f"def {node.name}_body({params}):", *printer.lines]


def _origins(node: ComputedBuffer | ExternKernel) -> str:
    seen: list[str] = []
    for origin in node.origins:
        text = origin.render()
        if text not in seen:
            seen.append(text)
    return ", ".join(seen)


def _print_computed(node: ComputedBuffer) -> list[str]:
    lay = node.layout
    data = node.data
    kind = f"Reduction {data.reduction_type}" if isinstance(data, Reduction) else "Pointwise"
    lines = [f"    # {node.name}: {kind} {lay.render()}  <- {_origins(node)}"]
    lines += print_body(node)
    layout = f"{lay.dtype}, {lay.size}, {lay.stride}, {lay.offset}"
    if isinstance(data, Reduction):
        lines.append(f"    rt.reduction({node.name!r}, {node.name}_body, {data.ranges}, "
                     f"{data.reduction_ranges}, {layout})")
    else:
        lines.append(f"    rt.pointwise({node.name!r}, {node.name}_body, {data.ranges}, {layout})")
    return lines


def _print_extern(node: ExternKernel) -> list[str]:
    outs = []
    for out in node.outputs:
        if isinstance(out, ExternOutput):
            lay = out.layout
            outs.append(f"({out.name!r}, {lay.dtype}, {lay.size}, {lay.stride}, {lay.offset})")
        else:
            outs.append(format_value(out))
    head = f"    # {node.name}: {type(node).__name__} {node.kind}  <- {_origins(node)}"
    call = "rt.fallback(" if isinstance(node, Fallback) else f"rt.extern({node.kind!r}, "
    return [head, f"    {call}{format_value(node.op)}, {format_value(node.args)}, "
                  f"{format_value(node.kwargs)}, [{', '.join(outs)}])"]


def print_graph(graph: Any) -> str:
    """`graph` (an `ir.IRGraph`, whose `str()` calls this: hence no import of `ir` here) as the
    text of a module whose `call(...)` runs it."""
    params = [buf.name if buf is not None else f"unused{i}" for i, buf in enumerate(graph.inputs)]
    lines = [HEADER, "", f"def call({', '.join([*params, 'constants=None'])}):",
             "    rt = PrintedRun(constants)"]
    for buf in graph.inputs:
        if buf is not None:
            lay = buf.layout
            lines.append(f"    rt.bind({buf.name!r}, {buf.name}, {lay.dtype}, {lay.size}, "
                         f"{lay.stride}, {lay.offset})")
    for name in graph.constants:
        lines.append(f"    rt.constant({name!r})")
    for node in graph.nodes:
        lines += _print_computed(node) if isinstance(node, ComputedBuffer) else _print_extern(node)
    for name, arg in graph.mutations:
        lines.append(f"    rt.mutate({name!r}, {name}, rt.{arg.render()})")
    lines.append(f"    return {format_value(list(graph.outputs))}")
    return "\n".join(lines) + "\n"
