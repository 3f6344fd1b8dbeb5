"""tracer: `ATenTracer`, the dispatch mode that records ATen ops into an FX graph.

A TorchDispatchMode stacked over a FakeTensorMode: every ATen op that reaches it is run on fake
tensors (so real devices, shapes and strides are known, no data is touched) and recorded as a node.
Both stages of the joint trace record with it: stage 1 (`trace.py`) replays the captured graph
and autograd's backward under it, stage 2 (`functionalize.py`) replays the raw joint under
functionalization with the decomposition policy.

Never: raises from the dispatch handler on metadata queries (a C++ caller can abort the process).
"""
from __future__ import annotations

import operator
from typing import Any, Callable

import torch
import torch.fx

from kiln.autograd import _compat
from kiln.autograd.decompositions import keeps
from kiln.autograd.mutation import mutated_arg_positions
from kiln.autograd.symbolic import SizeNodes

__all__ = ["ASSERTIONS", "ATenTracer", "PROVENANCE_KEYS", "is_assertion"]

# The node meta a replay copies onto the ATen nodes an FX node becomes (`ATenTracer.provenance`).
PROVENANCE_KEYS = ("user_location", "stack_trace")


def _bound_args(op: _compat.OpOverload, args: tuple, kwargs: dict) -> list[Any]:
    values = list(args)
    for arg in _compat.schema(op).arguments[len(args):]:
        values.append(kwargs.get(arg.name))
    return values


_UNKNOWN = object()


# Ops whose only effect is to raise: torch's decompositions check data with them (one_hot's
# `_assert_async.msg(all(self < num_classes), ...)`), where eager's kernel raises. They return
# no tensor and have no users, so the tracer records them anyway and dead-code removal and the
# partitioner keep them explicitly; on the CPU they raise RuntimeError as eager does, on CUDA
# they are device asserts.
ASSERTIONS = frozenset({torch.ops.aten._assert_async.default, torch.ops.aten._assert_async.msg})


def is_assertion(target: Any) -> bool:
    return target in ASSERTIONS


class ATenTracer(_compat.TorchDispatchMode):
    """Records the ATen ops that reach it into `self.graph` (see the module docstring).

    Tensors are matched to nodes by identity (strong references keep ids unique for the trace);
    an op that returns its mutated argument (in-place, out=) rebinds it to the op's node. Ops the
    policy keeps are recorded whole; otherwise `decompositions` maps
    ops to Python decompositions, applied by re-entering the tracer; CompositeImplicitAutograd ops
    are expanded the same way. `provenance` is copied onto every new node. A symbolic number an
    op takes (a size of a graph traced with symbolic sizes) becomes nodes that compute it from
    the placeholders' sizes (`symbolic.SizeNodes`)."""

    def __init__(self, fake_mode: Any, decompositions: dict | None = None) -> None:
        super().__init__()
        self.fake_mode = fake_mode
        self.graph = torch.fx.Graph()
        self.decompositions = decompositions or {}
        self.provenance: dict[str, Any] = {}
        self.constants: dict[str, torch.Tensor] = {}
        self.paused = False
        self.on_mutation: Callable[[_compat.OpOverload, list], None] | None = None
        self.on_input_copy: Callable[[torch.Tensor, torch.Tensor], bool] | None = None
        self.backward_provenance: dict[int, dict[str, Any]] | None = None
        self._nodes: dict[int, torch.fx.Node] = {}
        self._alive: list[Any] = []
        self._expansions: dict[Any, Callable | None] = {}
        self._kept: set[Any] = set()
        self.sizes = SizeNodes(self.graph)

    # -- tensors and nodes ---------------------------------------------------------------------
    def bind(self, tensor: torch.Tensor, node: torch.fx.Node) -> None:
        self._nodes[id(tensor)] = node
        self._alive.append(tensor)

    def placeholder(self, name: str, value: torch.Tensor) -> torch.fx.Node:
        first = next((n for n in self.graph.nodes if n.op != "placeholder"), None)
        if first is None:
            node = self.graph.placeholder(name)
        else:
            with self.graph.inserting_before(first):
                node = self.graph.placeholder(name)
        node.meta["val"] = value
        self.bind(value, node)
        self.sizes.note_placeholder(node, value)
        return node

    def constant(self, real: torch.Tensor, fake: torch.Tensor | None = None) -> torch.Tensor:
        """A get_attr node for a real tensor the trace met; returns its fake stand-in."""
        if fake is None:
            fake = self.fake_mode.from_tensor(real, static_shapes=True)
        name = f"_tensor_constant{len(self.constants)}"
        self.constants[name] = real
        node = self.graph.get_attr(name)
        node.meta["val"] = fake
        node.meta.update(self.provenance)
        self.bind(fake, node)
        return fake

    def _arg_node(self, value: torch.Tensor) -> torch.fx.Node:
        node = self._nodes.get(id(value))
        if node is not None:
            return node
        if not _compat.is_fake(value):
            return self._nodes[id(self.constant(value))]
        real = _compat.fake_constant(value)
        if real is not None:
            self.constant(real, value)
            return self._nodes[id(value)]
        raise RuntimeError(f"kiln.autograd: a {tuple(value.shape)} tensor reached the tracer "
                           "without a known origin")

    def to_nodes(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return self._arg_node(value)
        if _compat.is_symbolic(value):
            return self.sizes.node_for(value)
        if isinstance(value, (list, tuple)):
            return type(value)(self.to_nodes(v) for v in value)
        if isinstance(value, dict):  # keyword arguments (SDPA's attn_mask=): inputs, not constants
            return {k: self.to_nodes(v) for k, v in value.items()}
        return value

    # -- dispatch ------------------------------------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if self.paused or func.namespace == "prim":  # metadata queries: never record, never raise
            return func(*args, **kwargs)
        if self.on_input_copy is not None and func is torch.ops.aten.copy_.default \
                and self.on_input_copy(args[0], args[1]):
            return args[0]
        if func not in self._kept and not self._keep(func):
            expanded = self._expand(func, args, kwargs)
            if expanded is not NotImplemented:
                return expanded
        out = func(*args, **kwargs)
        self._record(func, args, kwargs, out)
        return out

    def _keep(self, func: Any) -> bool:
        if keeps(func, "autograd"):
            self._kept.add(func)
            return True
        return False

    def _expand(self, func: Any, args: tuple, kwargs: dict) -> Any:
        expansion = self._expansions.get(func, _UNKNOWN)
        if expansion is _UNKNOWN:
            expansion = self.decompositions.get(func)
            if expansion is None and _compat.has_composite_implicit_kernel(func):
                expansion = func.decompose
            self._expansions[func] = expansion
        if expansion is None:
            return NotImplemented
        with self:
            return expansion(*args, **kwargs)

    def _record(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        writes = mutated_arg_positions(func)
        if not writes and not _has_tensor(out) and not is_assertion(func):
            return  # a pure query (sizes, flags): nothing to record
        if writes and self.on_mutation is not None:
            self.on_mutation(func, _bound_args(func, args, kwargs))
        node = self.graph.create_node("call_function", func, self.to_nodes(args),
                                      self.to_nodes(kwargs), name=func.overloadpacket.__name__)
        node.meta["val"] = out
        node.meta.update(self._current_provenance())
        if isinstance(out, torch.Tensor):
            self.bind(out, node)
        elif isinstance(out, (list, tuple)):
            for i, item in enumerate(out):
                if isinstance(item, torch.Tensor):
                    item_node = self.graph.call_function(operator.getitem, (node, i))
                    item_node.meta.update(node.meta)
                    item_node.meta["val"] = item
                    self.bind(item, item_node)

    def _current_provenance(self) -> dict[str, Any]:
        if self.backward_provenance is not None:
            grad_fn = _compat.current_autograd_node()
            if grad_fn is not None:
                found = self.backward_provenance.get(_compat.sequence_nr(grad_fn))
                if found is not None:
                    return found
        return self.provenance

    def label_autograd_nodes(self, value: Any) -> None:
        """Remember the provenance of the autograd nodes that produced `value`, so the backward
        ops they run later carry the same user line."""
        if self.backward_provenance is None:
            return
        stack = [t.grad_fn for t in _tensors(value) if t.grad_fn is not None]
        while stack:
            grad_fn = stack.pop()
            key = _compat.sequence_nr(grad_fn)
            if key in self.backward_provenance:
                continue
            self.backward_provenance[key] = dict(self.provenance)
            stack.extend(fn for fn, _ in grad_fn.next_functions if fn is not None)

    def graph_module(self) -> torch.fx.GraphModule:
        root = torch.nn.Module()
        for name, value in self.constants.items():
            setattr(root, name, value)
        return torch.fx.GraphModule(root, self.graph, class_name="JointGraph")


def _has_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (list, tuple)):
        return any(_has_tensor(v) for v in value)
    return False


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []
