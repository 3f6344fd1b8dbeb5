"""Partition a joint forward+backward ATen graph into a forward graph and a backward graph.

Input: a joint graph, any object with `gm`, `num_fw_outputs`, `num_primals`, `num_tangents`
(the autograd stage's `JointGraph`, or a test fixture), optionally `static_input_indices` (primals
that are parameters or buffers). `gm` has placeholders `primals_*` then `tangents_*`, one output
`(*forward_outputs, *input_grads)`, and on every node `meta["val"]` and `meta["phase"]` in
{"forward", "backward"} (backward = depends on a tangent).

Output: `PartitionResult`: `fw_gm(*primals) -> (*forward_outputs, *saved)` and
`bw_gm(*saved, *tangents) -> input_grads`, both runnable and printable as Python.

Policies:
    default   eager-like: the forward computes what its outputs need and saves every such value
              the backward reads, and the symbolic sizes the backward reads as ints; the rest
              of the backward's forward-phase inputs (views and transposes of weights,
              constants) is computed in the backward.
    min_cut   save the fewest bytes: a minimum s-t cut (own Dinic solver, `maxflow.py`) over the
              forward nodes, each split in/out with capacity = its size. Pointwise, view and
              creation ops, non-shrinking reductions and the row-wise fused ops torch keeps
              whole (native_layer_norm, _softmax, gelu) may be recomputed in the backward.
              Random ops are never recomputed. Compute-heavy ops (matmul, convolution,
              attention), reductions that shrink their input > 4x and ops outside the allowlist
              are not recomputed when the forward outputs need them. Graph inputs are free to
              save (those in `static_input_indices` when the joint gives it). Views are never
              saved (their bases are), nor tuples (their getitems are). Ties in bytes go to
              values nearer the backward (Inductor's 1.1^distance weight, as a tie-break only).
              Symbolic sizes (`sym_size.int` and arithmetic on it) cost 8 bytes to save and may
              be recomputed from a saved tensor's size.
              Unlike Inductor, it does not keep a value because a backward matmul will
              materialize it anyway: it trades that recompute for memory.

Invariants, raised as InternalError here and asserted in tests by `check_partition`: the forward
graph holds no backward node; the backward graph reads graph inputs only as saved values and
recomputes no random op; the forward graph keeps every random op, in joint order. Tests also
assert saved bytes (min_cut) <= saved bytes (default) on every fixture.

Never: mutates the joint graph, calls torch's partitioners, or reorders random ops.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from kiln.autograd._compat import size_hint
from kiln.autograd.tracer import is_assertion
from kiln.autograd.maxflow import FlowNetwork
from kiln.autograd.saved_report import SavedValue, format_saved_report
from kiln.errors import InternalError, InvalidArgument

__all__ = [
    "COMPUTE_HEAVY_OPS",
    "POLICIES",
    "PartitionResult",
    "RECOMPUTABLE_OPS",
    "VIEW_OPS",
    "partition_joint",
    "recompute_ban",
]

POLICIES: tuple[str, ...] = ("default", "min_cut")

# Rule tables, keyed by op name (the OpOverloadPacket name, any namespace).
COMPUTE_HEAVY_OPS: frozenset[str] = frozenset({
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "_scaled_mm",
    "convolution", "_convolution", "convolution_backward", "cudnn_convolution",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "_flash_attention_forward", "_efficient_attention_forward", "_native_multi_head_attention",
    "upsample_bilinear2d", "upsample_nearest2d", "_upsample_bilinear2d_aa",
})
VIEW_OPS: frozenset[str] = frozenset({
    "view", "_unsafe_view", "reshape", "permute", "expand", "unsqueeze", "squeeze", "select",
    "slice", "alias", "as_strided", "t", "transpose", "split", "split_with_sizes", "unbind",
    "diagonal", "narrow", "unfold", "detach", "broadcast_in_dim", "view_as_real",
    "view_as_complex", "_reshape_alias",
})
REDUCTION_OPS: frozenset[str] = frozenset({
    "sum", "mean", "amax", "amin", "max", "min", "var", "var_mean", "std", "std_mean", "prod",
    "argmax", "argmin", "logsumexp", "any", "all", "norm", "linalg_vector_norm",
})
# Besides Tag.pointwise ops, views and non-shrinking reductions, these may be recomputed.
RECOMPUTABLE_OPS: frozenset[str] = frozenset({
    "getitem", "full", "full_like", "zeros", "zeros_like", "ones", "ones_like", "empty",
    "empty_like", "empty_strided", "new_empty", "new_zeros", "new_ones", "new_full", "arange",
    "iota", "scalar_tensor", "lift_fresh_copy", "clone", "_to_copy", "copy", "to",
    "convert_element_type", "index", "gather", "cat", "constant_pad_nd", "slice_scatter",
    "select_scatter", "where", "native_layer_norm", "_softmax", "_log_softmax", "gelu",
    "_grad_sum_to_size", "sum_to_size",
})
_SHRINK_FACTOR = 4  # a reduction whose output is > 4x smaller than its input is not recomputed
_MAX_DIST = 100


def _op_name(target: Any) -> str:
    if target is operator.getitem:
        return "getitem"
    packet = getattr(target, "overloadpacket", None)
    return getattr(packet, "__name__", None) or getattr(target, "__name__", str(target))


def _is_random(target: Any) -> bool:
    return torch.Tag.nondeterministic_seeded in getattr(target, "tags", ())


def _value_bytes(val: Any) -> int | None:
    """Bytes to keep `val` alive; None for values that are never saved whole (tuples, None)."""
    if isinstance(val, torch.Tensor):
        return _numel(val) * val.element_size()
    if isinstance(val, (bool, int, float, torch.SymInt, torch.SymFloat, torch.SymBool)):
        return 8
    return None


def _numel(val: Any) -> int:
    """Elements of a tensor (the example's count for symbolic sizes: no guard is recorded)."""
    if isinstance(val, torch.Tensor):
        return size_hint(val.numel())
    if isinstance(val, (tuple, list)):
        return max((_numel(v) for v in val), default=0)
    return 0


def _shrinks(node: fx.Node) -> bool:
    inputs = [a.meta.get("val") for a in node.all_input_nodes]
    biggest_in = max((_numel(v) for v in inputs), default=0)
    return _numel(node.meta.get("val")) * _SHRINK_FACTOR < biggest_in


def _is_size(node: fx.Node) -> bool:
    """A symbolic number computed in the graph (`sym_size.int`, `operator.mul` of sizes)."""
    return isinstance(node.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool))


def recompute_ban(node: fx.Node) -> str | None:
    """Why `node` must not be recomputed in the backward (a saved-report reason), or None.

    A `getitem` answers for its producer: the parts of a tuple live where the tuple is computed.
    """
    if node.op != "call_function":
        return None
    target = node.target
    if target is operator.getitem and isinstance(node.args[0], fx.Node):
        return recompute_ban(node.args[0])
    if _is_size(node):
        return None  # a size read off a tensor, or arithmetic on sizes: free to recompute
    name = _op_name(target)
    if _is_random(target):
        return "random"
    schema = getattr(target, "_schema", None)
    if schema is not None and schema.is_mutable:
        return "not-recomputable"  # a functional joint has none; never run a mutation twice
    if name in COMPUTE_HEAVY_OPS:
        return "compute-heavy"
    if name in REDUCTION_OPS or torch.Tag.reduction in getattr(target, "tags", ()):
        return "reduction" if _shrinks(node) else None
    if (name in VIEW_OPS or name in RECOMPUTABLE_OPS
            or torch.Tag.pointwise in getattr(target, "tags", ())):
        return None
    return "not-recomputable"


@dataclass(frozen=True)
class PartitionResult:
    """A partitioned joint graph.

    fw_gm:       placeholders = primals in order; returns (*forward_outputs, *saved values)
    bw_gm:       placeholders = (*saved values, *tangents); returns input grads (None kept)
    num_saved:   len(saved)
    saved_bytes: total size of the saved values
    saved:       names of the saved nodes, in the order fw_gm returns them
    policy:      "default" or "min_cut"
    saved_values: one `SavedValue` record per saved node (shape, dtype, bytes, reason)
    recomputed:  forward-phase nodes the backward computes itself, in graph order
    """

    fw_gm: fx.GraphModule
    bw_gm: fx.GraphModule
    num_saved: int
    saved_bytes: int
    saved: list[str]
    policy: str
    num_fw_outputs: int
    saved_values: tuple[SavedValue, ...] = field(repr=False)
    recomputed: tuple[str, ...] = field(repr=False)

    @property
    def saved_activation_bytes(self) -> int:
        """Saved bytes that are not graph inputs (those are alive anyway)."""
        return sum(v.nbytes for v in self.saved_values if v.reason not in ("parameter", "input"))

    def report(self) -> str:
        return format_saved_report(self.saved_values, policy=self.policy,
                                   recomputed=self.recomputed)


@dataclass
class _Joint:
    """The joint graph, classified once: what each partitioner reads."""

    gm: fx.GraphModule
    nodes: list[fx.Node]
    order: dict[fx.Node, int]
    primals: list[fx.Node]
    tangents: list[fx.Node]
    fw_outputs: list[Any]
    grads: list[Any]
    backward: set[fx.Node]
    required_fw: set[fx.Node]
    random: list[fx.Node]  # forward random ops, in graph order
    static_primals: set[fx.Node] | None  # None: the joint did not say, all inputs are free


def partition_joint(joint: Any, *, policy: str = "min_cut") -> PartitionResult:
    """Split `joint` into forward and backward graphs with `policy` ("default" or "min_cut")."""
    if policy not in POLICIES:
        raise InvalidArgument(f"unknown partition policy {policy!r}",
                              hint=f"use one of: {', '.join(POLICIES)}")
    info = _classify(joint)
    if policy == "default":
        available = _default_available(info)
    else:
        available = _min_cut_available(info)
    return _extract(info, available, policy)


def _classify(joint: Any) -> _Joint:
    gm: fx.GraphModule = joint.gm
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    n_p, n_t, n_out = joint.num_primals, joint.num_tangents, joint.num_fw_outputs
    if len(placeholders) != n_p + n_t:
        raise InternalError(f"joint graph has {len(placeholders)} placeholders, expected "
                            f"{n_p} primals + {n_t} tangents", stage="autograd")
    outputs = _flat_outputs(gm)
    if len(outputs) != n_out + n_p:
        raise InternalError(f"joint graph returns {len(outputs)} values, expected {n_out} "
                            f"forward outputs + {n_p} input grads", stage="autograd")
    primals, tangents = placeholders[:n_p], placeholders[n_p:]
    backward = _backward_nodes(nodes, tangents)
    fw_outputs = outputs[:n_out]
    # random ops and assertions (their effect is not a value) run in the forward, once
    random = [n for n in nodes if n.op == "call_function"
              and (_is_random(n.target) or is_assertion(n.target)) and n not in backward]
    required_fw = _ancestors(_nodes_in(fw_outputs) + random)
    if bad := sorted(n.name for n in required_fw & backward):
        raise InternalError(f"forward outputs depend on tangents through {bad[:5]}",
                            stage="autograd")
    static = getattr(joint, "static_input_indices", None)
    static_primals = None if static is None else {primals[i] for i in static}
    return _Joint(gm, nodes, {n: i for i, n in enumerate(nodes)}, primals, tangents,
                  fw_outputs, outputs[n_out:], backward, required_fw, random, static_primals)


def _flat_outputs(gm: fx.GraphModule) -> list[Any]:
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    args = out.args[0]
    return list(args) if isinstance(args, (tuple, list)) else [args]


def _nodes_in(values: Iterable[Any]) -> list[fx.Node]:
    return [v for v in values if isinstance(v, fx.Node)]


def _backward_nodes(nodes: list[fx.Node], tangents: list[fx.Node]) -> set[fx.Node]:
    """Nodes tagged phase=backward; the tangent closure where a node carries no tag."""
    backward: set[fx.Node] = set(tangents)
    for n in nodes:
        if n.op == "output":
            continue
        phase = n.meta.get("phase")
        if phase == "backward" or (phase is None and any(a in backward
                                                         for a in n.all_input_nodes)):
            backward.add(n)
    return backward


def _ancestors(roots: Iterable[fx.Node]) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    stack = list(roots)
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(n.all_input_nodes)
    return seen


# ---------------------------------------------------------------------------------------------
# The two policies decide one thing: which forward-phase nodes the forward graph makes available
# to the backward. `_extract` then saves the available ones the backward reads and recomputes
# the rest from them.

def _default_available(info: _Joint) -> Callable[[fx.Node], bool]:
    fw = info.required_fw | set(info.primals)
    parts = {u for n in fw if isinstance(n.meta.get("val"), (tuple, list))
             for u in n.users if u.target is operator.getitem}
    fw |= parts  # the parts of a tuple live where the tuple is computed
    for n in info.nodes:  # sizes of forward values: saved as ints, not recomputed from tensors
        if n not in info.backward and _is_size(n) and all(a in fw for a in n.all_input_nodes):
            fw.add(n)
    return lambda n: n in fw


def _min_cut_available(info: _Joint) -> Callable[[fx.Node], bool]:
    net = FlowNetwork()
    fw_nodes = [n for n in info.nodes if n.op != "output" and n not in info.backward]
    dist = _dist_from_backward(info, fw_nodes)
    sizes = {n: _value_bytes(n.meta.get("val")) for n in fw_nodes}
    weight = {n: (sizes[n] or 0) * round(1000 * 1.1 ** dist[n]) for n in fw_nodes}
    major = 1 + sum(weight.values())  # bytes dominate; the distance weight only breaks ties
    grad_nodes, random = set(_nodes_in(info.grads)), set(info.random)
    for n in fw_nodes:
        net.add_edge((n, "in"), (n, "out"), _save_cost(info, n, sizes[n], weight[n], major))
        banned = n in info.required_fw and recompute_ban(n) is not None
        if n.op == "placeholder" or banned or n in random:
            net.add_edge("source", (n, "in"), math.inf)
        for user in n.users:
            if user.op != "output" and user not in info.backward:
                net.add_edge((n, "out"), (user, "in"), math.inf)
        if n in grad_nodes or any(u in info.backward for u in n.users):
            net.add_edge((n, "out"), "sink", math.inf)  # the backward reads it
    net.add_node("source")
    net.add_node("sink")
    result = net.solve("source", "sink")
    if result.value == math.inf:
        raise InternalError("min-cut found no finite cut: a value the backward needs can "
                            "neither be saved nor recomputed", stage="autograd")
    side = result.source_side
    return lambda n: (n, "in") in side


def _save_cost(info: _Joint, n: fx.Node, size: int | None, weight: int,
               major: int) -> int | float:
    if n.op == "placeholder":
        free = info.static_primals is None or n in info.static_primals
        return 0 if free or size is None else size * major + weight
    if size is None or n.op == "get_attr" or _op_name(n.target) in VIEW_OPS:
        return math.inf  # tuples are saved by their getitems, views by their bases
    return size * major + weight


def _dist_from_backward(info: _Joint, fw_nodes: list[fx.Node]) -> dict[fx.Node, int]:
    """Hops from each forward node to its nearest backward user (capped at _MAX_DIST)."""
    dist: dict[fx.Node, int] = {}
    grad_nodes = set(_nodes_in(info.grads))
    for n in reversed(fw_nodes):
        if n in grad_nodes or any(u in info.backward for u in n.users):
            dist[n] = 1
        else:
            dist[n] = min((dist[u] + 1 for u in n.users if u in dist), default=_MAX_DIST)
        dist[n] = min(dist[n], _MAX_DIST)
    return dist


# ---------------------------------------------------------------------------------------------
# Extraction: build the two graphs from the joint and the policy's `available` decision.

def _extract(info: _Joint, available: Callable[[fx.Node], bool], policy: str) -> PartitionResult:
    saved, bw_nodes, recomputed = _backward_closure(info, available)
    fw_nodes = _ancestors(_nodes_in(info.fw_outputs) + saved + info.random)
    if bad := sorted(n.name for n in fw_nodes & info.backward):
        raise InternalError(f"{policy} partition put backward nodes in the forward graph: "
                            f"{bad[:5]}", stage="autograd")
    fw_gm = _build_fw(info, fw_nodes, saved)
    bw_gm = _build_bw(info, bw_nodes, saved, recomputed)
    records = tuple(_saved_value(info, n, policy) for n in saved)
    return PartitionResult(
        fw_gm=fw_gm, bw_gm=bw_gm, num_saved=len(saved),
        saved_bytes=sum(r.nbytes for r in records), saved=[n.name for n in saved],
        policy=policy, num_fw_outputs=len(info.fw_outputs), saved_values=records,
        recomputed=tuple(n.name for n in sorted(recomputed, key=info.order.__getitem__)))


def _backward_closure(info: _Joint, available: Callable[[fx.Node], bool]
                      ) -> tuple[list[fx.Node], set[fx.Node], set[fx.Node]]:
    """Walk back from the input grads: (saved nodes in graph order, backward graph nodes,
    forward-phase nodes the backward recomputes)."""
    saved: set[fx.Node] = set()
    bw_nodes: set[fx.Node] = set()
    recomputed: set[fx.Node] = set()
    stack = _nodes_in(info.grads)
    while stack:
        n = stack.pop()
        if n in saved or n in bw_nodes or n in info.tangents:
            continue
        if n in info.backward or n.op == "get_attr":
            bw_nodes.add(n)
        elif available(n):
            saved.add(n)
            continue
        elif n.op == "placeholder" or (n.op == "call_function" and _is_random(n.target)):
            raise InternalError(f"partition would recompute {n.name} ({_op_name(n.target)}) "
                                "in the backward", stage="autograd")
        else:
            bw_nodes.add(n)
            recomputed.add(n)
        stack.extend(n.all_input_nodes)
    return sorted(saved, key=info.order.__getitem__), bw_nodes, recomputed


def _build_fw(info: _Joint, fw_nodes: set[fx.Node], saved: list[fx.Node]) -> fx.GraphModule:
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for n in info.nodes:
        if n in info.primals or (n in fw_nodes and n.op != "placeholder"):
            env[n] = graph.node_copy(n, env.__getitem__)
    outs = [fx.map_arg(v, env.__getitem__) for v in info.fw_outputs] + [env[n] for n in saved]
    graph.output(tuple(outs))
    return _module(info.gm, graph)


def _build_bw(info: _Joint, bw_nodes: set[fx.Node], saved: list[fx.Node],
              recomputed: set[fx.Node]) -> fx.GraphModule:
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for n in saved:
        env[n] = graph.placeholder(n.name)
        env[n].meta = {**n.meta, "saved": True}
    for n in info.tangents:
        env[n] = graph.node_copy(n, env.__getitem__)
    for n in info.nodes:
        if n in bw_nodes:
            env[n] = graph.node_copy(n, env.__getitem__)
            if n in recomputed:
                env[n].meta["recomputed"] = True
    graph.output(tuple(fx.map_arg(v, env.__getitem__) for v in info.grads))
    return _module(info.gm, graph)


def _module(root: fx.GraphModule, graph: fx.Graph) -> fx.GraphModule:
    graph.lint()
    gm = fx.GraphModule(root, graph)
    gm.recompile()
    return gm


def _view_base(n: fx.Node) -> fx.Node:
    while (n.op == "call_function" and _op_name(n.target) in VIEW_OPS
           and isinstance(n.args[0], fx.Node)):
        n = n.args[0]
    return n


def _saved_value(info: _Joint, n: fx.Node, policy: str) -> SavedValue:
    val = n.meta.get("val")
    base = _view_base(n)
    if base.op == "placeholder":  # a graph input, or a view of one: no extra memory held
        param = info.static_primals is not None and base in info.static_primals
        reason = "parameter" if param else "input"
    else:
        reason = recompute_ban(n) or policy.replace("_", "-")
    if isinstance(val, torch.Tensor):
        shape: tuple[int, ...] | None = tuple(size_hint(s) for s in val.shape)
        dtype = str(val.dtype).removeprefix("torch.")
    else:
        shape, dtype = None, type(val).__name__
    op = "placeholder" if n.op == "placeholder" else _op_name(n.target)
    return SavedValue(n.name, op, shape, dtype, _value_bytes(val) or 0, reason)
