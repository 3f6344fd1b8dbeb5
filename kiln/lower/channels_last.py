"""channels_last: convolution graphs on CUDA computed in NHWC (channels-last) memory order.

cuDNN's fast convolutions on tensor cores read and write NHWC. Given NCHW tensors, eager (and a
graph kept in eager's layouts) pays for the conversion inside every convolution call, and every
BatchNorm / activation / residual kernel between two convolutions works on NCHW. torch.compile
switches conv graphs to channels-last (Inductor's layout optimization); so does this pass, on
CUDA graphs before lowering, when `config.channels_last` is on (`KILN_CHANNELS_LAST=1`; off by
default until its gain is measured beside torch.compile in one run, benchmarks/RESULTS.md) and
no convolution of the graph is grouped. Grouped and depthwise convolutions
keep NCHW: on the H200 (bf16, batch 64) NHWC made MobileNetV3 8.1 ms (3.8 without) and
ConvNeXt-T 5.4 ms (4.5), both built on depthwise convolutions, while ResNet-50's profile showed
1.1 ms of its 5.1 ms (inference; 3.4 of 16.8 ms in training) in cuDNN's own NCHW<->NHWC
conversions, and NHWC took it to 4.0 ms (benchmarks/RESULTS.md). With it on:

1. every 2-D convolution whose input is not channels-last reads a channels-last copy of it
   (in practice only the first one: the copy's layout then flows through the graph);
2. each node's `meta["val"]` is recomputed on fake tensors in graph order, so every later op gets
   the strides eager gives for those inputs (pointwise ops and convolutions keep channels-last),
   which the lower stage then uses for its buffers;
3. a `view` of a value that channels-last made non-viewable (a ViT patch embedding's
   `flatten`) reads a contiguous copy first.

The plan is made on fake tensors first and applied only when it works and changes no graph
output's strides: a graph whose outputs would need converting back (a training forward, whose
saved activations are outputs) is left as it is. Weights are not copied: a convolution given a
channels-last input converts its weight itself, as in eager.
"""
from __future__ import annotations

import logging
import operator
from typing import Any

import torch
import torch.fx

from kiln.config import config
from kiln.lower import _compat

__all__ = ["DEVICES", "GROUPED_STAY_NCHW", "MIN_CONVS", "use_channels_last"]

log = logging.getLogger("kiln.lower")
aten = torch.ops.aten

DEVICES = ("cuda",)  # where cuDNN's NHWC kernels pay off (tests set ("cpu",))
MIN_CONVS = 2  # a graph with one convolution gains less than the input copy costs
GROUPED_STAY_NCHW = True  # graphs with a grouped convolution keep NCHW (tests switch it off)
_VIEWS = (aten.view.default, aten._unsafe_view.default)
_NHWC = torch.channels_last


class _Abandon(Exception):
    """The plan does not apply to this graph (an op the fake run cannot follow, an output whose
    layout would change)."""


def use_channels_last(gm: torch.fx.GraphModule) -> int:
    """Rewrite `gm` (in place) to compute its convolutions channels-last when
    `config.channels_last` is on and it has at least `MIN_CONVS` 2-D convolutions on `DEVICES`;
    returns the number of copies inserted (0: left as it was)."""
    if not config.channels_last:
        return 0
    if sum(1 for node in gm.graph.nodes if _conv2d_input(node) is not None) < MIN_CONVS:
        return 0
    if GROUPED_STAY_NCHW and any(_grouped(node) for node in gm.graph.nodes):
        log.debug("channels_last: graph left in its layouts (a grouped convolution)")
        return 0
    try:
        plan = _Plan(gm.graph)
    except _Abandon as why:
        log.debug("channels_last: graph left in its layouts (%s)", why)
        return 0
    plan.apply(gm)
    log.debug("channels_last: %d convolution(s) in NHWC, %d copies", plan.convs, len(plan.copies))
    return len(plan.copies)


def _grouped(node: torch.fx.Node) -> bool:
    """A convolution with groups > 1 (depthwise included): cuDNN's NHWC kernels for those were
    slower than NCHW on the H200."""
    return node.op == "call_function" and node.target is aten.convolution.default \
        and node.args[8] != 1


def _conv2d_input(node: torch.fx.Node) -> torch.fx.Node | None:
    """The input node of a non-transposed 2-D convolution on `DEVICES`, else None."""
    if node.op != "call_function" or node.target is not aten.convolution.default:
        return None
    x, transposed = node.args[0], node.args[6]
    val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if transposed or not isinstance(val, torch.Tensor) or val.dim() != 4:
        return None
    return x if val.device.type in DEVICES else None


class _Plan:
    """The new fake value of every node, and the copies to insert: `copies[(node, user)]` is the
    memory format `user` reads `node` in."""

    def __init__(self, graph: torch.fx.Graph) -> None:
        self.mode = _compat.new_fake_mode(allow_non_fake_inputs=True)
        self.vals: dict[torch.fx.Node, Any] = {}
        self.copies: dict[tuple[torch.fx.Node, torch.fx.Node], torch.memory_format] = {}
        self.convs = 0
        for node in graph.nodes:
            self._visit(node)

    def _visit(self, node: torch.fx.Node) -> None:
        if node.op in ("placeholder", "get_attr"):
            self.vals[node] = _fake_like(self.mode, node.meta.get("val"))
        elif node.op == "call_function":
            self.vals[node] = self._run(node)
        elif node.op == "output":
            self._check_outputs(node)
        else:
            raise _Abandon(f"{node.op} node {node.name}")

    def _run(self, node: torch.fx.Node) -> Any:
        x = _conv2d_input(node)
        if x is not None:
            self.convs += 1
            if not self.vals[x].is_contiguous(memory_format=_NHWC):
                self.copies[(x, node)] = _NHWC
        try:
            return self._call(node)
        except Exception as err:  # noqa: BLE001 - anything the fake run rejects
            if node.target not in _VIEWS or (node.args[0], node) in self.copies:
                raise _Abandon(f"{node.target} at {node.name}: {type(err).__name__}") from err
        self.copies[(node.args[0], node)] = torch.contiguous_format  # a view of NHWC memory
        try:
            return self._call(node)
        except Exception as err:  # noqa: BLE001
            raise _Abandon(f"{node.target} at {node.name}: {type(err).__name__}") from err

    def _call(self, node: torch.fx.Node) -> Any:
        def value(arg: torch.fx.Node) -> Any:
            val = self.vals[arg]
            fmt = self.copies.get((arg, node))
            if fmt is None:
                return val
            with self.mode:
                return val.clone(memory_format=fmt)

        args = torch.fx.node.map_arg(node.args, value)
        kwargs = torch.fx.node.map_arg(node.kwargs, value)
        if node.target is operator.getitem:
            return args[0][args[1]]
        with self.mode:
            return node.target(*args, **kwargs)

    def _check_outputs(self, node: torch.fx.Node) -> None:
        for out in _nodes(node.args):
            old, new = out.meta.get("val"), self.vals[out]
            if isinstance(old, torch.Tensor) and _strides(old) != _strides(new):
                raise _Abandon(f"output {out.name} would change strides")

    def apply(self, gm: torch.fx.GraphModule) -> None:
        graph = gm.graph
        for (source, user), fmt in self.copies.items():
            with graph.inserting_before(user):
                copy = graph.call_function(aten.clone.default, (source,),
                                           {"memory_format": fmt})
            with self.mode:
                copy.meta["val"] = self.vals[source].clone(memory_format=fmt)
            if "user_location" in user.meta:
                copy.meta["user_location"] = user.meta["user_location"]
            user.replace_input_with(source, copy)
        for node, val in self.vals.items():
            node.meta["val"] = val
        gm.recompile()


def _fake_like(mode: Any, val: Any) -> Any:
    if not isinstance(val, torch.Tensor):
        return val
    return _compat.fake_tensor_like(mode, val.shape, val.stride(), val.dtype, val.device,
                                    val.storage_offset())


def _nodes(arg: Any) -> list[torch.fx.Node]:
    found: list[torch.fx.Node] = []
    torch.fx.node.map_arg(arg, found.append)
    return found


def _strides(t: Any) -> tuple:
    """Strides that matter: a dim of size 1 is never stepped over."""
    return tuple(s for s, n in zip(t.stride(), t.shape) if n != 1) if isinstance(
        t, torch.Tensor) else ()
