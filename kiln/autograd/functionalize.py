"""functionalize: stage 2 of the joint trace — the raw (mutating) joint becomes a JointGraph.

The raw joint from stage 1 is replayed under the public `torch.func.functionalize` with the
tracer below it: the C++ functionalization layer sits above the Python dispatch key, so the tracer
records out-of-place ops only, and it applies the decomposition policy as it records. Mutations
of graph inputs come out of functionalization as trailing `copy_(input, new_value)`; the tracer
turns each into an extra forward output (the runtime writes it back after the call).

Then: dead code is removed (random ops survive under eager RNG, assertions always), every node is tagged with its
phase, and the graph is checked — no op may mutate, every node has meta["val"].

Refused (AutogradUnsupported, the backend runs the graph eagerly): an input mutated while it
shares memory with another input (functionalization would see two unrelated tensors) — stage 1
traces such groups through a synthetic base, so this is a safety net.
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.fx

from kiln.autograd import _compat
from kiln.autograd.rng import eager_rng, is_random
from kiln.autograd.mutation import mutated_arg_positions
from kiln.autograd.joint import AutogradUnsupported, JointGraph, OutputInfo, RawTrace
from kiln.autograd.symbolic import SizeSymbols
from kiln.autograd.tracer import PROVENANCE_KEYS, ATenTracer, is_assertion
from kiln.errors import InternalError

__all__ = ["functionalize_raw", "check_functional", "tag_phases", "eliminate_dead_code"]


def functionalize_raw(raw: RawTrace, decompositions: dict) -> JointGraph:
    """Stage 2: the functional, decomposed JointGraph of a raw joint."""
    fake_mode = raw.fake_mode
    tracer = ATenTracer(fake_mode, decompositions)
    with fake_mode:
        primals = [p.detach() if isinstance(p, torch.Tensor) else p for p in raw.primals]
        tangents = [t.detach() for t in raw.tangents]
    for i, primal in enumerate(primals):
        tracer.placeholder(f"primals_{i}", primal)
    for j, tangent in enumerate(tangents):
        tracer.placeholder(f"tangents_{j}", tangent)
    constants = {name: tracer.constant(value) for name, value in raw.constants.items()}
    updates = _InputUpdates(tracer, primals)
    tracer.on_input_copy = updates
    names = list(constants)

    def replay(*args: Any) -> Any:
        n = len(primals) + len(tangents)
        attrs = dict(zip(names, args[n:]))
        return _ReplayRaw(raw.gm, tracer, attrs).run(*args[:n])

    functional = torch.func.functionalize(replay, remove="mutations")
    # symbolic sizes: torch's Python kernels, as in stage 1 (some C++ composite kernels of
    # functionalization want concrete sizes)
    dispatcher = _compat.python_dispatcher() if raw.symbolic else contextlib.nullcontext()
    with fake_mode, tracer, torch.no_grad(), dispatcher:
        outs = functional(*primals, *tangents, *constants.values())
    num_outs = sum(1 for info in raw.outputs if info.kind != "constant")
    num_returned = len(raw.returned_inputs)
    for i, value in zip(raw.returned_inputs, outs[num_outs:num_outs + num_returned]):
        updates.values[i] = tracer.to_nodes(value)  # written through a clone: no copy_ into it
    _refuse_aliased_mutations(updates.values, primals, raw.synthetic_bases)
    mutated = tuple(sorted(updates.values))
    fw_values = [updates.values[i] for i in mutated]
    result_nodes = tracer.to_nodes((*outs[:num_outs], *outs[num_outs + num_returned:]))
    out_node = tracer.graph.output((*fw_values, *result_nodes))
    out_node.meta["val"] = tuple(n.meta["val"] if isinstance(n, torch.fx.Node) else n
                                 for n in out_node.args[0])
    gm = tracer.graph_module()
    eliminate_dead_code(gm.graph, keep_random=eager_rng())
    tag_phases(gm.graph)
    check_functional(gm)
    gm.recompile()
    return JointGraph(
        gm=gm, num_fw_outputs=len(fw_values) + num_outs, num_primals=len(primals),
        num_tangents=len(tangents), primals_requiring_grad=list(raw.requires_grad),
        training=raw.training, mutated_inputs=mutated, outputs=raw.outputs,
        input_mutations=tuple(raw.mutations.get(i, OutputInfo("mutation", index=i))
                              for i in mutated),
        tangent_specs=raw.tangent_specs, output_spec=raw.output_spec,
        input_sources=raw.input_sources, lifted_attrs=raw.lifted_attrs,
        static_input_indices=tuple(i for i in raw.static_inputs if i not in updates.values),
        synthetic_bases=raw.synthetic_bases,
        size_symbols=SizeSymbols(primals) if raw.symbolic else None)


class _InputUpdates:
    """The tracer's hook for `copy_`: a copy into a primal is an input mutation; its new value
    becomes a forward output instead of an op in the graph."""

    def __init__(self, tracer: ATenTracer, primals: list) -> None:
        self.tracer = tracer
        self.index = {id(p): i for i, p in enumerate(primals)}
        self.values: dict[int, torch.fx.Node] = {}

    def __call__(self, dst: torch.Tensor, src: torch.Tensor) -> bool:
        i = self.index.get(id(dst))
        if i is None:
            return False
        if src.dtype != dst.dtype or not _same_shape(src.shape, dst.shape):
            with self.tracer:
                src = src.to(dst.dtype).expand(dst.shape)
        self.values[i] = self.tracer.to_nodes(src)
        return True


class _ReplayRaw(torch.fx.Interpreter):
    """Replays the raw joint; get_attr reads the (functionalized) constants passed in."""

    def __init__(self, gm: torch.fx.GraphModule, tracer: ATenTracer,
                 attrs: dict[str, Any]) -> None:
        super().__init__(gm, garbage_collect_values=True)
        self.tracer = tracer
        self.attrs = attrs

    def run_node(self, n: torch.fx.Node) -> Any:
        self.tracer.provenance = {k: n.meta[k] for k in PROVENANCE_KEYS if k in n.meta}
        return super().run_node(n)

    def get_attr(self, target: Any, args: tuple, kwargs: dict) -> Any:
        return self.attrs[target]

    def call_function(self, target: Any, args: tuple, kwargs: dict) -> Any:
        if target is torch.ops.aten.expand.default and _same_size(args[0], args[1]):
            # an expand that changes no size is an alias: writes through it are legal in eager,
            # and functionalization's inverse of expand subtracts, which bool tensors refuse
            return torch.ops.aten.alias.default(args[0])
        return super().call_function(target, args, kwargs)


def _same_size(tensor: torch.Tensor, size: Any) -> bool:
    return len(size) == tensor.dim() and all(
        _compat.known_equal(want, -1) or _compat.known_equal(want, have)
        for want, have in zip(size, tensor.shape))


def _same_shape(a: Any, b: Any) -> bool:
    """Equal shapes for every size (symbolic sizes compared without recording a guard)."""
    return len(a) == len(b) and all(_compat.known_equal(x, y) for x, y in zip(a, b))


def _refuse_aliased_mutations(updates: dict[int, Any], primals: list, bases: tuple) -> None:
    """A written input must not share memory with another input, except a synthetic base with
    its members (the graph reads them through the base)."""
    keys = {i: _compat.storage_key(p) for i, p in enumerate(primals)
            if isinstance(p, torch.Tensor)}
    members = {base.index: set(base.members) for base in bases}
    for i in updates:
        others = [j for j, key in keys.items()
                  if j != i and key == keys[i] and j not in members.get(i, ())]
        if others:
            raise AutogradUnsupported(
                f"input primals_{i} is mutated in place and shares memory with input "
                f"primals_{others[0]}",
                hint="the graph runs eagerly instead; pass separate tensors, or clone one")


def eliminate_dead_code(graph: torch.fx.Graph, *, keep_random: bool) -> None:
    """Remove nodes nothing uses (random ops stay when `keep_random`: they advance the
    generator; assertions stay: they raise). The graph is functional by now, so no other node
    has a side effect."""
    for node in reversed(list(graph.nodes)):
        if node.op in ("placeholder", "output") or node.users:
            continue
        if keep_random and is_random(node.target) or is_assertion(node.target):
            continue
        graph.erase_node(node)


def tag_phases(graph: torch.fx.Graph) -> None:
    """meta["phase"]: "backward" for tangents and every node that depends on one."""
    for node in graph.nodes:
        backward = (node.op == "placeholder" and node.name.startswith("tangents_")) or any(
            arg.meta.get("phase") == "backward" for arg in node.all_input_nodes)
        node.meta["phase"] = "backward" if backward else "forward"


def check_functional(gm: torch.fx.GraphModule) -> None:
    """No node mutates and every node carries meta["val"] (an internal invariant)."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, _compat.OpOverload) \
                and mutated_arg_positions(node.target):
            raise InternalError(f"the functional graph still mutates: {node.format_node()}",
                                stage="autograd")
        if node.op != "output" and "val" not in node.meta:
            raise InternalError(f"node {node.name} has no meta['val']", stage="autograd")
