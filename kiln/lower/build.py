"""build: the lower stage's driver — graph passes, inputs, the interpreter, outputs.

`build_graph` is `lower_graph`'s body: it copies the FX graph (passes never touch the caller's),
eliminates dead code, rewrites explicit attention, pads misaligned large matmuls on CUDA
(`padding`), binds placeholders to `InputBuffer`s and `get_attr` tensors to `ConstantBuffer`s,
runs the `Interpreter`, and turns each output into a strided view of a buffer with eager's
strides (read before the passes; copying only when no view has them).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Sequence

import torch
import torch.fx

from kiln.lower import _compat, rules  # noqa: F401  (rules fills the rule table)
from kiln.lower.ir import ConstantBuffer, InputBuffer, IRGraph, Layout, Origin, TensorArg
from kiln.lower.lowering import GraphBuilder, Interpreter, LoweringError
from kiln.lower.values import BufferValue, PointwiseValue, TensorValue, strided_view

__all__ = ["build_graph", "copy_graph_module"]

log = logging.getLogger("kiln.lower")


def copy_graph_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A new GraphModule with a copy of `gm`'s graph (node meta dicts copied shallowly)."""
    graph = torch.fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    return torch.fx.GraphModule(gm, graph)


def build_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any] | None = None, *,
                attention_rewrite: bool = True) -> IRGraph:
    start = time.perf_counter()
    gm = copy_graph_module(gm)
    gm.graph.eliminate_dead_code()
    metas = _output_metas(gm)  # before the passes: outputs keep the strides eager gives them
    if attention_rewrite:
        from kiln.lower.attention import rewrite_attention

        rewrite_attention(gm)
    from kiln.lower.padding import pad_matmuls

    pad_matmuls(gm)
    builder = GraphBuilder()
    interp = Interpreter(builder)
    _bind_inputs(gm, example_inputs, builder, interp)
    outputs = interp.run_nodes(list(gm.graph.nodes))
    values = _compat.tree_leaves(outputs, is_leaf=_is_leaf)
    builder.graph.outputs = [_output(builder, v, m) for v, m in zip(values, metas)]
    log.debug("lowered %d FX nodes into %r in %.3f s", len(gm.graph.nodes), builder.graph,
              time.perf_counter() - start)
    return builder.graph


def _output_metas(gm: torch.fx.GraphModule) -> list:
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    return _compat.tree_leaves(
        torch.fx.node.map_arg(out_node.args[0], lambda n: n.meta.get("val")),
        is_leaf=lambda x: x is None)


def _is_leaf(x: Any) -> bool:
    return x is None or isinstance(x, TensorValue)


def _bind_inputs(gm: torch.fx.GraphModule, example_inputs: Sequence[Any] | None,
                 builder: GraphBuilder, interp: Interpreter) -> None:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    values = [_input_value(n, i, example_inputs) for i, n in enumerate(placeholders)]
    device = _compute_device(values)
    for node, val in zip(placeholders, values):
        if isinstance(val, torch.Tensor):
            where = val.device
            if _host_scalar(val, device):
                where = device
                builder.graph.moved_inputs.append(node.name)
            layout = Layout(val.dtype, where, tuple(val.shape), tuple(val.stride()),
                            val.storage_offset())
            buf = InputBuffer(node.name, layout, (_origin(node),))
            builder.graph.add_buffer(buf)
            builder.graph.inputs.append(buf)
            interp.env[node] = BufferValue(buf)
        else:
            builder.graph.inputs.append(None)
            interp.env[node] = val
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = getattr(gm, node.target)
            if not isinstance(value, torch.Tensor):
                raise LoweringError(f"get_attr {node.target} is not a tensor")
            if _host_scalar(value, device):  # `x[:, 1:] = 2.0` lifts a CPU scalar tensor
                value = value.to(device)
            layout = Layout(value.dtype, value.device, tuple(value.shape), tuple(value.stride()),
                            value.storage_offset())
            buf = ConstantBuffer(node.name, layout, value, (_origin(node),))
            builder.graph.add_buffer(buf)
            builder.graph.constants[node.name] = buf
            interp.env[node] = BufferValue(buf)


def _input_value(node: torch.fx.Node, i: int, example_inputs: Sequence[Any] | None) -> Any:
    if example_inputs is not None and i < len(example_inputs) and \
            isinstance(example_inputs[i], torch.Tensor):
        return example_inputs[i]
    return node.meta.get("val")


def _compute_device(values: Sequence[Any]) -> torch.device | None:
    """The accelerator the graph computes on, if any input lives on one."""
    return next((v.device for v in values
                 if isinstance(v, torch.Tensor) and v.device.type != "cpu"), None)


def _host_scalar(value: torch.Tensor, device: torch.device | None) -> bool:
    """A 0-dim CPU tensor in a graph on an accelerator: eager allows the mix, a generated
    kernel would dereference a host pointer on the device (an illegal memory access)."""
    return device is not None and value.device.type == "cpu" and value.dim() == 0


def _origin(node: torch.fx.Node) -> Origin:
    return Origin(node.name, node.op, node.meta.get("user_location"))


def _output(builder: GraphBuilder, value: Any, meta: Any) -> TensorArg | Any:
    if not isinstance(value, TensorValue):
        return value
    want = tuple(meta.stride()) if isinstance(meta, torch.Tensor) else None
    if isinstance(value, PointwiseValue):
        builder.realize(value, stride=want)
    arg = strided_view(value)
    if arg is None or (want is not None and not _same_strides(arg, want)):
        arg = builder.copy(value, stride=want).buffer.as_arg()
    return arg


def _same_strides(arg: TensorArg, want: Sequence[int]) -> bool:
    return all(a == b for s, a, b in zip(arg.size, arg.stride, want) if s != 1)
