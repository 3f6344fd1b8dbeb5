"""symbolic: symbolic sizes in the autograd stage (issue 15, stage B; docs/dynamic_shapes.md).

A graph captured with symbolic sizes (placeholders whose `meta["val"]` are FakeTensors with
SymInt sizes, one ShapeEnv per capture) is traced once, on FakeTensors of that ShapeEnv, and the
traced graphs serve every size. Three things make that work, all here:

- `SizeSymbols`: where each symbol of a trace lives in a call's arguments (`s0` is
  `args[0].shape[0]`), read off the trace's primals. Every symbol of a traced graph must be one
  of them (else `SymbolicUnsupported`).
- `SizeNodes`: a symbolic number an op takes (`view(x, [s0, 12])`) becomes graph nodes that
  compute it from the inputs at run time: `sym_size.int(primals_0, 0)`, then `operator.mul`...
  (the vocabulary of capture's graphs). A backward that needs a size reads such a node; the
  partitioner saves its value (an int) or recomputes it from a saved tensor.
- `SizeFunction`: Python compiled from size expressions, evaluated on a call's arguments: the
  layouts the runtime needs per call (tangents, outputs that view inputs), and the facts the
  trace added to the ShapeEnv after capture rendered its guards (`SizeConditions`): a call
  whose sizes break them runs the graph traced for its own sizes.

Never: specializes a size to the example's value without a condition that checks it per call.
"""
from __future__ import annotations

import operator
from typing import Any, Callable, Sequence

import torch
import torch.fx

from kiln.autograd import _compat
from kiln.autograd.joint import AutogradUnsupported

__all__ = ["SizeConditions", "SizeFunction", "SizeNodes", "SizeSymbols", "SymbolicUnsupported",
           "has_unbacked_sizes", "is_symbolic_graph", "is_symbolic_value", "symbolic_positions"]


class SymbolicUnsupported(AutogradUnsupported):
    """The symbolic trace cannot follow these sizes; the graph is traced per size instead."""


def is_symbolic_value(value: Any) -> bool:
    """A tensor with a symbolic size, stride or storage offset, or a symbolic number."""
    if isinstance(value, torch.Tensor):
        return any(_compat.is_symbolic(s) for s in
                   (*value.shape, *value.stride(), value.storage_offset()))
    return _compat.is_symbolic(value)


def symbolic_positions(gm: torch.fx.GraphModule) -> list[int]:
    """Positions of the placeholders whose `meta["val"]` is symbolic: what a per-size cache
    keys on (capture's graphs read sizes from tensors, so these are tensors)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return [i for i, n in enumerate(placeholders) if is_symbolic_value(n.meta.get("val"))]


def is_symbolic_graph(gm: torch.fx.GraphModule) -> bool:
    """Whether `gm` (a captured graph, or a graph the autograd stage traced) has inputs with
    symbolic sizes (`meta["val"]` of its placeholders)."""
    return any(is_symbolic_value(n.meta.get("val")) for n in gm.graph.nodes
               if n.op == "placeholder")


def has_unbacked_sizes(gm: torch.fx.GraphModule) -> bool:
    """Whether some value of `gm` has a data-dependent size or is a data-dependent number (an
    unbacked symbol, stage D: `nonzero`'s count, `item()`): sizes no input carries, so neither a
    trace per input size nor `SizeSymbols` can follow them."""
    for node in gm.graph.nodes:
        if node.meta.get("unbacked_bindings"):
            return True
        leaves, _ = _compat.tree_flatten(node.meta.get("val"))
        if any(_compat.unbacked_symbols(v) for v in leaves
               if isinstance(v, (torch.Tensor, *_compat.SYM_TYPES))):
            return True
    return False


class SizeSymbols:
    """Each symbol of a trace and where a call's arguments hold it: `(input index, kind, dim)`
    with kind "size", "stride" or "offset"; the first input that has it wins."""

    def __init__(self, inputs: Sequence[Any]) -> None:
        self.where: dict[Any, tuple[int, str, int]] = {}
        for i, value in enumerate(inputs):
            if isinstance(value, torch.Tensor):
                self._note(i, [*(("size", d, s) for d, s in enumerate(value.shape)),
                               *(("stride", d, s) for d, s in enumerate(value.stride())),
                               ("offset", 0, value.storage_offset())])
            elif isinstance(value, torch.SymInt):  # an int argument: the symbol is the value
                self._note(i, [("value", 0, value)])

    def _note(self, i: int, places: list[tuple[str, int, Any]]) -> None:
        for kind, dim, value in places:
            if not isinstance(value, _compat.SYM_TYPES):
                continue
            # the symbol the input was made with, too: a later trace may have specialized it
            # (`s2 -> 16`), and the fact `Eq(s2, 16)` must still be read from this input
            for expr in (_compat.sym_expr(value), _compat.unreplaced_expr(value)):
                if expr.is_Symbol:
                    self.where.setdefault(expr, (i, kind, dim))

    def source(self, symbol: Any) -> str:
        """Python reading `symbol` from a call's `args`."""
        i, kind, dim = self.place(symbol)
        return {"size": f"args[{i}].shape[{dim}]", "stride": f"args[{i}].stride({dim})",
                "offset": f"args[{i}].storage_offset()", "value": f"args[{i}]"}[kind]

    def place(self, symbol: Any) -> tuple[int, str, int]:
        found = self.where.get(symbol)
        if found is None:
            raise SymbolicUnsupported(f"a size {symbol} that no graph input has",
                                      hint="the graph is compiled per size instead")
        return found

    def check(self, value: Any) -> None:
        """Raise SymbolicUnsupported unless every symbol of `value` is an input's."""
        for symbol in _free_symbols(value):
            self.place(symbol)


def _free_symbols(value: Any) -> set:
    if isinstance(value, (list, tuple)):
        return set().union(*(_free_symbols(v) for v in value)) if value else set()
    if _compat.is_symbolic(value):
        return set(_compat.sym_expr(value).free_symbols)
    if isinstance(value, _compat.sympy.Basic):
        return set(value.free_symbols)
    return set()


class SizeNodes:
    """Graph nodes computing symbolic numbers from the inputs' sizes (see the module docstring):
    one node per distinct expression, the leaves read from the placeholders that first had
    each symbol."""

    _READS = {"size": _compat.SYM_SIZE, "stride": _compat.SYM_STRIDE}

    def __init__(self, graph: torch.fx.Graph) -> None:
        self.graph = graph
        self.leaves: dict[Any, tuple[torch.fx.Node, str, int, Any]] = {}
        self.nodes: dict[Any, torch.fx.Node] = {}

    def note_placeholder(self, node: torch.fx.Node, value: Any) -> None:
        if not isinstance(value, (torch.Tensor, torch.SymInt)):
            return
        symbols = SizeSymbols([value])
        for symbol, (_, kind, dim) in symbols.where.items():
            if symbol not in self.leaves:
                size = (value if kind == "value" else value.shape[dim] if kind == "size"
                        else value.stride(dim) if kind == "stride" else value.storage_offset())
                self.leaves[symbol] = (node, kind, dim, size)

    def node_for(self, value: Any) -> Any:
        """A node (or a constant) computing symbolic `value` at run time."""
        return self._emit(_compat.sym_expr(value))

    def _emit(self, expr: Any) -> Any:
        if expr.is_Integer:
            return int(expr)
        if expr.is_Number:
            return float(expr)
        known = self.nodes.get(expr)
        if known is None:
            known = self.nodes[expr] = self._build(expr)
        return known

    def _build(self, expr: Any) -> torch.fx.Node:
        if expr.is_Symbol:
            return self._leaf(expr)
        sympy = _compat.sympy
        if isinstance(expr, (sympy.Add, sympy.Mul)):
            fn = operator.add if isinstance(expr, sympy.Add) else operator.mul
            args = sorted(expr.args, key=lambda a: a.is_Number)  # a node first, constants last
            result = self._emit(args[0])
            for arg in args[1:]:
                result = self._call(fn, result, self._emit(arg))
            return result
        if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and expr.exp > 0:
            return self._call(operator.pow, self._emit(expr.base), int(expr.exp))
        fn = _compat.SYMPY_CALLS.get(type(expr))
        if fn is None:
            raise SymbolicUnsupported(f"a size expression the graph cannot compute: {expr}",
                                      hint="the graph is compiled per size instead")
        return self._call(fn, *(self._emit(arg) for arg in expr.args))

    def _leaf(self, symbol: Any) -> torch.fx.Node:
        found = self.leaves.get(symbol)
        if found is None:
            raise SymbolicUnsupported(f"a size {symbol} that no graph input has",
                                      hint="the graph is compiled per size instead")
        placeholder, kind, dim, value = found
        if kind == "value":  # an int argument's placeholder is the number itself
            return placeholder
        if kind == "offset":
            node = self.graph.call_function(_compat.SYM_STORAGE_OFFSET, (placeholder,))
        else:
            node = self.graph.call_function(self._READS[kind], (placeholder, dim))
        node.meta["val"] = value
        return node

    def _call(self, fn: Callable, *args: Any) -> Any:
        vals = [a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in args]
        node = self.graph.call_function(fn, tuple(args))
        node.meta["val"] = fn(*vals)  # SymInt arithmetic: records no guard
        return node


class SizeFunction:
    """`fn(args)`: `values` (nested tuples and lists of ints and symbolic numbers) evaluated for
    the sizes of a call's `args`, as Python compiled once (cheap per call)."""

    def __init__(self, values: Any, symbols: SizeSymbols) -> None:
        symbols.check(values)
        names = {symbol: symbols.source(symbol) for symbol in symbols.where}
        self.source = f"lambda args: {_python(values, _compat.SymbolPrinter(names))}"
        self.fn = eval(self.source, {"math": __import__("math")})  # noqa: S307 - our own text

    def __call__(self, args: Sequence[Any]) -> Any:
        return self.fn(args)


def _python(value: Any, printer: Any) -> str:
    if isinstance(value, (tuple, list)):
        inner = "".join(f"{_python(v, printer)}, " for v in value)
        return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    if isinstance(value, _compat.SYM_TYPES):
        return f"({printer.doprint(_compat.sym_expr(value))})"
    if isinstance(value, _compat.sympy.Basic):
        return f"({printer.doprint(value)})"
    return repr(value)


class SizeConditions:
    """Facts the autograd stage's trace added to the capture's ShapeEnv (`s0 > 16`, `Eq(s0, 8)`)
    after capture had rendered its guards: the traced graphs are right only for sizes that keep
    them, so each call checks them (`holds(args)`)."""

    def __init__(self, facts: list[Any], symbols: SizeSymbols) -> None:
        self.facts = facts
        self.check = SizeFunction(tuple(facts), symbols)

    def holds(self, args: Sequence[Any]) -> bool:
        return all(self.check(args))

    def __str__(self) -> str:
        return ", ".join(str(f) for f in self.facts)
