"""host_scalars: 0-dim CPU values a graph on an accelerator computes move to the accelerator.

Eager lets a 0-dim CPU tensor meet CUDA tensors in one op (`x[x > 0] = 0` indexes with a CPU
scalar tensor, and its backward builds `full([], 0, device=cpu)` for the values' gradient).
Lowered as written, such a value is a CPU buffer that a compiled Triton kernel writes or reads
through a device pointer: an illegal memory access, or kiln's device check refusing the graph.
The value is a scalar either way, so computing it on the graph's device gives eager's answer.

A value moves only when all of it stays inside the graph: its tensor inputs are on the device
or move too, each of its users computes on the device (a 0-dim CUDA tensor beside CPU tensors
is an error in eager where a CPU scalar is not). A returned one moves too, and the graph returns
a copy to the CPU (`_to_copy(device=cpu)`, a torch op): eager returns it on the CPU, and left
there it would be a CPU buffer a kernel writes. Graph inputs of this kind are moved by the
driver (`IRGraph.moved_inputs`).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.fx

__all__ = ["host_scalar", "move_host_scalars"]


def move_host_scalars(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    device = _graph_device(gm)
    if device is None:
        return gm
    moving = _movable(gm, device)
    returned = set(gm.graph.output_node().all_input_nodes)
    for node in list(gm.graph.nodes):
        if node in moving:
            _place(node, device)
            if node in returned:
                _return_on_host(gm, node)
    if moving:
        gm.recompile()
    return gm


def _return_on_host(gm: torch.fx.GraphModule, node: torch.fx.Node) -> None:
    """The output reads a CPU copy of the moved `node` (other users keep the device value)."""
    output = gm.graph.output_node()
    with gm.graph.inserting_after(node):
        copy = gm.graph.call_function(torch.ops.aten._to_copy.default, (node,),
                                      {"device": torch.device("cpu")})
    copy.meta["val"] = _scalar_meta_on(node.meta["val"], torch.device("cpu"))
    copy.meta.update({k: v for k, v in node.meta.items() if k not in ("val", "tensor_meta")})
    output.replace_input_with(node, copy)


def _graph_device(gm: torch.fx.GraphModule) -> torch.device | None:
    """The accelerator the graph's inputs live on, if any."""
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor) and val.device.type not in ("cpu", "meta"):
                return val.device
    return None


def _movable(gm: torch.fx.GraphModule, device: torch.device) -> set[torch.fx.Node]:
    """The computed 0-dim CPU values, pruned until each one left reads only device values,
    moving ones or 0-dim CPU inputs and constants (the driver moves those), and has only device
    users, moving ones or the output (which gets a CPU copy)."""
    output = gm.graph.output_node()
    moving = {n for n in gm.graph.nodes if n.op == "call_function"
              and host_scalar(n.meta.get("val"))}

    def stays(n: torch.fx.Node) -> bool:
        return all(a in moving or _on(a, device) or (a.op != "call_function"
                                                     and host_scalar(a.meta.get("val")))
                   for a in n.all_input_nodes) \
            and all(u in moving or u is output or _on(u, device) for u in n.users)

    while True:
        keep = {n for n in moving if stays(n)}
        if keep == moving:
            return moving
        moving = keep


def host_scalar(val: Any) -> bool:
    """A 0-dim CPU tensor: eager lets it meet tensors of any device in one op."""
    return isinstance(val, torch.Tensor) and val.device.type == "cpu" and val.dim() == 0


def _on(node: torch.fx.Node, device: torch.device) -> bool:
    """Whether `node` computes on `device` (every tensor it gives is there)."""
    val = node.meta.get("val")
    vals = val if isinstance(val, (tuple, list)) else (val,)
    tensors = [v for v in vals if isinstance(v, torch.Tensor)]
    return bool(tensors) and all(t.device == device for t in tensors)


def _place(node: torch.fx.Node, device: torch.device) -> None:
    if node.kwargs.get("device") is not None:  # factories and `_to_copy(..., device=cpu)`
        node.kwargs = {**node.kwargs, "device": device}
    node.meta["val"] = _scalar_meta_on(node.meta["val"], device)


def _scalar_meta_on(val: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The 0-dim meta value `val` as it is on `device`: a fake one from its own mode, or a
    real tensor as the meta (no fake mode) moved there."""
    mode = getattr(val, "fake_mode", None)
    if mode is None:
        return val.to(device)
    with mode:
        return torch.empty((), dtype=val.dtype, device=device)
