"""Turn a finished trace into a cache entry: the graph's outputs, the Python source of the entry
function (read inputs, call the compiled graph, replay side effects, rebuild the result with the
caller's exact Python structure), and the FX GraphModule handed to the backend."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.fx

from kiln.capture.unsupported import unsupported
from kiln.capture.variables.base import VT, ConstantVT, LazyVT
from kiln.capture.variables.containers import DictVT, ListVT, SliceVT, TupleVT
from kiln.capture.variables.functions import TorchFunctionVT, UserFunctionVT
from kiln.capture.variables.nn_module import ModuleVT
from kiln.capture.variables.objects import ClassVT, NewObjectVT, PythonModuleVT, UserObjectVT
from kiln.capture.variables.tensor import TensorVT

if TYPE_CHECKING:
    from kiln.capture.output_graph import OutputGraph

__all__ = ["EntryCode", "build_entry_code", "new_object"]


def new_object(cls: type, attrs: dict[str, Any]) -> Any:
    """Rebuild an object created inside the graph region (dataclass or plain class)."""
    obj = cls.__new__(cls)
    for name, value in attrs.items():
        object.__setattr__(obj, name, value)
    return obj


def replace_dict(target: dict, contents: dict) -> None:
    target.clear()
    target.update(contents)


class EntryCode:
    """Lines of an entry function body, plus the graph module and whether it must be called."""

    def __init__(self, body: list[str], gm: torch.fx.GraphModule | None,
                 example_inputs: list[torch.Tensor], graph_ref: str | None) -> None:
        self.body = body
        self.gm = gm
        self.example_inputs = example_inputs
        self.graph_ref = graph_ref


class _Rebuilder:
    def __init__(self, output: OutputGraph) -> None:
        self.output = output
        self.consts = output.consts
        self.input_source = {inp.node: inp.source for inp in output.inputs}
        self.outputs: list[torch.fx.Node] = []
        self._out_index: dict[torch.fx.Node, int] = {}

    def expr(self, vt: VT) -> str:
        if isinstance(vt, LazyVT):
            return vt.source.expr()
        if isinstance(vt, TensorVT):
            return self._tensor(vt)
        if isinstance(vt, ConstantVT):
            return self.consts.literal_or_ref(vt.value)
        if isinstance(vt, TupleVT):
            return self._tuple(vt)
        if isinstance(vt, ListVT):
            if vt.source is not None:
                return vt.source.expr()
            return "[" + ", ".join(self.expr(i) for i in vt.items) + "]"
        if isinstance(vt, DictVT):
            if vt.source is not None:
                return vt.source.expr()
            return self._dict_literal(vt)
        if isinstance(vt, SliceVT):
            return f"slice({self.expr(vt.start)}, {self.expr(vt.stop)}, {self.expr(vt.step)})"
        if isinstance(vt, NewObjectVT):
            attrs = self._dict_literal(DictVT(vt.attrs))
            return f"{self.consts.ref(new_object)}({self.consts.ref(vt.cls)}, {attrs})"
        if isinstance(vt, (ModuleVT, UserObjectVT, PythonModuleVT, ClassVT, UserFunctionVT,
                           TorchFunctionVT)) or vt.is_constant():
            if vt.source is not None:
                return vt.source.expr()
            return self.consts.ref(vt.as_constant())
        unsupported("output-value", f"returning or storing {vt.describe()} out of a compiled "
                    "region is not supported yet")

    def _tensor(self, vt: TensorVT) -> str:
        node = vt.node
        if node in self.input_source:  # an input returned as is keeps its identity
            return self.input_source[node].expr()
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
        return [f"setattr({target}, {name!r}, {self.expr(value)})"
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

    def _replay_cell(self, box: Any) -> list[str]:
        return [f"{box.source.expr()} = {self.expr(box.value)}"]


def build_entry_code(output: OutputGraph, result: VT) -> EntryCode:
    rebuild = _Rebuilder(output)
    effects = rebuild.side_effect_lines()
    result_expr = rebuild.expr(result)
    graph = output.graph
    has_work = output.call_count() > 0
    if not has_work:
        return EntryCode([*effects, f"return {result_expr}"], None, [], None)
    graph.output(tuple(rebuild.outputs))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph, class_name="CapturedGraph")
    graph_ref = "__graph"
    args = ", ".join(inp.source.expr() for inp in output.inputs)
    body = [f"__o = {graph_ref}({args})", *effects, f"return {result_expr}"]
    return EntryCode(body, gm, [inp.example for inp in output.inputs], graph_ref)
