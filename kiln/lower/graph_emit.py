"""graph_emit: adding ATen nodes to an FX graph during a graph pass, each with the `meta["val"]`
(a fake tensor) that later passes and the lower stage read, and the user source line it stands
for.
"""
from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

from kiln.lower import _compat

__all__ = ["NodeEmitter"]


class NodeEmitter:
    """Adds nodes with `meta["val"]` computed on fake tensors of the operands' metadata."""

    def __init__(self, graph: torch.fx.Graph, location: Any) -> None:
        self.graph = graph
        self.mode = _compat.new_fake_mode(allow_non_fake_inputs=True)
        self.fakes: dict[torch.fx.Node, Any] = {}
        self.location = location

    def fake(self, node: torch.fx.Node) -> Any:
        if node not in self.fakes:
            v = node.meta.get("val")
            self.fakes[node] = _compat.fake_tensor_like(
                self.mode, v.shape, v.stride(), v.dtype, v.device, v.storage_offset())
        return self.fakes[node]

    def call(self, target: Any, *args: Any, **kwargs: Any) -> torch.fx.Node:
        node = self.graph.call_function(target, args, kwargs)
        fake_args = torch.fx.node.map_arg(args, self.fake)
        fake_kwargs = torch.fx.node.map_arg(kwargs, self.fake)
        with self.mode:
            val = target(*fake_args, **fake_kwargs)
        node.meta["val"] = val
        if self.location is not None:
            node.meta["user_location"] = self.location
        self.fakes[node] = val
        return node

    def item(self, node: torch.fx.Node, i: int) -> torch.fx.Node:
        out = self.graph.call_function(operator.getitem, (node, i))
        out.meta["val"] = self.fakes[node][i]
        self.fakes[out] = self.fakes[node][i]
        return out
